"""One trainer, two executors: the same 3-step spec run in this process (`local_trainer`) and on Ray
(`ray_trainer`, 2 rollout workers) samples the same tokens, scores the same rewards, makes the same update
and writes the same metric keys, outputs and checkpoint layout, in every `speculative.mode`, with every
arm kind and with partial rollouts. Speculative decoding is lossless, so the drafters' different schedules
(one epoch after the update here, idle-time spot trainers on Ray) leave the tokens as they are.

The runs share one Ray session (started by the first, shut down after the module)."""

from __future__ import annotations

import json

import pytest
import ray
import torch
from _train_runs import TIMING_KEYS, tiny_policy  # tests/e2e is no package: its folder is on sys.path

from tlt.checkpoint.store import load_latest
from tlt.runtime import trainer as trainer_module
from tlt.runtime.local_executor import local_trainer
from tlt.runtime.ray_executor import ray_trainer
from tlt.spec.run import TLTTrainingRun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHAIN, TREE = {"kind": "chain", "depth": 2}, {"kind": "tree", "depth": 2, "topk": 2, "verifyTokens": 4}
CASES = {
    "off": {"mode": "off"},
    "ngram": {"mode": "ngram", "arms": [{"kind": "ngram", "depth": 4}, {"kind": "history", "depth": 4}]},
    "static": {"mode": "static", "arms": [CHAIN, TREE]},
    "tlt": {
        "mode": "tlt",
        "arms": [
            CHAIN,
            TREE,
            {"kind": "ngram", "depth": 3},
            {"kind": "history", "depth": 3},
            {"kind": "mixed", "depth": 3},
            {"kind": "plain"},
        ],
    },
    "tlt-block": {"mode": "tlt", "arms": [{"kind": "block", "depth": 3}, CHAIN]},
    "partial-tlt": {"mode": "tlt", "arms": [CHAIN, {"kind": "ngram", "depth": 3}]},
}
# partial rollouts: the same groups trained, cut at the same tokens, whether a shard runs on its own worker or
# beside the other in one engine
ALGORITHM = {"partial-tlt": {"rollout": {"mode": "partial", "overProvision": 1.0, "maxStaleness": 1}}}
# what one executor has and the other by nature has not (the rest of every step's keys must be the same)
UNSHARED = {"trainer_acks", "hub_pushes", "drafter_trainers"}
# what the drafters' schedules change (their versions, losses and time, so the drafts and their acceptance), and
# what the batch's shape changes (one engine here, a shard a worker on Ray: the decode steps by rows running)
DRAFTS = ("drafter_", "sd_", "accept", "harvested_", "stop_latency", "draft_vocab", "step_split", "eval_seconds")
SHAPE = ("steps_by_running", "tokens_by_running")


@pytest.fixture(scope="module")
def ray_session():
    yield
    ray.shutdown()


def _run(tmp_path, case: str) -> TLTTrainingRun:
    spec = {
        "model": {"path": str(tiny_policy(tmp_path)), "dtype": "float32"},
        "dataset": {"builtin": {"numTrain": 32}},
        "algorithm": {
            "steps": 3,
            "promptsPerStep": 4,
            "groupSize": 2,
            "maxNewTokens": 24,
            "seed": 5,
            **ALGORITHM.get(case, {}),
        },
        "rollout": {"replicas": 2},
        "speculative": {**CASES[case], "threshold": 8, "buckets": [2, 8]},
        "drafter": {"enabledSlots": "all", "batchTokens": 64, "learningRate": 1e-3},
        "checkpoint": {"intervalSteps": 3},
    }
    return TLTTrainingRun.model_validate({"metadata": {"name": case}, "spec": spec})


def _recorded(monkeypatch, make) -> tuple[list[dict], list[dict]]:
    """(metrics, [{"tokens", "rewards"} per step]) of `make().train()`: the trainer's rollouts as it reads them."""
    seen: list[dict] = []
    metrics = trainer_module.shard_rollout_metrics

    def record(completions, rewards, *args, **kwargs):
        seen.append({"tokens": [list(c.token_ids) for c in completions], "rewards": rewards.clone()})
        return metrics(completions, rewards, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(trainer_module, "shard_rollout_metrics", record)
        history = make().train()
    return history, seen


def _layout(out) -> dict:
    ckpt = load_latest(out / "checkpoints")
    files = sorted(p.name for p in (out / "checkpoints" / f"step-{ckpt.step:08d}").iterdir())
    outputs = sorted(p.name for p in out.iterdir() if p.name not in ("slots.json",))
    return {
        "outputs": outputs,
        "files": files,
        "tensors": {name: sorted(t) for name, t in ckpt.tensors.items()},
        "objects": sorted(ckpt.objects),
        "state": sorted(ckpt.state),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_executors_run_the_same_steps(tmp_path, monkeypatch, ray_session, case):
    run = _run(tmp_path, case)
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    on_ray, ray_seen = _recorded(monkeypatch, lambda: ray_trainer(run, ray_out, num_cpus=2))
    here, local_seen = _recorded(monkeypatch, lambda: local_trainer(run, local_out))

    assert [m["step"] for m in here] == [m["step"] for m in on_ray] == [1, 2, 3]
    for step, (a, b) in enumerate(zip(local_seen, ray_seen, strict=True), start=1):
        assert a["tokens"] == b["tokens"], f"step {step}: the executors sampled different tokens"
        assert torch.equal(a["rewards"], b["rewards"]), f"step {step}: different rewards"
    for a, b in zip(here, on_ray, strict=True):
        assert set(a) - UNSHARED == set(b) - UNSHARED, (set(a) ^ set(b)) - UNSHARED
        for key in ("loss", "policy_loss", "clip_fraction", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        _assert_close(a, b, set(a) - TIMING_KEYS - UNSHARED - {k for k in a if k.startswith(DRAFTS)} - set(SHAPE))
    if case != "off":  # the tokens were equal with drafts accepted and rejected on both
        assert all(sum(m["sd_row_steps"] for m in history) > 0 for history in (here, on_ray)), "nothing drafted"
    if case == "partial-tlt":
        assert [m["trained_groups"] for m in here] == [m["trained_groups"] for m in on_ray]
        assert any(m["off_policy_fraction"] > 0 for m in here)
    if case in ("static", "tlt", "tlt-block"):
        assert max(m["drafter_version"] or 0 for m in here) > 0, "the in-process executor trained no drafter"
    assert _layout(local_out) == _layout(ray_out)
    kinds = {e["type"] for e in map(json.loads, (local_out / "events.jsonl").read_text().splitlines())}
    assert kinds <= {e["type"] for e in map(json.loads, (ray_out / "events.jsonl").read_text().splitlines())}


def _assert_close(a: dict, b: dict, keys: set[str]) -> None:
    """Every key equal, floats up to rounding (the two processes' thread counts differ)."""
    for k in sorted(keys):
        if isinstance(a[k], float) and isinstance(b[k], float):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
        else:
            assert a[k] == b[k], k
