"""Partial rollouts in a whole run (in this process, the tiny policy): a ledger of every group over 6 steps
(none trained twice, none lost, none trained older than `maxStaleness`), resume with responses in flight
equal to the uninterrupted run, and speculative decoding inside it training exactly the tokens a run without
drafts trains."""

from __future__ import annotations

import pytest
import torch
from _train_runs import TIMING_KEYS, tiny_policy  # tests/e2e is no package: its folder is on sys.path

from tlt.runtime import trainer as trainer_module
from tlt.runtime.local_executor import local_trainer
from tlt.spec.run import TLTTrainingRun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 6
PARTIAL = {"mode": "partial", "overProvision": 2.0, "maxStaleness": 1}
TLT = {"mode": "tlt", "threshold": 64, "buckets": [8, 64], "arms": [{"kind": "chain", "depth": 3}, {"kind": "ngram"}]}


def _run(root, speculative=None) -> TLTTrainingRun:
    spec = {
        "model": {"path": str(tiny_policy(root)), "dtype": "float32"},
        "dataset": {"builtin": {"numTrain": 64}},
        "algorithm": {
            "steps": STEPS,
            "promptsPerStep": 4,
            "groupSize": 2,
            "maxNewTokens": 24,
            "seed": 1,
            "temperature": 1.0,
            "rollout": PARTIAL,
        },
        "rollout": {"replicas": 2},
        "speculative": speculative or {"mode": "off"},
        "drafter": {"enabledSlots": "all", "batchTokens": 64, "learningRate": 1e-3},
        "checkpoint": {"intervalSteps": 2},
    }
    return TLTTrainingRun.model_validate({"metadata": {"name": "partial"}, "spec": spec})


def _train(monkeypatch, run, out, on_step=None):
    """(trainer, metrics, trained tokens per step) of `run` in `out`."""
    seen: list[list[list[int]]] = []
    metrics = trainer_module.shard_rollout_metrics

    def record(completions, rewards, *args, **kwargs):
        seen.append([list(c.token_ids) for c in completions])
        return metrics(completions, rewards, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(trainer_module, "shard_rollout_metrics", record)
        trainer = local_trainer(run, out)
        history = trainer.train(on_step=on_step)
    return trainer, history, seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    with pytest.MonkeyPatch.context() as patch:
        return (root, *_train(patch, _run(root), root / "reference"))


def test_every_group_is_trained_once_or_still_in_flight_and_none_too_stale(reference):
    _, trainer, history, _ = reference
    trained = [key for m in history for key in m["trained_groups"]]
    assert len(trained) == len(set(trained)) == STEPS * 4, "P groups a step, none twice"
    dropped = [key for m in history for key in m["dropped_groups"]]
    assert dropped, "the premise: some groups grew too stale and were dropped"
    partial = trainer.partial
    waiting = {g.key for g in partial.inflight} | {key for key, _, _ in partial.queue}
    assert set(trained).isdisjoint(waiting)
    assert set(trained) | waiting == set(range(partial.cursor)), "every prompt drawn is trained or waiting"
    for key in dropped:
        later = [m["step"] for m in history if key in m["trained_groups"]]
        assert later or key in waiting, f"group {key} was dropped and lost"
    for m in history:
        assert all(int(age) <= 1 for age in m["staleness_tokens"]), m["staleness_tokens"]
        assert m["rollout_mode"] == "partial" and 0.0 <= m["off_policy_fraction"] <= 1.0
    assert any(m["off_policy_fraction"] > 0 for m in history)
    assert any(m.get("importance_weight_mean") is not None for m in history)


def test_resume_with_responses_in_flight_equals_the_uninterrupted_run(reference, monkeypatch):
    root, trainer, history, tokens = reference
    out = root / "resumed"

    def crash(metrics):
        if metrics["step"] == 3:  # after the checkpoint of step 2: step 3 is redone
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(monkeypatch, _run(root), out, on_step=crash)
    resumed, again, seen = _train(monkeypatch, _run(root), out)
    assert seen == tokens[2:], "steps 3.. sample and train the same tokens"
    for a, b in zip(history, again, strict=True):
        assert {k: v for k, v in a.items() if k not in TIMING_KEYS} == {
            k: v for k, v in b.items() if k not in TIMING_KEYS
        }, a["step"]
    for (name, p), q in zip(trainer.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(p, q), name


def test_speculative_decoding_inside_partial_rollouts_trains_the_same_tokens(reference, monkeypatch):
    root, _, history, tokens = reference
    _, drafted, seen = _train(monkeypatch, _run(root, TLT), root / "tlt")
    assert sum(m["sd_row_steps"] for m in drafted) > 0 and max(m["accept_length"] or 0 for m in drafted) > 1
    assert seen == tokens, "lossless: the same tokens trained, step by step"
    assert [m["trained_groups"] for m in drafted] == [m["trained_groups"] for m in history]
    assert [m["staleness_tokens"] for m in drafted] == [m["staleness_tokens"] for m in history]
