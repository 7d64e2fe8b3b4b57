"""`tlt demo [--out DIR] [--full-warmstart]`: `tlt train examples/run.yaml` on a local Ray cluster.

The example run (built-in task, speculative.mode tlt, two rollout workers) with the live display
and the end-of-run report. By default the policy is the reduced warm start (trained and cached
on first use, minutes on 2 CPU cores) so that set-up plus run stay within minutes;
--full-warmstart uses the default warm start that `tlt train` uses (a longer first run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "run.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, default=EXAMPLE, help=f"run file (default: {EXAMPLE})")
    parser.add_argument("--out", type=Path, default=Path("runs") / "demo", help="output folder (default: runs/demo)")
    parser.add_argument("--full-warmstart", action="store_true",
                        help="use the default warm start (as `tlt train` does) instead of the reduced one")


def run(args: argparse.Namespace) -> int:
    from tlt.config_io import SpecError, load_run
    from tlt.runtime.ray_train import train_ray
    from tlt.tasks.warmstart import WarmstartConfig, reduced_config

    if not args.file.is_file():
        print(f"--file {args.file}: no such file; run from a checkout of the repository or pass --file", file=sys.stderr)
        return 2
    try:
        spec = load_run(args.file)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    warmstart = WarmstartConfig() if args.full_warmstart else reduced_config()
    return train_ray(spec, args.out, warmstart=warmstart)
