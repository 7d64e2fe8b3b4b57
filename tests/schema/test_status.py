"""The status model: what the operator writes is what the CRD's status schema accepts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tlt.spec.crd_validate import validate_run
from tlt.spec.status import (
    PHASES,
    Condition,
    DrafterStatus,
    RoleStatus,
    RunStatus,
    StepStatus,
    set_condition,
    status_patch,
)

T0 = datetime(2026, 11, 22, 0, 0, 0, tzinfo=UTC)


def full_status() -> RunStatus:
    return RunStatus(
        phase="Running",
        conditions=[
            Condition(
                type="Ready",
                status="True",
                observed_generation=3,
                last_transition_time=T0,
                reason="PodsReady",
                message="all pods ready",
            )
        ],
        observed_generation=3,
        policy=RoleStatus(desired=1, ready=1, failed=0),
        rollout=RoleStatus(desired=2, ready=2, failed=0),
        verifier=RoleStatus(desired=1, ready=1, failed=0),
        replicas=2,
        selector="tlt.dev/run=r,tlt.dev/role=rollout",
        step=StepStatus(current=4, total=10, last_step_seconds=12.5, off_policy_fraction=0.25),
        drafter=DrafterStatus(
            version=3,
            accept_length=2.4,
            enabled_slots=["r-rollout-0"],
            active_trainers=1,
            idle_gpu_seconds=30.0,
            harvested_gpu_seconds=21.5,
        ),
        restarts=0,
        start_time=T0,
        message="step 4/10",
    )


def run_with(status: dict) -> dict:
    return {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": "r"},
        "spec": {},
        "status": status,
    }


def test_phases():
    assert PHASES == ("Pending", "Running", "Suspended", "Restarting", "Succeeded", "Failed")


def test_full_status_patch_is_camel_case_and_accepted_by_the_crd():
    patch = status_patch(full_status())
    assert patch["drafter"]["acceptLength"] == 2.4 and patch["step"]["lastStepSeconds"] == 12.5
    assert patch["step"]["offPolicyFraction"] == 0.25
    assert patch["conditions"][0]["lastTransitionTime"] == "2026-11-22T00:00:00Z"
    assert patch["conditions"][0]["observedGeneration"] == 3
    result = validate_run(run_with(patch))
    assert result.ok, result.messages()
    assert result.object["status"] == patch, "the CRD must keep (not prune) every status field the operator writes"


def test_partial_patch_leaves_unset_fields_out():
    assert status_patch(RunStatus(phase="Pending")) == {"phase": "Pending"}


def test_status_round_trips_through_the_patch():
    status = full_status()
    assert RunStatus.model_validate(status_patch(status)) == status


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ({"reason": "not camel"}, "reason"),
        ({"status": "Yes"}, "status"),
        ({"lastTransitionTime": "yesterday"}, "lastTransitionTime"),
        ({"type": ""}, "type"),
    ],
)
def test_bad_condition_rejected_by_model_and_crd(condition, field):
    good = {
        "type": "Ready",
        "status": "True",
        "lastTransitionTime": "2026-11-22T00:00:00Z",
        "reason": "PodsReady",
        "message": "",
    }
    bad = {**good, **condition}
    with pytest.raises(ValidationError):
        Condition.model_validate(bad)
    messages = validate_run(run_with({"conditions": [bad]})).messages()
    assert any(m.startswith(f"status.conditions[0].{field}:") for m in messages), messages


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_off_policy_fraction_outside_0_1_rejected_by_model_and_crd(value):
    with pytest.raises(ValidationError):
        StepStatus(off_policy_fraction=value)
    messages = validate_run(run_with({"step": {"offPolicyFraction": value}})).messages()
    assert any(m.startswith("status.step.offPolicyFraction:") for m in messages), messages


def test_condition_requires_message_like_metav1():
    with pytest.raises(ValidationError):
        Condition(type="Ready", status="True", last_transition_time=T0, reason="PodsReady")


def test_unknown_phase_rejected_by_model_and_crd():
    with pytest.raises(ValidationError):
        RunStatus(phase="Done")
    assert not validate_run(run_with({"phase": "Done"})).ok


def test_set_condition_keeps_transition_time_while_status_unchanged():
    first = Condition(type="Ready", status="False", last_transition_time=T0, reason="Starting", message="")
    later = T0 + timedelta(minutes=5)
    same = Condition(type="Ready", status="False", last_transition_time=later, reason="Waiting", message="pods")
    (cond,) = set_condition([first], same)
    assert cond.last_transition_time == T0 and cond.reason == "Waiting"
    flipped = Condition(type="Ready", status="True", last_transition_time=later, reason="PodsReady", message="")
    (cond,) = set_condition([first], flipped)
    assert cond.last_transition_time == later and cond.status == "True"


def test_set_condition_appends_new_types_and_keeps_others():
    ready = Condition(type="Ready", status="True", last_transition_time=T0, reason="PodsReady", message="")
    suspended = Condition(type="Suspended", status="False", last_transition_time=T0, reason="Running", message="")
    out = set_condition([ready], suspended)
    assert [c.type for c in out] == ["Ready", "Suspended"]


def test_one_condition_per_type_in_model_and_crd():
    cond = {
        "type": "Ready",
        "status": "True",
        "lastTransitionTime": "2026-11-22T00:00:00Z",
        "reason": "PodsReady",
        "message": "",
    }
    with pytest.raises(ValidationError, match="one entry per type"):
        RunStatus.model_validate({"conditions": [cond, {**cond, "status": "False"}]})
    messages = validate_run(run_with({"conditions": [cond, {**cond, "status": "False"}]})).messages()
    assert messages == ['status.conditions[1]: Duplicate value: {"type": "Ready"}']
