"""kopf handlers: thin triggers of one level-based reconcile (`reconcile.reconcile`).

Every edge (create, resume after an operator restart, spec update, any change of one of the
run's pods) and a periodic resync of every run trigger the same pass, so missed events, manual
edits and restarts all converge. There is deliberately no delete handler and no kopf timer (both
put a finalizer on the run, which hangs deletion while the operator is down): children carry
ownerReferences and the garbage collector removes them. Handlers return None.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from tlt.spec.run import API_GROUP, API_VERSION, KIND, PLURAL

from . import metrics, names
from . import settings as tunables
from .idleness import SlotTracker
from .kube import Kube, KubeError, path_of
from .reconcile import RUN_API, SpecError, reconcile

log = logging.getLogger(__name__)
RESOURCE = (API_GROUP, API_VERSION, PLURAL)
CRD_WAIT_SECONDS = 120.0


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    tunables.configure(settings)
    memo.kube = Kube.from_environment(tunables.request_timeout_seconds())
    if tunables.exact_namespaces():
        await _wait_for_crd(memo.kube, CRD_WAIT_SECONDS)
    memo.runs = {}  # shared by every object's memo (kopf copies the root memo shallowly)
    # Trainer-slot memory of every run (see idleness), shared likewise; Prometheus only from the allowlist.
    memo.slots = SlotTracker(allowlist=tunables.prometheus_allowlist())
    memo.resync = asyncio.create_task(_resync_forever(memo), name="tlt-resync")


async def _wait_for_crd(kube: Kube, timeout: float) -> None:
    """Without a cluster-wide CRD watch kopf finds the CRD once, at start: one applied with the operator
    (`kubectl apply -k`) may not be served yet. Wait for it, then fail (the Deployment restarts the pod)
    rather than serve nothing."""
    path = f"/apis/{API_GROUP}/{API_VERSION}"
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            found = await kube.request("GET", path)
            if any(r.get("name") == PLURAL for r in found.get("resources") or []):
                return
        except KubeError as exc:
            if exc.code not in (404, 503):
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise kopf.PermanentError(
                f"{PLURAL}.{API_GROUP}/{API_VERSION} is not served after {timeout:.0f}s: install the CRD (crds/) first"
            )
        await asyncio.sleep(2)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.resync


async def _resync_forever(memo: kopf.Memo) -> None:
    """The level-based timer: every period, one pass over every run. A kopf timer would do, but
    kopf puts a finalizer on every object with a timer, and a finalizer hangs deletion while the
    operator is down; this loop needs none."""
    period = tunables.reconcile_seconds()
    namespaces = tunables.namespaces() or [None]
    while True:
        await asyncio.sleep(period)
        for namespace in namespaces:
            try:
                runs = await memo.kube.list(path_of(RUN_API, KIND, namespace), "")
            except KubeError as exc:
                log.warning("cannot list runs for the periodic reconcile: %s", exc)
                continue
            await asyncio.gather(*(_resync_one(run["metadata"], memo) for run in runs))


async def _resync_one(meta: dict[str, Any], memo: kopf.Memo) -> None:
    try:
        await _pass(meta["namespace"], meta["name"], memo)
    except (kopf.TemporaryError, kopf.PermanentError) as exc:
        log.warning("periodic reconcile of %s/%s: %s", meta["namespace"], meta["name"], exc)
    except Exception:  # one run's bug must not stop the resync of every other run
        log.exception("periodic reconcile of %s/%s failed", meta["namespace"], meta["name"])


@dataclass
class _RunState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False


async def _pass(namespace: str, name: str, memo: kopf.Memo) -> None:
    """Reconcile one run; triggers that arrive during a pass coalesce into one more pass."""
    state: _RunState = memo.runs.setdefault((namespace, name), _RunState())
    state.dirty = True
    if state.lock.locked():
        return
    async with state.lock:
        while state.dirty:
            state.dirty = False
            await _reconcile_once(namespace, name, memo)


async def _reconcile_once(namespace: str, name: str, memo: kopf.Memo) -> None:
    with metrics.RECONCILE_SECONDS.time():
        try:
            await reconcile(memo.kube, namespace, name, memo.slots)
        except KubeError as exc:
            metrics.RECONCILES.labels(result="retry").inc()
            raise kopf.TemporaryError(f"API trouble, retrying: {exc}", delay=1 if exc.transient else 30) from exc
        except SpecError as exc:
            metrics.RECONCILES.labels(result="invalid").inc()
            raise kopf.PermanentError(str(exc)) from exc
    metrics.RECONCILES.labels(result="ok").inc()


def _managed_here(spec: kopf.Spec, **_: Any) -> bool:
    """Runs another controller manages (`spec.managedBy`) get no handler at all: kopf then writes
    nothing on them, not even its progress annotations."""
    return bool(spec.get("managedBy", names.MANAGER) == names.MANAGER)


@kopf.on.create(*RESOURCE, id="create", when=_managed_here)
async def on_create(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _pass(namespace, name, memo)


@kopf.on.resume(*RESOURCE, id="resume", when=_managed_here)
async def on_resume(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _pass(namespace, name, memo)


@kopf.on.update(*RESOURCE, field="spec", id="update", when=_managed_here)
async def on_update(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _pass(namespace, name, memo)


def _owner(meta: dict[str, Any]) -> str | None:
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller") and r.get("kind") == KIND]
    return refs[0]["name"] if refs else None


@kopf.on.event("v1", "pods", labels={names.RUN_LABEL: kopf.PRESENT}, id="pod-changed")
async def on_pod_event(namespace: str, meta: dict[str, Any], memo: kopf.Memo, **_: Any) -> None:
    """A run's pod changed (started, failed, finished, vanished): reconcile its run now rather
    than at the next timer tick."""
    run = _owner(meta)
    if run is not None:
        await _pass(namespace, run, memo)


@kopf.on.probe(id="runs")
def probe(**_: Any) -> int:
    """Runs this operator reconciles (the liveness endpoint reports it)."""
    return sum(int(sample.value) for sample in next(iter(metrics.RUNS.collect())).samples)
