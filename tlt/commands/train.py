"""`tlt train run.yaml [--out DIR] [--local] [--address ADDR]`: run a TLTTrainingRun.

Default: on Ray (a local cluster, or the one at --address / $RAY_ADDRESS) with a live display and
an end-of-run report (`tlt.runtime.ray_train`); --local: one process, no Ray.

Rerunning the same command on the same output folder resumes from its newest checkpoint.
Before Ray starts or a model loads, what the run reads here is checked as `tlt validate` checks it
(`tlt.runtime.input_checks`: model folder, dataset files, first prompts, reward plug-in, metrics port), one
line per problem. --local runs every speculative.mode on the rollout worker's own code in this process
(`tlt.workers.local_rollout`); what needs a second process (a sidecar trainer, the vLLM engine) is refused.
SIGTERM or SIGINT (Ctrl-C) stops the run after the step under way, with a checkpoint of it
(`tlt.runtime.graceful_stop`); a second one stops it at once.

Exit status: 0 done, or stopped on a signal with its checkpoint written; 1 the run stopped on an error
(unusable checkpoint, a checkpoint that could not be written, bad model or data); 2 the run file does not
validate or asks for what cannot run here (rollout.engine vllm without vLLM, or with settings vLLM cannot
honour: `tlt.rollout.vllm.spec_map`; a model, dataset or port the checks refuse); 143 stopped on a signal but
the checkpoint could not be written (one line says why); 128 + N when a second signal N stopped it at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tlt.rollout.vllm.availability import rollout_engine_problem, vllm_model_problem
from tlt.rollout.vllm.spec_map import vllm_spec_problem
from tlt.runtime.graceful_stop import GracefulStop, stop_on_signals, stopped_line, write_failed
from tlt.spec.manifest_io import SpecError, load_run
from tlt.spec.run import TLTTrainingRun


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="run.yaml: a TLTTrainingRun manifest or a bare spec")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder: metrics.jsonl, checkpoints, final policy (default: runs/<metadata.name>)",
    )
    parser.add_argument(
        "--local", action="store_true", help="single process, no Ray: rollout and update take turns in this process"
    )
    parser.add_argument(
        "--address",
        default=None,
        help="join the Ray cluster at this address (default: $RAY_ADDRESS, else a local cluster)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_run(args.file)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    problem = rollout_engine_problem(spec.spec.rollout.engine)
    if problem is None and spec.spec.rollout.engine == "vllm":
        problem = vllm_spec_problem(spec.spec, cuda=torch.cuda.is_available()) or vllm_model_problem(spec.spec)
        if problem is None and args.local:
            problem = (
                "rollout.engine 'vllm' needs the Ray loop (a vLLM rollout worker beside the policy's "
                "trainer): drop --local, or set rollout.engine to 'tlt'"
            )
    if problem is None and args.local and spec.spec.policy.world > 1:
        from tlt.runtime.local_executor import MSG_POLICY_GROUP

        problem = MSG_POLICY_GROUP.format(world=spec.spec.policy.world)
    if problem is not None:
        print(f"{args.file}: {problem}", file=sys.stderr)
        return 2
    from tlt.runtime.input_checks import input_problems, metrics_port_problem

    problems = input_problems(spec.spec) + [p for p in [metrics_port_problem(spec.spec)] if p is not None]
    if problems:
        print("\n".join(f"{args.file}: {line}" for line in problems), file=sys.stderr)
        return 2
    out = args.out if args.out is not None else Path("runs") / spec.metadata.name
    if args.local:
        return train_local(spec, out)
    from tlt.runtime.ray_train import train_ray

    return train_ray(spec, out, address=args.address)


def _step_line(m: dict[str, Any]) -> str:
    return (
        f"step {m['step']:>4}  reward {m['reward_mean']:.3f}  len {m['response_length_mean']:.0f} "
        f"(p90 {m['response_length_p90']}, trunc {m['truncation_rate']:.0%})  "
        f"{m['tokens_per_second']:.0f} tok/s  tail {m['tail_fraction']:.0%}  "
        f"rollout {m['rollout_seconds']:.1f}s  update {m['update_seconds']:.1f}s"
    )


def train_local(spec: TLTTrainingRun, out: Path) -> int:
    """The trainer over the in-process executor with a progress display; resumes from `out` when it holds checkpoints.
    Stops gracefully on SIGTERM / SIGINT (the module docstring)."""
    with stop_on_signals() as stop:
        return _train_local(spec, out, stop)


def _train_local(spec: TLTTrainingRun, out: Path, stop: GracefulStop) -> int:
    from tlt.checkpoint.recovery import cannot_resume
    from tlt.checkpoint.resume_guard import ResumeError
    from tlt.checkpoint.store import CheckpointError, CheckpointWriteError
    from tlt.runtime.local_executor import local_trainer

    console = Console(stderr=True)
    try:
        trainer = local_trainer(spec, out)
    except (CheckpointError, ResumeError) as exc:
        console.print(f"error: {cannot_resume(out, exc)}", style="red", highlight=False, soft_wrap=True)
        return 1
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 1
    total = spec.spec.algorithm.steps
    if trainer.step:
        console.print(f"resuming {spec.metadata.name} at step {trainer.step}/{total} from {trainer.checkpoint_root}")
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(spec.metadata.name, total=total, completed=min(trainer.step, total))

        def on_step(metrics: dict[str, Any]) -> None:
            progress.console.print(_step_line(metrics), highlight=False)
            progress.update(task, completed=metrics["step"])

        try:
            history = trainer.train(on_step=on_step, stop=stop)
        except CheckpointWriteError as exc:
            trainer.loggers.close()
            code, line = write_failed(stop, exc)
            console.print(line, style="red", highlight=False, soft_wrap=True)
            return code
    trainer.loggers.close()
    if trainer.step < total:
        console.print(
            stopped_line(
                spec.metadata.name, stop.name, trainer.step, total, str(trainer.stopped) if trainer.stopped else None
            ),
            highlight=False,
            soft_wrap=True,
        )
        return 0
    from tlt.runtime.report import write_report

    last = history[-1] if history else None
    summary = f"done: {len(history)} steps" + (f", final reward {last['reward_mean']:.3f}" if last else "")
    report = write_report(out, title=f"TLT run {spec.metadata.name} (--local)") if trainer.step else None
    console.print(
        f"{summary}; policy in {out / 'policy'}, metrics in {trainer.metrics_path}"
        + (f", report {report}" if report else "")
    )
    return 0
