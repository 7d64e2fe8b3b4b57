"""`HubKeeper.recover`: what makes a failed hub call worth making again."""

from __future__ import annotations

from ray.exceptions import RayActorError

from tlt.runtime.hub_keeper import HubKeeper
from tlt.workers.services import HubRestarted


def _keeper(awaiting: bool) -> HubKeeper:
    keeper = object.__new__(HubKeeper)
    keeper.hub, keeper.emit, keeper.restart_seconds = None, lambda *a, **k: None, 1.0
    keeper.learned, keeper.known, keeper.recoveries = {}, (3, {}), []
    keeper._wait_for_hub = lambda: {"awaiting": awaiting}  # type: ignore[method-assign]
    return keeper


def test_a_call_refused_before_the_hub_was_restored_elsewhere_is_made_again_without_a_second_restore():
    keeper = _keeper(awaiting=False)  # restored since the call (a prefetched pull) was made
    assert keeper.recover(HubRestarted("the drafter hub restarted"))
    assert keeper.recoveries == [], "no second restore, no second record"


def test_another_actors_loss_is_not_the_hubs_when_the_hub_answers_as_before():
    keeper = _keeper(awaiting=False)
    assert not keeper.recover(RayActorError())
