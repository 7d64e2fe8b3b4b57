"""The coordinator's side of the drafter hub: its calls, and the hub's restart on its own.

Ray restarts a lost hub's process (`ray_services.HUB_RESTARTS`); the restarted hub holds a fresh drafter and
refuses the drafter's calls until it is restored (`HubRestarted`). Every call the coordinator makes to the hub
goes through `HubKeeper`: when one fails because the hub was lost, the keeper waits for the restarted hub,
restores the drafter the coordinator last pulled from it (the drafters the run learns, their parameters and
version; the hub's own AdamW is not used by the spot trainers, which keep theirs) and makes the call again.
The step goes on; the served drafter never left the coordinator. What is lost: the trainers' pushes since that
pull (drafter updates only; the rollouts' tokens do not depend on them), and a trainer whose push failed stops
for the rest of its step. Event `hub_restarted`; the step's `recoveries` gain a record.

A hub that cannot come back (killed for good, out of restarts, not up within `RESTART_SECONDS`) leaves the
original failure to the step, which restarts from the newest checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError

from tlt.runtime.failure_kinds import LOST, cause_of, classify, failure_line
from tlt.workers.services import HubRestarted

log = logging.getLogger(__name__)

HUB = "drafter-hub"
RESTART_SECONDS = 120.0  # a restarted hub builds one drafter: seconds; its node's replacement can take longer
POLL_SECONDS = 0.2
Emit = Callable[..., None]
Drafter = tuple[int, Any]  # (version, parameters)


def hub_lost(exc: BaseException) -> bool:
    """True when `exc` (out of `ray.get` of a hub call) says the hub's process was lost or restarted."""
    restarted = isinstance(exc, HubRestarted) or isinstance(cause_of(exc), HubRestarted)
    return restarted or classify(exc) == LOST


class HubKeeper:
    """The hub actor `hub` and what restores it: the drafters it holds and the drafter last pulled from it."""

    def __init__(self, hub: Any, emit: Emit, restart_seconds: float = RESTART_SECONDS) -> None:
        self.hub = hub
        self.emit = emit
        self.restart_seconds = restart_seconds
        self.learned = ray.get(hub.drafters.remote())  # after the workers told it (`use_drafters`)
        self.known: Drafter = ray.get(hub.pull.remote())
        self.recoveries: list[dict[str, Any]] = []

    def pull_ref(self) -> Any:
        """An object ref of the hub's newest (version, parameters); resolve it with `fetch`."""
        return self.hub.pull.remote()

    def fetch(self, pulled: Any) -> tuple[Drafter, Any]:
        """(the drafter of `pulled`, its object ref): a ref of a new pull when the hub was lost meanwhile."""
        try:
            newest = ray.get(pulled)
        except Exception as exc:
            if not self.recover(exc):
                raise
            pulled = self.pull_ref()
            newest = ray.get(pulled)
        self.known = newest
        return newest, pulled

    def pull(self) -> Drafter:
        return self.fetch(self.pull_ref())[0]

    def call(self, method: str, *args: Any) -> Any:
        """`method(*args)` of the hub, made again once after the hub was lost and restored."""
        try:
            return ray.get(getattr(self.hub, method).remote(*args))
        except Exception as exc:
            if not self.recover(exc):
                raise
            return ray.get(getattr(self.hub, method).remote(*args))

    def recover(self, exc: BaseException) -> bool:
        """After `exc`: when the hub was lost and Ray restarted it, restore it (`HubWorker.restore`) and return
        True (also when it was restored since `exc`'s call: the call may be made again); False when `exc` is not
        the hub's loss, or the hub does not come back."""
        if not hub_lost(exc):
            return False
        status = self._wait_for_hub()
        if status is None:
            return False
        if not status["awaiting"]:
            # restored since the failed call was made (a ref taken before, e.g. a prefetched pull): made again;
            # any other failure was not the hub's loss (it answers as before)
            return isinstance(exc, HubRestarted) or isinstance(cause_of(exc), HubRestarted)
        version, params = self.known
        ray.get(self.hub.restore.remote(self.learned, version, params))
        record = {"lost": HUB, "reason": failure_line(exc), "restored_version": version, "at": time.time()}
        log.warning("the drafter hub was lost (%s): restarted, its drafter at version %d", record["reason"], version)
        self.recoveries.append(record)
        self.emit("hub_restarted", **record)
        return True

    def _wait_for_hub(self) -> dict[str, Any] | None:
        """The hub's `ping` once it answers (Ray refuses calls while it restarts); None: gone for good, or not
        back within `restart_seconds`."""
        deadline = time.monotonic() + self.restart_seconds
        while True:
            try:
                return ray.get(self.hub.ping.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            except ActorUnavailableError:  # restarting: its new process is not up yet
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_SECONDS)
            except GetTimeoutError:
                break
            except Exception as probe:
                if classify(probe) != LOST:
                    raise
                return None  # died for good (killed without restart, out of restarts): the step fails
        log.error("the drafter hub was lost and is not back after %.0f s", self.restart_seconds)
        return None

    def take_recoveries(self) -> list[dict[str, Any]]:
        """The hub's restarts since the last call (records for the step's `recoveries`)."""
        out, self.recoveries = self.recoveries, []
        return out
