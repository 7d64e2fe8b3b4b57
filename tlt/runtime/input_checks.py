"""What a run reads from this machine, checked offline before anything starts.

`tlt validate` (unless `--schema-only`) and `tlt train` (before Ray starts or a model loads) run the same
checks and print the same lines, so a run that cannot start is refused in a second, not after minutes of
loading, with one line per problem instead of a traceback:

- `model.path`: `tlt.models.loading.model_folder_problems` (the folder, config.json and its model_type,
  weights, tokenizer files), then the tokenizer loads from its files alone and fits `vocab_size`. The
  path is never handed to huggingface_hub: a folder that is not there is said to be missing. Both rollout
  engines load the policy through `load_policy`, so its list of model types is the one for either engine.
  Unset, the policy is the built-in task's warm start, which the project builds itself: nothing to read,
  but it knows only the built-in task (`dataset.source: file` needs a `model.path`).
- `dataset.path`, `dataset.evalPath`: every record parses and has its prompt (or the template's fields)
  and answer, and the file is not empty (`tlt.tasks.datasets.read_problems`; records named `data.jsonl:6`).
- the prompts: the first PROMPT_SAMPLE training records encode as the policy gets them (template, chat
  template; `tlt.tasks.prompt_format.encode_prompt`): a chat template that does not parse, or raises, is
  one line naming the model folder and the template's error.
- `verifier.reward` imports; `speculative.drafterPath` is a folder holding the drafters the arms use, a block
  part of the run's block size (`tlt.drafter.warmstart`).

`metrics_port_problem` is apart: a port is free or busy when the run starts, not when its file is checked,
so `tlt validate` warns of it and `tlt train` refuses.
"""

from __future__ import annotations

import socket
from pathlib import Path

import jinja2
from transformers import PreTrainedTokenizerBase

from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS
from tlt.drafter.warmstart import has_block_part, warm_start_problem
from tlt.models.loading import (
    load_tokenizer,
    model_folder_problems,
    read_model_config,
    tokenizer_size_problem,
)
from tlt.monitoring.factory import metrics_port_message
from tlt.rl.reward_plugin import RewardPluginError, load_reward
from tlt.rollout.vllm.availability import vllm_model_problem
from tlt.spec.plan import SpeculativePlan, learned_drafters, usable_arms
from tlt.spec.run import RunSpec
from tlt.tasks.datasets import DatasetError, held_out_indices, read_problems
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import PromptError, encode_prompt

# Records whose prompts are encoded: a template that fails usually fails on the first record; a few more
# catch one that depends on the record, at a cost that stays small for any tokenizer.
PROMPT_SAMPLE = 4


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type, the first line of its message, and a template's line number."""
    lines = str(exc).strip().splitlines()
    where = f" at template line {exc.lineno}" if isinstance(exc, jinja2.TemplateSyntaxError) else ""
    return f"{type(exc).__name__}: {lines[0] if lines else ''}{where}"


def model_problems(spec: RunSpec) -> tuple[list[str], PreTrainedTokenizerBase | None]:
    """The problems of `model.path`, and its tokenizer when it loads (None when unset or it cannot)."""
    path = spec.model.path
    if path is None:
        if spec.dataset.source == "file":
            return [
                "spec.model.path: required with dataset.source 'file' (the built-in policy knows only the "
                "built-in task): a local Hugging Face folder of a Qwen2/Qwen3/Llama causal LM"
            ], None
        return [], None
    problems = model_folder_problems(path)
    if problems:
        return [f"spec.model.path: {line}" for line in problems], None
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # noqa: BLE001 - a tokenizer's files may fail in any of transformers' loaders
        return [f"spec.model.path: the tokenizer in {path!r} does not load ({_one_line(exc)})"], None
    too_large = tokenizer_size_problem(tokenizer, read_model_config(path), path)
    return ([f"spec.model.path: {too_large}"] if too_large else []), tokenizer


def dataset_problems(spec: RunSpec) -> tuple[list[str], list[Problem]]:
    """The problems of the dataset files, and the training problems when `dataset.path` reads."""
    data = spec.dataset
    if data.source != "file" or data.path is None:
        return [], []
    problems: list[str] = []
    train: list[Problem] = []
    for field, path in (("path", data.path), ("evalPath", data.eval_path)):
        if path is None:
            continue
        try:
            read = read_problems(Path(path), data)
        except DatasetError as exc:
            problems.append(f"spec.dataset.{field}: {exc}")
            continue
        if field == "path":
            train = read
    if (
        not problems
        and spec.algorithm.eval_every
        and data.eval_path is None
        and not held_out_indices(len(train), data.eval_fraction, data.split_seed)
    ):
        problems.append(
            f"spec.algorithm.evalEvery: {spec.algorithm.eval_every} needs held-out problems, and "
            f"{data.path} holds none out: set dataset.evalPath, or dataset.evalFraction > 0 with at "
            "least 2 records, or evalEvery: 0"
        )
    return problems, train


def prompt_problems(spec: RunSpec, tokenizer: PreTrainedTokenizerBase, problems: list[Problem]) -> list[str]:
    """The first PROMPT_SAMPLE problems encoded as the policy gets them; the first failure, as one line."""
    for problem in problems[:PROMPT_SAMPLE]:
        try:
            encode_prompt(tokenizer, problem)
        except PromptError:
            return [
                f"spec.dataset.chat: true, but the tokenizer in {spec.model.path!r} has no chat template "
                "(chat_template in tokenizer_config.json); set dataset.chat: false or use a chat model"
            ]
        except Exception as exc:  # noqa: BLE001 - a model's chat template is its own code and may raise anything
            return [
                f"spec.model.path: the chat template of {spec.model.path!r} fails on {problem.source} "
                f"({_one_line(exc)}); fix chat_template in its tokenizer_config.json or chat_template.jinja, "
                "or set dataset.chat: false"
            ]
    return []


def input_problems(spec: RunSpec) -> list[str]:
    """Every problem with what the run reads here, one line each, field path first (see the module docstring)."""
    problems, tokenizer = model_problems(spec)
    if not problems and spec.rollout.engine == "vllm" and (heads := vllm_model_problem(spec)) is not None:
        problems.append(f"spec.{heads}")
    data_problems, train = dataset_problems(spec)
    problems += data_problems
    if tokenizer is not None and not data_problems:
        problems += prompt_problems(spec, tokenizer, train)
    if spec.verifier.reward is not None:
        try:
            load_reward(spec.verifier.reward)
        except RewardPluginError as exc:
            problems.append(f"spec.{exc}")
    try:  # the arms the mode may use (`tlt.spec.plan`): ngram needs a model-free one that drafts
        usable_arms(spec.speculative)
    except ValueError as exc:
        return [*problems, f"spec.{exc}"]
    drafter = spec.speculative.drafter_path
    if drafter is not None and not Path(drafter).is_dir():
        problems.append(
            f"spec.speculative.drafterPath: drafter folder {drafter!r} does not exist (a folder "
            "save_drafter or tlt export-drafter wrote; unset: the drafter starts untrained)"
        )
    elif drafter is not None and (problem := _warm_start_problem(spec, drafter, tokenizer is not None)):
        problems.append(f"spec.{problem}")
    elif drafter is not None and (untrained := untrained_block_problem(spec)) is not None:
        problems.append(untrained)
    return problems


def _warm_start_problem(spec: RunSpec, folder: str, model_ok: bool) -> str | None:
    """`warm_start_problem` of `speculative.drafterPath` for this run; the block part's feature layers are
    checked against `model.path`'s depth when it is set and sound (the built-in policy's is known at start)."""
    known = spec.model.path is not None and model_ok
    layers = int(read_model_config(spec.model.path)["num_hidden_layers"]) if known else 0
    return warm_start_problem(folder, learned_drafters(spec.speculative, layers), check_layers=known)


def untrained_block_problem(spec: RunSpec) -> str | None:
    """Why the block arms of a run that never trains its drafter would draft with an untrained block drafter:
    `speculative.drafterPath` without a block part, and mode static starting from it (which freezes it) or
    `drafter.training: false`; None otherwise."""
    sd = spec.speculative
    plan = SpeculativePlan.of(sd, spec.drafter)
    if sd.drafter_path is None or plan.ever_trains or not plan.block_size:
        return None
    if has_block_part(sd.drafter_path):
        return None
    why = "drafter.training false" if plan.retrains else "speculative.mode static starting from it"
    return (
        f"spec.speculative.drafterPath: {sd.drafter_path!r} holds no block drafter ({BLOCK_SNAPSHOTS}/), and this "
        f"run never trains one ({why}): its block arms would draft with an untrained drafter. Point it at a "
        "folder with a block/ part, drop the block arms, or let the drafter train"
    )


def metrics_port_problem(spec: RunSpec, host: str = "0.0.0.0") -> str | None:
    """Why the Prometheus logger could not serve on `monitoring.metricsPort` here, or None (also when the
    prometheus logger is off). Binds the port as the logger's server does (address reuse on) and lets it go."""
    monitoring = spec.monitoring
    if "prometheus" not in monitoring.loggers:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, monitoring.metrics_port))
        except OSError as exc:
            return metrics_port_message(monitoring.metrics_port, exc)
    return None
