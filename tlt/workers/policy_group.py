"""The policy group: one GRPO update shared by several ranks of one `torch.distributed` process group.

Each rank is a process holding the policy sharded (`fsdp`: FSDP2's `fully_shard` per decoder layer, then the
root, so a rank keeps ~1/world of the weights, gradients and AdamW state) or replicated (`ddp`). A step's
rows are split by tokens (`token_balanced_shards`), each rank runs its share, and the loss is normalised over
the WHOLE batch exactly as on one rank (`algorithm.lossAgg` with the batch's token and sequence counts, not
a mean of per-rank means): every rank scales its share's gradient by the world size, the group averages, so
the update is the one-rank update up to summation order. Gradient clipping sees the global norm. Ranks run
the same number of forward-backward passes (a rank with fewer micro-batches repeats one at loss weight 0),
so their collectives stay in step.

`rank_update` is what each rank calls; the metrics and the old log-probs come back summed over the group,
identical on every rank. `full_weights` gathers the full weights (to the CPU, on rank 0 only) for the rollout
engines. Backend: gloo on the CPU, NCCL on CUDA; collectives are torch.distributed's.
"""

from __future__ import annotations

import datetime
import functools
import heapq
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from tlt.rl.packing import micro_batches
from tlt.rl.update import RolloutBatch, policy_update
from tlt.spec.run import AlgorithmSpec

SHARDINGS = ("none", "ddp", "fsdp")
METRIC_SUMS = ("loss", "policy_loss", "kl", "clip_fraction")  # each rank's share of the batch's value


def token_balanced_shards(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Rows 0..B-1 split into `world` shards of near-equal tokens (`lengths[b]` each): longest first onto the
    shard with the fewest tokens so far (ties: the lower rank); each shard's rows in batch order.
    ValueError when a shard would be empty (fewer rows than ranks)."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if len(lengths) < world:
        raise ValueError(f"{len(lengths)} sequences cannot feed {world} policy ranks (each needs one)")
    heap = [(0, rank) for rank in range(world)]
    shards: list[list[int]] = [[] for _ in range(world)]
    for row in sorted(range(len(lengths)), key=lambda b: (-lengths[b], b)):
        tokens, rank = heapq.heappop(heap)
        shards[rank].append(row)
        heapq.heappush(heap, (tokens + lengths[row], rank))
    return [sorted(rows) for rows in shards]


def rank_passes(
    rows: list[int], lengths: Sequence[int], algo: AlgorithmSpec, world: int, passes: int
) -> list[tuple[list[int], float]]:
    """This rank's (rows, loss weight) passes: its rows micro-batched as on one rank (`algo.microBatchSize`,
    `algo.updateLayout`) at weight `world`, then weight-0 repeats of its first micro-batch up to `passes`."""
    local = micro_batches([lengths[b] for b in rows], algo.micro_batch_size, algo.update_layout)
    own = [([rows[i] for i in group], float(world)) for group in local]
    if len(own) > passes:
        raise ValueError(f"{len(own)} micro-batches on this rank but the group runs {passes}")
    return own + [(own[0][0], 0.0)] * (passes - len(own))


def init_group(rank: int, world: int, address: str, port: int, *, backend: str = "gloo", timeout_s: float = 120.0):
    """Join the policy group at `tcp://address:port` (rank 0 listens there). A rank that cannot join within
    `timeout_s` raises RuntimeError naming the rank and the address."""
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except (RuntimeError, TimeoutError) as exc:  # torch's DistStoreError is a RuntimeError
        raise RuntimeError(
            f"policy rank {rank} of {world} could not join the group at {address}:{port} within {timeout_s:.0f} s: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc


def checkpoint_activations(policy: nn.Module) -> nn.Module:
    """Each decoder layer of `policy` recomputes its activations in the backward (`torch.utils.checkpoint`,
    non-reentrant) instead of keeping them; parameter names unchanged. Numerically the same update."""
    for layer in policy.model.layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
    return policy


def shard_policy(
    policy: nn.Module, sharding: str, compute_dtype: torch.dtype | None = None, *, reshard_after_forward: bool = True
) -> nn.Module:
    """`policy` prepared for the group: `fsdp` shards it in place (per decoder layer, then the root; with a
    bfloat16 `compute_dtype` over float32 master weights, parameters are cast for the forward and gradients
    reduced in float32; `reshard_after_forward` false keeps a layer's gathered weights until its backward),
    `ddp` wraps it, `none` returns it unchanged."""
    if sharding not in SHARDINGS:
        raise ValueError(f"policy.sharding must be one of {list(SHARDINGS)}, got {sharding!r}")
    if sharding == "none":
        return policy
    if sharding == "ddp":
        return DistributedDataParallel(policy)
    master = next(policy.parameters()).dtype
    lower = compute_dtype is not None and compute_dtype != master
    mp = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if lower else MixedPrecisionPolicy()
    )
    for layer in policy.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(policy, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return policy


def rank_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: AlgorithmSpec,
    *,
    pad_id: int,
) -> dict[str, float]:
    """This rank's part of the group's GRPO update on `batch` (the whole batch, the same on every rank): its
    token-balanced share of the rows, the old log-probs from the first pass. Returns the update's metrics,
    summed over the group; `batch.old_logprobs` is the whole batch's, as on one rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = batch.lengths()
    rows = token_balanced_shards(lengths, world)[rank]
    count = torch.tensor(len(micro_batches([lengths[b] for b in rows], algo.micro_batch_size, algo.update_layout)))
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    passes = rank_passes(rows, lengths, algo, world, int(count))
    metrics = policy_update(model, optimizer, batch, algo, pad_id=pad_id, old_from_first_pass=True, passes=passes)
    sums = torch.tensor([metrics[k] for k in METRIC_SUMS], dtype=torch.float64)
    dist.all_reduce(sums)
    dist.all_reduce(batch.old_logprobs)  # each rank filled its own rows, zeros elsewhere
    return {**metrics, **dict(zip(METRIC_SUMS, sums.tolist()))}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights on the CPU on rank 0 (an empty dict on the others), gathered tensor by tensor so that
    no rank holds a second full copy on the device."""
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(inner, options=options)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds of parameters, gradients and optimizer state (its shards only)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in model.parameters():
        total += local(p).numel() * p.element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * p.grad.element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += local(value).numel() * value.element_size()
    return total
