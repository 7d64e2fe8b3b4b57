"""Where each role of `tlt train` computes: the CPU, or a GPU the role asked for.

A role asks for GPUs with `<role>.resources.gpus`: on a cluster the operator turns it into the pod's
`nvidia.com/gpu`; `tlt train` on one machine maps the same fields onto that machine's GPUs, so one
`run.yaml` means the same in both places:

- the policy (the coordinator's process: GRPO update, whole-run checkpoints) computes on `cuda` when
  `policy.resources.gpus >= 1`;
- each rollout worker (its engine, its drafter, its co-located drafter trainer) asks Ray for GPU when
  `rollout.resources.gpus >= 1`: on a local cluster of G GPUs and R workers, min(1, G / R) of one each
  (two workers on one GPU take half each and share it; the coordinator's process shares it too); on role
  pods, the pod's own `rollout.resources.gpus`. A worker computes on the first GPU Ray hands it (the engine
  has no tensor parallelism);
- verifiers and the drafter hub stay on the CPU (they score text and average a drafter's parameter
  deltas); `gpus: 0`, the default, keeps a role on the CPU on any machine.

A role that asks for a GPU where none is visible is refused before anything starts, naming the field
(Ray would otherwise wait forever for a GPU that never comes). Tensors that cross processes (policy
weights, completions' log-probs, drafter parameters, the drafter buffer's hidden states) travel on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from tlt.rollout.types import Completion

CPU = torch.device("cpu")


@dataclass(frozen=True)
class GpuPlan:
    """policy_device: where the policy and its update live. rollout_gpus: Ray's `num_gpus` of each rollout
    worker (0: the worker computes on the CPU)."""

    policy_device: torch.device = CPU
    rollout_gpus: float = 0.0


def policy_device(policy_gpus: int, *, cuda_available: bool) -> torch.device:
    """`cuda` when the policy asks for a GPU (`policy.resources.gpus`) and this process sees one, the CPU when
    it asks for none; ValueError naming the field when it asks for one that is not there."""
    if policy_gpus > 0 and not cuda_available:
        raise ValueError(
            f"policy.resources.gpus is {policy_gpus} but this process sees no CUDA GPU "
            "(torch.cuda.is_available() is False); set policy.resources.gpus to 0 to update the policy on the CPU"
        )
    return torch.device("cuda") if policy_gpus > 0 else CPU


def gpu_plan(
    policy_gpus: int,
    rollout_gpus: int,
    replicas: int,
    resources: Mapping[str, float],
    *,
    role_pods: bool,
    cuda_available: bool,
) -> GpuPlan:
    """The GPU share of the policy and of each rollout worker, from the roles' `resources.gpus`.

    resources: the Ray cluster's (`ray.cluster_resources()`: "GPU" counts its GPUs). role_pods: rollout
    workers land on rollout pods (one each), so a worker asks for its pod's GPUs, not a share of the cluster's.
    cuda_available: whether this (the coordinator's) process sees a CUDA device.
    Raises ValueError naming the field when a role asks for a GPU that is not there.
    """
    device = policy_device(policy_gpus, cuda_available=cuda_available)
    gpus = float(resources.get("GPU", 0.0))
    share = 0.0
    if rollout_gpus > 0:
        if gpus <= 0:
            raise ValueError(
                f"rollout.resources.gpus is {rollout_gpus} but the Ray cluster has no GPU "
                "(ray.cluster_resources() lists none); set rollout.resources.gpus to 0 to roll out on the CPU"
            )
        if role_pods:
            share = float(rollout_gpus)
        else:
            share = math.floor(min(1.0, gpus / max(replicas, 1)) * 10_000) / 10_000
    return GpuPlan(policy_device=device, rollout_gpus=share)


def actor_device(gpu_ids: Sequence[object]) -> torch.device:
    """The device of a Ray actor given `ray.get_gpu_ids()`: Ray sets CUDA_VISIBLE_DEVICES to the GPUs it
    assigned, so the first of them is `cuda:0` inside the actor; the CPU when it assigned none."""
    return torch.device("cuda", 0) if len(gpu_ids) > 0 else CPU


def to_cpu(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """`state`'s tensors detached, on the CPU (cast to `dtype` when given), for Ray's object store or a
    checkpoint. Tensors already on the CPU in that dtype are not copied."""
    return {name: t.detach().to(device=CPU, dtype=dtype or t.dtype) for name, t in state.items()}


def tree_to_cpu(obj: Any) -> Any:
    """`obj` (dicts, lists and tuples of tensors and plain values, e.g. an optimizer's `state_dict()`) with
    every tensor on the CPU: new containers, the same tensor objects where they were on the CPU already."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: tree_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(tree_to_cpu(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_to_cpu(v) for v in obj)
    return obj


def completion_to_cpu(completion: Completion) -> Completion:
    """`completion` with its log-probs and hidden states on the CPU (itself when they are there already)."""
    hidden = completion.hidden
    if completion.logprobs.device == CPU and (hidden is None or hidden.device == CPU):
        return completion
    return replace(completion, logprobs=completion.logprobs.cpu(), hidden=None if hidden is None else hidden.cpu())
