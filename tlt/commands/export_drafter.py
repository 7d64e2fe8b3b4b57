"""`tlt export-drafter CHECKPOINT --target POLICY --out DIR [--dtype D]`: a drafter as an EAGLE folder.

CHECKPOINT is one of
- a run's output folder (`tlt train --out RUN`): its served drafter, `RUN/drafter-served/`, written when
  the run finished: the drafter the run's next step would draft with (under `drafter.publish:
  validated` the last one validated on fresh rollouts; under `latest` the hub's newest). What to deploy.
- a run's `drafter/` snapshot folder (`RUN/drafter`): the hub's newest snapshot (its LATEST), which
  under `validated` may be a candidate that lost validation;
- a drafter checkpoint folder (`model.safetensors` + `config.json`), `RUN/drafter-served` included.
POLICY is the local policy folder the
drafter was trained against. The result loads in this engine and in vLLM
(`speculative_config={"method": "eagle", "model": DIR}`). Exit status: 0 written, 1 the
checkpoint or the policy cannot be used (the reason is printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a run's output folder (its served drafter, drafter-served/), a run's drafter/ "
        "folder (the hub's newest snapshot) or a drafter checkpoint folder",
    )
    parser.add_argument("--target", type=Path, required=True, help="local folder of the policy the drafter serves")
    parser.add_argument("--out", type=Path, required=True, help="folder to write (replaced if it exists)")
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="weight dtype of the export (default: keep the checkpoint's)",
    )


def run(args: argparse.Namespace) -> int:
    from tlt.drafter.export import export_eagle

    try:
        result = export_eagle(args.checkpoint, args.target, args.out, dtype=args.dtype)
    except (OSError, ValueError) as exc:
        print(f"tlt export-drafter: {exc}", file=sys.stderr)
        return 1
    print(
        f"exported {result.source} -> {result.path} ({result.tensors} tensors, "
        f"{result.parameters} parameters, {result.dtype})"
    )
    return 0
