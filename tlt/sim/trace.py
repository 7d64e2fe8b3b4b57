"""Response-length traces: one list of response lengths (tokens) per RL step.

`--trace` is one of:
- a `tlt train` output folder or its `metrics.jsonl` (each step's `response_lengths`, which the
  Ray runtime records);
- a JSONL file, one step a line: a list of lengths, or an object with `lengths` or `response_lengths`;
- a parametric long tail, `lognormal:median=M,sigma=S,n=N[,max=C]` or
  `pareto:min=M,alpha=A,n=N[,max=C]` (n responses per step, capped at max = the response-length cap),
  drawn for `steps` steps from `seed`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PARAMS = {"lognormal": ("median", "sigma", "n"), "pareto": ("min", "alpha", "n")}


def parse_parametric(text: str) -> tuple[str, dict[str, float]]:
    """'lognormal:median=800,sigma=1,n=64' -> ('lognormal', {...}); errors name the allowed keys."""
    kind, _, rest = text.partition(":")
    if kind not in PARAMS:
        raise ValueError(f"trace kind must be one of {sorted(PARAMS)} (or a file), got {kind!r}")
    params: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in (*PARAMS[kind], "max"):
            raise ValueError(
                f"{kind} trace takes {', '.join(PARAMS[kind])} and optional max, as key=value; got {item!r}"
            )
        params[key] = float(value)
    missing = [k for k in PARAMS[kind] if k not in params]
    if missing:
        raise ValueError(f"{kind} trace needs {', '.join(missing)}")
    if params["n"] < 1 or params.get("max", 1) < 1 or min(v for k, v in params.items() if k != "n") <= 0:
        raise ValueError(f"{kind} trace parameters must be > 0 and n >= 1, got {params}")
    return kind, params


def parametric_trace(text: str, steps: int, seed: int) -> list[list[int]]:
    """`steps` steps of lengths drawn from the parametric tail `text` (see the module docstring)."""
    kind, p = parse_parametric(text)
    rng = np.random.default_rng(seed)
    shape = (steps, int(p["n"]))
    if kind == "lognormal":
        draws = p["median"] * np.exp(p["sigma"] * rng.standard_normal(shape))
    else:
        draws = p["min"] * (1.0 + rng.pareto(p["alpha"], shape))
    draws = np.clip(np.rint(draws), 1, p.get("max", np.inf))
    return draws.astype(int).tolist()


def file_trace(path: Path) -> list[list[int]]:
    """Steps of lengths from a JSONL file or a `tlt train` output folder (its metrics.jsonl)."""
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"trace {path} does not exist")
    steps = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        lengths = row if isinstance(row, list) else row.get("lengths", row.get("response_lengths"))
        if not isinstance(lengths, list) or not lengths or not all(isinstance(n, int) and n >= 1 for n in lengths):
            raise ValueError(
                f"{path}:{number}: a step needs a non-empty list of lengths >= 1 (a list, or `lengths` /"
                " `response_lengths`; the local runtime's metrics.jsonl has only length statistics)"
            )
        steps.append(lengths)
    if not steps:
        raise ValueError(f"{path} holds no steps")
    return steps


def load_trace(spec: str, steps: int, seed: int = 0) -> list[list[int]]:
    """The trace `spec` names; a file trace is cut to its first `steps` steps."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if spec.split(":", 1)[0] in PARAMS:
        return parametric_trace(spec, steps, seed)
    return file_trace(Path(spec))[:steps]
