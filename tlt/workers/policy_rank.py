"""One rank of the policy group, as a process of its own (a Ray actor, `tlt.workers.sharded_policy`).

It loads the policy's master weights, joins the group's `torch.distributed` process group (gloo on the
CPU, NCCL on CUDA), shards the policy (`policy.sharding`), builds its AdamW over its shards, and from then
on runs its part of every GRPO update (`policy_group.rank_update`), of the gather of the full weights and
of the sharded checkpoint (`policy_shards`). Every call but `rendezvous` / `place` is collective: the
coordinator calls it on every rank at once.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from tlt.models.loading import load_policy, resolve_dtype
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.spec.run import RunSpec
from tlt.workers.policy import build_optimizer, master_dtype
from tlt.workers.policy_group import (
    checkpoint_activations,
    full_weights,
    init_group,
    rank_update,
    shard_policy,
    state_bytes,
    token_balanced_shards,
)
from tlt.workers.policy_shards import load_full, load_shards, named_optimizer_state, save_shards

log = logging.getLogger(__name__)


def free_port(host: str = "") -> int:
    """A TCP port free on this machine now (the group's rendezvous port on rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PolicyRank:
    """Rank `rank` of a group of `world`: the policy of `policy_path`, sharded `sharding`, on `device`."""

    def __init__(
        self, rank: int, world: int, spec: RunSpec, policy_path: str, threads: int, device: str = "cpu"
    ) -> None:
        torch.set_num_threads(max(1, threads))
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.rank, self.world, self.spec = rank, world, spec
        self.device = torch.device(device)
        self.policy, tokenizer = load_policy(policy_path, master_dtype(spec.model.dtype))
        self.policy.to(self.device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.compute_dtype = resolve_dtype(spec.model.dtype)
        self.optimizer: torch.optim.Optimizer | None = None
        self.share: dict[str, Any] = {}  # the rows and tokens of the last update

    def place(self) -> dict[str, Any]:
        """Where this rank runs: its Ray node, host address and process id."""
        import os

        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def rendezvous(self, host: str) -> int:
        """A free port on `host` for the group to meet at (called on rank 0)."""
        return free_port(host)

    def join(self, address: str, port: int, timeout_s: float) -> dict[str, Any]:
        """Join the group at address:port, shard the policy, build the optimizer; this rank's state bytes."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        init_group(self.rank, self.world, address, port, backend=backend, timeout_s=timeout_s)
        sharding = self.spec.policy.group_sharding
        if self.spec.policy.activation_checkpointing:  # before sharding: FSDP2 gathers around the recompute too
            checkpoint_activations(self.policy)
        self.policy = shard_policy(
            self.policy, sharding, self.compute_dtype, reshard_after_forward=self.spec.policy.reshard_after_forward
        )
        self.optimizer = build_optimizer(self.policy, self.spec)
        log.info(
            "policy rank %d of %d joined at %s:%d (%s, %s)", self.rank, self.world, address, port, sharding, backend
        )
        return {"rank": self.rank, "state_bytes": state_bytes(self.policy, self.optimizer)}

    def update(self, step_input: tuple[list[Completion], torch.Tensor]) -> dict[str, float]:
        """This rank's part of one step's GRPO update: the group's metrics (`rl_step.learn`'s) and, under
        "rank_share", the sequences and tokens this rank took."""
        completions, rewards = step_input
        batch = rl_step.build_batch(completions, rewards, importance_cap=self.spec.algorithm.rollout.importance_cap)
        engine_logprobs = batch.old_logprobs.clone()
        lengths = batch.lengths()
        rows = token_balanced_shards(lengths, self.world)[self.rank]
        # ddp runs the forward under autocast; fsdp casts through its mixed-precision policy
        autocast = self.compute_dtype if self.spec.policy.group_sharding == "ddp" else None
        with rl_step._compute_context(self._inner(), autocast):
            metrics = rank_update(self.policy, self._optimizer(), batch, self.spec.algorithm, pad_id=self.pad_id)
        metrics["logprob_gap"] = rl_step.logprob_gap(engine_logprobs, batch.old_logprobs, batch)
        metrics.update(rl_step.behaviour_metrics(batch))  # the whole batch's old log-probs, every rank
        self.share = {"rank": self.rank, "sequences": len(rows), "tokens": sum(lengths[b] for b in rows)}
        log.info(
            "policy rank %d: update on %d of %d sequences, %d of %d tokens",
            self.rank,
            len(rows),
            len(lengths),
            self.share["tokens"],
            sum(lengths),
        )
        return {**metrics, "rank_share": dict(self.share)}

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The full master weights on the CPU (rank 0; {} elsewhere), gathered tensor by tensor."""
        return full_weights(self.policy)

    def save_shards(self, folder: str) -> None:
        save_shards(self.policy, self._optimizer(), folder)

    def load_shards(self, folder: str) -> None:
        load_shards(self.policy, self._optimizer(), folder)

    def load_full(self, weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        """Load a one-rank checkpoint's weights and AdamW state (parameters by position) into the shards."""
        load_full(self.policy, self._optimizer(), weights, named_optimizer_state(self._inner(), optimizer_state))

    def _inner(self) -> torch.nn.Module:
        """The policy module (a `ddp` rank's without its wrapper)."""
        return self.policy.module if isinstance(self.policy, DistributedDataParallel) else self.policy

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError(f"policy rank {self.rank} has not joined its group")
        return self.optimizer
