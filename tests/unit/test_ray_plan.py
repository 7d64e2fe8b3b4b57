"""The Ray runtime's plain parts, without a cluster: which steps train the drafter, shards, CPU
shares on 2 cores, trainer slots, streaming finished responses out of the engine, KV release,
the live display."""

from __future__ import annotations

import io
import json
import time

import pytest
from rich.console import Console

from tlt.models.tiny import tiny_model
from tlt.rollout.decode_step import FinishWatcher
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams
from tlt.runtime import k8s_slots
from tlt.runtime.display import LiveDisplay
from tlt.runtime.ray_cluster import placement
from tlt.runtime.rl_step import shards
from tlt.runtime.spot_trainers import SlotSource
from tlt.spec.run import RunSpec
from tlt.workers.rollout_state import worker_identity
from tlt.workers.shard_generation import release_kv_cache


def spec(**sections) -> RunSpec:
    return RunSpec.model_validate(sections)


def test_shards_keep_prompt_order_and_cover_every_prompt():
    assert shards([5, 1, 9, 3, 7], 2) == [[5, 1, 9], [3, 7]]
    assert shards([4], 3) == [[4], [], []]


def test_two_cores_hold_every_role_with_one_torch_thread_each():
    s = spec(rollout={"replicas": 2}, verifier={"replicas": 2})
    plan = placement(s, {"CPU": 2.0})
    assert 2 * plan.rollout_cpus + 2 * plan.verifier_cpus + plan.hub_cpus <= 2.0
    assert plan.rollout_threads == 1 and plan.driver_threads == 2


def test_slot_source_fixed_and_operator_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TLT_SLOTS_FILE", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert SlotSource("all", tmp_path).enabled("rollout-0")
    assert not SlotSource("none", tmp_path).enabled("rollout-0")
    auto = SlotSource("auto", tmp_path)
    assert auto.enabled("rollout-1"), "no slot list written yet: every slot is enabled"
    (tmp_path / "slots.json").write_text(json.dumps({"enabled": ["rollout-0"]}))
    assert auto.enabled("rollout-0") and not auto.enabled("rollout-1")
    (tmp_path / "slots.json").write_text("[not json")
    with pytest.raises(ValueError, match="slots.json"):
        auto.enabled("rollout-0")


def test_in_a_cluster_the_operators_slot_list_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(k8s_slots, "enabled_workers", lambda: frozenset({"rollout-1"}))
    (tmp_path / "slots.json").write_text(json.dumps({"enabled": ["rollout-0"]}))
    auto = SlotSource("auto", tmp_path)
    assert auto.enabled("rollout-1") and not auto.enabled("rollout-0")


def test_workers_take_their_pods_rank_as_name(monkeypatch):
    monkeypatch.delenv("TLT_POD_NAME", raising=False)
    assert worker_identity(3) == "rollout-3"
    monkeypatch.setenv("TLT_ROLE", "rollout")
    monkeypatch.setenv("TLT_POD_NAME", "demo-rollout-7")
    assert worker_identity(0) == "rollout-7"


def test_finished_responses_leave_the_engine_before_the_batch_ends():
    model = tiny_model(vocab_size=32, hidden_size=32, num_layers=1, intermediate_size=64)
    engine = Engine(model, max_batch_size=4, max_context=64, return_hidden=True)
    requests = [Request(f"r{n}", [1, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=n)) for n in (3, 6, 12)]
    streamed: list[tuple[str, list[int], int]] = []
    engine.stepper = FinishWatcher(
        engine.stepper, lambda seq: streamed.append((seq.request.request_id, list(seq.tokens), len(streamed)))
    )
    completions = engine.generate(requests)
    assert [rid for rid, _, _ in streamed] == ["r3", "r6", "r12"], "each response streams once, as it finishes"
    assert {rid: toks for rid, toks, _ in streamed} == {c.request_id: c.token_ids for c in completions}
    release_kv_cache(engine)
    assert engine.runner.cache.capacity == 1
    again = engine.generate(requests)
    assert [c.token_ids for c in again] == [c.token_ids for c in completions], "the cache regrows after release"


def test_live_display_shows_phase_worker_states_and_restarts():
    console = Console(file=io.StringIO(), width=140, force_terminal=False)
    display = LiveDisplay("demo", total_steps=3, console=console)
    with display:
        display.event({"type": "phase", "step": 2, "phase": "rollout"})
        display.event(
            {
                "type": "workers",
                "step": 2,
                "workers": [
                    {
                        "worker": "rollout-0",
                        "state": "TRAINING",
                        "since": time.time(),
                        "running": 0,
                        "trainer_iterations": 7,
                    },
                    {
                        "worker": "rollout-1",
                        "state": "GENERATING",
                        "since": time.time(),
                        "running": 3,
                        "trainer_iterations": 0,
                    },
                ],
            }
        )
        display.event(
            {
                "type": "restart",
                "step": 2,
                "failed_step": 2,
                "resumed_step": 1,
                "restarts": 1,
                "limit": 3,
                "error": "ActorDiedError",
            }
        )
        text = "\n".join(str(part) for part in display.render().renderables)
    assert "step 2/3" in text and "rollout" in text
    assert "restart 1/3 from checkpoint step 1" in text
    console.print(display.render())
    shown = console.file.getvalue()
    assert "TRAINING" in shown and "GENERATING" in shown and "rollout-1" in shown
    assert "[demo] step 2/3: rollout (" in shown, "piped, each phase is a line of its own (the view is not redrawn)"


def test_piped_display_ends_its_last_view_with_a_newline():
    console = Console(file=io.StringIO(), force_terminal=False, width=100)
    with LiveDisplay("demo", total_steps=2, console=console) as display:
        display.event({"type": "checkpoint", "step": 2, "saved_step": 2})
    console.print("done: 2 steps")
    assert "checkpoint at step 2\ndone: 2 steps" in console.file.getvalue()


def test_role_pods_get_one_actor_each_with_that_pods_cpus():
    """On a cluster of role pods the rollout actor fits ONE rollout pod, not a share of the cluster."""
    from tlt.runtime.ray_cluster import _role_options

    s = RunSpec.model_validate(
        {"rollout": {"replicas": 2, "resources": {"cpu": "8"}}, "verifier": {"replicas": 1, "resources": {"cpu": "2"}}}
    )
    cluster = {"CPU": 18.0, "tlt_rollout": 2.0, "tlt_verifier": 1.0}
    plan = placement(s, cluster)
    assert plan.rollout_cpus == 8.0 and plan.rollout_threads == 8
    assert _role_options("rollout", cluster, plan.rollout_cpus) == {"num_cpus": 8.0, "resources": {"tlt_rollout": 1}}
