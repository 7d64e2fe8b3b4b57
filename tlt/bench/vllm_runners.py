"""The variants `tlt bench engine --part vllm` interleaves, one `Runner` each: a call generates one group of
requests at one running batch and returns its token ids, wall seconds and SD counts (`tlt.bench.engine_vllm`'s
docstring says what each variant is)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from tlt.adaptive.adaptive_stepper import AdaptiveStepper, rollout_stepper
from tlt.adaptive.arms import new_history_store, uses_history
from tlt.adaptive.bandit import BucketedBandit
from tlt.bench.vllm_compare import Call, Runner
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request
from tlt.rollout.vllm.vllm_engine import drafting_counts


def vllm_runner(engine: Any, table: Callable[[int], Any] | None = None, settle: Any | None = None) -> Runner:
    """A vLLM variant; with `table` (batch -> the table of the next call) the engine's table is set first, and
    `settle` (batch, steps) sees each call's engine steps (the dynamic variant's bandit learns from them)."""

    def go(batch: int, group: list[Request]) -> Call:
        if table is not None:
            engine.set_table(table(batch))
        started = time.perf_counter()
        out = engine.generate(group)
        call = Call([c.token_ids for c in out], time.perf_counter() - started)
        if engine.eagle:
            call.sd_rows, call.accepted, call.arms = drafting_counts(engine.steps)
        if settle is not None:
            settle(batch, engine.steps)
        return call

    return go


def table_runners(engine: Any, spec: Any, depths: list[int], batches: tuple[int, ...]) -> dict[str, Runner]:
    """The variants one table-driven vLLM engine serves: `vllm-fixed-k<K>` (K at every batch size) per EAGLE depth,
    and `vllm-dynamic` (TLT's threshold and buckets, each bucket's depth chosen by a bandit kept per batch size
    across calls, as `tlt-adaptive` keeps its own)."""
    from tlt.workers.vllm_speculation import VllmSpeculation

    rows = engine.max_batch_size
    runners: dict[str, Runner] = {
        f"vllm-fixed-k{k}": vllm_runner(engine, table=lambda batch, k=k: [(1, rows, k)]) for k in depths
    }
    plans = {b: VllmSpeculation(spec.speculative, spec.drafter.health, rows, seed=spec.algorithm.seed) for b in batches}
    calls = Counter()

    def settle(batch: int, steps: list[Any]) -> None:
        calls[batch] += 1
        row_steps, accepted, _ = drafting_counts(steps)
        plans[batch].settle(calls[batch], steps, row_steps, accepted)

    runners["vllm-dynamic"] = vllm_runner(engine, table=lambda batch: plans[batch].table(None), settle=settle)
    return runners


def plain_runner(engines: dict[int, Engine]) -> Runner:
    def go(batch: int, group: list[Request]) -> Call:
        started = time.perf_counter()
        out = engines[batch].generate(group)
        return Call([c.token_ids for c in out], time.perf_counter() - started)

    return go


def adaptive_runner(spec: Any, engines: dict[int, Engine], drafter: Any) -> Runner:
    """Per batch size: one engine, its bandit and history store, kept across calls (see the module docstring)."""
    bandits: dict[int, BucketedBandit | None] = dict.fromkeys(engines)
    histories = {b: new_history_store(spec.speculative) if uses_history(spec.speculative) else None for b in engines}

    def go(batch: int, group: list[Request]) -> Call:
        engine, history, waves = engines[batch], histories[batch], []
        stepper = rollout_stepper(
            spec.speculative,
            engine.runner,
            drafter,
            rows=batch,
            context=engine.max_context,
            bandit=bandits[batch],
            seed=spec.algorithm.seed,
            history=history,
        )
        engine.stepper = stepper
        engine.wave_observers = [lambda sequences: waves.append(list(sequences))] if history is not None else []
        started = time.perf_counter()
        out = engine.generate(group)
        call = Call([c.token_ids for c in out], time.perf_counter() - started)
        if isinstance(stepper, AdaptiveStepper):
            bandits[batch] = stepper.bandit
            call.sd_rows, call.accepted = stepper.stats.row_steps, stepper.stats.accepted
            call.arms.update(stepper.summary()["arms_chosen"])
        for wave in waves:
            history.observe(wave)
        return call

    return go
