"""The run's state machine as ONE pure function: `decide(spec, status, pods, generation, now)`.

Given the spec, the last written status and the pods observed right now, it says which pods to
remove, whether missing children should be created, whether the run itself should go (TTL), and
the next status. No I/O and no clock: the reconciler supplies `now` and performs the decision.

Phases: Pending (pods created, not all Running) -> Running (every desired pod Running) ->
Succeeded (the policy rank-0 pod, which runs the coordinator, exited 0) or Failed (more failed
pods than `runPolicy.backoffLimit`, or `activeDeadlineSeconds` passed since `startTime`).
Restarting: failed pods are being replaced.

Failures count per restart of the group, as JobSet's `failurePolicy` does, not per pod: a pass that
finds failed pods adds ONE restart, and a failed policy rank 0 (the Ray head) restarts every pod
of the run (the others would only fail one by one after losing it). Pods the cluster disrupted
(evicted, preempted: reason `Evicted` or a `DisruptionTarget` condition) are replaced without
counting. Pods that carry the run's label but are not owned by the run are never touched.
Suspended: `spec.suspend`, every pod removed,
`startTime` cleared so the deadline counts from the resume (as a Job does). Succeeded and Failed
are final; `cleanPodPolicy` picks the pods removed then (All, Running = the unfinished ones, None)
and `ttlSecondsAfterFinished` deletes the run after `completionTime`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from tlt.spec.run import RunSpec
from tlt.spec.status import Condition, DrafterStatus, RoleStatus, RunStatus, StepStatus, set_condition

from . import names
from .drafter_health import drafter_health

log = logging.getLogger(__name__)
FINAL = ("Succeeded", "Failed")
CONDITION_OF_PHASE = {
    "Running": "Running",
    "Suspended": "Suspended",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Restarting": "Restarting",
}
PHASE_CONDITIONS = frozenset(CONDITION_OF_PHASE.values())


@dataclass(frozen=True)
class PodView:
    """What the reconciler needs of a live pod."""

    name: str
    uid: str
    role: str
    rank: int
    phase: str
    ready: bool
    owned: bool
    spec_hash: str
    disrupted: bool = False


@dataclass
class Decision:
    status: RunStatus
    restart: list[PodView] = field(default_factory=list)
    remove: list[PodView] = field(default_factory=list)
    create_missing: bool = False
    delete_run: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)


def view_pod(pod: dict[str, Any], run_uid: str) -> PodView:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    rank = labels.get(names.RANK_LABEL, "")
    return PodView(
        name=meta["name"],
        uid=meta["uid"],
        role=labels.get(names.ROLE_LABEL, ""),
        rank=int(rank) if rank.isdigit() else -1,
        phase=status.get("phase", "Pending"),
        ready=ready,
        owned=any(ref.get("uid") == run_uid for ref in meta.get("ownerReferences") or []),
        spec_hash=annotations.get(names.SPEC_HASH_ANNOTATION, ""),
        disrupted=status.get("reason") == "Evicted"
        or any(
            c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in status.get("conditions") or []
        ),
    )


def desired_pods(spec: RunSpec) -> set[tuple[str, int]]:
    return {(role, rank) for role in names.ROLES for rank in range(getattr(spec, role).replicas)}


def _role_counts(spec: RunSpec, pods: list[PodView]) -> dict[str, RoleStatus]:
    return {
        role: RoleStatus(
            desired=getattr(spec, role).replicas,
            ready=sum(p.role == role and p.phase == "Running" and p.ready for p in pods),
            failed=sum(p.role == role and p.phase == "Failed" for p in pods),
        )
        for role in names.ROLES
    }


def _progress(spec: RunSpec, report: Mapping[str, Any], old: RunStatus) -> tuple[StepStatus, DrafterStatus | None]:
    """Step and drafter status from the coordinator's progress `report` (written by the workers:
    each value is checked against the status field it feeds)."""

    def number(key: str, part: type[StepStatus | DrafterStatus], name: str) -> Any:
        """The report's value when the status field takes it (type and bounds), else None (logged)."""
        value = report.get(key)
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):  # not true as 1, nor "3" as 3
            try:
                return getattr(part.model_validate({name: value}), name)
            except ValidationError:
                pass
        log.warning("progress report %s=%.80r is outside what status.%s takes: ignored", key, value, name)
        return None

    old_step = old.step or StepStatus()
    current = number("step", StepStatus, "current")
    step = StepStatus(
        current=current if current is not None else (old_step.current or 0),
        total=spec.algorithm.steps,
        last_step_seconds=number("lastStepSeconds", StepStatus, "last_step_seconds") or old_step.last_step_seconds,
    )
    # Kept while a report lacks them: held-out results between evaluations, the off-policy share (0 in sync mode).
    for key, name in (
        ("evalAccuracy", "eval_accuracy"),
        ("evalReward", "eval_reward"),
        ("offPolicyFraction", "off_policy_fraction"),
    ):
        value = number(key, StepStatus, name)
        setattr(step, name, value if value is not None else getattr(old_step, name))
    drafter = (old.drafter or DrafterStatus()).model_copy(
        update={
            k: v
            for k, v in {
                "version": number("drafterVersion", DrafterStatus, "version"),
                "accept_length": number("acceptLength", DrafterStatus, "accept_length"),
                "active_trainers": number("activeTrainers", DrafterStatus, "active_trainers"),
            }.items()
            if v is not None
        }
    )
    return step, drafter if drafter.model_dump(exclude_none=True) else None


def recovered(
    conditions: list[Condition], report: Mapping[str, Any], generation: int, now: datetime
) -> list[Condition]:
    """`conditions` with `Recovered=True` (reason `RecoveredInPlace`) saying the run's last recovery below the
    step (a lost rollout worker's shard generated by another, the step run again, the drafter hub restarted
    alone), from the coordinator's progress `report` (`recovery`: `{"step": n, "message": ...}`; written by
    the workers, so anything else there is ignored, logged)."""
    recovery = report.get("recovery")
    if recovery is None:
        return conditions
    step, said = (recovery.get(k) for k in ("step", "message")) if isinstance(recovery, dict) else (None, None)
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 1 and isinstance(said, str)):
        log.warning("progress report recovery=%.80r is not {step, message}: ignored", recovery)
        return conditions
    message = f"step {step}: {said}"[:1024]
    return set_condition(conditions, _condition("Recovered", True, "RecoveredInPlace", message, generation, now))


def _condition(kind: str, status: bool, reason: str, message: str, generation: int, now: datetime) -> Condition:
    return Condition(
        type=kind,
        status="True" if status else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=now,
    )


def decide(
    spec: RunSpec,
    old: RunStatus,
    pods: list[PodView],
    generation: int,
    now: datetime,
    desired_hashes: dict[str, str],
    progress: Mapping[str, Any] | None = None,
) -> Decision:
    """The next step for one run. `desired_hashes` maps each desired pod name to its spec hash;
    `progress` is the coordinator's last report (`reports.Reports.progress`)."""
    mine = [p for p in pods if p.owned]
    wanted = desired_pods(spec)
    phase, reason, message = old.phase or "Pending", "", ""
    decision = Decision(status=old)
    start_time, completion_time = old.start_time, old.completion_time
    restarts = old.restarts or 0

    if phase not in FINAL:
        failed = [p for p in mine if p.phase == "Failed"]
        counted = int(any(not p.disrupted for p in failed))  # one restart of the group per pass
        head_done = any(p.role == "policy" and p.rank == 0 and p.phase == "Succeeded" for p in mine)
        deadline = spec.run_policy.active_deadline_seconds
        if spec.suspend:
            phase, reason, message = "Suspended", "Suspended", "spec.suspend is true: pods removed"
            decision.remove.extend(mine)
            start_time = None
        elif head_done:
            phase, reason, message = "Succeeded", "CoordinatorSucceeded", "policy rank 0 finished every step"
        elif deadline is not None and start_time is not None and now - start_time > timedelta(seconds=deadline):
            phase, reason, message = "Failed", "DeadlineExceeded", f"running longer than {deadline}s"
        elif restarts + counted > spec.run_policy.backoff_limit:
            phase, reason = "Failed", "BackoffLimitExceeded"
            message = f"{restarts + counted} restarts, backoffLimit is {spec.run_policy.backoff_limit}"
        else:
            decision.create_missing = True
            head_failed = any(p.role == "policy" and p.rank == 0 for p in failed)
            if head_failed:  # the whole Ray cluster restarts with its head
                failed = failed + [p for p in mine if p.phase not in ("Failed", "Succeeded")]
            decision.restart.extend(failed)
            restarts += counted
            live = [p for p in mine if p not in failed]
            decision.remove.extend(
                p
                for p in live
                if (p.role, p.rank) not in wanted or desired_hashes.get(p.name, p.spec_hash) != p.spec_hash
            )
            start_time = start_time or now
            running = {(p.role, p.rank) for p in live if p.phase == "Running"}
            if failed:
                phase, reason = "Restarting", "PodFailed"
                message = f"replacing failed pods {', '.join(sorted(p.name for p in failed))}"
            elif wanted <= running:
                phase, reason, message = "Running", "AllPodsRunning", f"{len(wanted)} pods running"
            elif taken := sorted(p.name for p in pods if not p.owned and p.name in desired_hashes):
                phase, reason = "Pending", "PodNameTaken"
                message = f"pods {', '.join(taken)} exist but are not this run's: left alone, the run waits"
            else:
                phase, reason = "Pending", "PodsStarting"
                message = f"{len(running & wanted)}/{len(wanted)} pods running"
        if phase in FINAL:
            completion_time = now
    if phase in FINAL:
        clean = spec.run_policy.clean_pod_policy
        decision.remove.extend(
            p for p in mine if clean == "All" or (clean == "Running" and p.phase not in ("Succeeded", "Failed"))
        )
        ttl = spec.run_policy.ttl_seconds_after_finished
        decision.delete_run = (
            ttl is not None and completion_time is not None and now - completion_time >= timedelta(seconds=ttl)
        )

    conditions = list(old.conditions or [])
    if phase != old.phase:
        kind = CONDITION_OF_PHASE.get(phase)
        for cond in conditions:  # the other phases' conditions; Recovered, ChildConflict... keep their own
            if cond.status == "True" and cond.type != kind and cond.type in PHASE_CONDITIONS:
                conditions = set_condition(conditions, _condition(cond.type, False, reason, message, generation, now))
        if kind:
            conditions = set_condition(conditions, _condition(kind, True, reason, message, generation, now))
        level = "Warning" if phase in ("Failed", "Restarting") else "Normal"
        decision.events.append((level, reason, message))
    conditions = recovered(conditions, progress or {}, generation, now)
    counts = _role_counts(spec, mine)
    step, drafter = _progress(spec, progress or {}, old)
    conditions, drafter, health_events = drafter_health(conditions, drafter, progress or {}, generation, now)
    decision.events.extend(health_events)
    decision.status = old.model_copy(
        update=dict(
            phase=phase,
            conditions=conditions,
            observed_generation=generation,
            policy=counts["policy"],
            rollout=counts["rollout"],
            verifier=counts["verifier"],
            replicas=sum(p.role == "rollout" for p in mine),
            step=step,
            drafter=drafter,
            restarts=restarts,
            start_time=start_time,
            completion_time=completion_time,
            message=message or old.message,
        )
    )
    return decision
