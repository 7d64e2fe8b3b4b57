"""One RL step on the cluster: rollout replicas decode their shards, rewards are verified as responses
finish (overlapping the rollout), replicas that finish early idle -- or train the drafter (TLT) --
until the last response is scored, then the policy update and the weight sync.

    step = rollout_end + update + sync,  rollout_end = max(last decode, last reward verification)
    idle GPU-seconds = sum over replicas of (rollout_end - its decode end) * GPUs per replica
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from tlt.rl.packing import LAYOUTS, micro_batches
from tlt.sim.cost_model import CostModel
from tlt.sim.replica import Drafting, ReplicaRollout, Segment, decode_shard
from tlt.spec.run import ArmSpec, RunSpec


@dataclass(frozen=True)
class ClusterConfig:
    """The cluster and workload around the engine.

    replicas: rollout engines (each `gpus_per_replica` GPUs, tensor-parallel); update_gpus: GPUs of the
    policy update; prompt_len: prompt tokens per request; verifiers: reward workers, each taking
    `reward_seconds` per response; decision_tokens: tokens per row between two engine decisions;
    micro_batch_size / update_layout: the update's micro-batches (`algorithm.microBatchSize` /
    `updateLayout`): its forwards compute padded tokens (`update_tokens`); 0: prompt + response tokens.
    """

    replicas: int = 1
    gpus_per_replica: int = 1
    update_gpus: int = 1
    prompt_len: int = 128
    verifiers: int = 1
    reward_seconds: float = 0.0
    decision_tokens: int = 64
    micro_batch_size: int = 0
    update_layout: str = "sorted"

    def __post_init__(self) -> None:
        for name in ("replicas", "gpus_per_replica", "update_gpus", "prompt_len", "verifiers", "decision_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"cluster {name} must be >= 1, got {getattr(self, name)}")
        if self.reward_seconds < 0:
            raise ValueError(f"cluster reward_seconds must be >= 0, got {self.reward_seconds}")
        if self.micro_batch_size < 0 or self.update_layout not in LAYOUTS:
            raise ValueError(
                f"cluster micro_batch_size must be >= 0 and update_layout one of {list(LAYOUTS)}, got "
                f"{self.micro_batch_size}, {self.update_layout!r}"
            )

    @classmethod
    def from_run(cls, spec: RunSpec, *, prompt_len: int, reward_seconds: float, decision_tokens: int) -> ClusterConfig:
        """A run's roles: one engine per rollout pod over its GPUs, the update over every policy pod's GPUs
        (a CPU pod counts as one device), one reward worker per verifier pod."""
        return cls(
            replicas=max(1, spec.rollout.replicas),
            gpus_per_replica=max(1, spec.rollout.resources.gpus),
            update_gpus=max(1, spec.policy.replicas) * max(1, spec.policy.resources.gpus),
            prompt_len=prompt_len,
            verifiers=max(1, spec.verifier.replicas),
            reward_seconds=reward_seconds,
            decision_tokens=decision_tokens,
            micro_batch_size=spec.algorithm.micro_batch_size,
            update_layout=spec.algorithm.update_layout,
        )


@dataclass(frozen=True)
class Variant:
    """vanilla: no arms; static: the learned drafter, never retrained; tlt: trained in idle time."""

    name: str
    arms: tuple[ArmSpec, ...] = ()
    trains: bool = False


@dataclass
class StepResult:
    """One variant's step. timelines: per replica, its segments from 0 to the step's end."""

    step_seconds: float
    rollout_seconds: float
    update_seconds: float
    sync_seconds: float
    idle_gpu_seconds: float
    harvested_gpu_seconds: float
    alpha: float
    sd_seconds: float
    timelines: list[list[Segment]] = field(repr=False, default_factory=list)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if k != "timelines"}


def update_tokens(lengths: list[int], prompt_len: int, micro_batch_size: int = 0, layout: str = "sorted") -> int:
    """Tokens the update's forwards compute for responses of `lengths` after `prompt_len`-token prompts:
    micro-batches as `tlt.rl.packing.micro_batches` groups them, each row padded to its micro-batch's
    longest sequence (packed: no padding); micro_batch_size 0: prompt + response tokens, unpadded."""
    sequences = [prompt_len + n for n in lengths]
    if micro_batch_size == 0 or layout == "packed":
        return sum(sequences)
    return sum(
        len(rows) * max(sequences[b] for b in rows) for rows in micro_batches(sequences, micro_batch_size, layout)
    )


def verification_end(finish_times: list[float], verifiers: int, reward_seconds: float) -> float:
    """When the last response is scored: FIFO in finish order over `verifiers` workers."""
    free = [0.0] * verifiers
    end = 0.0
    for t in sorted(finish_times):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + reward_seconds)
        end = max(end, start + reward_seconds)
    return end


def simulate_step(
    lengths: list[int], variant: Variant, cost: CostModel, cluster: ClusterConfig, drafting: list[Drafting | None]
) -> StepResult:
    """The step of `lengths` (prompt-major responses) split in contiguous near-equal shards over the
    replicas; drafting: per replica, its SD state (None for vanilla)."""
    if len(drafting) != cluster.replicas:
        raise ValueError(f"drafting needs one entry per replica ({cluster.replicas}), got {len(drafting)}")
    shards = [s.tolist() for s in np.array_split(np.asarray(lengths, dtype=int), cluster.replicas)]
    rollouts: list[ReplicaRollout] = [
        decode_shard(shard, cost, prompt_len=cluster.prompt_len, drafting=d, decision_tokens=cluster.decision_tokens)
        for shard, d in zip(shards, drafting)
    ]
    finish = [t for r in rollouts for t in r.finish]
    rollout_end = max(max(r.end for r in rollouts), verification_end(finish, cluster.verifiers, cluster.reward_seconds))
    idle = sum(rollout_end - r.end for r in rollouts) * cluster.gpus_per_replica
    tokens = update_tokens(lengths, cluster.prompt_len, cluster.micro_batch_size, cluster.update_layout)
    update = cost.update_seconds(tokens, cluster.update_gpus)
    sync = cost.sync_seconds()
    end = rollout_end + update + sync
    spare = "train" if variant.trains else "idle"
    timelines = [
        [
            *r.segments,
            *([Segment(r.end, rollout_end, spare)] if rollout_end > r.end else []),
            Segment(rollout_end, rollout_end + update, "update"),
            Segment(rollout_end + update, end, "sync"),
        ]
        for r in rollouts
    ]
    alpha = next((d.alpha for d in drafting if d is not None), 0.0)
    sd = sum(s.end - s.start for r in rollouts for s in r.segments if s.kind == "sd")
    return StepResult(end, rollout_end, update, sync, idle, idle if variant.trains else 0.0, alpha, sd, timelines)
