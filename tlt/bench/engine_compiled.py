"""`tlt bench engine --part compiled`: eager vs compiled steps vs `transformers` generate vs the weight-read bound.

Per policy shape (the bench workload's 4 x 128 policy and a 24-layer one, random weights: a step's cost
does not depend on the values) and batch:
- decode step (ms): the eager runner, the compiled runner (`tlt/rollout/compiled.py`), and HF generate's
  per-token time (generate of n2 and n1 new tokens, (t2 - t1) / (n2 - n1): prefill cancels out);
- verify(k) / verify(1) for each width, eager and compiled;
- one compiled drafter step / one compiled target step;
- the weight-read bound: bytes a decode step must read (every weight once, the LM head included, plus
  the KV cache of `context` slots per row) over the read bandwidth the bench measures on this machine;
- graphs compiled during warm-up and during the timed rounds (steady-state recompiles, expected 0), and
  the timed target calls that ran dynamo's full guard check (expected 0: a warm step skips it);
- the whole shape set's compile time cold (an empty inductor cache) and warm (the same cache, a new
  process), each in a fresh subprocess (`tlt.bench.compile_probe`);
- the host-side share of a compiled speculative step (EAGLE chain, batch 1): the step's wall time
  minus the model forwards (target and drafter), over one target forward.
Every variant runs once per round, rounds interleaved; medians and per-round ranges are reported.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from transformers import GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from tlt.bench.cost_timing import forward_fn
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.rollout.drafting import EagleCache, EagleChainDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.runner import ModelRunner, causal_mask
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    """A Qwen2-shaped policy."""

    name: str
    num_layers: int
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    vocab_size: int = 64


@dataclass(frozen=True)
class CompiledBenchConfig:
    shapes: tuple[Shape, ...] = (Shape("workload-4x128", 4), Shape("deep-24x128", 24))
    batches: tuple[int, ...] = (1, 4, 16, 32)
    widths: tuple[int, ...] = (1, 3, 5)
    context: int = 128
    hf_tokens: tuple[int, int] = (8, 40)
    repeats: int = 5
    calls: int = 5  # timed calls of each step in a round (HF generate: 1, it decodes many tokens a call)
    threads: int = 1
    sd_new_tokens: int = 48
    compile_probe: bool = True

    @classmethod
    def quick(cls, repeats: int = 1) -> CompiledBenchConfig:
        return cls(
            shapes=(Shape("tiny-2x32", 2, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64),),
            batches=(1, 2),
            widths=(1, 3),
            context=16,
            hf_tokens=(2, 6),
            repeats=repeats,
            sd_new_tokens=8,
            compile_probe=False,
        )


def build_policy(shape: Shape, context: int, seed: int = 0) -> PreTrainedModel:
    config = Qwen2Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=max(1024, 2 * context),
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def read_bandwidth(threads: int, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory (a sum over a buffer far larger than the caches)."""
    torch.set_num_threads(threads)
    buf = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    buf.sum()
    best = min(_timed(buf.sum) for _ in range(repeats))
    return buf.numel() * 4 / best


def step_bytes(model: PreTrainedModel, batch: int, context: int) -> int:
    """Bytes one decode step reads at least: each weight once (tied ones once) and every row's KV cache."""
    weights = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * batch * config.num_key_value_heads * context * head_dim
    return sum(weights.values()) + kv * model.dtype.itemsize


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(fns: dict, repeats: int, calls: dict | None = None) -> dict:
    """One warm-up call each, then `repeats` rounds; in a round, every fn in turn: one untimed call, then
    `calls[key]` (default 1) timed calls back to back. key -> [mean seconds a call, per round].

    Why the untimed call: a decode loop calls the same step back to back, so its weights and code are warm;
    a single call right after another variant's (an HF generate at batch 32, the other engine) pays for
    what that variant evicted. Timed alone, the first variant after such a call read up to 1.3x slow."""
    for fn in fns.values():
        fn()
    seconds: dict = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            n = (calls or {}).get(key, 1)
            fn()
            seconds[key].append(_timed(lambda fn=fn, n=n: [fn() for _ in range(n)]) / n)
    return seconds


def _hf_fn(model: PreTrainedModel, batch: int, prompt_len: int, new: int) -> Callable[[], None]:
    prompts = torch.randint(1, model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
    gen = GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
    mask = torch.ones_like(prompts)

    def go() -> None:
        with torch.no_grad():
            model.generate(prompts, attention_mask=mask, generation_config=gen)

    return go


def _drafter_fn(model: PreTrainedModel, batch: int, context: int) -> tuple[Callable[[], None], EagleCache]:
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.dtype).eval()
    drafter.bind_policy(model)
    state = EagleCache(drafter, model.get_input_embeddings(), batch, context + 2, compile=True)
    state.cache.start(batch)
    state.cache.lengths = [context] * batch
    pos = torch.full((batch, 1), context, dtype=torch.long)
    mask = causal_mask(torch.full((batch,), context, dtype=torch.long), 1, context + 1)
    token = torch.ones(batch, 1, dtype=torch.long)
    feature = torch.zeros(batch, 1, model.config.hidden_size, dtype=model.dtype)
    return (lambda: drafter.logits(state.forward(token, feature, pos, pos, mask))), state


@torch.no_grad()
def bench_shape(shape: Shape, cfg: CompiledBenchConfig, bandwidth: float, on_row: Callable[[str], None]) -> dict:
    """Every timing of one policy shape; see the module docstring."""
    model = build_policy(shape, cfg.context)
    rows = max(cfg.batches)
    span = cfg.context + max(cfg.widths) + 1
    runners = {
        mode: ModelRunner(model, max_batch_size=rows, max_context=span, capacity=span, compile=mode == "compiled")
        for mode in ("eager", "compiled")
    }
    fns: dict = {}
    drafter_states = []
    for mode, runner in runners.items():
        runner.cache.start(rows)
        runner.cache.lengths = [cfg.context] * rows
        for b in cfg.batches:
            for w in cfg.widths:
                fns[(mode, b, w)] = forward_fn(runner, b, w, cfg.context)
    for b in cfg.batches:
        fns[("drafter", b, 1)], state = _drafter_fn(model, b, cfg.context)
        drafter_states.append(state)
        for n in cfg.hf_tokens:
            fns[("hf", b, n)] = _hf_fn(model, b, cfg.context, n)
    on_row(f"{shape.name}: compiling and warming up")
    compiled = runners["compiled"].compiled
    seconds = _interleaved(fns, 1)  # warm-up (compiles) + one round
    warm_compiles = compiled.compiles + sum(s.compiles for s in drafter_states)
    warm_guarded = compiled.guarded_calls
    on_row(f"{shape.name}: {cfg.repeats} timed rounds")
    more = _interleaved(fns, cfg.repeats, {key: 1 if key[0] == "hf" else cfg.calls for key in fns})
    seconds = {key: more[key] for key in seconds}
    recompiles = compiled.compiles + sum(s.compiles for s in drafter_states) - warm_compiles
    guarded = compiled.guarded_calls - warm_guarded  # timed target calls that ran dynamo's full guard check
    lo, hi = cfg.hf_tokens
    hf_step = {
        b: [(t2 - t1) / (hi - lo) for t1, t2 in zip(seconds[("hf", b, lo)], seconds[("hf", b, hi)])]
        for b in cfg.batches
    }
    med = statistics.median
    per_batch = []
    for b in cfg.batches:
        eager, comp = seconds[("eager", b, 1)], seconds[("compiled", b, 1)]
        bound = step_bytes(model, b, cfg.context) / bandwidth
        per_batch.append(
            {
                "batch": b,
                "eager_ms": med(eager) * 1e3,
                "compiled_ms": med(comp) * 1e3,
                "hf_ms": med(hf_step[b]) * 1e3,
                "bound_ms": bound * 1e3,
                "compiled_vs_eager": med(eager) / med(comp),
                "compiled_vs_eager_range": _range([e / c for e, c in zip(eager, comp)]),
                "compiled_vs_hf": med(hf_step[b]) / med(comp),
                "compiled_vs_hf_range": _range([h / c for h, c in zip(hf_step[b], comp)]),
                "bound_ratio": med(comp) / bound,
                "drafter_over_target": med(seconds[("drafter", b, 1)]) / med(comp),
                "verify_ratio": {
                    mode: {w: med(seconds[(mode, b, w)]) / med(seconds[(mode, b, 1)]) for w in cfg.widths}
                    for mode in ("eager", "compiled")
                },
                "verify_compiled_vs_eager": {
                    w: med(seconds[("eager", b, w)]) / med(seconds[("compiled", b, w)]) for w in cfg.widths
                },
            }
        )
    return {
        "shape": asdict(shape),
        "params": sum(p.numel() for p in model.parameters()),
        "per_batch": per_batch,
        "graphs_compiled_warmup": warm_compiles,
        "recompiles": recompiles,
        "full_guard_calls_timed": guarded,
        "host_overhead": host_overhead(model, cfg),
    }


def _range(values: list[float]) -> list[float]:
    return [min(values), max(values)]


@torch.no_grad()
def host_overhead(model: PreTrainedModel, cfg: CompiledBenchConfig) -> dict:
    """A compiled EAGLE-chain SD step at batch 1: its wall time split into model calls (the target's
    forward and LM head, the drafter's layer and LM head, each timed around the call) and the rest
    (drafting bookkeeping, masks, verification, commit). The prefill is left out."""
    context = cfg.context + cfg.sd_new_tokens + 8
    engine = Engine(model, max_batch_size=1, max_context=context, return_hidden=True, compile=True)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.dtype).eval()
    drafter.bind_policy(model)
    chain = EagleChainDrafter(drafter, model.get_input_embeddings(), 2, 1, context, compile=True)
    engine.stepper = SpeculativeStepper(engine.runner, chain)
    calls: dict[str, list[float]] = {"target": [], "drafter": []}
    _time_calls(engine.runner, "forward", calls["target"])
    _time_calls(engine.runner, "logits", calls["target"])
    # the drafter's one call per step: the fused catch-up + chain graph (its LM head inside)
    chain.state._chains[2] = _recording(chain.state._chain_step(2), calls["drafter"])
    prompt = torch.randint(1, model.config.vocab_size, (cfg.context,), generator=torch.Generator().manual_seed(2))
    request = Request("h", prompt.tolist(), SamplingParams(temperature=0.0, max_new_tokens=cfg.sd_new_tokens))
    engine.generate([request])  # warm-up: compiles
    step_seconds: list[float] = []

    def on_step(metrics) -> None:
        if metrics.step > 0:
            step_seconds.append(metrics.seconds)

    for timed in calls.values():
        timed.clear()
    engine.generate([request], on_step=on_step)
    target = calls["target"][2:]  # the prefill's forward and LM head
    steps = max(len(step_seconds), 1)
    target_forward = 2 * sum(target) / max(len(target), 1)  # one forward + one LM head per step
    host = max(sum(step_seconds) - sum(target) - sum(calls["drafter"]), 0.0) / steps
    return {
        "steps": len(step_seconds),
        "step_ms": sum(step_seconds) / steps * 1e3,
        "target_forward_ms": target_forward * 1e3,
        "drafter_ms_per_step": sum(calls["drafter"]) / steps * 1e3,
        "host_ms_per_step": host * 1e3,
        "host_overhead_fraction": host / target_forward,
    }


def _time_calls(obj: object, name: str, record: list[float]) -> None:
    """Wrap obj.name (an instance attribute shadows the method) so that each call's wall time is recorded."""
    setattr(obj, name, _recording(getattr(obj, name), record))


def _recording(inner: Callable, record: list[float]) -> Callable:
    """inner, appending each call's wall seconds to `record`."""

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            record.append(time.perf_counter() - t0)

    return timed


def compile_probe_seconds(shape: Shape, cfg: CompiledBenchConfig, cache_dir: str) -> dict:
    """Compile the whole shape set of `shape` in a new process with inductor's cache at cache_dir."""
    payload = json.dumps(
        {
            "shape": asdict(shape),
            "batches": list(cfg.batches),
            "widths": list(cfg.widths),
            "context": cfg.context,
            "threads": cfg.threads,
        }
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    out = subprocess.run(
        [sys.executable, "-m", "tlt.bench.compile_probe", payload], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"compile probe failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_compiled_bench(cfg: CompiledBenchConfig, on_row: Callable[[str], None] | None = None) -> dict:
    """All shapes; the issue's headline keys come from the deepest shape (the last)."""
    on_row = on_row or (lambda text: None)
    torch.set_num_threads(cfg.threads)
    bandwidth = read_bandwidth(cfg.threads)
    shapes = []
    for shape in cfg.shapes:
        entry = bench_shape(shape, cfg, bandwidth, on_row)
        if cfg.compile_probe:
            on_row(f"{shape.name}: compile probes (cold, then warm)")
            with tempfile.TemporaryDirectory(prefix="tlt-inductor-") as cache_dir:
                entry["compile_cold"] = compile_probe_seconds(shape, cfg, cache_dir)
                entry["compile_warm"] = compile_probe_seconds(shape, cfg, cache_dir)
        shapes.append(entry)
    head = shapes[-1]
    return {
        "compiled": {
            "config": {
                **asdict(replace(cfg, shapes=())),
                "read_bandwidth_gb_s": bandwidth / 1e9,
                "torch": torch.__version__,
            },
            "shapes": shapes,
            "headline_shape": head["shape"]["name"],
        },
        "compiled_vs_eager": {r["batch"]: r["compiled_vs_eager"] for r in head["per_batch"]},
        "compiled_vs_hf": {r["batch"]: r["compiled_vs_hf"] for r in head["per_batch"]},
        "bound_ratio": {r["batch"]: r["bound_ratio"] for r in head["per_batch"]},
        "host_overhead_fraction": head["host_overhead"]["host_overhead_fraction"],
        "recompiles": head["recompiles"],
        "compile_seconds_cold": head.get("compile_cold", {}).get("seconds"),
        "compile_seconds_warm": head.get("compile_warm", {}).get("seconds"),
    }
