"""`tlt warmstart [--config FILE] [--test] [--out DIR]`: the built-in task's warm-started policy.

Trains (or finds in the cache) a small Qwen2-shaped policy by SFT on the built-in task and
prints where it is and what it measured. `--config` is a YAML file of `WarmstartConfig`
fields (nested `task:` and `policy:` allowed); `--out` also copies the policy folder there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:  # torch is imported only when the command runs (the parser imports every command)
    from tlt.tasks.warmstart import WarmstartConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file of warm-start settings (default: the built-in ones)")
    parser.add_argument("--test", action="store_true", help="the reduced config used by tests (seconds)")
    parser.add_argument("--out", type=Path, help="also copy the policy folder (model + tokenizer) here")
    parser.add_argument("--cache-dir", type=Path, help="cache root (default: $TLT_CACHE_DIR or ~/.cache/tlt)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (1 is fastest on a busy shared CPU)")


def _load_config(args: argparse.Namespace) -> WarmstartConfig:
    from tlt.tasks.warmstart import WarmstartConfig, reduced_config

    if args.config and args.test:
        raise ValueError("--config and --test are exclusive")
    if args.test:
        return reduced_config()
    if not args.config:
        return WarmstartConfig()
    data = yaml.safe_load(args.config.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{args.config}: expected a mapping of warm-start settings")
    return WarmstartConfig.from_dict(data)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tlt.tasks.warmstart import load_metadata, warm_start

    try:
        config = _load_config(args)
    except (OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        print(f"tlt warmstart: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    with Progress(
        TextColumn("SFT"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        bar = progress.add_task("sft", total=config.steps, loss=float("nan"))
        folder = warm_start(
            config,
            root=args.cache_dir,
            on_step=lambda step, _total, loss: progress.update(bar, completed=step, loss=loss),
        )
    if args.out:
        shutil.copytree(folder, args.out, dirs_exist_ok=True)
        folder = args.out
    print(f"policy: {folder}")
    print(json.dumps(load_metadata(folder)["metrics"], indent=2))
    return 0
