"""Hardware profiles as data files, read into a `CostModel`.

`--hardware` names a built-in GPU (`h100`, `h200`, `h20`, `a100`: `tlt/sim/profiles/gpus/*.yaml`),
a profile YAML of either kind, or a `tlt bench engine --json` file:

- kind: roofline -- a GPU's published figures (see `roofline.GpuSpec`); combined with a model shape
  (`--model`: `qwen2.5-7b`, `qwen2.5-32b`, `llama-3.3-70b` from `profiles/models/`, or a YAML path);
- kind: measured -- `bench:` (a bench JSON path, relative to the YAML), `update_seconds_per_token`
  and `sync_seconds` (the update's cost, from a `tlt train` run: see `calibrate.update_cost`);
- a bench JSON -- the same, with the update cost passed in.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tlt.sim.cost_model import CostModel
from tlt.sim.measured import MeasuredCost
from tlt.sim.roofline import GpuSpec, ModelShape, RooflineCost


def _builtin(folder: str) -> dict[str, Path]:
    root = resources.files("tlt.sim") / "profiles" / folder
    return {p.name.removesuffix(".yaml"): Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")}


def builtin_gpus() -> list[str]:
    return sorted(_builtin("gpus"))


def builtin_models() -> list[str]:
    return sorted(_builtin("models"))


def _read_yaml(name: str, folder: str) -> tuple[dict[str, Any], Path]:
    known = _builtin(folder)
    path = known.get(name.lower(), Path(name))
    if not path.is_file():
        raise ValueError(f"{name!r} is neither a built-in {folder[:-1]} ({', '.join(sorted(known))}) nor a file")
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a profile must be a YAML mapping")
    return doc, path


def _build(cls: type, doc: dict[str, Any], path: Path) -> Any:
    """A `cls` from the YAML mapping `doc`, every field cast to its declared type (str, int or float)."""
    fields = cls.__dataclass_fields__
    if set(doc) != set(fields):
        raise ValueError(
            f"{path}: fields must be exactly {sorted(fields)}; missing {sorted(set(fields) - set(doc))},"
            f" unknown {sorted(set(doc) - set(fields))}"
        )
    casts = {"str": str, "int": int, "float": float}
    try:
        return cls(**{k: casts[str(f.type)](doc[k]) for k, f in fields.items()})
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def load_model_shape(name: str) -> ModelShape:
    doc, path = _read_yaml(name, "models")
    return _build(ModelShape, doc, path)


def load_cost_model(
    hardware: str, *, model: str = "qwen2.5-7b", tp: int = 1, update_cost: tuple[float, float] | None = None
) -> CostModel:
    """The cost model `hardware` names (see the module docstring). update_cost: (seconds per token,
    sync seconds) for a bench JSON, or to override a measured profile's."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if hardware.endswith(".json"):
        if update_cost is None:
            raise ValueError(
                f"{hardware}: a bench JSON holds no update cost; pass --calibrate-run DIR (a `tlt train`"
                " output) or use a measured profile YAML with update_seconds_per_token and sync_seconds"
            )
        bench = json.loads(Path(hardware).read_text())
        return MeasuredCost.from_bench(bench, *update_cost, name=f"{Path(hardware).name} (measured)")
    doc, path = _read_yaml(hardware, "gpus")
    kind = doc.pop("kind", None)
    if kind == "roofline":
        return RooflineCost(_build(GpuSpec, doc, path), load_model_shape(model), tp)
    if kind == "measured":
        missing = {"bench", "update_seconds_per_token", "sync_seconds"} - set(doc)
        if missing:
            raise ValueError(f"{path}: a measured profile needs {sorted(missing)}")
        bench = json.loads((path.parent / doc["bench"]).read_text())
        per_token, sync = update_cost or (float(doc["update_seconds_per_token"]), float(doc["sync_seconds"]))
        return MeasuredCost.from_bench(bench, per_token, sync, name=f"{path.name} (measured)")
    raise ValueError(f"{path}: kind must be 'roofline' or 'measured', got {kind!r}")
