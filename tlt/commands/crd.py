"""`tlt crd [--out FILE]`: write the `TLTTrainingRun` CRD YAML generated from the pydantic models."""

from __future__ import annotations

import argparse
from pathlib import Path

from tlt.spec.crd import crd_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")


def run(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.out is None:
        print(text, end="")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.encode())} bytes)")
    return 0
