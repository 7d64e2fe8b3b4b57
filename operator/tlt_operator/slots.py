"""The operator's slow-timescale decision: which rollout pods' drafter-trainer slots are enabled.

An enabled slot is a permission, not a command: the coordinator (fast timescale) starts a
trainer only in an enabled slot and only while that worker is IDLE, and stops it the moment
rollout needs the device. This module decides the permissions from what the operator sees
every poll, as ONE pure function, `decide_slots`, with no clock, no I/O and no Kubernetes.

What a pod is doing: `classify` combines the worker state the pod reports (GENERATING / IDLE /
TRAINING, with the time it entered that state) and, when Prometheus is configured, DCGM GPU
utilisation samples. Utilisation alone cannot tell rollout load from trainer load, hence:

    reported     utilisation since the report  verdict  since
    GENERATING   any                           BUSY     the report (rollout load)
    TRAINING     any                           IDLE     the report (trainer load: slot in use, kept)
    IDLE         none, or latest < idle        IDLE     the report, or the start of the low run
                                                        when a high sample came after the report
    IDLE         latest >= idle                BUSY     start of the high run (the GPU is used by
                                                        something the worker does not report)
    (none)       latest < idle                 IDLE     start of the low run
    (none)       latest >= idle                BUSY     start of the high run
    (none)       none                          UNKNOWN  -  (the slot stays as it is)

"Run": the trailing samples on the same side of `idleUtilization`; its start is the first of
them (a lower bound on how long the condition has held). For a reported state only samples
taken at or after the report count: older ones describe the previous state.

How slots change (`enabledSlots: auto`): a slot turns on after its pod has been IDLE for
`idleWindowSeconds` and off after BUSY for `busyWindowSeconds` (hysteresis: in between, and
for UNKNOWN, it stays as it is); no slot changes twice within `cooldownSeconds`. Then the
bounds, which override the windows and the cooldown: at most `maxTrainers` enabled (those
already enabled kept first, then the longest idle, then by name); at least `minTrainers`
(already enabled first, then pods out of cooldown, then IDLE longest, UNKNOWN, BUSY shortest,
then by name). `all` enables every pod and `none` none, immediately; `all` still stops at
`maxTrainers`. Pods that disappeared lose their slot and their history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tlt.spec.run import DrafterSpec
from tlt.spec.status import DrafterStatus


class WorkerState(StrEnum):
    """What a rollout worker reports about itself on its pod."""

    GENERATING = "GENERATING"
    IDLE = "IDLE"
    TRAINING = "TRAINING"


class Verdict(StrEnum):
    """What the operator concludes about a pod's device, for the slot decision."""

    IDLE = "IDLE"
    BUSY = "BUSY"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class UtilSample:
    """One GPU-utilisation reading of a pod: `at` in epoch seconds, `value` in [0, 1]."""

    at: float
    value: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"utilisation sample value must be in [0, 1], got {self.value}")


@dataclass(frozen=True)
class PodObservation:
    """What the operator sees of one rollout pod in one poll.

    state / state_since: the reported worker state and when it was entered (epoch seconds);
        both or neither.
    utilization: recent samples of the pod's GPU utilisation (any order), empty without Prometheus.
    """

    name: str
    state: WorkerState | None = None
    state_since: float | None = None
    utilization: tuple[UtilSample, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("pod observation needs a non-empty name")
        if self.state is not None:
            allowed = [s.value for s in WorkerState]
            if self.state not in allowed:
                raise ValueError(f"pod {self.name}: state must be one of {allowed}, got {self.state!r}")
            object.__setattr__(self, "state", WorkerState(self.state))
        object.__setattr__(self, "utilization", tuple(self.utilization))
        if (self.state is None) != (self.state_since is None):
            raise ValueError(f"pod {self.name}: state and state_since must be given together")


@dataclass(frozen=True)
class SlotState:
    """The decision carried from one poll to the next.

    enabled: pods whose slot is enabled. last_change: when each pod's slot last changed.
    """

    enabled: frozenset[str] = frozenset()
    last_change: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form, e.g. for the run's status."""
        return {"enabled": sorted(self.enabled), "lastChange": dict(sorted(self.last_change.items()))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlotState:
        return cls(
            frozenset(str(p) for p in data.get("enabled", ())),
            {str(p): float(t) for p, t in data.get("lastChange", {}).items()},
        )


@dataclass(frozen=True)
class PodDecision:
    """One pod's outcome: slot enabled or not, the verdict behind it and why, in words."""

    enabled: bool
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class SlotDecision:
    """Result of `decide_slots`: the enabled set, per-pod reasons (gone pods included), next state."""

    enabled: frozenset[str]
    pods: Mapping[str, PodDecision]
    state: SlotState
    turned_on: frozenset[str]
    turned_off: frozenset[str]


def _trailing_run(samples: Iterable[UtilSample], idle_utilization: float) -> tuple[bool, float] | None:
    """(latest sample is idle, time of the first sample of the trailing same-side run); None if empty."""
    ordered = sorted(samples, key=lambda s: s.at)
    if not ordered:
        return None
    idle = ordered[-1].value < idle_utilization
    start = len(ordered) - 1
    while start > 0 and (ordered[start - 1].value < idle_utilization) == idle:
        start -= 1
    return idle, ordered[start].at


def classify(pod: PodObservation, idle_utilization: float) -> tuple[Verdict, float | None, str]:
    """(verdict, since when, why) for one pod, per the truth table in the module docstring."""
    if pod.state is not None and pod.state_since is not None:
        if pod.state is WorkerState.GENERATING:
            return Verdict.BUSY, pod.state_since, "worker reports GENERATING"
        if pod.state is WorkerState.TRAINING:
            return Verdict.IDLE, pod.state_since, "worker reports TRAINING (trainer load)"
        after = [s for s in pod.utilization if s.at >= pod.state_since]
        run = _trailing_run(after, idle_utilization)
        if run is None:
            return Verdict.IDLE, pod.state_since, "worker reports IDLE"
        idle, start = run
        if not idle:
            return Verdict.BUSY, start, f"worker reports IDLE but GPU utilisation >= {idle_utilization:g}"
        since = pod.state_since if start == min(s.at for s in after) else start
        return Verdict.IDLE, since, f"worker reports IDLE, GPU utilisation < {idle_utilization:g}"
    run = _trailing_run(pod.utilization, idle_utilization)
    if run is None:
        return Verdict.UNKNOWN, None, "no reported state and no utilisation"
    idle, start = run
    side = "<" if idle else ">="
    return (Verdict.IDLE if idle else Verdict.BUSY), start, f"GPU utilisation {side} {idle_utilization:g}"


def record_utilization(
    history: Mapping[str, tuple[UtilSample, ...]], reading: Mapping[str, float], at: float, horizon: float
) -> dict[str, tuple[UtilSample, ...]]:
    """History with one poll's `reading` ({pod: utilisation}) appended at `at`, samples older than
    `horizon` seconds dropped. Keep horizon >= the longer window plus one poll, or windows are never reached.
    """
    merged: dict[str, tuple[UtilSample, ...]] = {}
    for pod in sorted(set(history) | set(reading)):
        samples = [s for s in history.get(pod, ()) if s.at >= at - horizon]
        if pod in reading:
            samples.append(UtilSample(at, min(1.0, max(0.0, reading[pod]))))
        if samples:
            merged[pod] = tuple(samples)
    return merged


def _fmt(seconds: float) -> str:
    return f"{seconds:.0f}s"


def _window_rule(verdict: Verdict, held: float, enabled: bool, spec: DrafterSpec) -> tuple[bool, str]:
    """(slot wanted, why) from the windows alone: on after idleWindow, off after busyWindow, else kept."""
    if verdict is Verdict.IDLE and held >= spec.idle_window_seconds:
        return True, f"idle {_fmt(held)} >= idleWindowSeconds {spec.idle_window_seconds}"
    if verdict is Verdict.BUSY and held >= spec.busy_window_seconds:
        return False, f"busy {_fmt(held)} >= busyWindowSeconds {spec.busy_window_seconds}"
    if verdict is Verdict.UNKNOWN:
        return enabled, "nothing observed, kept"
    window = "idleWindowSeconds" if verdict is Verdict.IDLE else "busyWindowSeconds"
    return enabled, f"{verdict.lower()} {_fmt(held)} < {window}, kept"


def decide_slots(pods: Iterable[PodObservation], previous: SlotState, now: float, spec: DrafterSpec) -> SlotDecision:
    """Enabled trainer slots for this poll; pure and deterministic (ties break by pod name).

    pods: the run's rollout pods now. previous: the last decision's state (`SlotState()` at first).
    now: epoch seconds. spec: the run's `drafter` section (the knobs named in the module docstring).
    """
    observed = list(pods)
    names = [p.name for p in observed]
    if len(set(names)) != len(names):
        raise ValueError(f"pod names must be unique, got {sorted(names)}")
    verdicts = {p.name: classify(p, spec.idle_utilization) for p in observed}
    held = {n: max(0.0, now - since) if since is not None else 0.0 for n, (_, since, _) in verdicts.items()}
    current = {n: n in previous.enabled for n in names}

    def cooling(name: str) -> float:
        last = previous.last_change.get(name)
        return 0.0 if last is None else max(0.0, spec.cooldown_seconds - (now - last))

    want: dict[str, bool] = {}
    why: dict[str, str] = {}
    for name in sorted(names):
        verdict, _, what = verdicts[name]
        if spec.enabled_slots != "auto":
            want[name] = spec.enabled_slots == "all"
            why[name] = f"enabledSlots={spec.enabled_slots}"
            continue
        target, rule = _window_rule(verdict, held[name], current[name], spec)
        if target != current[name] and cooling(name) > 0:
            target, rule = current[name], f"{rule}; cooldown {_fmt(cooling(name))} left, kept"
        want[name], why[name] = target, f"{what}; {rule}"

    def idle_first(name: str) -> tuple[int, float, str]:
        verdict = verdicts[name][0]
        order = {Verdict.IDLE: 0, Verdict.UNKNOWN: 1, Verdict.BUSY: 2}[verdict]
        return order, -held[name] if verdict is Verdict.IDLE else held[name], name

    enabled = {n for n in names if want[n]}
    if len(enabled) > spec.max_trainers:
        keep = sorted(enabled, key=lambda n: (not current[n], idle_first(n)))[: spec.max_trainers]
        for name in enabled - set(keep):
            why[name] += f"; maxTrainers {spec.max_trainers} reached"
        enabled = set(keep)
    if spec.enabled_slots == "auto" and len(enabled) < spec.min_trainers:
        spare = sorted(set(names) - enabled, key=lambda n: (not current[n], cooling(n) > 0, idle_first(n)))
        for name in spare[: spec.min_trainers - len(enabled)]:
            why[name] += f"; enabled to keep minTrainers {spec.min_trainers}"
            enabled.add(name)

    gone = previous.enabled - set(names)
    turned_on = frozenset(n for n in enabled if not current[n])
    turned_off = frozenset(n for n in names if current[n] and n not in enabled) | gone
    decisions = {n: PodDecision(n in enabled, verdicts[n][0], why[n]) for n in sorted(names)}
    for name in sorted(gone):
        decisions[name] = PodDecision(False, Verdict.UNKNOWN, "pod gone, slot released")
    last_change = {n: t for n, t in previous.last_change.items() if n in current}
    last_change.update({n: now for n in turned_on | (turned_off & set(names))})
    state = SlotState(frozenset(enabled), last_change)
    return SlotDecision(frozenset(enabled), decisions, state, turned_on, turned_off)


@dataclass(frozen=True)
class SlotOutcome:
    """One poll's result: the drafter status to write, events, the decision, GPU-seconds added."""

    drafter: DrafterStatus
    events: list[tuple[str, str, str]]
    decision: SlotDecision
    idle_gpu_seconds: float
    harvested_gpu_seconds: float
