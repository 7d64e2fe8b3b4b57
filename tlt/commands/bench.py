"""`tlt bench <name>`: side-by-side benchmarks. Each sub-bench is one entry in BENCHES."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from tlt.bench.run_cli import add_run_arguments, run_run

def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per variant, median reported (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model and short runs (seconds): checks the bench, measures little"
    )


def _engine_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tlt.bench.engine import EngineBenchConfig, run_engine_bench

    console = Console()
    if args.quick:
        cfg = EngineBenchConfig.quick(repeats=args.repeats or 1)
    else:
        cfg = EngineBenchConfig(repeats=args.repeats or 3)
    if cfg.repeats < 1:
        console.print("[red]error:[/red] --repeats must be >= 1")
        return 2
    with console.status("benchmarking") as status:
        result = run_engine_bench(cfg, on_row=lambda text: status.update(text))
    table = Table(title=f"engine tokens/s ({result['config']['params'] / 1e6:.1f}M params, "
                  f"prompt {cfg.prompt_len}, {cfg.new_tokens} new tokens, median of {cfg.repeats})")
    for column in ("dtype", "batch", "hf-generate tok/s", "tlt tok/s", "tlt / hf"):
        table.add_column(column, justify="right")
    rows = {(r["engine"], r["dtype"], r["batch"]): r["tokens_per_s"] for r in result["rows"]}
    for ratio in result["ratios"]:
        key = (ratio["dtype"], ratio["batch"])
        table.add_row(ratio["dtype"], str(ratio["batch"]), f"{rows[('hf-generate', *key)]:.1f}",
                      f"{rows[('tlt', *key)]:.1f}", f"{ratio['tlt_over_hf']:.2f}x")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


# name -> (help, add_arguments, run)
BENCHES: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "engine": ("tokens/s of the rollout engine vs transformers generate", _engine_arguments, _engine_run),
    "run": ("the pinned RL workload under each SD variant, side by side", add_run_arguments, run_run),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (help_text, add, _) in BENCHES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
        add(p)


def run(args: argparse.Namespace) -> int:
    return BENCHES[args.bench][2](args)
