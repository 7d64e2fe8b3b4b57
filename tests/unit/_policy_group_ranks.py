"""One rank of a policy group on this machine (gloo, 127.0.0.1), run as its own process by
`test_policy_group.py`: `python _policy_group_ranks.py RANK WORLD PORT SHARDING OUT`; sharding `single` runs the
one-process update for comparison. Writes what it measured to OUT/<sharding>-<rank>.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tlt.models.tiny import tiny_model
from tlt.rl.update import RolloutBatch, policy_update
from tlt.spec.run import AlgorithmSpec

STEPS = 3
ALGO = AlgorithmSpec(ppo_epochs=2, micro_batch_size=2, learning_rate=1e-3, clip_ratio_low=0.1, clip_ratio_high=0.1)


def model() -> torch.nn.Module:
    return tiny_model("qwen2", seed=3, dtype=torch.float64, num_layers=2, tie_word_embeddings=True)


def batch(step: int) -> RolloutBatch:
    """Ten sequences of unequal lengths (a rank may get fewer micro-batches than another)."""
    g = torch.Generator().manual_seed(100 + step)
    lengths = [1, 19, 3, 7, 2, 12, 5, 1, 9, 4]
    prompts = [
        torch.randint(1, 64, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() for _ in lengths
    ]
    responses = [torch.randint(1, 64, (n,), generator=g).tolist() for n in lengths]
    width = max(lengths)
    return RolloutBatch(
        prompts,
        responses,
        torch.zeros(len(lengths), width, dtype=torch.float64),
        torch.randn(len(lengths), generator=g),
    )


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=ALGO.learning_rate, betas=(0.9, 0.999), weight_decay=0.01)


def main(rank: int, world: int, port: int, sharding: str, out: Path) -> None:
    torch.set_num_threads(1)
    policy = model()
    metrics, old = [], []
    if sharding == "single":
        opt = optimizer(policy.parameters())
        for step in range(STEPS):
            b = batch(step)
            metrics.append(policy_update(policy, opt, b, ALGO, old_from_first_pass=True))
            old.append(b.old_logprobs)
        from tlt.workers.policy_group import state_bytes

        torch.save(
            {"metrics": metrics, "old": old, "weights": policy.state_dict(), "bytes": state_bytes(policy, opt)},
            out / "single-0.pt",
        )
        return
    from tlt.workers.policy_group import (
        checkpoint_activations,
        full_weights,
        init_group,
        rank_update,
        shard_policy,
        state_bytes,
    )

    init_group(rank, world, "127.0.0.1", port, timeout_s=60)
    # "fsdp-gathered": fsdp keeping each layer's gathered weights from its forward to its backward;
    # "fsdp-recomputed": fsdp with every layer's activations recomputed in the backward
    if sharding == "fsdp-recomputed":
        checkpoint_activations(policy)
    base = sharding.split("-")[0]
    sharded = shard_policy(policy, base, reshard_after_forward=sharding != "fsdp-gathered")
    opt = optimizer(sharded.parameters())
    for step in range(STEPS):
        b = batch(step)
        metrics.append(rank_update(sharded, opt, b, ALGO, pad_id=0))
        old.append(b.old_logprobs)
    weights = full_weights(sharded)
    torch.save(
        {"metrics": metrics, "old": old, "weights": weights, "bytes": state_bytes(sharded, opt)},
        out / f"{sharding}-{rank}.pt",
    )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
