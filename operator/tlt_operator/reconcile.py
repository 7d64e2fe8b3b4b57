"""One level-based reconcile pass of one run: read the world, `decide`, act, write status.

Called from every handler and the timer; passes of one run never overlap (the handlers hold a
per-run lock). Nothing here trusts the event that triggered it: the run and its pods are read
fresh, so a pass after a restart, a missed event or a manual change converges the same way.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from typing import Any

from pydantic import ValidationError

from tlt.spec.plan import trains_online
from tlt.spec.references import reference_problems
from tlt.spec.run import API_GROUP, API_VERSION, KIND, RunSpec
from tlt.spec.status import Condition, DrafterStatus, RunStatus, set_condition

from . import metrics, names, settings
from .builders import (
    build_configmap,
    build_event,
    build_network_policy,
    build_pod,
    build_podgroup,
    build_ray_token_secret,
    build_reports_configmap,
    build_resource_claim_template,
    build_service,
    build_worker_identity,
)
from .builders.common import RunRef
from .idleness import SlotTracker
from .kube import ChildConflict, Kube, KubeError, path_of
from .lifecycle import FINAL, PodView, decide, desired_pods, view_pod
from .reports import Reports, parse_reports, state_of_pod
from .status_write import post_event, write_status

log = logging.getLogger(__name__)
RUN_API = f"{API_GROUP}/{API_VERSION}"


class SpecError(ValueError):
    """The stored spec does not parse as a RunSpec (it passed the CRD, so the CRD lags the model), or names a
    Secret or ServiceAccount it may not (`tlt.spec.references`: the CRD cannot know the admin's lists)."""


def _desired_pods(ref: RunRef, spec: RunSpec, token_secret: str) -> dict[str, dict[str, Any]]:
    pods = [build_pod(ref, spec, role, rank, token_secret) for role, rank in sorted(desired_pods(spec))]
    return {p["metadata"]["name"]: p for p in pods}


async def _remove(kube: Kube, namespace: str, pods: list[PodView], cause: str) -> int:
    done = await asyncio.gather(*(kube.delete(path_of("v1", "Pod", namespace, p.name), p.uid) for p in pods))
    metrics.PODS_REMOVED.labels(cause=cause).inc(sum(done))
    return sum(done)


class ChildRejected(Exception):
    """The API refused a child for good (400 / 403 / 422: bad syntax, a forbidden value, a quota)."""


REJECTED = (400, 403, 422)


def _rejected(child: dict[str, Any], exc: KubeError) -> ChildRejected:
    return ChildRejected(
        f"{child['kind']} {child['metadata']['name']} was rejected by the API ({exc.code}): {exc.message}"[:1024]
    )


def _spec_condition(run: dict[str, Any], error: str) -> RunStatus:
    """The run's status with `ValidSpec=False` and the validation message: a spec the CRD let through
    but the operator cannot read (a stored run older than a stricter schema) is visible, not silent."""
    old = RunStatus.model_validate(run.get("status") or {})
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    condition = Condition(
        type="ValidSpec",
        status="False",
        reason="InvalidSpec",
        message=error[:4096],
        observed_generation=int(run["metadata"].get("generation", 1)),
        last_transition_time=now,
    )
    return old.model_copy(
        update={"phase": old.phase or "Pending", "conditions": set_condition(list(old.conditions or []), condition)}
    )


def _problem(
    status: RunStatus,
    kind: str,
    error: str | None,
    bad: str,
    reasons: tuple[str, str],
    cleared: str,
    generation: int,
    now: datetime.datetime,
) -> RunStatus:
    """Condition `kind` set to `bad` with `error` (reason `reasons[0]`), or back from it (reason `reasons[1]`,
    message `cleared`) once the error is gone; none at all on a run that never had the problem (no noise)."""
    before = next((c for c in status.conditions or [] if c.type == kind), None)
    if error is None and (before is None or before.status != bad):
        return status
    good = "False" if bad == "True" else "True"
    condition = Condition(
        type=kind,
        status=bad if error else good,
        reason=reasons[0] if error else reasons[1],
        message=error or cleared,
        observed_generation=generation,
        last_transition_time=now,
    )
    return status.model_copy(update={"conditions": set_condition(list(status.conditions or []), condition)})


def _created(status: RunStatus, error: str | None, generation: int, now: datetime.datetime) -> RunStatus:
    """Condition `Created` (as Trainer v2): False with the API's message when a child was rejected."""
    return _problem(
        status,
        "Created",
        error,
        "False",
        ("ChildRejected", "ChildrenCreated"),
        "every child was created",
        generation,
        now,
    )


def _conflict(status: RunStatus, error: str | None, generation: int, now: datetime.datetime) -> RunStatus:
    """Condition `ChildConflict`: True naming the object while one holds a child's name (also the status
    message), False once it is gone."""
    status = _problem(
        status,
        "ChildConflict",
        error,
        "True",
        ("ChildConflict", "NoConflict"),
        "no object holds a child's name",
        generation,
        now,
    )
    return status.model_copy(update={"message": error[:1024]}) if error else status


async def _create_once(kube: Kube, child: dict[str, Any]) -> None:
    """Create a pod unless one of its name exists (pods are immutable; one not the run's is `PodNameTaken`)."""
    try:
        await kube.request("POST", path_of(child["apiVersion"], child["kind"], child["metadata"]["namespace"]), child)
        metrics.CHILDREN_CREATED.labels(kind=child["kind"]).inc()
    except KubeError as exc:
        if exc.code in REJECTED:
            raise _rejected(child, exc) from exc
        if exc.code != 409:
            raise


async def _token_secret(kube: Kube, run: dict[str, Any], ref: RunRef, spec: RunSpec, old: RunStatus) -> str:
    """The name of the run's Ray token Secret: the one `status.rayTokenSecret` records, else a new one the
    server names (`generateName`), recorded in the status at once, before any pod can refer to it. A
    Secret someone planted is never used: its name is not the recorded one. A record lost to a failed
    status write costs one unused Secret (the run owns it: garbage-collected with the run)."""
    if old.ray_token_secret:
        return old.ray_token_secret
    secret = build_ray_token_secret(ref, spec, secrets.token_hex(32))
    try:
        created = await kube.request("POST", path_of("v1", "Secret", ref.namespace), secret)
    except KubeError as exc:
        if exc.code in REJECTED:
            raise _rejected(secret, exc) from exc
        raise
    metrics.CHILDREN_CREATED.labels(kind="Secret").inc()
    name = str(created["metadata"]["name"])
    await write_status(kube, run, old.model_copy(update={"ray_token_secret": name}), 0)
    return name


async def _create_children(
    kube: Kube, ref: RunRef, spec: RunSpec, pods: dict[str, dict[str, Any]], live: set[str]
) -> None:
    """Every child this pass lacks but the token Secret (ChildConflict before any pod when a name is held)."""
    children = (
        build_configmap(ref, spec),
        build_reports_configmap(ref, spec),
        build_service(ref, spec),
        build_network_policy(ref, spec, settings.operator_namespace()),
        *build_worker_identity(ref, spec),
        build_podgroup(ref, spec),
        build_resource_claim_template(ref, spec),
    )
    for child in children:
        if child is None:
            continue
        try:
            if await kube.apply(child) == "created":
                metrics.CHILDREN_CREATED.labels(kind=child["kind"]).inc()
        except KubeError as exc:
            if exc.code in REJECTED:
                raise _rejected(child, exc) from exc
            raise
    await asyncio.gather(*(_create_once(kube, pod) for name, pod in pods.items() if name not in live))


def _training_slots(spec: RunSpec) -> bool:
    """Runs whose rollout pods train the drafter in idle time have trainer slots."""
    return trains_online(spec.speculative, spec.drafter)


async def _slots(
    slots: SlotTracker,
    namespace: str,
    name: str,
    spec: RunSpec,
    live: list[dict[str, Any]],
    views: list[PodView],
    reports: Reports,
    status: RunStatus,
) -> tuple[RunStatus, list[tuple[str, str, str]]]:
    """The drafter status after one more trainer-slot poll (see `idleness`), and its events. Only
    Running rollout pods have slots; a suspended or finished run has none."""
    drafter = status.drafter or DrafterStatus()
    if status.phase in (*FINAL, "Suspended") or not _training_slots(spec):
        slots.forget(namespace, name)
        if drafter.enabled_slots:
            status = status.model_copy(
                update={
                    "drafter": drafter.model_copy(
                        update={"enabled_slots": [], "enabled_trainers": 0, "active_trainers": 0}
                    )
                }
            )
        return status, []
    leaving = {p["metadata"]["name"] for p in live if p["metadata"].get("deletionTimestamp")}
    pods = {
        v.name: state_of_pod(reports, v.rank, v.uid)
        for v in views
        if v.owned and v.role == "rollout" and v.phase == "Running" and v.name not in leaving
    }
    outcome = await slots.poll(namespace, name, spec, pods, drafter)
    if outcome is None:
        return status, []
    return status.model_copy(update={"drafter": outcome.drafter}), outcome.events


async def _reports(kube: Kube, ref: RunRef) -> Reports:
    """What the run's workers reported (`builders.reports`); nothing while the ConfigMap does not exist."""
    try:
        live = await kube.get(path_of("v1", "ConfigMap", ref.namespace, names.reports_name(ref.name)))
    except KubeError as exc:
        if exc.code != 404:
            raise
        return Reports()
    return parse_reports(live, ref.uid)


async def reconcile(kube: Kube, namespace: str, name: str, slots: SlotTracker | None = None) -> None:
    """Converge one run; raises KubeError for transient API trouble and SpecError for a bad spec.
    `slots`: the operator's trainer-slot memory; None leaves the slots alone."""
    try:
        run = await kube.get(path_of(RUN_API, KIND, namespace, name))
    except KubeError as exc:
        if exc.code == 404:
            metrics.observe_phase(namespace, name, None)
            if slots is not None:
                slots.forget(namespace, name)
            return
        raise
    meta = run["metadata"]
    if meta.get("deletionTimestamp"):
        return
    if (run.get("spec") or {}).get("managedBy", names.MANAGER) != names.MANAGER:
        log.debug("%s/%s is managed by %s: left alone", namespace, name, run["spec"]["managedBy"])
        return
    try:
        spec = RunSpec.model_validate(run.get("spec") or {})
    except ValidationError as exc:
        error = SpecError(f"spec of {namespace}/{name} is not a valid RunSpec: {exc}")
        await write_status(kube, run, _spec_condition(run, str(error)), 0)
        raise error from exc
    references = reference_problems(name, spec, settings.shared_names())
    if references:  # the CRD cannot know the admin's lists: the operator is the gate, and creates nothing
        error = SpecError(f"spec of {namespace}/{name} names what it may not: " + "; ".join(references))
        await write_status(kube, run, _spec_condition(run, str(error)), 0)
        raise error
    ref = RunRef(name, namespace, meta["uid"])
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    old = RunStatus.model_validate(run.get("status") or {})
    token = old.ray_token_secret or ""
    if not token and old.phase not in FINAL:  # a finished run makes no pod: it needs no token
        try:
            token = await _token_secret(kube, run, ref, spec, old)
        except ChildRejected as exc:
            log.warning("%s/%s: %s", namespace, name, exc)
            await write_status(kube, run, _created(old, str(exc), int(meta.get("generation", 1)), now), 0)
            await post_event(kube, build_event(run, "Warning", "ChildRejected", str(exc), now))
            return
        run = await kube.get(path_of(RUN_API, KIND, namespace, name))  # its status now records the token
        meta = run["metadata"]
        old = RunStatus.model_validate(run.get("status") or {})
    wanted = _desired_pods(ref, spec, token)
    live = await kube.list(path_of("v1", "Pod", namespace), names.run_selector(name))
    views = [view_pod(p, ref.uid) for p in live]
    reports = await _reports(kube, ref)
    hashes = {n: p["metadata"]["annotations"][names.SPEC_HASH_ANNOTATION] for n, p in wanted.items()}
    decision = decide(spec, old, views, int(meta.get("generation", 1)), now, hashes, reports.progress)

    removed = await _remove(kube, namespace, decision.restart, "failed")
    metrics.POD_RESTARTS.inc(removed)
    await _remove(kube, namespace, decision.remove, "unwanted")
    # The restart counts once, and only when this pass removed the failed pods (another pass may have).
    restarted = (decision.status.restarts or 0) - (old.restarts or 0) if removed else 0
    status = decision.status.model_copy(
        update={
            "restarts": (old.restarts or 0) + restarted,
            "selector": f"{names.run_selector(name)},{names.ROLE_LABEL}=rollout",
            "ray_token_secret": old.ray_token_secret,
        }
    )
    if any(c.type == "ValidSpec" and c.status == "False" for c in status.conditions or []):
        valid = Condition(
            type="ValidSpec",
            status="True",
            reason="SpecValid",
            message="the spec is valid",
            observed_generation=int(meta.get("generation", 1)),
            last_transition_time=now,
        )
        status = status.model_copy(update={"conditions": set_condition(list(status.conditions or []), valid)})
    if decision.create_missing:
        gone = {p.name for p in decision.restart + decision.remove}
        generation = int(meta.get("generation", 1))
        try:
            await _create_children(kube, ref, spec, wanted, {p.name for p in views} | gone)
            status = _created(status, None, generation, now)
            status = _conflict(status, None, generation, now)
        except ChildRejected as exc:
            log.warning("%s/%s: %s", namespace, name, exc)
            status = _created(status, str(exc), generation, now)
            decision.events.append(("Warning", "ChildRejected", str(exc)))
        except ChildConflict as exc:
            log.warning("%s/%s: %s", namespace, name, exc)
            status = _conflict(status, str(exc), generation, now)
            decision.events.append(("Warning", "ChildConflict", str(exc)))
    slot_events: list[tuple[str, str, str]] = []
    if slots is not None:
        status, slot_events = await _slots(slots, namespace, name, spec, live, views, reports, status)
    await write_status(kube, run, status, restarted)
    metrics.observe_phase(namespace, name, status.phase)
    for level, reason, message in decision.events + slot_events:
        await post_event(kube, build_event(run, level, reason, message, now))
    if decision.delete_run:
        log.info(
            "%s/%s finished %ss ago: deleting it (ttlSecondsAfterFinished)",
            namespace,
            name,
            spec.run_policy.ttl_seconds_after_finished,
        )
        await kube.delete(path_of(RUN_API, KIND, namespace, name), ref.uid)
