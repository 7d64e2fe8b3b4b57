"""Training (the `train` component): run the RL loop on a cluster or in this process, publish outputs.

`mode` is explicit and there is no fallback between the two:
- `local`: the run trains on this machine, in `work_dir` (a fresh temporary folder when empty;
  an existing one resumes from its checkpoints), with the runtime `local_runtime` names, as
  `tlt train` does: `ray` (a local Ray cluster: the only runtime that trains a drafter, for
  `speculative.mode` static / tlt) or `single-process` (`tlt train --local`: no drafter). The
  final policy and, when the run trained one, its served drafter (`drafter-served/`: the one the
  next step would draft with, see `tlt.drafter.publish`; the hub's newest snapshot for a run
  without it) are copied into the Model artifacts.
- `cluster`: a `TLTTrainingRun` is created and followed (`tlt_components.cluster`). Its outputs
  stay on the run's checkpoint volume (`checkpoint.claimName`, required; `checkpoint_claim`, when
  given, must name the same claim): the Model artifacts record where, relative to the claim
  (`location.json`), and the steps that read them mount the claim (`tlt_components.volume`).

The run spec is validated by `tlt.spec.manifest_io.parse_run`; it must have the dataset section the
prepared Dataset artifact was made from. Step metrics come back as data (`TrainResult.metrics`):
every numeric metric of the last step under its own name, a per-step series of the main ones as
`stepNNNN_<name>`, and `steps`; `TrainResult.report` is a Markdown report for the KFP UI (a local
run's end-of-run report with its plots, a cluster run's headline numbers; `tlt_components.report`).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlt.drafter.export import SERVED_DIR, SERVED_INFO, ExportResult, export_eagle, resolve_checkpoint, target_config
from tlt.spec.run import TLTTrainingRun
from tlt_components.common import at_least, choice, object_name, parse_run_spec
from tlt_components.prepare import read_info
from tlt_components.report import metrics_report, run_report
from tlt_components.volume import (
    CHECKPOINT_MOUNT,
    base_policy_folder,
    checkpoint_run,
    claim_of,
    cluster_location,
    final_checkpoint,
    read_location,
    write_drafter,
    write_location,
)

log = logging.getLogger(__name__)

MODES = ("cluster", "local")
LOCAL_RUNTIMES = ("ray", "single-process")
DRAFTER_DIR = "drafter"  # where the runtimes write drafter snapshots under their output folder
SERIES_KEYS = (
    "reward_mean",
    "response_length_mean",
    "tokens_per_second",
    "step_seconds",
    "accept_length",
    "drafter_loss",
)
HEADLINE_KEYS = (
    "steps",
    "restarts",
    "reward_mean",
    "accept_length",
    "tokens_per_second",
    "step_seconds",
    "drafter_loss",
)


@dataclass
class TrainResult:
    """What `run_train` produced: metrics and the metadata of the policy and drafter artifacts."""

    metrics: dict[str, float]
    policy_metadata: dict[str, Any]
    drafter_metadata: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    report: str = ""


def check_prepared(run: TLTTrainingRun, info: dict[str, Any]) -> None:
    """ValueError unless the prepared data was made from this run's dataset section (fields named)."""
    current = run.spec.dataset.model_dump(mode="json", by_alias=True)
    prepared = info.get("dataset", {})
    differ = sorted(k for k in set(current) | set(prepared) if current.get(k) != prepared.get(k))
    if differ:
        raise ValueError(
            f"the prepared data was made from a different dataset section (fields {differ}); "
            "pass the same run spec to prepare_data and train"
        )


def check_claim(run: TLTTrainingRun, checkpoint_claim: str) -> None:
    """ValueError unless the run has a checkpoint claim, the same as `checkpoint_claim` when that is given."""
    claim = claim_of(run)
    if checkpoint_claim and checkpoint_claim != claim:
        raise ValueError(
            f"parameter 'checkpoint_claim' is {checkpoint_claim!r} but run_spec checkpoint.claimName is "
            f"{claim!r}: the steps after train mount checkpoint_claim to read the run's "
            "outputs, so both must name the same PersistentVolumeClaim"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def history_metrics(history: list[dict[str, Any]]) -> dict[str, float]:
    """Flat numeric metrics of a run's step history (see the module docstring)."""
    metrics: dict[str, float] = {"steps": float(len(history))}
    for row in history:
        for key in SERIES_KEYS:
            if _is_number(row.get(key)):
                metrics[f"step{int(row['step']):04d}_{key}"] = float(row[key])
    if history:
        metrics.update({k: float(v) for k, v in history[-1].items() if _is_number(v) and k != "step"})
    return metrics


def _copy_folder(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, dirs_exist_ok=True)


def train_local(run: TLTTrainingRun, runtime: str, work_dir: Path, policy_dir: Path, drafter_dir: Path) -> TrainResult:
    """Train in `work_dir` with `runtime`; copy the policy and the served drafter (else the newest drafter
    snapshot; none when the run trained no drafter) out."""
    from tlt.runtime.graceful_stop import EXIT_TERMINATED, stop_on_signals, stopped_line
    from tlt.runtime.local_executor import local_trainer
    from tlt.workers.policy import POLICY_DIR

    if runtime == "ray":
        from tlt.runtime.ray_executor import ray_trainer

        trainer = ray_trainer(run, work_dir)
    else:
        trainer = local_trainer(run, work_dir)
    with stop_on_signals() as stop:  # SIGTERM (pod eviction, a cancelled run): the step under way, a checkpoint
        history = trainer.train(
            on_step=lambda m: log.info("step %d: reward %.3f", m["step"], m["reward_mean"]), stop=stop
        )
    trainer.loggers.close()
    if stop.requested and trainer.step < run.spec.algorithm.steps:  # the task fails (143); a retry resumes
        checkpoint = str(trainer.stopped) if trainer.stopped else None
        log.warning(stopped_line(run.metadata.name, stop.name, trainer.step, run.spec.algorithm.steps, checkpoint))
        raise SystemExit(EXIT_TERMINATED)
    _copy_folder(work_dir / POLICY_DIR, policy_dir)
    snapshots, served = work_dir / DRAFTER_DIR, work_dir / SERVED_DIR
    drafter_trained = snapshots.exists() or served.exists()
    served_version = None
    if served.exists():
        _copy_folder(resolve_checkpoint(served), drafter_dir)
        served_version = int(json.loads((served / SERVED_INFO).read_text())["version"])
        log.info("drafter artifact: the served drafter (version %d) from %s", served_version, served)
    elif drafter_trained:
        source = resolve_checkpoint(snapshots)
        _copy_folder(source, drafter_dir)
        log.info("drafter artifact: the hub's newest snapshot %s (the run wrote no %s/)", source, SERVED_DIR)
    else:
        log.info(
            "the run trained no drafter (speculative.mode %s, runtime %s): the drafter artifact is empty",
            run.spec.speculative.mode,
            runtime,
        )
    return TrainResult(
        metrics=history_metrics(history),
        policy_metadata={"location": "artifact", "steps": len(history)},
        drafter_metadata={
            "location": "artifact",
            "trained": drafter_trained,
            "runtime": runtime,
            "speculative_mode": run.spec.speculative.mode,
            **({"served_version": served_version} if served_version is not None else {}),
        },
        history=history,
        report=run_report(work_dir, title=f"TLT run {run.metadata.name}"),
    )


def train_cluster(
    run: TLTTrainingRun,
    *,
    namespace: str,
    name: str,
    poll_seconds: float,
    timeout_seconds: float,
    policy_dir: Path,
    drafter_dir: Path,
    api: Any = None,
) -> TrainResult:
    """Create and follow a TLTTrainingRun; the artifacts record where its outputs are."""
    from tlt_components.cluster import train_on_cluster

    actual, status = train_on_cluster(
        run, namespace=namespace, name=name, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, api=api
    )
    location = cluster_location(run, namespace=namespace, name=actual)
    for folder in (policy_dir, drafter_dir):
        write_location(folder, location)
    step, drafter = status.get("step") or {}, status.get("drafter") or {}
    metrics = {"steps": float(step.get("current") or 0), "restarts": float(status.get("restarts") or 0)}
    if _is_number(drafter.get("acceptLength")):
        metrics["accept_length"] = float(drafter["acceptLength"])
    note = (
        f"TLTTrainingRun {namespace}/{actual}, phase {status.get('phase')}; its metrics.jsonl and report "
        "stay with its checkpoints on the claim."
    )
    return TrainResult(
        metrics=metrics,
        policy_metadata=location,
        drafter_metadata=location,
        report=metrics_report(f"TLT run {actual}", metrics, HEADLINE_KEYS, note),
    )


def run_train(
    run_spec: dict[str, Any],
    data_dir: str | Path,
    *,
    mode: str,
    policy_dir: str | Path,
    local_runtime: str = "ray",
    drafter_dir: str | Path,
    namespace: str = "default",
    run_name: str = "",
    poll_seconds: float = 10.0,
    timeout_seconds: float = 0.0,
    work_dir: str = "",
    checkpoint_claim: str = "",
    api: Any = None,
) -> TrainResult:
    """Validate every input, then train in the chosen mode (see the module docstring)."""
    choice("mode", mode, MODES)
    choice("local_runtime", local_runtime, LOCAL_RUNTIMES)
    at_least("poll_seconds", poll_seconds, 0.1)
    at_least("timeout_seconds", timeout_seconds, 0)
    run = parse_run_spec(run_spec)
    check_prepared(run, read_info(data_dir))
    if mode == "cluster":
        object_name("namespace", namespace)
        if run_name:
            object_name("run_name", run_name)
        check_claim(run, checkpoint_claim)
        return train_cluster(
            run,
            namespace=namespace,
            name=run_name,
            poll_seconds=poll_seconds,
            timeout_seconds=timeout_seconds,
            policy_dir=Path(policy_dir),
            drafter_dir=Path(drafter_dir),
            api=api,
        )
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="tlt-train-"))
    return train_local(run, local_runtime, work, Path(policy_dir), Path(drafter_dir))


def export_trained_drafter(
    drafter_dir: str | Path,
    metadata: dict[str, Any],
    policy_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: str,
    mount: str | Path = CHECKPOINT_MOUNT,
) -> ExportResult:
    """Export the drafter artifact of `train` as an EAGLE folder; a clear error when it holds none.
    A cluster run's drafter is read from its final checkpoint on the claim mounted at `mount`."""
    if metadata.get("location") == "cluster":
        checkpoint = final_checkpoint(read_location(drafter_dir), mount)
        target = target_config(base_policy_folder(checkpoint_run(checkpoint)))
        with tempfile.TemporaryDirectory(prefix="tlt-drafter-") as scratch:
            drafter = write_drafter(checkpoint, target, Path(scratch) / "drafter")
            return export_eagle(drafter, target, out_dir, dtype=dtype)  # type: ignore[arg-type]
    if metadata.get("trained") is False:
        raise ValueError(
            f"the training run produced no drafter (speculative.mode {metadata.get('speculative_mode')!r}, "
            f"runtime {metadata.get('runtime')!r}); train with speculative.mode static or tlt on the ray runtime"
        )
    return export_eagle(drafter_dir, policy_dir, out_dir, dtype=dtype)  # type: ignore[arg-type]
