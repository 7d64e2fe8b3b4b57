"""`tlt train` with `rollout.engine: vllm` (Ray, a local cluster, 2 vLLM rollout workers, a tiny warm
start with 2 heads of 32 since vLLM's CPU attention has no kernel for the reduced policy's 16):

- mode tlt, greedy: vLLM drafts with the run's EAGLE drafter (hot-reloaded every step), the spot
  trainers train it on features this worker computes over vLLM's rollouts, and the step-1 responses
  are token for token this engine's greedy responses of the same policy;
- threshold 0 at temperature 1 (the shadow setting: the drafter trains, vLLM never drafts) samples;
- the `tlt train` command itself refuses what vLLM's CPU build cannot honour, naming the fields.
Each run starts Ray and two vLLM engines (about a minute on 2 cores)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

pytest.importorskip("vllm", reason="vLLM is not installed: this tier runs in .venv-vllm (make vllm-venv)")

import ray  # noqa: E402

from tlt.cli import main  # noqa: E402
from tlt.rollout.engine import Engine  # noqa: E402
from tlt.runtime import rl_step  # noqa: E402
from tlt.runtime.ray_executor import ray_trainer  # noqa: E402
from tlt.spec.run import TLTTrainingRun  # noqa: E402
from tlt.tasks.warmstart import load_policy, reduced_config, warm_start  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def tiny_warmstart():
    """The reduced warm start with 2 query heads of 32 sharing one KV head, trained briefly."""
    base = reduced_config()
    return dataclasses.replace(base, policy=dataclasses.replace(base.policy, num_heads=2, num_kv_heads=1), steps=150)


def spec(**speculative) -> dict:
    return {
        "model": {"dtype": "float32", "maxContext": 160},
        "dataset": {"builtin": {"numTrain": 32, "numEval": 8}},
        "algorithm": {
            "steps": 2,
            "promptsPerStep": 4,
            "groupSize": 2,
            "maxNewTokens": 48,
            "microBatchSize": 8,
            "temperature": speculative.pop("temperature", 0.0),
        },
        "rollout": {"replicas": 2, "engine": "vllm"},
        "verifier": {"replicas": 1},
        "speculative": {"mode": "tlt", "arms": [{"kind": "chain", "depth": 3}], **speculative},
        "drafter": {"enabledSlots": "all", "batchTokens": 128, "learningRate": 1e-3},
        "checkpoint": {"intervalSteps": 1000},
    }


def run_ray(name: str, body: dict, out):
    run = TLTTrainingRun.model_validate({"metadata": {"name": name}, "spec": body})
    try:
        trainer = ray_trainer(run, out, warmstart=tiny_warmstart(), num_cpus=2)
        history = trainer.train()
    finally:
        ray.shutdown()
    return run, trainer, history


def test_a_greedy_tlt_run_on_vllm_drafts_trains_and_matches_this_engine(tmp_path):
    run, trainer, history = run_ray("vllm-tlt", spec(), tmp_path / "out")
    assert [m["step"] for m in history] == [1, 2]
    assert all(len(m["response_lengths"]) == 8 for m in history)
    assert all(m["sd_row_steps"] > 0 and m["accept_length"] >= 1.0 for m in history), "vLLM's EAGLE drafted"
    assert sum(m["drafter_updates"] for m in history) > 0, "the spot trainers trained on vLLM's rollouts"
    assert all(m["streamed_rewards"] == 8 for m in history), "every response scored the step it finished"
    for m in history:  # every worker's drafter health and served version reach the step's metrics
        assert m["drafter_health"] and all(
            h["healthy"] and h["served_version"] is not None for h in m["drafter_health"].values()
        )
        assert m["sd_by_bucket"], "per-bucket draft counts"
    assert any(m["drafter_feature_seconds"] for m in history), "the features' policy forward is timed"
    # step 1 ran the warm start: this engine's greedy responses of the same requests have the same lengths
    policy, tokenizer = load_policy(warm_start(tiny_warmstart()))
    ids = rl_step.select_prompts(len(trainer.problems), run.spec.algorithm.prompts_per_step, run.spec.algorithm.seed, 1)
    requests = rl_step.make_requests([trainer.problems[i] for i in ids], ids, tokenizer, run.spec.algorithm, 1)
    engine = Engine(policy.float().eval(), max_batch_size=len(requests), max_context=run.spec.model.max_context)
    ours = [len(c.token_ids) for c in engine.generate(requests)]
    assert history[0]["response_lengths"] == ours


def test_a_sampled_run_with_a_shadow_drafter_trains_without_drafting(tmp_path):
    _, _, history = run_ray("vllm-shadow", spec(threshold=0, temperature=1.0), tmp_path / "out")
    assert [m["step"] for m in history] == [1, 2]
    assert all(m["sd_row_steps"] == 0 for m in history), "threshold 0: vLLM runs without EAGLE"
    assert sum(m["drafter_updates"] for m in history) > 0


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"speculative": {"mode": "ngram"}}, r"speculative\.mode 'ngram'"),
        ({"algorithm": {"temperature": 1.0}}, r"algorithm\.temperature 1\.0.*vLLM's CPU build"),
    ],
)
def test_train_refuses_what_vllm_cannot_honour_naming_the_field(tmp_path, capsys, edit, message):
    import re

    body = spec()
    for key, value in edit.items():
        body[key].update(value)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"spec": body}))
    assert main(["train", str(path), "--out", str(tmp_path / "out")]) == 2
    assert re.search(message, capsys.readouterr().err, re.S)
    assert not (tmp_path / "out").exists()
