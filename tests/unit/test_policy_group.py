"""The policy group's update (`tlt.workers.policy_group`): two gloo ranks, replicated (ddp) or sharded (fsdp),
give the one-rank update of a float64 policy (losses, metrics, old log-probs, weights, over three steps), and
a sharded rank holds about half of one rank's state. The ranks are processes of their own on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tlt.spec.run import AlgorithmSpec
from tlt.workers.policy_group import rank_passes, shard_policy, token_balanced_shards

RANKS = Path(__file__).with_name("_policy_group_ranks.py")
# fsdp-gathered: no reshard after the forward; fsdp-recomputed: activations recomputed in the backward
GROUPS = ("ddp", "fsdp", "fsdp-gathered", "fsdp-recomputed")
TOLERANCE = 1e-10  # float64; the ranks sum the batch in another order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    """One single-process update and a two-rank group per sharding, all started at once."""
    out = tmp_path_factory.mktemp("policy-group")
    procs = [subprocess.Popen([sys.executable, str(RANKS), "0", "1", "0", "single", str(out)])]
    for sharding in GROUPS:
        port = _free_port()
        procs += [
            subprocess.Popen([sys.executable, str(RANKS), str(rank), "2", str(port), sharding, str(out)])
            for rank in (0, 1)
        ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.args
    return {
        name: [torch.load(out / f"{name}-{rank}.pt", weights_only=False) for rank in ranks]
        for name, ranks in (
            ("single", [0]),
            ("ddp", [0, 1]),
            ("fsdp", [0, 1]),
            ("fsdp-gathered", [0, 1]),
            ("fsdp-recomputed", [0, 1]),
        )
    }


@pytest.mark.slow
@pytest.mark.parametrize("sharding", GROUPS)
def test_two_ranks_update_as_one_rank(runs, sharding):
    (single,) = runs["single"]
    for rank in runs[sharding]:
        for got, want in zip(rank["metrics"], single["metrics"], strict=True):
            assert got.keys() == want.keys()
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=TOLERANCE, abs=TOLERANCE), key
        for got, want in zip(rank["old"], single["old"], strict=True):
            torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
    weights = runs[sharding][0]["weights"]
    assert weights.keys() == single["weights"].keys()
    for name, want in single["weights"].items():
        torch.testing.assert_close(weights[name], want, rtol=TOLERANCE, atol=TOLERANCE, msg=name)


@pytest.mark.slow
def test_a_sharded_rank_holds_about_half_the_state(runs):
    one = runs["single"][0]["bytes"]
    for rank in runs["fsdp"]:
        assert rank["bytes"] <= 0.55 * one, (rank["bytes"], one)
    assert all(rank["bytes"] >= one for rank in runs["ddp"]), "replicas each hold it all"


def test_shards_balance_tokens_and_cover_every_row_once():
    lengths = [1, 19, 3, 7, 2, 12, 5, 1, 9, 4]
    shards = token_balanced_shards(lengths, 2)
    assert sorted(r for s in shards for r in s) == list(range(10))
    assert [sum(lengths[r] for r in s) for s in shards] == [32, 31]
    assert all(s == sorted(s) for s in shards), "batch order within a shard"
    assert token_balanced_shards([5], 1) == [[0]]
    with pytest.raises(ValueError, match="2 sequences cannot feed 3 policy ranks"):
        token_balanced_shards([4, 4], 3)


def test_every_rank_runs_as_many_passes_and_the_extra_ones_weigh_nothing():
    algo = AlgorithmSpec(micro_batch_size=2)
    lengths = [1, 19, 3, 7, 2]
    passes = rank_passes([0, 2, 4], lengths, algo, world=2, passes=3)
    assert [w for _, w in passes] == [2.0, 2.0, 0.0]
    assert sorted(r for rows, w in passes if w for r in rows) == [0, 2, 4]
    with pytest.raises(ValueError, match="3 micro-batches on this rank but the group runs 2"):
        rank_passes([0, 1, 2, 3, 4], lengths, algo, world=2, passes=2)


def test_an_unknown_sharding_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"policy.sharding must be one of \['none', 'ddp', 'fsdp'\]"):
        shard_policy(torch.nn.Linear(2, 2), "zero3")
