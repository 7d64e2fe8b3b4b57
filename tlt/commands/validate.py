"""`tlt validate run.yaml`: every error with its field path and what is allowed.

Beyond the spec itself: with `rollout.engine: vllm`, what vLLM cannot honour (`tlt.rollout.vllm.spec_map`;
an error everywhere, or a warning where only vLLM's CPU build refuses it); then what the run reads on this
machine (`tlt.runtime.input_checks`: the model folder, the dataset files, the first prompts, the reward plug-in;
a busy metrics port is a warning), the checks `tlt train` runs before it starts. `--schema-only` skips
those: the spec alone, e.g. for a manifest whose paths exist only on the cluster. `--show-prompt N` prints
the text and token ids of the first N training prompts exactly as the policy gets them (template, chat
template and special tokens applied, by `tlt.tasks.prompt_format`), with the tokenizer of `model.path` (or
the built-in task's).
"""

from __future__ import annotations

import argparse
import sys

from transformers import PreTrainedTokenizerBase

from tlt.models.loading import load_tokenizer
from tlt.rl.reward_plugin import RewardPluginError, load_reward
from tlt.rollout.vllm.spec_map import vllm_spec_problem
from tlt.runtime.input_checks import input_problems, metrics_port_problem
from tlt.spec.manifest_io import SpecError, load_run
from tlt.spec.references import SharedNames, reference_problems
from tlt.spec.run import RunSpec
from tlt.spec.spec_warnings import spec_warnings
from tlt.tasks.datasets import DatasetError, load_problems
from tlt.tasks.prompt_format import PromptError, encode_prompt
from tlt.tasks.tokenizer import build_task_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="run.yaml files: TLTTrainingRun manifests or bare specs")
    parser.add_argument(
        "--show-prompt",
        type=int,
        default=0,
        metavar="N",
        help="print the text and token ids of the first N training prompts as the model gets them "
        "(reads the dataset and model.path's tokenizer)",
    )
    parser.add_argument(
        "--schema-only",
        action="store_true",
        help="check the spec alone: not the model folder, dataset files, prompts and metrics port "
        "on this machine (e.g. a manifest whose paths exist only on the cluster)",
    )


def run_tokenizer(spec: RunSpec) -> PreTrainedTokenizerBase:
    """The tokenizer of `model.path`, else the built-in task's."""
    if spec.model.path is None:
        return build_task_tokenizer()
    return load_tokenizer(spec.model.path)


def show_prompts(spec: RunSpec, count: int) -> None:
    tokenizer = run_tokenizer(spec)
    for number, problem in enumerate(load_problems(spec.dataset, "train")[:count], start=1):
        ids = encode_prompt(tokenizer, problem)
        print(f"--- prompt {number}{f' ({problem.source})' if problem.source else ''}: {len(ids)} tokens")
        print(tokenizer.decode(ids, skip_special_tokens=False))
        print(f"ids: {ids}")


def run(args: argparse.Namespace) -> int:
    if args.show_prompt < 0:
        print(f"--show-prompt must be >= 0, got {args.show_prompt}", file=sys.stderr)
        return 2
    failed = 0
    for path in args.files:
        try:
            run_ = load_run(path)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        references = reference_problems(run_.metadata.name, run_.spec, SharedNames.from_environment())
        if references:
            print("\n".join(f"{path}: {line}" for line in references), file=sys.stderr)
            failed += 1
            continue
        vllm_problem = vllm_spec_problem(run_.spec, cuda=True)
        if vllm_problem is not None:
            print(f"{path}: {vllm_problem}", file=sys.stderr)
            failed += 1
            continue
        if not args.schema_only and (inputs := input_problems(run_.spec)):
            print("\n".join(f"{path}: {line}" for line in inputs), file=sys.stderr)
            failed += 1
            continue
        try:
            if args.schema_only and run_.spec.verifier.reward is not None:
                load_reward(run_.spec.verifier.reward)
            if args.show_prompt:
                show_prompts(run_.spec, args.show_prompt)
        except (RewardPluginError, DatasetError, PromptError, OSError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        warnings = spec_warnings(run_.spec)  # before "ok": nothing may fail after it is printed
        port = None if args.schema_only else metrics_port_problem(run_.spec)
        if port is not None:
            warnings.append(f"{port} (tlt train here would refuse to start)")
        print(f"{path}: ok ({run_.kind} {run_.metadata.shown_name})")
        for warning in warnings:
            print(f"{path}: warning: {warning}", file=sys.stderr)
        cpu_problem = vllm_spec_problem(run_.spec, cuda=False)
        if cpu_problem is not None:
            print(f"{path}: warning: on vLLM's CPU build this run is refused: {cpu_problem}", file=sys.stderr)
    return 1 if failed else 0
