"""The run state machine (`tlt_operator.lifecycle.decide`), a pure function, case by case."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tlt.spec.run import RunSpec
from tlt.spec.status import RunStatus
from tlt_operator.lifecycle import PodView, decide
from tlt_operator.main import build_parser
from tlt_operator.status_write import merge_diff

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SPEC = RunSpec.model_validate({"rollout": {"replicas": 2}})
NAMES = ["r-policy-0", "r-rollout-0", "r-rollout-1", "r-verifier-0"]
HASHES = {n: "h" for n in NAMES}


def pod(name: str, phase: str = "Running", owned: bool = True, spec_hash: str = "h") -> PodView:
    role, rank = name.split("-")[1], int(name.split("-")[2])
    return PodView(name, f"uid-{name}", role, rank, phase, phase == "Running", owned, spec_hash)


def all_running(**overrides: str) -> list[PodView]:
    return [pod(n, overrides.get(n, "Running")) for n in NAMES]


def spec(**fields: object) -> RunSpec:
    return SPEC.model_copy(update={k: v for k, v in fields.items()})


def test_all_pods_running_is_running_and_emits_one_event() -> None:
    d = decide(SPEC, RunStatus(phase="Pending"), all_running(), 1, NOW, HASHES)
    assert d.status.phase == "Running" and d.create_missing and not d.remove and not d.restart
    assert d.events == [("Normal", "AllPodsRunning", "4 pods running")]
    again = decide(SPEC, d.status, all_running(), 1, NOW, HASHES)
    assert again.events == [], "no event without a transition"


def test_missing_pod_is_pending_surplus_goes_and_strangers_are_left_alone() -> None:
    pods = all_running()[:3] + [pod("r-rollout-5"), pod("r-rollout-1", owned=False), pod("q-verifier-7", owned=False)]
    d = decide(SPEC, RunStatus(), pods, 1, NOW, HASHES)
    assert d.status.phase == "Pending" and d.create_missing
    assert {p.name for p in d.remove} == {"r-rollout-5"}, "only what the run owns is touched"
    assert "r-rollout-1" in d.status.message and "not this run's" in d.status.message


def test_changed_template_replaces_the_pod() -> None:
    d = decide(SPEC, RunStatus(), all_running(), 1, NOW, {**HASHES, "r-rollout-0": "new"})
    assert [p.name for p in d.remove] == ["r-rollout-0"]


def test_failures_restart_until_backoff_limit() -> None:
    base = RunSpec.model_validate({"rollout": {"replicas": 2}, "runPolicy": {"backoffLimit": 1}})
    d = decide(base, RunStatus(phase="Running", restarts=0), all_running(**{"r-rollout-1": "Failed"}), 1, NOW, HASHES)
    assert d.status.phase == "Restarting" and d.status.restarts == 1 and [p.name for p in d.restart] == ["r-rollout-1"]
    d = decide(base, d.status, all_running(**{"r-verifier-0": "Failed"}), 1, NOW, HASHES)
    assert d.status.phase == "Failed" and d.status.completion_time == NOW and not d.restart
    assert {p.name for p in d.remove} == set(NAMES) - {"r-verifier-0"}, "cleanPodPolicy Running"


def test_deadline_counts_from_start_time() -> None:
    timed = RunSpec.model_validate({"rollout": {"replicas": 2}, "runPolicy": {"activeDeadlineSeconds": 60}})
    started = RunStatus(phase="Running", start_time=NOW - timedelta(seconds=59))
    assert decide(timed, started, all_running(), 1, NOW, HASHES).status.phase == "Running"
    late = started.model_copy(update={"start_time": NOW - timedelta(seconds=61)})
    assert decide(timed, late, all_running(), 1, NOW, HASHES).status.phase == "Failed"


def test_suspend_removes_pods_and_clears_start_time() -> None:
    d = decide(spec(suspend=True), RunStatus(phase="Running", start_time=NOW), all_running(), 2, NOW, HASHES)
    assert d.status.phase == "Suspended" and d.status.start_time is None and not d.create_missing
    assert {p.name for p in d.remove} == set(NAMES)
    assert {c.type: c.status for c in d.status.conditions} == {"Suspended": "True"}


def test_coordinator_success_is_success_and_ttl_deletes_later() -> None:
    ttl = RunSpec.model_validate({"rollout": {"replicas": 2}, "runPolicy": {"ttlSecondsAfterFinished": 30}})
    d = decide(ttl, RunStatus(phase="Running"), all_running(**{"r-policy-0": "Succeeded"}), 1, NOW, HASHES)
    assert d.status.phase == "Succeeded" and not d.delete_run
    later = decide(ttl, d.status, [], 1, NOW + timedelta(seconds=30), HASHES)
    assert later.delete_run and later.status.phase == "Succeeded" and not later.create_missing


def test_status_patch_carries_only_what_changed() -> None:
    old = {"phase": "Running", "drafter": {"version": 1, "enabledSlots": ["a"]}, "message": "x"}
    new = {"phase": "Running", "drafter": {"version": 2, "enabledSlots": ["a"]}}
    assert merge_diff(old, new) == {"drafter": {"version": 2}, "message": None}
    assert merge_diff(old, old) is None


def test_operator_command_line_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.metrics_port, args.health_port) == (9090, 8080)
