"""The `tlt` command. Each subcommand lives in `tlt/commands/<name>.py` and exposes
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their
command runs, so `tlt validate` does not pay for torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("tlt.commands.validate", "check a run.yaml (full manifest or bare spec)"),
    "warmstart": ("tlt.commands.warmstart", "train (or find cached) the built-in task's warm-started policy"),
    "crd": ("tlt.commands.crd", "write the TLTTrainingRun CRD YAML generated from the run spec"),
    "train": ("tlt.commands.train", "run a TLTTrainingRun on this machine (resumes from its checkpoints)"),
    "worker": ("tlt.commands.worker", "run one pod of a TLTTrainingRun on a cluster (the operator's pod entry point)"),
    "drafter-trainer": (
        "tlt.commands.drafter_trainer",
        "run a rollout pod's drafter-trainer sidecar (drafter.placement: sidecar)",
    ),
    "demo": ("tlt.commands.demo", "train examples/run.yaml on a local Ray cluster, with live display and report"),
    "export-drafter": (
        "tlt.commands.export_drafter",
        "write a drafter checkpoint as a Hugging Face EAGLE folder (vLLM-loadable)",
    ),
    "generate": ("tlt.commands.generate", "complete prompts from a file with the rollout engine"),
    "bench": ("tlt.commands.bench", "side-by-side benchmarks (tlt bench engine)"),
    "simulate": (
        "tlt.commands.simulate",
        "predict vanilla / static / TLT step times on a GPU cluster from a length trace",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported to declare its arguments."""
    parser = argparse.ArgumentParser(
        prog="tlt", description="TLT: lossless speculative rollouts with an online drafter for RL training."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return importlib.import_module(COMMANDS[args.command][0]).run(args)


if __name__ == "__main__":
    sys.exit(main())
