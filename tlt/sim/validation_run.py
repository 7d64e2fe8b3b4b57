"""A short run of one bench variant for `tlt simulate --validate` (the local check's data).

    python -m tlt.sim.validation_run --workload bench/workload-deep-v1.yaml --variant vanilla --steps 8 \\
        --num-cpus 1 --out /tmp/simval/vanilla-1t

The workload's run of that variant (its policy, drafter warm start, speculative settings) on the Ray
runtime, with `algorithm.steps` cut to `--steps` and without `tlt bench run`'s per-step held-out
probes; the folder gets `metrics.jsonl` with `response_lengths`. `--num-cpus 1` gives the driver's
policy update one torch thread (the runtime gives it one per logical CPU): on a shared 2-core machine
a 2-thread update is 3-30x slower and varies from step to step with the other processes' load
(docs/simulate.md, Validation), which no cost model can predict.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlt.sim.validation_run", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument("--variant", default="vanilla", help="a variant of the workload (default vanilla)")
    parser.add_argument("--steps", type=int, default=8, help="RL steps (default 8: 4 fitted, 4 predicted)")
    parser.add_argument("--num-cpus", type=int, default=1, help="CPUs of the local Ray cluster (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="the run's output folder")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2")

    import ray

    from tlt.bench.run import variant_run
    from tlt.bench.workload import DEFAULT_WORKLOAD, load_workload, warm_drafter
    from tlt.runtime.ray_executor import ray_trainer

    workload = load_workload(args.workload or DEFAULT_WORKLOAD)
    if args.variant not in workload.variants:
        parser.error(f"--variant must be one of {sorted(workload.variants)}")
    workload.spec.setdefault("algorithm", {})["steps"] = args.steps
    drafter, _ = warm_drafter(workload)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    started = time.perf_counter()
    try:
        ray_trainer(
            variant_run(workload, args.variant, 0, drafter),
            args.out,
            warmstart=workload.warmstart,
            num_cpus=args.num_cpus,
        ).train()
    finally:
        ray.shutdown()
    info = {
        "workload": str(workload.path),
        "variant": args.variant,
        "steps": args.steps,
        "num_cpus": args.num_cpus,
        "wall_seconds": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": Path("/proc/loadavg").read_text().split()[:3],
    }
    (args.out / "validation_run.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
