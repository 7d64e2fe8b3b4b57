"""Cluster-style trainer timing and failure recovery, on one local Ray run.

Trainers stop before the next step's first rollout token (`stop_trainers_at="rollout"`, rollout
pods with their own devices), so both workers' trainers harvest the policy update together and
update one drafter. The drafter hub is killed for good in the middle of step 2 (`ray.kill` without a restart:
a hub that cannot come back; a lost rollout worker, verifier or hub process costs no step:
tests/e2e/test_shard_retry_run.py): the step fails, the run
restarts from its step-1 checkpoint (counted against runPolicy.backoffLimit, and said so in the
events) and finishes; what the checkpoint held (metrics, drafter version) is carried on, not lost.
"""

from __future__ import annotations

import json

import pytest
import ray

from tlt.checkpoint.store import load_checkpoint
from tlt.runtime.ray_executor import ray_trainer
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.warmstart import reduced_config

pytestmark = pytest.mark.slow

SPEC = {
    "model": {"dtype": "float32", "maxContext": 256},
    "dataset": {"builtin": {"numTrain": 64, "numEval": 16}},
    "algorithm": {"steps": 3, "promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 96, "microBatchSize": 16},
    "rollout": {"replicas": 2},
    "speculative": {"mode": "tlt"},
    "drafter": {"enabledSlots": "all", "batchTokens": 128},
    "checkpoint": {"intervalSteps": 1, "keep": 5},
    "runPolicy": {"backoffLimit": 2},
}


@pytest.fixture(scope="module")
def recovered_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ray-recovery")
    run = TLTTrainingRun.model_validate({"metadata": {"name": "recovery"}, "spec": SPEC})
    holder: dict = {"killed": None, "checkpoint_1": None}

    def kill_in_step_2(event: dict) -> None:
        if event["type"] == "phase" and event["phase"] == "rollout" and event["step"] == 2 and not holder["killed"]:
            holder["checkpoint_1"] = load_checkpoint(out / "checkpoints" / "step-00000001")
            victim = holder["trainer"].executor.actors.hub
            ray.kill(victim, no_restart=True)
            holder["killed"] = True

    try:
        trainer = ray_trainer(
            run, out, warmstart=reduced_config(), num_cpus=2, on_event=kill_in_step_2, stop_trainers_at="rollout"
        )
        holder["trainer"] = trainer
        prefetch, holder["prefetched_after"] = trainer.executor.drafters.prefetch, []

        def spy(hub):  # records each call, then pulls as before
            holder["prefetched_after"].append(trainer.step)
            prefetch(hub)

        trainer.executor.drafters.prefetch = spy
        history = trainer.train()
    finally:
        ray.shutdown()
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return trainer, history, events, holder


def test_a_killed_hub_fails_the_step_and_the_run_recovers_from_its_checkpoint(recovered_run):
    trainer, history, events, holder = recovered_run
    assert holder["killed"]
    restarts = [e for e in events if e["type"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["failed_step"] == 2 and restarts[0]["resumed_step"] == 1
    assert restarts[0]["limit"] == 2 and trainer.restarts == 1
    assert [m["step"] for m in history] == [1, 2, 3]


def test_nothing_in_the_last_checkpoint_is_lost(recovered_run):
    _, history, _, holder = recovered_run
    saved = holder["checkpoint_1"]
    assert history[0] == saved.state["metrics"][0], "step 1 as checkpointed is the run's step 1"
    # the drafter resumed from the checkpointed hub state: the first sync after the restart
    # continues its version count (optimizer steps) instead of starting a fresh drafter at version 0
    pushes = [p for m in history[1:] for p in m["hub_pushes"]]
    assert pushes, "no drafter updates after the restart"
    assert pushes[0]["version"] == saved.state["drafter_version"] + pushes[0]["steps"]


def test_cluster_mode_trainers_harvest_the_update_together_and_stop_before_the_next_rollout(recovered_run):
    _, history, _, _ = recovered_run
    together = 0
    for m in history:
        for ack in m["trainer_acks"]:
            assert ack["requested_at"] <= ack["stop_received_at"] <= ack["stopped_at"] <= ack["acked_at"]
            assert ack["acked_at"] <= m["rollout_dispatched_at"], "a rollout began before a trainer stopped"
        spans = [(a["started_at"], a["stopped_at"]) for a in m["trainer_acks"]]
        overlapping = len(spans) == 2 and max(s for s, _ in spans) < min(e for _, e in spans)
        if overlapping and len({p["trainer"] for p in m["hub_pushes"]}) == 2:
            together += 1
    assert together >= 1, "never had two trainers updating the one drafter at once"


def test_no_drafter_is_pulled_early_while_trainers_still_push(recovered_run):
    """Pulling the hub's drafter when a step ends saves the next step that pull, but here trainers run
    through the update and push until the next rollout starts: a pull then would serve a stale drafter.
    The coordinator pulls at dispatch instead (every step's drafter is checked in test_ray_runtime)."""
    trainer, history, _, holder = recovered_run
    assert any(m["trainer_acks"] for m in history[1:]), "no trainer ran on into a later step"
    assert holder["prefetched_after"] == []


def test_the_bandits_resume_from_the_checkpoint(recovered_run):
    """Each worker's bandit is in the checkpoint and the new workers continue it: after the restart
    every arm choice of every step is counted once in the final bandits, none forgotten."""
    trainer, history, _, holder = recovered_run
    saved = holder["checkpoint_1"].state["bandits"]
    assert len(saved) == 2 and all(sum(map(sum, b["pulls"])) > 0 for b in saved)
    final = load_checkpoint(trainer.checkpoint_root / "step-00000003").state["bandits"]
    chosen = sum(n for m in history for n in m["sd_arms"].values())
    assert sum(sum(map(sum, b["pulls"])) for b in final) == chosen


def test_the_checkpoint_holds_the_drafter_optimizer_and_every_workers_buffer(recovered_run):
    """What a restart resumes the drafter from: the hub's parameters, both workers' online buffers and
    their trainers' AdamW moments (the exact resume is tests/unit/test_drafter_resume.py)."""
    saved = recovered_run[3]["checkpoint_1"]
    assert saved.tensors["drafter"], "no drafter parameters in the checkpoint"
    buffers = saved.objects["drafter_buffers"]
    assert len(buffers) == 2
    for state in buffers:
        assert state["buffer"]["tokens"] and state["buffer"]["current_step"] == 1
        assert "optimizer" in state
    assert any(state["optimizer"]["state"] for state in buffers), "no trainer's AdamW moments in the checkpoint"


def test_rollouts_draft_with_the_validated_drafter_and_it_survives_the_restart(recovered_run):
    """`drafter.publish: validated` (the default): a step drafts with the served drafter; the hub's newer
    parameters are scored beside it and served from the next step on only when promoted; the served
    drafter is in the checkpoint, and the step that failed resumes with it."""
    trainer, history, _, holder = recovered_run
    assert history[0]["drafter_served_version"] == 0 and history[0]["drafter_candidate_version"] is None
    assert holder["checkpoint_1"].state["served_drafter_version"] == history[1]["drafter_served_version"]
    assert any(m["drafter_candidate_version"] is not None for m in history), "no step had a newer drafter to score"
    for m, following in zip(history, history[1:] + [None]):
        if m["drafter_candidate_version"] is None:
            assert m["drafter_promoted"] is None
            expected = m["drafter_served_version"]
        else:
            assert m["drafter_candidate_version"] > m["drafter_served_version"]
            assert 0 <= m["drafter_candidate_agreement"] <= 1 and m["drafter_promoted"] in (True, False)
            expected = m["drafter_candidate_version"] if m["drafter_promoted"] else m["drafter_served_version"]
        if following is not None:
            assert following["drafter_served_version"] == expected
    assert trainer.executor.served[0] == expected
    final = load_checkpoint(trainer.checkpoint_root / "step-00000003")
    assert final.state["served_drafter_version"] == expected
