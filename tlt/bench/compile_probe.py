"""Compile one policy shape's whole step set in this process and print {"seconds", "compiles"} as JSON.

Run by `tlt bench engine --part compiled` in a fresh subprocess, with TORCHINDUCTOR_CACHE_DIR pointing
at an empty folder (cold) or at the one a previous probe filled (warm): what a new rollout worker pays.
The set: the target's decode, every verify width and a prefill, at batch 1 and at the largest batch,
and the compiled drafter step at both.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from tlt.bench.cost_timing import forward_fn
from tlt.bench.engine_compiled import Shape, _drafter_fn, build_policy
from tlt.rollout.runner import ModelRunner


@torch.no_grad()
def probe(shape: Shape, batches: list[int], widths: list[int], context: int) -> dict:
    model = build_policy(shape, context)
    rows = max(batches)
    runner = ModelRunner(model, max_batch_size=rows, max_context=2 * context + max(widths) + 1, compile=True)
    runner.cache.start(rows)
    runner.cache.lengths = [context] * rows
    t0 = time.perf_counter()
    states = []
    for b in sorted({1, rows}):
        for w in sorted({*widths, context}):
            forward_fn(runner, b, w, context)()
        step, state = _drafter_fn(model, b, context)
        step()
        states.append(state)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "compiles": runner.compiled.compiles + sum(s.compiled.compiles for s in states)}


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    torch.set_num_threads(args["threads"])
    print(json.dumps(probe(Shape(**args["shape"]), args["batches"], args["widths"], args["context"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
