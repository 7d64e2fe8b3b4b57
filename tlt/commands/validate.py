"""`tlt validate run.yaml`: every error with its field path and what is allowed."""

from __future__ import annotations

import argparse
import sys

from tlt.config_io import SpecError, load_run
from tlt.spec_warnings import spec_warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="run.yaml files: TLTTrainingRun manifests or bare specs")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            run_ = load_run(path)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: ok ({run_.kind} {run_.metadata.name})")
        for warning in spec_warnings(run_.spec):
            print(f"{path}: warning: {warning}", file=sys.stderr)
    return 1 if failed else 0
