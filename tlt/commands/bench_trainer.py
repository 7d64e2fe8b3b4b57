"""`tlt bench trainer`: a decode loop with and without a spot trainer on another core (`tlt.bench.trainer_beside`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tlt.commands.bench_args import batches, workload_file, write_json


def arms(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated arms, each plain or chain-<k>."""
    from tlt.bench.trainer_beside import is_arm

    out = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in out if not is_arm(a)]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"--arms: comma-separated plain or chain-<k> (k >= 1), got {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument(
        "--batches", type=batches, default=(1,), help="running batch sizes decoded, e.g. 1,4 (default 1)"
    )
    parser.add_argument(
        "--arms",
        type=arms,
        default=("plain", "chain-3"),
        help="decode arms, comma-separated: plain, chain-<k> (default plain,chain-3)",
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds, each with the trainer off and on (default 6)"
    )
    parser.add_argument("--requests", type=int, default=8, help="requests decoded per arm and round (default 8)")
    parser.add_argument(
        "--threads", type=int, default=1, help="the decode's torch threads (default 1, a Ray rollout worker's here)"
    )
    parser.add_argument("--quick", action="store_true", help="the workload's small version (checks the bench)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tlt.bench.trainer_beside import PROBE_ARM, TrainerBesideConfig, run_trainer_beside

    console = Console()
    try:
        cfg = TrainerBesideConfig(
            workload=workload_file(args.workload),
            batches=args.batches,
            arms=args.arms,
            rounds=args.rounds,
            requests=args.requests,
            threads=args.threads,
            quick=args.quick,
        )
        with console.status("decoding with the trainer off and on") as status:
            result = run_trainer_beside(cfg, on_row=status.update)
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    table = Table(
        title=f"decode beside a spot trainer ({result['workload']['name']}, {cfg.threads} thread(s); the "
        f"trainer trained {result['trainer_tokens_per_s']:.0f} tokens/s while on)"
    )
    for column in ("arm", "batch", "tok/s off", "tok/s on", "on / off", "range"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        low, high = row["on_over_off_range"]
        probe = row["arm"] == PROBE_ARM  # the control: matrix products / s, no batch
        table.add_row(
            f"{row['arm']} (matmul/s)" if probe else row["arm"],
            "-" if probe else str(row["batch"]),
            f"{row['tokens_per_s_off']:.0f}",
            f"{row['tokens_per_s_on']:.0f}",
            f"{row['on_over_off']:.3f}",
            f"{low:.3f}-{high:.3f}",
        )
    console.print(table)
    return write_json(console, args.json, result)
