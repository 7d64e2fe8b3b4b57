"""`tlt bench trainer`: what a spot trainer on another core costs a worker that is still decoding.

On one machine the drafter trainer harvests the core of a rollout worker whose shard is done while the
other worker decodes its tail. It runs in the lowest CPU class (`tlt.drafter.priority`), so it never takes
a core that is asked for, but the cores still share caches and memory. This bench measures that term
alone: the workload's policy decodes (plain and EAGLE chains, at the given running batches, on the torch
threads of a rollout worker) while a second process trains the workload's warm drafter with the spot
trainer's own step (`tlt.drafter.trainer.local_step` over packed rows of the policy's own samples, the
workload's `drafter.batchTokens` and learning rate, SCHED_IDLE), switched on and off between rounds.
Rounds are interleaved: in each, every arm decodes the same requests once with the trainer off and once
with it on, the order flipped every round. Coupled sampling keeps the tokens the same in both, so the
per-round ratio is a ratio of seconds. Reports per arm and batch: decode tokens/s off and on (medians),
on over off paired by round (median and range), and the tokens/s the trainer trained while on.

A control row, `compute-probe` (batch 0; "tokens" are matrix products): a 256 x 256 float32 matmul loop,
compute-bound and cache-resident, timed in the same windows. Two separate cores leave it alone (measured
here: within 3%); where a hypervisor runs the two vCPUs on one physical core's hyperthreads it slows with
the trainer on too, and the decode's slowdown is then the shared core's, not the shared caches'.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

STATES = ("off", "on")


def is_arm(name: str) -> bool:
    """Whether `name` is an arm this bench decodes with: "plain" or "chain-<k>", k >= 1."""
    return name == "plain" or (name.startswith("chain-") and name[6:].isdigit() and int(name[6:]) >= 1)


@dataclass(frozen=True)
class TrainerBesideConfig:
    workload: Path
    batches: tuple[int, ...] = (1,)
    arms: tuple[str, ...] = ("plain", "chain-3")
    rounds: int = 6
    requests: int = 8  # requests decoded per arm and round (waves of `batch` rows)
    threads: int = 1  # the decode's torch threads (a `tlt bench run` rollout worker's)
    trainer_threads: int = 1
    settle_seconds: float = 0.5  # after switching the trainer, before timing
    quick: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rounds", "requests", "threads", "trainer_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.batches or min(self.batches) < 1:
            raise ValueError(f"batches must be >= 1, got {list(self.batches)}")
        if not self.arms:
            raise ValueError("arms must name at least one arm (plain, chain-<k>)")
        for arm in self.arms:
            if not is_arm(arm):
                raise ValueError(f"arms: {arm!r} is not plain or chain-<k> with k >= 1")
        if self.settle_seconds < 0:
            raise ValueError(f"settle_seconds must be >= 0, got {self.settle_seconds}")


def beside_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (arm, batch), in first-seen order: tokens/s off and on (medians over rounds), on / off paired by
    round (median, [min, max]). records: {"arm", "batch", "round", "state" ("off" | "on"), "tokens", "seconds"},
    every (arm, batch, round) with both states."""
    cells: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for r in records:
        if r["state"] not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {r['state']!r}")
        if not r["seconds"] > 0:
            raise ValueError(f"seconds must be > 0, got {r['seconds']}")
        cells.setdefault((r["arm"], int(r["batch"])), {}).setdefault(int(r["round"]), {})[r["state"]] = (
            r["tokens"] / r["seconds"]
        )
    out = []
    for (arm, batch), rounds in cells.items():
        missing = sorted(k for k, v in rounds.items() if set(v) != set(STATES))
        if missing:
            raise ValueError(f"{arm} at batch {batch}: rounds {missing} lack the trainer on or off")
        ratios = [v["on"] / v["off"] for v in rounds.values()]
        out.append(
            {
                "arm": arm,
                "batch": batch,
                "rounds": len(rounds),
                "tokens_per_s_off": statistics.median(v["off"] for v in rounds.values()),
                "tokens_per_s_on": statistics.median(v["on"] for v in rounds.values()),
                "on_over_off": statistics.median(ratios),
                "on_over_off_range": [min(ratios), max(ratios)],
            }
        )
    return out


PROBE_ARM = "compute-probe"


def compute_probe(products: int = 200, size: int = 256) -> tuple[int, float]:
    """(products, seconds): `products` size x size float32 matrix products, back to back (the control row)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # noqa: B018 - warm: first-call set-up outside the clock
    started = time.perf_counter()
    for _ in range(products):
        a @ b  # noqa: B018
    return products, time.perf_counter() - started


def _train_beside(
    folder: str,
    drafter_config: Any,
    drafter_state: dict[str, torch.Tensor],
    packs: list[Any],
    lr: float,
    threads: int,
    gate: Any,
    stop: Any,
    ready: Any,
    tokens: Any,
) -> None:
    """The trainer process: the spot trainer's step over `packs`, round robin, while `gate` is set."""
    from tlt.drafter.objective import make_optimizer
    from tlt.drafter.priority import lower_thread_priority
    from tlt.drafter.trainer import local_step
    from tlt.models.drafter import EagleDrafter
    from tlt.tasks.warmstart import load_policy

    lower_thread_priority()
    torch.set_num_threads(threads)
    policy, _ = load_policy(Path(folder))
    drafter = EagleDrafter(drafter_config).to(torch.float32)
    drafter.load_state_dict(drafter_state)
    drafter.bind_policy(policy.float().eval())
    drafter.train()
    optimizer = make_optimizer(drafter, lr)
    ready.set()
    i = 0
    while not stop.is_set():
        if not gate.wait(0.05):
            continue
        packed = packs[i % len(packs)]
        local_step(drafter, optimizer, packed)
        i += 1
        with tokens.get_lock():
            tokens.value += packed.num_trained


def run_trainer_beside(cfg: TrainerBesideConfig, on_row: Any = None) -> dict[str, Any]:
    """Run the bench (module docstring); the result as a JSON-able dict."""
    from tlt.bench.bench_drafter import countdown_task, sample_context
    from tlt.bench.engine_sd import SdBenchConfig, sd_engine
    from tlt.bench.run import _load_average, variant_run
    from tlt.bench.workload import load_workload, warm_drafter
    from tlt.drafter.buffer import OnlineBuffer
    from tlt.drafter.evaluate import make_requests
    from tlt.models.drafter import load_drafter
    from tlt.models.loading import resolve_dtype
    from tlt.rollout.compiled import resolve_compile
    from tlt.rollout.engine import Engine
    from tlt.tasks.countdown import generate
    from tlt.tasks.warmstart import load_policy, warm_start

    note = on_row or (lambda text: None)
    load_before = _load_average()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    workload = load_workload(cfg.workload, quick=cfg.quick)
    drafter_path, drafter_info = warm_drafter(workload)
    if drafter_path is None:
        raise ValueError(f"{cfg.workload}: the trainer bench needs the workload's drafterWarmstart (it has none)")
    spec = variant_run(workload, "tlt", 0, drafter_path).spec
    algo = spec.algorithm
    folder = warm_start(workload.warmstart)
    policy, tokenizer = load_policy(folder)
    policy = policy.to(resolve_dtype(spec.model.dtype)).eval()
    drafter = load_drafter(drafter_path, policy).to(torch.float32)
    drafter.bind_policy(policy)
    compiled = resolve_compile(spec.rollout.compile, policy)
    sd_cfg = replace(SdBenchConfig(), compile=compiled)
    task = countdown_task(folder)
    group = algo.group_size if algo.temperature > 0 else 1

    def requests_for(count: int, seed: int) -> list:
        problems = generate(math.ceil(count / group), seed, task)
        return make_requests(
            tokenizer,
            [p for p in problems for _ in range(group)][:count],
            max_new_tokens=algo.max_new_tokens,
            temperature=algo.temperature,
            seed=seed,
        )

    # the trainer's samples: the policy's own, other prompts, with hidden states (as a rollout buffers them)
    note("sampling the trainer's data")
    samples = requests_for(max(cfg.requests, 16), cfg.seed + 2)
    sampler = Engine(
        policy, max_batch_size=len(samples), max_context=sample_context(policy, samples), return_hidden=True
    )
    buffer = OnlineBuffer(1, spec.drafter.batch_tokens, seed=cfg.seed)
    buffer.add(sampler.generate(samples), 0)
    packs = buffer.batches(0)
    decode = requests_for(cfg.requests, cfg.seed + 1)
    context = sample_context(policy, decode)
    engines = {(arm, b): sd_engine(arm, sd_cfg, policy, drafter, b, context) for b in cfg.batches for arm in cfg.arms}
    note("warming up the decode engines")
    for engine in engines.values():
        engine.generate(decode)

    ctx = mp.get_context("spawn")
    gate, stop, ready, trained = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Value("d", 0.0)
    state = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
    proc = ctx.Process(
        target=_train_beside,
        daemon=True,
        args=(
            str(folder),
            drafter.config,
            state,
            packs,
            spec.drafter.learning_rate,
            cfg.trainer_threads,
            gate,
            stop,
            ready,
            trained,
        ),
    )
    proc.start()
    records: list[dict[str, Any]] = []
    on_seconds = on_tokens = 0.0
    try:
        while not ready.wait(1.0):  # loading the policy and drafter: seconds
            if not proc.is_alive():
                raise RuntimeError(f"the trainer process exited (code {proc.exitcode}) before it started training")
        for round_ in range(cfg.rounds):
            for state_name in STATES if round_ % 2 == 0 else STATES[::-1]:
                (gate.set if state_name == "on" else gate.clear)()
                time.sleep(cfg.settle_seconds)
                window_start, tokens_start = time.perf_counter(), trained.value
                for (arm, b), engine in engines.items():
                    note(f"round {round_ + 1}/{cfg.rounds}: {arm} batch {b}, trainer {state_name}")
                    started = time.perf_counter()
                    out = engine.generate(decode)
                    records.append(
                        {
                            "arm": arm,
                            "batch": b,
                            "round": round_,
                            "state": state_name,
                            "tokens": sum(len(c.token_ids) for c in out),
                            "seconds": time.perf_counter() - started,
                        }
                    )
                products, seconds = compute_probe()
                records.append(
                    {
                        "arm": PROBE_ARM,
                        "batch": 0,
                        "round": round_,
                        "state": state_name,
                        "tokens": products,
                        "seconds": seconds,
                    }
                )
                if state_name == "on":
                    on_seconds += time.perf_counter() - window_start
                    on_tokens += trained.value - tokens_start
                    if not proc.is_alive():  # an "on" window without a trainer would read as no interference
                        raise RuntimeError(f"the trainer process died (code {proc.exitcode}) during round {round_ + 1}")
        gate.clear()
    finally:
        stop.set()
        gate.set()  # wake it to see the stop
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
        torch.set_num_threads(threads_before)
    return {
        "workload": {"path": str(cfg.workload), "name": workload.name, "quick": cfg.quick},
        "config": {
            **asdict(cfg),
            "workload": str(cfg.workload),
            "compiled": compiled,
            "trainer_row_tokens": spec.drafter.batch_tokens,
            "trainer_rows": len(packs),
        },
        "drafter": drafter_info,
        "rows": beside_summary(records),
        "trainer_tokens_per_s": on_tokens / on_seconds if on_seconds > 0 else 0.0,
        "records": records,
        "load_average": {"before": load_before, "after": _load_average()},
    }
