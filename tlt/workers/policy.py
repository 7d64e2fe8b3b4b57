"""The policy role: the trained weights, their optimizer, the GRPO update, and what leaves the role.

Both loops (one process and Ray) hold ONE policy role and call it the same way: `update` learns from a
step's rollouts, `rollout_weights` is what rollout engines load, `add_to` / `load` are its part of the
whole-run checkpoint (tensors "policy" and "rng", object "optimizer"), `save` writes the final Hugging
Face folder. The loops do not know how the update runs: above one policy rank the Ray loop holds a
`tlt.workers.sharded_policy.ShardedPolicyRole`, with this interface, instead (`policy_role`).

Numerics: the master weights are float32 (float64 when `model.dtype` is float64); the update runs under
autocast in `model.dtype` when that is bfloat16; rollout engines get a copy in `model.dtype`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.checkpoint.store import Checkpoint
from tlt.models.loading import load_policy, resolve_dtype, save_policy
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.runtime.devices import CPU, to_cpu
from tlt.spec.run import RunSpec, TLTTrainingRun
from tlt.tasks.warmstart import WarmstartConfig, warm_start
from tlt.workers.policy_group import checkpoint_activations
from tlt.workers.policy_shards import POLICY_SHARDS, load_shards

POLICY_DIR = "policy"  # the final policy's folder under a run's output folder


def master_dtype(model_dtype: str) -> torch.dtype:
    """Dtype of the policy's trained weights: float64 for a float64 run, else float32."""
    return torch.float64 if resolve_dtype(model_dtype) == torch.float64 else torch.float32


def policy_path(run: TLTTrainingRun, warmstart: WarmstartConfig | None) -> str:
    """The folder the policy's architecture, weights and tokenizer come from: `model.path`, else the built-in
    warm start (trained once and cached)."""
    if run.spec.model.path is not None:
        return run.spec.model.path
    return str(warm_start(warmstart or WarmstartConfig()))


def build_policy(
    spec: RunSpec, warmstart: WarmstartConfig | None = None, device: torch.device = CPU
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy (master weights, eval mode, on `device`) and tokenizer: `model.path`, else the built-in
    warm start."""
    path = spec.model.path
    if path is None:
        if spec.dataset.source != "builtin":
            raise ValueError("model.path is required unless dataset.source is 'builtin' (the warm start's task)")
        path = warm_start(warmstart or WarmstartConfig())
    policy, tokenizer = load_policy(path, master_dtype(spec.model.dtype))
    if spec.policy.activation_checkpointing:
        checkpoint_activations(policy)
    return policy.to(device), tokenizer


def build_optimizer(policy: PreTrainedModel, spec: RunSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        policy.parameters(), lr=spec.algorithm.learning_rate, betas=(0.9, 0.999), weight_decay=0.01
    )


class PolicyRole:
    """The policy of one run on `device`: master weights, tokenizer, AdamW; its update and checkpoint part."""

    def __init__(self, spec: RunSpec, warmstart: WarmstartConfig | None = None, device: torch.device = CPU) -> None:
        self.spec = spec
        self.policy, self.tokenizer = build_policy(spec, warmstart, device)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.compute_dtype = resolve_dtype(spec.model.dtype)
        self.optimizer = build_optimizer(self.policy, spec)

    @property
    def config(self) -> Any:
        return self.policy.config

    def update(self, completions: list[Completion], rewards: torch.Tensor) -> dict[str, float]:
        """One step's GRPO update from its rollouts (rewards [P, G]); the update's metrics."""
        return rl_step.learn(
            self.policy,
            self.optimizer,
            completions,
            rewards,
            self.spec.algorithm,
            pad_id=self.pad_id,
            compute_dtype=self.compute_dtype,
        )

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        """The weights rollout engines load: on the CPU, in `model.dtype`."""
        return to_cpu(self.policy.state_dict(), self.compute_dtype)

    def add_to(self, ckpt: Checkpoint) -> None:
        """This role's part of a whole-run checkpoint: the weights, the torch RNG, the optimizer state."""
        # clones: safetensors refuses tensors that share memory (tied embeddings)
        ckpt.tensors["policy"] = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        ckpt.tensors["rng"] = {"torch": torch.get_rng_state()}
        ckpt.objects["optimizer"] = self.optimizer.state_dict()

    def load(self, ckpt: Checkpoint) -> None:
        """Restore what `add_to` wrote, or the shards a policy group wrote at any world size (DCP)."""
        if "policy" in ckpt.tensors:
            self.policy.load_state_dict(ckpt.tensors["policy"])
            self.optimizer.load_state_dict(ckpt.objects["optimizer"])
        else:
            load_shards(self.policy, self.optimizer, ckpt.folder_path(POLICY_SHARDS))
        torch.set_rng_state(ckpt.tensors["rng"]["torch"])

    def save(self, out_dir: Path) -> Path:
        """The final policy as a Hugging Face folder `<out_dir>/policy`."""
        folder = Path(out_dir) / POLICY_DIR
        save_policy(self.policy, self.tokenizer, folder)
        return folder
