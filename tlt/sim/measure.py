"""Decode costs at several contexts for `tlt simulate --hardware FILE.json`.

    python -m tlt.sim.measure --workload bench/workload-deep-v1.yaml --contexts 32,128,320 --out costs.json

Writes `tlt bench run`'s costs.json (`verify`, `drafter` at the workload's own `costs.context`) plus a
`contexts` section with the same measurement at each of `--contexts` (`measured.MeasuredCost`
interpolates between them). Measured as the bench does: the workload's policy and dtype, compiled as
its workers run, one torch thread, process CPU time, fastest of `costs.repeats` interleaved repeats.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlt.sim.measure", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument("--contexts", default="32,128,320", help="cached tokens, comma-separated (default 32,128,320)")
    parser.add_argument("--out", type=Path, required=True, help="costs JSON to write")
    args = parser.parse_args(argv)

    import torch

    from tlt.bench.machine import machine_info
    from tlt.bench.run import policy_costs
    from tlt.bench.workload import DEFAULT_WORKLOAD, load_workload

    try:
        contexts = sorted({int(c) for c in args.contexts.split(",") if c.strip()})
    except ValueError:
        contexts = []
    if not contexts or contexts[0] < 1:
        parser.error(f"--contexts must be positive integers, comma-separated, got {args.contexts!r}")
    workload = load_workload(args.workload or DEFAULT_WORKLOAD)
    torch.set_num_threads(1)  # as `tlt bench run` (the rollout workers' one thread)
    base = int(workload.costs["context"])
    out: dict[str, dict] = {}
    for context in sorted({*contexts, base}):
        workload.costs["context"] = context
        started = time.perf_counter()
        verify, drafter = policy_costs(workload)
        out[str(context)] = {"verify": verify, "drafter": drafter}
        print(f"context {context}: {time.perf_counter() - started:.1f} s", flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    args.out.write_text(
        json.dumps(
            {
                **out[str(base)],
                "context": base,
                "load_average": load,
                "machine": machine_info(),
                "contexts": {c: v for c, v in out.items() if int(c) in contexts},
            }
        )
        + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
