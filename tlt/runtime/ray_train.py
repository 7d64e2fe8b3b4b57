"""`tlt train` on Ray: the coordinator with the live display, then the end-of-run report.

Local Ray cluster by default; `address` (or `$RAY_ADDRESS`) joins an existing cluster unchanged.
SIGTERM / SIGINT stop the run after the step under way with a checkpoint, then Ray is shut down
(`tlt.runtime.graceful_stop`; the handler is installed again once `ray.init` has put Ray's own in place).
Exit status as `tlt train`: 0 done or stopped with a checkpoint, 1 the run stopped on an error, 143 stopped
on a signal without a checkpoint (the line says why).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import ray
from rich.console import Console

from tlt.checkpoint.recovery import cannot_resume
from tlt.checkpoint.resume_guard import ResumeError
from tlt.checkpoint.store import CheckpointError, CheckpointWriteError
from tlt.runtime import k8s_slots
from tlt.runtime.display import LiveDisplay
from tlt.runtime.graceful_stop import (
    GracefulStop,
    StoppedWhileStarting,
    stop_on_signals,
    stopped_line,
    write_failed,
)
from tlt.runtime.ray_executor import ray_trainer
from tlt.runtime.report import PLOTS, write_report
from tlt.runtime.restarts import RunFailed
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.warmstart import WarmstartConfig

log = logging.getLogger(__name__)


def _on_step(display: LiveDisplay, metrics: dict, recovered: dict) -> None:
    """Show the step; on a cluster also publish it for the operator, with the run's last recovery (kept in
    `recovered`; best effort: a failed report is logged, never fails the run)."""
    display.step(metrics)
    recovered.update(k8s_slots.recovery_report(metrics) or {})
    try:
        k8s_slots.report_progress(metrics, recovered or None)
    except k8s_slots.SlotApiError as exc:
        log.warning("could not publish progress on the pod: %s", exc)


def train_ray(
    run: TLTTrainingRun,
    out: Path,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    warmstart: WarmstartConfig | None = None,
    stopped_exit: int = 0,
) -> int:
    """Train `run` into `out` with the live display; write the report. `warmstart` picks the built-in
    task's policy when `model.path` is unset (default: the default warm start). `stopped_exit`: the exit
    status of a run stopped on a signal with its checkpoint written (`tlt worker` must not exit 0 then: that
    is the pod's Succeeded)."""
    with stop_on_signals() as stop:
        return _train_ray(run, out, address, num_cpus, warmstart, stop, stopped_exit)


def _train_ray(
    run: TLTTrainingRun,
    out: Path,
    address: str | None,
    num_cpus: int | None,
    warmstart: WarmstartConfig | None,
    stop: GracefulStop,
    stopped_exit: int,
) -> int:
    console = Console(stderr=True)
    address = address or os.environ.get("RAY_ADDRESS") or None
    total = run.spec.algorithm.steps
    display = LiveDisplay(run.metadata.name, total, console)
    try:
        with display:
            trainer = ray_trainer(
                run,
                out,
                address=address,
                num_cpus=num_cpus,
                on_event=display.event,
                warmstart=warmstart,
                stop_trainers_at="rollout" if address else "update",
                stop=stop,
            )
            if trainer.step:
                console.print(
                    f"resuming {run.metadata.name} at step {trainer.step}/{total} from {trainer.checkpoint_root}"
                )
            recovered: dict = {}
            history = trainer.train(on_step=lambda metrics: _on_step(display, metrics, recovered), stop=stop)
    except StoppedWhileStarting as exc:
        line = stopped_line(run.metadata.name, "SIGTERM", exc.step, total, exc.checkpoint)
        console.print(line, highlight=False, soft_wrap=True)
        return stopped_exit
    except CheckpointWriteError as exc:
        ray.shutdown()
        code, line = write_failed(stop, exc)
        console.print(line, style="red", highlight=False, soft_wrap=True)
        return code
    except (CheckpointError, ResumeError) as exc:
        ray.shutdown()  # a drafter that does not fit is found once Ray has started
        console.print(f"error: {cannot_resume(out, exc)}", style="red", highlight=False, soft_wrap=True)
        return 1
    except RunFailed as exc:
        console.print(f"[red]run failed:[/red] {exc}", highlight=False)
        return 1
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    if trainer.step < total:  # stopped on a signal, its checkpoint written
        ray.shutdown()
        trainer.loggers.close()
        console.print(
            stopped_line(
                run.metadata.name, stop.name, trainer.step, total, str(trainer.stopped) if trainer.stopped else None
            ),
            highlight=False,
            soft_wrap=True,
        )
        return stopped_exit
    report = write_report(out, title=f"TLT run {run.metadata.name}")
    trainer.loggers.log_figures([Path(out) / name for name in PLOTS], trainer.step)
    trainer.loggers.close()
    snapshots = Path(out) / "drafter"  # a learned drafter's snapshots (none with the vLLM engine or mode off)
    console.print(
        f"done: {len(history)} steps; metrics {trainer.metrics_path}; report {report}; "
        f"policy {out / 'policy'}" + (f"; drafter snapshots {snapshots}" if snapshots.is_dir() else "")
    )
    return 0
