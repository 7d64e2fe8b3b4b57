"""`tlt bench costs`: the cost model's terms for a policy shape on this machine's hardware.

Speculative decoding with a chain of d drafts pays at a running batch of b rows when the tokens a step
keeps exceed what the step costs in plain steps: the verify forward over d + 1 tokens per row
(`verify_ratio(b, d + 1)`, one token = 1) plus d drafter steps (`drafter_ratio(b)` each). That sum is the
chain's *break-even accept length*: a drafter accepted less often than that makes decoding slower. Both
terms depend on the shape (layers, width, vocabulary) and the hardware, not on the weights, so this bench
times a shape with random weights: a real model's shape (`--shape`, or `--config` with its config.json)
on the device it would decode on, with no download. The accept lengths themselves are the workload's
(`tlt bench run` measures them); this bench says what they must reach.

Timing is `tlt.bench.cost_timing`: every (batch, width) interleaved within a repeat, the fastest repeat
kept; the CPU clock of this process on a CPU (one thread: set `--threads`), the wall clock with the
device synchronised on CUDA.

`--draft-vocab 0,N` times the drafter with its whole head and with a reduced draft vocabulary of N tokens
(`tlt.models.draft_vocab`, `speculative.draftVocab`) side by side: for a real vocabulary the head is most
of a one-layer drafter's step. The break-even accept lengths are given per head size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from tlt.bench.cost_timing import (
    CostPoint,
    DrafterCost,
    cost_ratio,
    drafter_ratio,
    measure_costs,
    measure_drafter_costs,
)
from tlt.models.loading import resolve_dtype
from tlt.models.tiny import tiny_config

# Published shapes (their config.json on the Hub), as tiny_config arguments. Weights are random.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        family="qwen2",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        family="qwen2",
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        family="qwen2",
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class CostsConfig:
    """shape: a SHAPES name, or None with `config` (a config.json file or a folder holding one)."""

    shape: str | None = "qwen2.5-0.5b"
    config: Path | None = None
    device: str = "cpu"
    dtype: str = "bfloat16"
    batches: tuple[int, ...] = (1, 4, 16, 64)
    depths: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    context: int = 512
    repeats: int = 5
    compile: bool = False
    draft_vocabs: tuple[int, ...] = (0,)


def model_config(cfg: CostsConfig) -> PretrainedConfig:
    """The transformers config of `cfg.shape` or `cfg.config`; ValueError naming the field when neither works."""
    if (cfg.shape is None) == (cfg.config is None):
        raise ValueError("give exactly one of --shape (a built-in shape) and --config (a config.json)")
    if cfg.config is not None:
        if not Path(cfg.config).exists():
            raise ValueError(f"--config: {cfg.config} does not exist (a config.json file or a folder holding one)")
        return AutoConfig.from_pretrained(str(cfg.config))  # a family the runner cannot drive is refused there
    if cfg.shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}; got {cfg.shape!r}")
    kwargs = dict(SHAPES[cfg.shape])
    family = kwargs.pop("family")
    return tiny_config(family, max_position_embeddings=32768, rope_theta=1e6, **kwargs)


def random_model(config: PretrainedConfig, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """The shape with random weights, built directly on `device` in `dtype` (a 7B shape never passes
    through float32 or host memory)."""
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def break_even(
    verify: list[CostPoint], drafter: list[DrafterCost], batch: int, depth: int, draft_vocab: int = 0
) -> float:
    """Accept length (tokens a step keeps, the target's own included) at which a chain of `depth` drafts
    costs what plain decoding does at `batch` rows: verify_ratio(batch, depth + 1) + depth x drafter_ratio
    (the drafter's head over `draft_vocab` tokens, 0: the whole vocabulary)."""
    return cost_ratio(verify, batch, depth + 1) + depth * drafter_ratio(drafter, batch, draft_vocab)


def run_costs(cfg: CostsConfig) -> dict[str, Any]:
    """Measure and summarise; the JSON-ready result (see the module docstring)."""
    if min(cfg.batches, default=0) < 1 or min(cfg.depths, default=0) < 1:
        raise ValueError(f"--batches and --depths must be integers >= 1, got {cfg.batches} and {cfg.depths}")
    if not cfg.draft_vocabs or min(cfg.draft_vocabs) < 0:
        raise ValueError(f"--draft-vocab sizes must be >= 0 (0: the whole vocabulary), got {cfg.draft_vocabs}")
    if cfg.context < 1 or cfg.repeats < 1:
        raise ValueError(f"--context and --repeats must be >= 1, got {cfg.context} and {cfg.repeats}")
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise ValueError(f"--device must be a torch device (cpu, cuda, cuda:1, ...), got {cfg.device!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {cfg.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device}: no CUDA device here")
    config = model_config(cfg)
    model = random_model(config, device, resolve_dtype(cfg.dtype))
    clock = "wall" if device.type == "cuda" else "cpu"
    widths = sorted({d + 1 for d in cfg.depths})
    verify = measure_costs(
        model,
        batches=list(cfg.batches),
        widths=widths,
        context=cfg.context,
        repeats=cfg.repeats,
        clock=clock,
        compile=cfg.compile,
    )
    if max(cfg.draft_vocabs) >= config.vocab_size:
        raise ValueError(
            f"--draft-vocab sizes must be below the shape's vocabulary ({config.vocab_size}), "
            f"got {max(cfg.draft_vocabs)}"
        )
    drafter = measure_drafter_costs(
        model,
        batches=list(cfg.batches),
        context=cfg.context,
        repeats=cfg.repeats,
        clock=clock,
        compile=cfg.compile,
        draft_vocabs=tuple(cfg.draft_vocabs),
    )
    return {
        "shape": cfg.shape,
        "config": str(cfg.config) if cfg.config else None,
        "model_type": config.model_type,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": cfg.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": cfg.dtype,
        "context": cfg.context,
        "repeats": cfg.repeats,
        "compile": cfg.compile,
        "clock": clock,
        "verify": [asdict(p) for p in verify],
        "drafter": [asdict(d) for d in drafter],
        "break_even": [
            {"batch": b, "depth": d, "draft_vocab": n, "accept_length": break_even(verify, drafter, b, d, n)}
            for b in cfg.batches
            for n in dict.fromkeys(cfg.draft_vocabs)
            for d in cfg.depths
        ],
    }


def costs_table(result: dict[str, Any]) -> Table:
    """`run_costs`'s result as a table: per batch, the target's one-token step, the drafter's relative cost and
    the break-even accept length of each chain depth."""
    depths = sorted({r["depth"] for r in result["break_even"]})
    table = Table(
        title=f"{result['shape'] or result['config']} ({result['parameters'] / 1e6:.0f}M parameters) on "
        f"{result['device_name'] or result['device']}, {result['dtype']}, context {result['context']}"
        f"{', compiled' if result['compile'] else ''}: break-even accept length by chain depth"
    )
    for col in ("rows", "target ms", "draft vocab", "drafter / target", *(f"d={d}" for d in depths)):
        table.add_column(col, justify="right")
    for d in result["drafter"]:
        b, n = d["batch"], d.get("draft_vocab", 0)
        target = next(p["seconds"] for p in result["verify"] if p["batch"] == b and p["width"] == 1)
        even = {
            r["depth"]: r["accept_length"]
            for r in result["break_even"]
            if r["batch"] == b and r.get("draft_vocab", 0) == n
        }
        table.add_row(
            str(b),
            f"{target * 1e3:.2f}",
            str(n or result["vocab_size"]),
            f"{d['ratio']:.3f}",
            *(f"{even[x]:.2f}" for x in depths),
        )
    return table
