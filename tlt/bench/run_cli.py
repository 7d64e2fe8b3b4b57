"""`tlt bench run` arguments and output: terminal table, JSON and PNG (the work is in tlt.bench.run)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tlt.rollout.step_timing import STEP_SPLIT_ENV


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument("--quick", action="store_true", help="the workload's small version (checks the pipeline)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default: the workload's)")
    parser.add_argument("--png", type=Path, default=None, help="also write the figure here")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep each run's output folder here")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument(
        "--split",
        action="store_true",
        help="rollout workers split each decode step's time by part (target forward, drafter, host)",
    )


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _span(entry: dict[str, float], spec: str = ".1f") -> str:
    return f"{entry['median']:{spec}} [{entry['min']:{spec}}, {entry['max']:{spec}}]"


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log file or pipe: no wrapping of the wide table
    table = Table(
        title=f"tlt bench run: {report['workload']['name']} (sha256 {report['workload_sha256'][:12]}, "
        f"{report['workload']['repeats']} repeats, median [range])"
    )
    for column in (
        "variant",
        "rollout s",
        "step s",
        "update s",
        "ms/token",
        "accept (held-out, last)",
        "arms chosen",
        "harvested s",
        "len p50/p90/max",
        "trunc",
        "final reward",
    ):
        table.add_column(column, justify="right")
    for name, v in report["variants"].items():
        accept = v["heldout_accept_length"][-1] if v["heldout_accept_length"] else None
        arms = ", ".join(f"{k}:{n}" for k, n in v["arms_chosen"].items()) or "-"
        lengths = v["response_length"]
        table.add_row(
            name,
            _span(v["rollout_seconds"]),
            _span(v["step_seconds"]),
            _span(v["update_seconds"]),
            f"{1000 * v['seconds_per_token']['median']:.2f}",
            _fmt(accept),
            arms,
            f"{v['harvested_seconds']['median']:.1f}",
            f"{lengths['p50']}/{lengths['p90']}/{lengths['max']}",
            f"{v['truncation_rate']:.2f}",
            f"{v['final_reward']['median']:.3f}",
        )
    console.print(table)
    ci = report["interference_ci95"]
    console.print(
        f"rollout speedup {report['rollout_speedup']:.2f}x, end to end {report['e2e_speedup']:.2f}x "
        f"(Amdahl bound {report['amdahl_e2e_bound']:.2f}x at rollout share {report['vanilla_rollout_share']:.2f}); "
        f"ideal SD speedup {_fmt(report['ideal_speedup'])}x with the measured drafter cost "
        f"({_fmt(report.get('ideal_speedup_free_drafter'))}x with a free drafter), TLT reaches "
        f"{_fmt(report['tlt_fraction_of_ideal'])} "
        f"of it; accept length TLT/static {_fmt(report['accept_length_ratio'])} held-out, "
        f"{_fmt(report.get('rollout_accept_length_ratio'))} in the rollout (every arm the bandit ran); interference "
        f"{report['interference_fraction']:+.3f} (95% CI {'n/a' if ci is None else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'}); "
        f"reward delta {report['reward_delta']:+.3f}"
    )
    by_position = report.get("rollout_accept_ratio_by_position") or {}
    if by_position:
        tlt_cells = report["variants"]["tlt"]["rollout_accept_by_position"]
        console.print(
            "accept length TLT/static in the rollout by response position: "
            + ", ".join(
                f"{edge}+ {_fmt(ratio)} ({_fmt(tlt_cells[edge]['accept_length'])} over {tlt_cells[edge]['row_steps']} "
                f"row-steps)"
                for edge, ratio in by_position.items()
            )
        )
    van = report["variants"]["vanilla"]
    kl = [k for k in van.get("heldout_kl") or [] if k is not None]
    frozen = [a for a in van.get("frozen_accept_length") or [] if a is not None]
    if kl or frozen:
        console.print(
            f"drift (vanilla): held-out KL(step 0 || last) {_fmt(kl[-1] if kl else None)} nats/token; frozen "
            f"drafter accept {_fmt(frozen[0] if frozen else None)} -> {_fmt(frozen[-1] if frozen else None)} "
            f"(drop {_fmt(report.get('frozen_accept_drop'))})"
        )
    console.print(
        "engine vs step overhead (sum over steps, median): "
        + ", ".join(
            f"{n} generate {v['generate_seconds']['median']:.1f} s + overhead "
            f"{v['rollout_overhead_seconds']['median']:.1f} s"
            for n, v in report["variants"].items()
            if "generate_seconds" in v
        )
    )
    by_running = report["variants"]["vanilla"]["seconds_by_running"]
    console.print(
        "vanilla decode seconds by running batch: " + ", ".join(f"{k}: {s:.2f}" for k, s in by_running.items())
    )
    for n, v in report["variants"].items():
        per_step = v.get("ms_per_decode_step_by_range") or {}
        if per_step:
            console.print(
                f"{n} decode steps by running batch (ms a step): "
                + ", ".join(f"{k}: {v['decode_steps_by_range'][k]} ({ms:.2f})" for k, ms in per_step.items())
            )
        parts = v.get("rollout_overhead_parts") or {}
        if parts:
            console.print(f"{n} rollout overhead by part (s): " + ", ".join(f"{k} {x:.2f}" for k, x in parts.items()))
    per_token = report.get("tlt_speedup_per_token_by_range") or {}
    if per_token:
        console.print(
            "tlt speed-up per generated token by running batch (decode steps): "
            + ", ".join(f"{k}: {x:.2f}x" for k, x in per_token.items())
        )
    by_part = report.get("interference_by_part") or {}
    if by_part:
        console.print(
            "interference by part (tlt-shadow - vanilla, share of vanilla's step): "
            + ", ".join(f"{k} {x:+.3f}" for k, x in by_part.items())
        )
    slower = report.get("interference_per_token_by_range") or {}
    if slower:
        console.print(
            "tlt-shadow time per decoded token over vanilla's by running batch: "
            + ", ".join(f"{k}: {x:+.3f}" for k, x in slower.items())
        )
    for name in ("static", "tlt"):
        rates = report["variants"].get(name, {}).get("arm_rates") or {}
        if rates:
            rows = Table(title=f"{name}: tokens/s of each arm per running-batch bucket (workers' step timings; steps)")
            arms = sorted({a for cells in rates.values() for a in cells})
            rows.add_column("bucket <=", justify="right")
            for arm in arms:
                rows.add_column(arm, justify="right")
            for bucket, cells in rates.items():
                rows.add_row(
                    bucket,
                    *(
                        f"{cells[a]['tokens_per_second']:.0f} ({cells[a]['steps']})"
                        if a in cells and cells[a]["tokens_per_second"] is not None
                        else "-"
                        for a in arms
                    ),
                )
            console.print(rows)
    drafter = report.get("drafter_costs")
    if drafter:
        console.print(
            "drafter step / target step by batch: " + ", ".join(f"{d['batch']}: {d['ratio']:.2f}" for d in drafter)
        )
    for name, v in report["variants"].items():
        for stepper, ranges in (v.get("step_split") or {}).items():
            cells = "; ".join(
                f"{rng}: {c['total']:.2f} ({c.get('target_forward', 0):.2f} + {c.get('draft_graph', 0):.2f} + "
                f"host {c['host']:.2f}) x{c['steps']}"
                for rng, c in ranges.items()
            )
            console.print(f"{name} {stepper} ms a step (target + drafter + host) x steps: {cells}")
    console.print(
        f"load average before/after: {report['load_average'].get('before')} / {report['load_average'].get('after')}"
    )
    console.print(machine_line(report))


def machine_line(report: dict[str, Any]) -> str:
    """Where and from what the numbers were taken: CPU, CPUs usable, kernel ISA, warm-start weights' sha256."""
    from tlt.bench.machine import describe

    warm = (report.get("workload") or {}).get("warmstart") or {}
    drafter = (report.get("workload") or {}).get("drafter_warmstart") or {}
    return (
        f"machine: {describe(report.get('machine'))}; warm start weights sha256 "
        f"{(warm.get('weights_sha256') or 'n/a')[:12]}, drafter {(drafter.get('weights_sha256') or 'n/a')[:12]}"
    )


def run_run(args: argparse.Namespace) -> int:
    from tlt.bench.accuracy import is_accuracy_workload
    from tlt.bench.run import run_bench
    from tlt.bench.run_plot import plot_report
    from tlt.bench.workload import DEFAULT_WORKLOAD, load_workload

    path = args.workload or DEFAULT_WORKLOAD
    if is_accuracy_workload(path):
        return run_accuracy(args, path)
    workload = load_workload(path, quick=args.quick, repeats=args.repeats)
    before = os.environ.get(STEP_SPLIT_ENV)
    if args.split:
        os.environ[STEP_SPLIT_ENV] = "1"  # inherited by the local Ray cluster's workers
    try:
        report = run_bench(workload, work_dir=args.work_dir, num_cpus=args.num_cpus, progress=print)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    finally:
        if before is None:
            os.environ.pop(STEP_SPLIT_ENV, None)
        else:
            os.environ[STEP_SPLIT_ENV] = before
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        print(f"wrote {plot_report(report, args.png)}")
    return 0


def run_accuracy(args: argparse.Namespace, path: Path) -> int:
    """A time-to-accuracy workload (`tlt.bench.accuracy`): its runs, report lines, JSON and figure."""
    from tlt.bench.accuracy import load_accuracy_workload, plot_accuracy, print_accuracy_report, run_accuracy_bench

    try:
        workload = load_accuracy_workload(path, quick=args.quick, repeats=args.repeats)
        report = run_accuracy_bench(workload, work_dir=args.work_dir, num_cpus=args.num_cpus, progress=print)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    print_accuracy_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        print(f"wrote {plot_accuracy(report, args.png)}")
    return 0
