"""A 3-step TLT run on Ray (local cluster, 2 rollout workers, the reduced warm start): the run
finishes, trainers start only on IDLE workers and acknowledge STOP before the policy update, and
the online drafter agrees more with the policy on fresh rollouts than the drafter it started from.

The drafter's quality is measured twice: accept length of speculative decoding
(`tlt.drafter.evaluate`) and top-1 agreement with the target on fresh rollouts.
"""

from __future__ import annotations

import json

import pytest
import ray
import torch
from ray_run_spec import SPEC  # tests/e2e is no package: its folder is on sys.path

from tlt.drafter.buffer import pack, sample_from_completion
from tlt.drafter.evaluate import evaluate_drafter
from tlt.drafter.export import resolve_checkpoint
from tlt.drafter.hub import DrafterHub
from tlt.drafter.trainer import packed_agreement
from tlt.models.drafter import drafter_config_from_target, load_drafter
from tlt.models.loading import load_policy
from tlt.rollout.engine import Engine
from tlt.runtime import rl_step
from tlt.runtime.ray_executor import ray_trainer
from tlt.runtime.report import summarize, write_report
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import reduced_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ray-run")
    spec = {**SPEC, "algorithm": {**SPEC["algorithm"], "evalEvery": 2, "evalSamples": 4}}
    run = TLTTrainingRun.model_validate({"metadata": {"name": "e2e"}, "spec": spec})
    try:
        # a display's callback, as `tlt train` has: the run then logs the workers' status as events
        trainer = ray_trainer(run, out, warmstart=reduced_config(), num_cpus=2, on_event=lambda event: None)
        history = trainer.train()
    finally:
        ray.shutdown()
    return run, trainer, history, out


def test_three_step_tlt_run_finishes_with_checkpoint_policy_and_drafter(finished_run):
    run, trainer, history, out = finished_run
    assert [m["step"] for m in history] == [1, 2, 3]
    assert (out / "checkpoints" / "LATEST").read_text() == "step-00000003"
    assert (out / "policy" / "config.json").is_file()
    assert (out / "drafter" / "LATEST").is_file(), "the hub's asynchronous drafter snapshot"
    assert all(m["drafter_updates"] >= 0 for m in history)
    assert sum(m["drafter_updates"] for m in history) > 0, "no trainer ever pushed a gradient"
    # rewards were computed by verifiers as responses finished, not after the rollout
    assert sum(m["streamed_rewards"] for m in history) > 0
    assert all(len(m["response_lengths"]) == 16 for m in history)
    assert write_report(out).is_file()


def test_held_out_evaluation_runs_every_n_steps_and_after_the_last(finished_run):
    _, _, history, out = finished_run
    assert ["eval_accuracy" in m for m in history] == [False, True, True]
    for m in history[1:]:
        assert m["eval_samples"] == 4 and 0.0 <= m["eval_accuracy"] <= 1.0 and m["eval_seconds"] > 0
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("eval_reward_mean") for m in logged] == [m.get("eval_reward_mean") for m in history]


def test_rollout_workers_froze_their_start_up_heap(finished_run):
    """Each worker, a Ray actor, collected and froze its start-up heap before its first rollout
    (`tlt.runtime.heap`): every status it reported says so."""
    *_, out = finished_run
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    statuses = [s for e in events if e["type"] == "workers" for s in e["workers"]]
    assert {s["worker"] for s in statuses} == {"rollout-0", "rollout-1"}
    assert all(s["heap"] is not None and s["heap"]["frozen"] > 0 for s in statuses)


def test_finished_run_writes_the_served_drafter_for_export(finished_run):
    run, trainer, _, out = finished_run
    served = out / "drafter-served"
    info = json.loads((served / "served.json").read_text())
    assert info["publish"] == run.spec.drafter.publish
    assert info["step"] == 3
    drafter = load_drafter(served, trainer.policy.config)
    if run.spec.drafter.publish == "validated" and trainer.executor.served is not None:
        assert info["version"] == trainer.executor.served[0]
        for name, tensor in drafter.state_dict().items():
            assert torch.equal(tensor, trainer.executor.served[1][name]), name
    assert resolve_checkpoint(out) == served, "tlt export-drafter RUN exports the served drafter"


def test_trainers_start_only_after_their_worker_finished_generating(finished_run):
    _, _, history, _ = finished_run
    trained = 0
    for m in history:
        for worker, states in m["worker_states"].items():
            names = [s for s, _ in states]
            if "TRAINING" in names:
                trained += 1
                assert names.index("GENERATING") < names.index("TRAINING"), (worker, names)
                i = names.index("TRAINING")
                assert names[i - 1] == "IDLE", (worker, names)
            times = [t for _, t in states]
            assert times == sorted(times)
    assert trained > 0


def test_the_last_worker_to_finish_starts_no_trainer_beside_a_running_one(finished_run):
    """Trainers stop when the update starts (one machine): the shard that finishes last would train for
    no time, its start and stop on the critical path; it starts none while another worker's trainer runs."""
    _, _, history, _ = finished_run
    checked = 0
    for m in history:
        finished = {}
        for worker, states in m["worker_states"].items():
            names = [s for s, _ in states]
            after = names.index("GENERATING") + 1
            finished[worker] = (states[after + names[after:].index("IDLE")][1], "TRAINING" in names)
        last = max(finished, key=lambda w: finished[w][0])
        if any(trained for w, (_, trained) in finished.items() if w != last):
            checked += 1
            assert not finished[last][1], f"step {m['step']}: {last} finished last and still started a trainer"
    assert checked > 0, "no step had a trainer on the first worker to finish"


def test_every_trainer_acknowledges_stop_before_the_policy_update(finished_run):
    _, _, history, _ = finished_run
    acks = [(m, a) for m in history for a in m["trainer_acks"]]
    assert acks, "no trainer ran"
    for m, ack in acks:
        # coordinator request -> worker received -> worker stopped -> coordinator acknowledged -> update
        assert ack["requested_at"] <= ack["stop_received_at"] <= ack["stopped_at"] <= ack["acked_at"]
        assert ack["acked_at"] <= m["update_started_at"], (
            f"step {m['step']}: update began before {ack['worker']} stopped"
        )
    latency = summarize(history)["stop_latency"]
    print(f"stop latency over {latency['count']} stops: p50 {latency['p50']:.4f}s p99 {latency['p99']:.4f}s")


def test_each_step_sees_the_hub_drafter_its_trainers_left(finished_run):
    """The coordinator pulls the next step's drafter when a step ends (trainers stopped before the update):
    every step's newest drafter (the candidate under `drafter.publish: validated`, else the served one) is
    the hub's version after the last push of the steps before it, none older."""
    _, _, history, _ = finished_run
    assert any(m["hub_pushes"] for m in history[:-1]), "no trainer pushed before the last step"
    version, served = 0, 0
    for m in history:
        newest = (
            m["drafter_candidate_version"]
            if m["drafter_candidate_version"] is not None
            else m["drafter_served_version"]
        )
        assert newest == version, f"step {m['step']} saw a stale hub drafter"
        assert m["drafter_served_version"] == served
        served = newest if m["drafter_promoted"] else served
        version = max([version, *(p["version"] for p in m["hub_pushes"])])


def test_online_training_raises_accept_length_and_agreement_on_fresh_rollouts(finished_run):
    """Same prompts, same seeds, same policy (the run's final one): the drafter the hub started from
    versus the hub's last snapshot, by accept length of speculative decoding and by top-1 agreement."""
    run, _, history, out = finished_run
    policy, tokenizer = load_policy(out / "policy", "float32")
    problems = load_problems(run.spec.dataset, "eval")[:12]
    initial = DrafterHub(drafter_config_from_target(policy.config), 1e-3, seed=run.spec.algorithm.seed).drafter
    initial.bind_policy(policy)
    trained = load_drafter(out / "drafter" / (out / "drafter" / "LATEST").read_text().strip(), policy).float()
    accept = {
        name: evaluate_drafter(
            policy, tokenizer, d, problems, draft_tokens=4, max_new_tokens=96, batch_size=4, temperature=1.0, seed=5
        ).accept_length
        for name, d in (("initial", initial), ("trained", trained))
    }
    engine = Engine(policy, max_batch_size=32, max_context=256, return_hidden=True)
    requests = rl_step.make_requests(problems, list(range(len(problems))), tokenizer, run.spec.algorithm, step=10_000)
    rows = pack([s for c in engine.generate(requests) if (s := sample_from_completion(c, 1)) is not None], 256)
    with torch.no_grad():
        agree = {name: packed_agreement(d.eval(), rows) for name, d in (("initial", initial), ("trained", trained))}
    print(
        f"accept length (T=1, 4 drafts): initial {accept['initial']:.3f}, trained {accept['trained']:.3f}; "
        f"top-1 agreement on {agree['initial'][1]} positions: {agree['initial'][0] / agree['initial'][1]:.3f} -> "
        f"{agree['trained'][0] / agree['trained'][1]:.3f}; in-run accept length per step "
        f"{[round(m['accept_length'], 3) for m in history]}"
    )
    assert accept["trained"] > accept["initial"]
    assert agree["trained"][0] > agree["initial"][0]
