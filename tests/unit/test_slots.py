"""The operator's trainer-slot decision (tlt_operator.slots): windows, hysteresis, cooldown, bounds."""

from __future__ import annotations

import random

import pytest

from tlt.spec.run import DrafterSpec
from tlt_operator.slots import (
    PodObservation,
    SlotState,
    UtilSample,
    Verdict,
    WorkerState,
    classify,
    decide_slots,
    record_utilization,
)

IDLE, BUSY = 0.05, 0.9


def _spec(**knobs) -> DrafterSpec:
    base = dict(
        idle_window_seconds=10,
        busy_window_seconds=5,
        cooldown_seconds=30,
        min_trainers=0,
        max_trainers=2,
        idle_utilization=0.2,
    )
    return DrafterSpec(**(base | knobs))


def _pod(name: str, state: str | None = None, since: float | None = None, util=()) -> PodObservation:
    samples = tuple(s if isinstance(s, UtilSample) else UtilSample(*s) for s in util)
    return PodObservation(name, state, since, samples)


def _poll_utilisation(
    spec: DrafterSpec, series: dict[str, list[float]], poll: float = 5.0, state: SlotState | None = None
) -> list[frozenset[str]]:
    """Feed per-poll utilisation readings (no reported state) through history and the decision."""
    state, history, enabled = state or SlotState(), {}, []
    for i in range(len(next(iter(series.values())))):
        now = i * poll
        history = record_utilization(history, {p: v[i] for p, v in series.items()}, now, horizon=60)
        decision = decide_slots([_pod(p, util=history[p]) for p in series], state, now, spec)
        state = decision.state
        enabled.append(decision.enabled)
    return enabled


@pytest.mark.parametrize(
    ("pod", "verdict", "since"),
    [
        (_pod("p", "GENERATING", 3.0, [(4.0, IDLE)]), Verdict.BUSY, 3.0),
        (_pod("p", "TRAINING", 3.0, [(4.0, BUSY)]), Verdict.IDLE, 3.0),
        (_pod("p", "IDLE", 3.0), Verdict.IDLE, 3.0),
        (_pod("p", "IDLE", 3.0, [(1.0, BUSY), (4.0, IDLE)]), Verdict.IDLE, 3.0),
        (_pod("p", "IDLE", 3.0, [(4.0, BUSY), (6.0, IDLE)]), Verdict.IDLE, 6.0),
        (_pod("p", "IDLE", 3.0, [(4.0, IDLE), (6.0, BUSY), (8.0, BUSY)]), Verdict.BUSY, 6.0),
        (_pod("p", None, None, [(2.0, BUSY), (4.0, IDLE), (6.0, IDLE)]), Verdict.IDLE, 4.0),
        (_pod("p", None, None, [(6.0, BUSY), (2.0, IDLE)]), Verdict.BUSY, 6.0),
        (_pod("p"), Verdict.UNKNOWN, None),
    ],
    ids=[
        "generating-is-rollout-load",
        "training-is-trainer-load",
        "idle-report",
        "old-busy-sample-ignored",
        "idle-after-busy-sample",
        "idle-report-but-gpu-busy",
        "util-only-idle",
        "util-only-unsorted",
        "nothing-known",
    ],
)
def test_truth_table_combines_reported_state_and_utilisation(pod, verdict, since):
    assert classify(pod, idle_utilization=0.2)[:2] == (verdict, since)


def test_idle_pod_is_enabled_only_after_the_idle_window():
    spec = _spec()
    early = decide_slots([_pod("a", "IDLE", 0.0)], SlotState(), 9.0, spec)
    assert early.enabled == frozenset()
    late = decide_slots([_pod("a", "IDLE", 0.0)], early.state, 10.0, spec)
    assert late.enabled == {"a"} and late.turned_on == {"a"}
    assert "idleWindowSeconds" in late.pods["a"].reason


def test_busy_pod_keeps_its_slot_until_the_busy_window_passes():
    spec = _spec(cooldown_seconds=0)
    state = SlotState(frozenset({"a"}), {"a": 0.0})
    kept = decide_slots([_pod("a", "GENERATING", 100.0)], state, 104.0, spec)
    assert kept.enabled == {"a"}
    dropped = decide_slots([_pod("a", "GENERATING", 100.0)], kept.state, 105.0, spec)
    assert dropped.enabled == frozenset() and dropped.turned_off == {"a"}


def test_no_flapping_under_oscillating_utilisation():
    spec = _spec()
    fast = [IDLE, BUSY] * 60
    assert set(_poll_utilisation(spec, {"a": fast})) == {frozenset()}
    on = SlotState(frozenset({"a"}))
    assert set(_poll_utilisation(spec, {"a": fast}, state=on)) == {frozenset({"a"})}


def test_slow_oscillation_changes_a_slot_at_most_once_per_cooldown():
    spec = _spec(cooldown_seconds=30)
    slow = ([IDLE] * 3 + [BUSY] * 3) * 20  # 15 s idle, 15 s busy: both windows are met each time
    enabled = _poll_utilisation(spec, {"a": slow})
    changes = [i * 5.0 for i in range(1, len(enabled)) if enabled[i] != enabled[i - 1]]
    assert changes, "the slot never turned on although each idle phase outlasts the idle window"
    assert all(b - a >= spec.cooldown_seconds for a, b in zip(changes, changes[1:]))


def test_never_more_than_max_trainers_and_ties_break_by_name():
    spec = _spec(max_trainers=2)
    pods = [_pod(n, "IDLE", 0.0) for n in ["e", "c", "a", "d", "b"]]
    decision = decide_slots(pods, SlotState(), 60.0, spec)
    assert decision.enabled == {"a", "b"}
    assert "maxTrainers 2 reached" in decision.pods["c"].reason


def test_longest_idle_pods_win_the_free_slots():
    spec = _spec(max_trainers=1)
    decision = decide_slots([_pod("a", "IDLE", 40.0), _pod("b", "IDLE", 10.0)], SlotState(), 60.0, spec)
    assert decision.enabled == {"b"}


def test_enabled_slots_are_kept_before_new_idle_pods_take_them():
    spec = _spec(max_trainers=1)
    state = SlotState(frozenset({"b"}), {"b": 0.0})
    decision = decide_slots([_pod("a", "IDLE", 0.0), _pod("b", "TRAINING", 50.0)], state, 60.0, spec)
    assert decision.enabled == {"b"} and decision.turned_on == frozenset()


def test_min_trainers_kept_even_when_every_pod_is_busy_without_churn():
    spec = _spec(min_trainers=1)
    pods = [_pod(n, "GENERATING", 0.0) for n in ["b", "a", "c"]]
    state, seen = SlotState(), []
    for now in range(0, 300, 5):
        decision = decide_slots(pods, state, float(now), spec)
        state = decision.state
        seen.append(decision.enabled)
    assert set(seen) == {frozenset({"a"})}
    assert "minTrainers 1" in decide_slots(pods, SlotState(), 0.0, spec).pods["a"].reason


def test_cooldown_holds_a_slot_that_just_changed():
    spec = _spec(cooldown_seconds=30, busy_window_seconds=0)
    on = decide_slots([_pod("a", "IDLE", 0.0)], SlotState(), 10.0, spec)
    assert on.enabled == {"a"}
    state, first_off = on.state, None
    for now in range(15, 60, 5):
        decision = decide_slots([_pod("a", "GENERATING", 12.0)], state, float(now), spec)
        state = decision.state
        if not decision.enabled and first_off is None:
            first_off = now
    assert first_off == 40
    held = decide_slots([_pod("a", "GENERATING", 12.0)], on.state, 20.0, spec)
    assert "cooldown 20s left" in held.pods["a"].reason


def test_pods_that_disappear_release_their_slot_to_the_next_idle_pod():
    spec = _spec(max_trainers=1)
    first = decide_slots([_pod("a", "IDLE", 0.0), _pod("b", "IDLE", 0.0)], SlotState(), 20.0, spec)
    assert first.enabled == {"a"}
    after = decide_slots([_pod("b", "IDLE", 0.0)], first.state, 25.0, spec)
    assert after.enabled == {"b"}
    assert after.turned_off == {"a"} and after.pods["a"].reason == "pod gone, slot released"
    assert "a" not in after.state.last_change


def test_unknown_pods_keep_their_slot():
    spec = _spec()
    state = SlotState(frozenset({"a"}), {"a": 0.0})
    decision = decide_slots([_pod("a"), _pod("b")], state, 100.0, spec)
    assert decision.enabled == {"a"}
    assert decision.pods["b"].verdict is Verdict.UNKNOWN


def test_training_pod_with_a_busy_gpu_stays_enabled_but_idle_report_with_busy_gpu_does_not():
    spec = _spec(cooldown_seconds=0)
    state = SlotState(frozenset({"t", "i"}), {})
    pods = [
        _pod("t", "TRAINING", 0.0, [(10.0, BUSY), (20.0, BUSY)]),
        _pod("i", "IDLE", 0.0, [(10.0, BUSY), (20.0, BUSY)]),
    ]
    decision = decide_slots(pods, state, 20.0, spec)
    assert decision.enabled == {"t"}


def test_lowered_max_trainers_drops_slots_even_in_cooldown():
    state = SlotState(frozenset({"a", "b", "c"}), {"a": 99.0, "b": 99.0, "c": 99.0})
    pods = [_pod(n, "TRAINING", 0.0) for n in "abc"]
    decision = decide_slots(pods, state, 100.0, _spec(max_trainers=1))
    assert decision.enabled == {"a"} and decision.turned_off == {"b", "c"}


def test_fixed_modes_all_and_none():
    pods = [_pod(n, "GENERATING", 0.0) for n in "cab"]
    assert decide_slots(pods, SlotState(), 1.0, _spec(enabled_slots="all", max_trainers=2)).enabled == {"a", "b"}
    state = SlotState(frozenset({"a"}), {"a": 0.5})
    assert decide_slots(pods, state, 1.0, _spec(enabled_slots="none", min_trainers=1)).enabled == frozenset()


def test_random_polls_respect_the_bounds_and_input_order():
    rng = random.Random(0)
    spec = _spec(min_trainers=1, max_trainers=3, cooldown_seconds=10)
    names = [f"pod-{i}" for i in range(7)]
    state, since = SlotState(), {n: (0.0, "IDLE") for n in names}
    for step in range(200):
        now = step * 3.0
        for n in names:
            if rng.random() < 0.2:
                since[n] = (now, rng.choice(["IDLE", "GENERATING", "TRAINING"]))
        present = [n for n in names if rng.random() < 0.9]
        pods = [_pod(n, since[n][1], since[n][0], [(now, rng.random())]) for n in present]
        decision = decide_slots(pods, state, now, spec)
        shuffled = decide_slots(rng.sample(pods, len(pods)), state, now, spec)
        assert shuffled == decision
        assert len(decision.enabled) <= spec.max_trainers
        assert len(decision.enabled) >= min(spec.min_trainers, len(present))
        assert decision.enabled <= set(present)
        state = decision.state


def test_state_round_trips_through_its_dict_form():
    state = SlotState(frozenset({"b", "a"}), {"a": 1.5, "b": 2.0})
    assert SlotState.from_dict(state.to_dict()) == state


def test_record_utilization_appends_and_forgets_old_samples():
    history = record_utilization({}, {"a": 0.5}, 0.0, horizon=10)
    history = record_utilization(history, {"a": 1.5, "b": 0.1}, 5.0, horizon=10)
    history = record_utilization(history, {"b": 0.2}, 12.0, horizon=10)
    assert history == {"a": (UtilSample(5.0, 1.0),), "b": (UtilSample(5.0, 0.1), UtilSample(12.0, 0.2))}


def test_bad_observations_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="state and state_since"):
        PodObservation("a", WorkerState.IDLE)
    with pytest.raises(ValueError, match="state must be one of"):
        PodObservation("a", "SLEEPING", 0.0)
    with pytest.raises(ValueError, match="utilisation sample"):
        UtilSample(0.0, 42.0)
    with pytest.raises(ValueError, match="unique"):
        decide_slots([_pod("a"), _pod("a")], SlotState(), 0.0, _spec())
