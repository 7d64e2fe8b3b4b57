"""Training on a cluster (`train` with `mode: cluster`): create a `TLTTrainingRun`, follow it to the end.

The run is created through the Kubernetes API (the operator does the rest); its `.status` is
polled every `poll_seconds` and progress (phase, step, accept length) is logged when it changes.
`Succeeded` returns the final status; `Failed` raises `RunFailed` with the operator's message.
When the component is cancelled (KFP deletes its pod: SIGTERM) or gives up (`timeout_seconds`),
the run is deleted before the component exits, so no orphaned run keeps its GPUs. Transient API
errors (429, 5xx) are retried a few times; a run deleted by someone else fails the component.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tlt.spec.run import API_GROUP, API_VERSION, PLURAL, TLTTrainingRun

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = (429, 500, 502, 503, 504)
MAX_TRANSIENT_ERRORS = 5
PIPELINE_LABEL = "tlt.dev/created-by"


class RunFailed(RuntimeError):
    """The run ended Failed, or vanished while it was followed."""


class RunCancelled(BaseException):
    """The component was asked to stop (SIGTERM); a BaseException so no `except Exception` eats it."""


def custom_objects_api() -> client.CustomObjectsApi:
    """A client for the cluster this process runs in, or the current kubeconfig context outside one."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CustomObjectsApi()


def run_manifest(run: TLTTrainingRun, *, namespace: str, name: str) -> dict[str, Any]:
    """The TLTTrainingRun to create: the validated spec under `name`, or a generated name from the
    run's `metadata.name` when `name` is empty."""
    body = run.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
    labels = dict(body["metadata"].get("labels") or {})
    labels[PIPELINE_LABEL] = "kubeflow-pipelines"
    metadata: dict[str, Any] = {"namespace": namespace, "labels": labels}
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = f"{run.metadata.name}-"
    body["metadata"] = metadata
    return body


def _progress(status: dict[str, Any]) -> tuple[Any, ...]:
    step = status.get("step") or {}
    drafter = status.get("drafter") or {}
    return status.get("phase"), step.get("current"), step.get("total"), drafter.get("acceptLength")


def _failure_message(status: dict[str, Any]) -> str:
    if status.get("message"):
        return str(status["message"])
    failed = [c for c in status.get("conditions") or [] if c.get("type") == "Failed"]
    return f"{failed[0].get('reason')}: {failed[0].get('message')}" if failed else "no message in status"


def follow_run(
    api: client.CustomObjectsApi,
    namespace: str,
    name: str,
    *,
    poll_seconds: float,
    timeout_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll the run's status until Succeeded (return it) or Failed (RunFailed); TimeoutError after
    `timeout_seconds` (0: no limit)."""
    deadline = clock() + timeout_seconds if timeout_seconds > 0 else None
    last: tuple[Any, ...] | None = None
    errors = 0
    while True:
        try:
            obj = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
            errors = 0
        except ApiException as exc:
            if exc.status == 404:
                raise RunFailed(f"TLTTrainingRun {namespace}/{name} was deleted while it was followed") from None
            if exc.status not in TRANSIENT_STATUSES or errors >= MAX_TRANSIENT_ERRORS:
                raise
            errors += 1
            log.warning(
                "reading TLTTrainingRun %s/%s failed (%s %s); retrying", namespace, name, exc.status, exc.reason
            )
            sleep(poll_seconds)
            continue
        status = obj.get("status") or {}
        progress = _progress(status)
        if progress != last:
            phase, current, total, accept = progress
            log.info(
                "TLTTrainingRun %s/%s: phase %s, step %s/%s, accept length %s",
                namespace,
                name,
                phase,
                current,
                total,
                accept,
            )
            last = progress
        if status.get("phase") == "Succeeded":
            return status
        if status.get("phase") == "Failed":
            raise RunFailed(f"TLTTrainingRun {namespace}/{name} failed: {_failure_message(status)}")
        if deadline is not None and clock() >= deadline:
            raise TimeoutError(f"TLTTrainingRun {namespace}/{name} did not finish within {timeout_seconds:g} s")
        sleep(poll_seconds)


def delete_run(api: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Delete the run (its children go with it by owner references); already gone is fine."""
    try:
        api.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        log.info("deleted TLTTrainingRun %s/%s", namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _raise_cancelled(signum: int, _frame: Any) -> None:
    raise RunCancelled(f"signal {signal.Signals(signum).name}")


@contextmanager
def cancellable() -> Iterator[None]:
    """Turn SIGTERM into RunCancelled while inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_cancelled)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_on_cluster(
    run: TLTTrainingRun,
    *,
    namespace: str,
    name: str,
    poll_seconds: float,
    timeout_seconds: float,
    api: client.CustomObjectsApi | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, dict[str, Any]]:
    """Create the run and follow it; returns (its name, its final status). The run is deleted when
    this is cancelled or times out; a Failed run is left in place for inspection."""
    api = api if api is not None else custom_objects_api()
    with cancellable():
        created = api.create_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, run_manifest(run, namespace=namespace, name=name)
        )
        actual = created["metadata"]["name"]
        log.info("created TLTTrainingRun %s/%s", namespace, actual)
        try:
            return actual, follow_run(
                api, namespace, actual, poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, sleep=sleep
            )
        except (RunCancelled, KeyboardInterrupt, TimeoutError):
            delete_run(api, namespace, actual)
            raise
