"""A step's drafters come from one hub pull, issued early when asked; the pulled object is handed on as
it is, and only a drafter that is not the hub's newest is put into a new object."""

from __future__ import annotations

import pytest

from tlt.runtime import served_drafter
from tlt.runtime.served_drafter import StepDrafters


class _Ref:
    def __init__(self, value):
        self.value = value


class _Hub:
    """`tlt.runtime.hub_keeper.HubKeeper`'s pulls, over a hub whose newest drafter is `newest`."""

    def __init__(self, newest):
        self.newest, self.pulls = newest, 0

    def pull_ref(self):
        self.pulls += 1
        version, params = self.newest
        return _Ref((version, params))  # a new object each pull, as Ray's deserialization gives

    def fetch(self, ref):
        return ref.value, ref


@pytest.fixture(autouse=True)
def _fake_ray(monkeypatch):
    monkeypatch.setattr(served_drafter.ray, "get", lambda ref: ref.value)
    monkeypatch.setattr(served_drafter.ray, "put", lambda value: _Ref(value))


def test_a_prefetched_pull_is_used_once_and_handed_on_as_it_is():
    hub = _Hub((3, "p3"))
    drafters = StepDrafters("latest")
    drafters.prefetch(hub)
    hub.newest = (4, "p4")  # a push after the prefetch would be missed: callers prefetch only when none can come
    served, candidate = drafters.refs(hub)
    assert hub.pulls == 1 and served.value == (3, "p3") and candidate is None
    assert drafters.served == (3, "p3")
    drafters.refs(hub)
    assert hub.pulls == 2, "a prefetched pull serves one step only"


def test_without_a_prefetch_the_step_pulls_and_forget_drops_a_prefetch():
    hub = _Hub((1, "p1"))
    drafters = StepDrafters("latest")
    drafters.prefetch(hub)
    drafters.forget()
    hub.newest = (2, "p2")
    served, _ = drafters.refs(hub)
    assert served.value == (2, "p2") and hub.pulls == 2


def test_validated_serves_the_kept_drafter_and_scores_the_hubs_newest():
    hub = _Hub((5, "p5"))
    drafters = StepDrafters("validated", served=(3, "p3"))
    drafters.prefetch(hub)
    pulled_served, pulled_candidate = drafters.refs(hub)
    assert pulled_served.value == (3, "p3") and pulled_candidate.value == (5, "p5")
    out = drafters.outcome([{"agree": 1, "agree_total": 4, "candidate_agree": 2, "candidate_total": 4}])
    assert out["drafter_promoted"] is True and drafters.served == (5, "p5") and drafters.candidate is None
    assert drafters.next_drafter((6, "p6")) == (5, "p5")
    assert StepDrafters("latest", served=(5, "p5")).next_drafter((6, "p6")) == (6, "p6")


def test_no_hub_no_drafters():
    assert StepDrafters("latest").refs(None) == (None, None)


def test_a_drafter_that_stays_served_keeps_its_object(monkeypatch):
    puts = []
    monkeypatch.setattr(served_drafter.ray, "put", lambda value: puts.append(value) or _Ref(value))
    hub = _Hub((1, "p1"))
    drafters = StepDrafters("validated", served=(0, "p0"))  # e.g. resumed from a checkpoint
    first, _ = drafters.refs(hub)
    assert puts == [(0, "p0")]
    drafters.outcome([{"agree": 3, "agree_total": 4, "candidate_agree": 1, "candidate_total": 4}])  # not promoted
    hub.newest = (2, "p2")
    again, candidate = drafters.refs(hub)
    assert again is first and puts == [(0, "p0")], "the kept drafter is not put again"
    drafters.outcome([{"agree": 1, "agree_total": 4, "candidate_agree": 3, "candidate_total": 4}])  # promoted
    promoted, none = drafters.refs(hub)
    assert promoted is candidate and none is None and puts == [(0, "p0")]
