"""`tlt train` on Ray: the coordinator with the live display, then the end-of-run report.

Local Ray cluster by default; `address` (or `$RAY_ADDRESS`) joins an existing cluster unchanged.
Exit status as `tlt train`: 0 done, 1 the run stopped on an error.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rich.console import Console

from tlt.spec.run import TLTTrainingRun
from tlt.runtime import k8s_slots
from tlt.runtime.checkpoint import CheckpointError
from tlt.runtime.display import LiveDisplay
from tlt.runtime.local import ResumeError
from tlt.runtime.ray_coordinator import RayTrainer, RunFailed
from tlt.runtime.report import PLOTS, write_report
from tlt.tasks.warmstart import WarmstartConfig

log = logging.getLogger(__name__)


def _on_step(display: LiveDisplay, metrics: dict) -> None:
    """Show the step; on a cluster also publish it on this pod for the operator (best effort: a
    failed annotation is logged, never fails the run)."""
    display.step(metrics)
    try:
        k8s_slots.report_progress(metrics)
    except k8s_slots.SlotApiError as exc:
        log.warning("could not publish progress on the pod: %s", exc)


def train_ray(run: TLTTrainingRun, out: Path, *, address: str | None = None, num_cpus: int | None = None,
              warmstart: WarmstartConfig | None = None) -> int:
    """Train `run` into `out` with the live display; write the report. `warmstart` picks the built-in
    task's policy when `model.path` is unset (default: the default warm start)."""
    console = Console(stderr=True)
    address = address or os.environ.get("RAY_ADDRESS") or None
    total = run.spec.algorithm.steps
    display = LiveDisplay(run.metadata.name, total, console)
    try:
        with display:
            trainer = RayTrainer(run, out, address=address, num_cpus=num_cpus, on_event=display.event, warmstart=warmstart,
                                 stop_trainers_at="rollout" if address else "update")
            if trainer.step:
                console.print(f"resuming {run.metadata.name} at step {trainer.step}/{total} from "
                              f"{trainer.checkpoint_root}")
            history = trainer.train(on_step=lambda metrics: _on_step(display, metrics))
    except (CheckpointError, ResumeError) as exc:
        console.print(f"[red]error:[/red] cannot resume from {out}: {exc}", highlight=False)
        return 1
    except RunFailed as exc:
        console.print(f"[red]run failed:[/red] {exc}", highlight=False)
        return 1
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 1
    report = write_report(out, title=f"TLT run {run.metadata.name}")
    trainer.loggers.log_figures([Path(out) / name for name in PLOTS], trainer.step)
    trainer.loggers.close()
    console.print(f"done: {len(history)} steps; metrics {trainer.metrics_path}; report {report}; "
                  f"policy {out / 'policy'}; drafter snapshots {out / 'drafter'}")
    return 0
