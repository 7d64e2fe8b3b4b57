"""`tlt demo [--out DIR]`: the same RL run twice on a local Ray cluster, vanilla then TLT, side by side.

`examples/demo.yaml` (built-in task, the bench workload countdown-deep-v3's settings and warm-started
16-layer policy, which still learns under RL) runs with `speculative.mode: off`
into OUT/vanilla and with the file's mode (tlt) into OUT/tlt, same prompts, seeds and steps, each
with its live display and own report; then OUT/report.md compares them (`tlt.runtime.demo_report`).
The warm start is trained and cached on first use (minutes on 2 CPU cores), and so is the drafter
TLT starts from (unless the file sets `speculative.drafterPath`): an EAGLE drafter trained briefly on
the warm start's own samples, as the bench's `drafterWarmstart`, which TLT then keeps training in idle
time. Before the first run, both runs' engine graphs compile once, split over the cores
(`tlt.runtime.precompile`), so every worker starts on a warm compile cache. A run folder that already
holds a finished run is resumed, not overwritten: its steps are reused.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
WARMSTARTS = ("deep-v3", "deep", "reduced", "default")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, default=EXAMPLE, help=f"run file (default: {EXAMPLE})")
    parser.add_argument("--out", type=Path, default=Path("runs") / "demo", help="output folder (default: runs/demo)")
    parser.add_argument(
        "--warmstart",
        choices=WARMSTARTS,
        default="deep-v3",
        help="built-in policy when the file sets no model.path (default: deep-v3, 16 layers, "
        "the bench workload countdown-deep-v3's)",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the file's)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tlt.bench.machine import describe, machine_info
    from tlt.bench.workload import DRAFTER_WARMSTART, drafter_warm_start
    from tlt.bench.workload import WARMSTARTS as CONFIGS
    from tlt.runtime.demo_report import write_demo_report
    from tlt.runtime.ray_cluster import local_graph_sets, precompile_local
    from tlt.runtime.ray_train import train_ray
    from tlt.spec.manifest_io import SpecError, load_run
    from tlt.spec.plan import speculates
    from tlt.workers.policy import policy_path

    if not args.file.is_file():
        print(
            f"--file {args.file}: no such file; run from a checkout of the repository or pass --file", file=sys.stderr
        )
        return 2
    if args.steps is not None and args.steps < 1:
        print(f"--steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    try:
        spec = load_run(args.file)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.steps is not None:
        spec.spec.algorithm.steps = args.steps
    if not speculates(spec.spec.speculative):
        print(f"{args.file}: speculative.mode is 'off'; the demo compares it with a speculative mode", file=sys.stderr)
        return 2
    warmstart = CONFIGS[args.warmstart]()
    if spec.spec.model.path is None and spec.spec.speculative.drafter_path is None:
        budget = (
            DRAFTER_WARMSTART
            if args.warmstart != "reduced"
            else {**DRAFTER_WARMSTART, "prompts": 16, "steps": 10, "maxNewTokens": 64}
        )
        spec.spec.speculative.drafter_path = str(drafter_warm_start(warmstart, budget)[0])
    vanilla = spec.model_copy(deep=True)
    vanilla.spec.speculative.mode = "off"
    # both runs' graph sets at once, in parallel: each run's workers then start on a warm compile cache
    resources = {"CPU": float(os.cpu_count() or 1)}
    policy = policy_path(spec, warmstart)
    console = Console()
    sets = local_graph_sets(vanilla.spec, policy, resources) + local_graph_sets(spec.spec, policy, resources)
    if sets:
        console.print("compiling the engines' graphs once for both runs (minutes from a cold cache)")
        report = precompile_local(sets, resources)
        if report["lanes"]:
            done = ", ".join(f"{c['set']} {c['seconds']:.0f} s" for c in report["compiled"])
            console.print(
                f"compiled in {report['seconds']:.0f} s, {report['lanes']} in parallel: {done or 'nothing'}"
                + (f"; failed (the workers compile these): {', '.join(report['failed'])}" if report["failed"] else "")
            )
        elif report["todo"]:
            console.print("one core: each run's workers compile their graphs as they start")
        else:
            console.print("already compiled on this machine")
    for name, run_ in (("vanilla", vanilla), ("tlt", spec)):
        code = train_ray(run_, args.out / name, warmstart=warmstart)
        if code:
            return code
    path, c = write_demo_report(args.out, args.out / "vanilla", args.out / "tlt", machine=describe(machine_info()))
    console.print(
        f"[bold]TLT vs vanilla[/bold] over {c['steps']} steps: rollout {c['rollout_speedup']:.2f}x, "
        f"step {c['step_speedup']:.2f}x; reward vanilla {c['reward']['vanilla']['first']:.3f} -> "
        f"{c['reward']['vanilla']['last']:.3f}, TLT {c['reward']['tlt']['first']:.3f} -> "
        f"{c['reward']['tlt']['last']:.3f}; report {path}"
    )
    return 0
