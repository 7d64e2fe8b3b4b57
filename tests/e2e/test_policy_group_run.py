"""The Ray loop with its policy update on a policy group of two ranks (`policy.replicas: 2`, one machine,
gloo on 127.0.0.1): the same run as one rank (float64 policy, so only summation order differs), resumed
across world sizes through the sharded checkpoints, and a SIGKILLed rank restarting the group from the
newest checkpoint. The runs are shared by the tests (each costs a Ray start)."""

from __future__ import annotations

import math
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from _train_runs import TIMING_KEYS, deterministic, ray_train, tiny_policy
from safetensors.torch import load_file

from tlt.checkpoint.store import LATEST
from tlt.spec.run import TLTTrainingRun

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

STEPS = 3
TOLERANCE = 1e-9  # float64: the group sums in another order
GROUP_KEYS = {"policy_rank_sequences", "policy_rank_tokens"}
RUN_KEYS = {"recoveries"}  # what a restart adds to the steps it redoes


def _run(root: Path, policy: dict[str, Any], steps: int = STEPS) -> TLTTrainingRun:
    return TLTTrainingRun.model_validate(
        {
            "metadata": {"name": "policy-group"},
            "spec": {
                "model": {"path": str(tiny_policy(root)), "dtype": "float64"},
                "dataset": {"builtin": {"numTrain": 64}},
                "algorithm": {
                    "steps": steps,
                    "promptsPerStep": 4,
                    "groupSize": 4,
                    "maxNewTokens": 16,
                    "learningRate": 1e-3,
                    "microBatchSize": 4,
                    "ppoEpochs": 2,
                    "seed": 3,
                },
                "speculative": {"mode": "off"},
                "checkpoint": {"intervalSteps": 1, "keep": 3},
                "policy": policy,
            },
        }
    )


def _train(run: TLTTrainingRun, out: Path, on_event: Any = None) -> tuple[Any, list[dict], list[dict]]:
    return ray_train(run, out, {}, on_event or (lambda event: None), num_cpus=2)


def _back_to_step(src: Path, dst: Path, step: int) -> Path:
    """A copy of the finished run `src` as it was after step `step`'s checkpoint (later ones and the final
    policy removed)."""
    shutil.copytree(src, dst)
    root = dst / "checkpoints"
    for folder in root.glob("step-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    (root / LATEST).write_text(f"step-{step:08d}")
    shutil.rmtree(dst / "policy")
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("policy-group")
    out: dict[str, Any] = {}
    _, out["one"], _ = _train(_run(root, {"replicas": 1}), root / "one")
    _, out["fsdp"], out["fsdp_events"] = _train(_run(root, {"replicas": 2, "sharding": "fsdp"}), root / "fsdp")
    # resumed after step 2 at another world size: the group's shards at one rank, one rank's weights at two
    _, out["fsdp_to_one"], _ = _train(_run(root, {"replicas": 1}), _back_to_step(root / "fsdp", root / "f1", 2))
    ddp = _run(root, {"replicas": 2, "sharding": "ddp"})
    _, out["one_to_ddp"], _ = _train(ddp, _back_to_step(root / "one", root / "o2", 2))

    killed: dict[str, Any] = {"done": False}

    def kill_rank_one(event: dict) -> None:  # rank 1's process dies once the checkpoint of step 1 is written
        if event["type"] == "policy_group":
            killed["pid"] = event["ranks"][1]["pid"]
        if event["type"] == "checkpoint" and event["saved_step"] == 1 and not killed["done"]:
            os.kill(killed["pid"], signal.SIGKILL)
            killed["done"] = True

    group = _run(root, {"replicas": 2})
    _, out["killed"], out["killed_events"] = _train(group, root / "killed", kill_rank_one)
    out["root"] = root
    return out


def _assert_same_steps(got: list[dict], want: list[dict], ignore: set[str] = frozenset()) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in want]
    skip = TIMING_KEYS | GROUP_KEYS | RUN_KEYS | set(ignore)
    for g, w in zip(deterministic(got, skip), deterministic(want, skip)):
        assert g.keys() == w.keys(), f"step {w['step']}: keys differ: {g.keys() ^ w.keys()}"
        for key, value in w.items():
            if isinstance(value, float):
                assert math.isclose(g[key], value, rel_tol=TOLERANCE, abs_tol=TOLERANCE), (w["step"], key)
            else:
                assert g[key] == value, (w["step"], key)


def _assert_same_weights(got: Path, want: Path) -> None:
    a = load_file(str(got / "policy" / "model.safetensors"))
    b = load_file(str(want / "policy" / "model.safetensors"))
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= TOLERANCE, f"final weights differ by {worst}"


def test_two_fsdp_ranks_train_as_one_rank(runs):
    assert any(m["loss"] != 0 for m in runs["one"]), "the run must learn something to compare"
    _assert_same_steps(runs["fsdp"], runs["one"])
    _assert_same_weights(runs["root"] / "fsdp", runs["root"] / "one")


def test_every_rank_takes_its_share_of_every_update(runs):
    group = [e for e in runs["fsdp_events"] if e["type"] == "policy_group"]
    assert len(group) == 1 and group[0]["world"] == 2 and group[0]["sharding"] == "fsdp"
    assert len({r["pid"] for r in group[0]["ranks"]}) == 2, "two processes"
    for m in runs["fsdp"]:
        assert len(m["policy_rank_tokens"]) == 2 and all(t > 0 for t in m["policy_rank_tokens"])
        assert sum(m["policy_rank_sequences"]) == 16
        assert sum(m["policy_rank_tokens"]) > round(m["response_length_mean"] * 16), "prompts and responses"


def test_the_group_resumes_at_one_rank_as_the_uninterrupted_run(runs):
    _assert_same_steps(runs["fsdp_to_one"], runs["one"])
    _assert_same_weights(runs["root"] / "f1", runs["root"] / "one")


def test_a_one_rank_checkpoint_resumes_on_two_ddp_ranks_as_the_uninterrupted_run(runs):
    _assert_same_steps(runs["one_to_ddp"], runs["one"])
    _assert_same_weights(runs["root"] / "o2", runs["root"] / "one")


def test_a_killed_rank_restarts_the_group_from_the_newest_checkpoint(runs):
    restarts = [e for e in runs["killed_events"] if e["type"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["failed_step"] == 2 and restarts[0]["resumed_step"] == 1
    assert len([e for e in runs["killed_events"] if e["type"] == "policy_group"]) == 2, "a fresh group"
    _assert_same_steps(runs["killed"], runs["one"])
    _assert_same_weights(runs["root"] / "killed", runs["root"] / "one")


def test_the_groups_final_policy_is_a_plain_hugging_face_folder(runs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(runs["root"] / "fsdp" / "policy"), dtype=torch.float64)
    want = load_file(str(runs["root"] / "one" / "policy" / "model.safetensors"))
    got = model.state_dict()
    assert max((got[k] - want[k]).abs().max().item() for k in want) <= TOLERANCE
    shards = runs["root"] / "fsdp" / "checkpoints" / "step-00000003" / "policy_shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
