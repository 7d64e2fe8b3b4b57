"""Freeze a rollout worker's start-up heap out of Python's cyclic garbage collector.

A rollout worker builds its policy, engine, drafter and compiled graphs before its first rollout: dynamo
and inductor keep many thousands of Python objects alive. A full collection (Python's oldest generation)
scans every tracked object, and the first one after start-up comes on its own some seconds later, in
the middle of a rollout or while the first rollout's arguments are deserialized, with the worker stalled
for a noticeable part of a second (measured: docs/measurements-history.md).

`freeze_heap` pays that collection once, at start-up, then moves every object still alive into the
permanent generation (`gc.freeze`), which later collections skip. Frozen objects are still freed by
reference counting; only cyclic garbage among them is never collected, so this runs only in a process
that holds nothing but the worker: a Ray actor (`freeze_actor_heap`), never in a process that builds
workers beside other work (tests, tools). vLLM freezes its heap after capturing CUDA graphs for the same
reason.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from tlt.runtime.optional_ray import ray

log = logging.getLogger(__name__)


def freeze_heap() -> dict[str, Any]:
    """Collect every generation, then freeze what is alive. Returns {"seconds", "collected", "frozen"}:
    the time both took, the unreachable objects found, and the objects now in the permanent generation."""
    started = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    return {"seconds": time.perf_counter() - started, "collected": collected, "frozen": gc.get_freeze_count()}


def in_actor() -> bool:
    """Whether this process runs a Ray actor (a process of its own)."""
    return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def freeze_actor_heap(name: str) -> dict[str, Any] | None:
    """`freeze_heap` in a Ray actor's process (logged under `name`); None, and nothing frozen, elsewhere."""
    if not in_actor():
        return None
    report = freeze_heap()
    log.info(
        "%s: heap frozen after start-up (%d objects; the collection took %.2f s)",
        name,
        report["frozen"],
        report["seconds"],
    )
    return report
