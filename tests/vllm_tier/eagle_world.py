"""The vLLM tests' tiny policy and EAGLE drafters (no vLLM imported here): a tied-head Llama with 2 heads of 32
(vLLM's CPU attention has no kernel for head_dim 16) saved with its exported EAGLE drafter, and the drafters
whose acceptance is known in advance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tlt.drafter.export import export_eagle
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, save_drafter
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.tokenizer import build_task_tokenizer

SHAPE = dict(num_heads=2, num_kv_heads=1, tie_word_embeddings=True)


def silent(policy: Any) -> dict[str, torch.Tensor]:
    """The policy's state with layers that write nothing: it predicts from the last token's embedding alone."""
    return {
        k: torch.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight")) else v
        for k, v in policy.state_dict().items()
    }


def drafter_state(policy: Any, seed: int) -> dict[str, torch.Tensor]:
    """A randomly initialised drafter's state for `policy` (EAGLE names)."""
    torch.manual_seed(seed)
    drafter = EagleDrafter(drafter_config_from_target(policy.config)).float()
    return {k: v.detach().clone() for k, v in drafter.state_dict().items()}


def exact_drafter(policy: Any) -> dict[str, torch.Tensor]:
    """Passes the next token's embedding through: it predicts what the silent policy does, every draft accepted."""
    state = drafter_state(policy, seed=40)
    hidden = policy.config.hidden_size
    state["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    for name in ("layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"):
        state[name] = torch.zeros_like(state[name])
    return state


def eagle_world(root: Path, *, silent_layers: bool = False) -> tuple[Any, Any]:
    """(policy, tokenizer): the tiny policy (its layers silent when asked) saved at root/policy with a fresh
    drafter exported in the EAGLE layout at root/eagle."""
    tokenizer = build_task_tokenizer()
    policy = tiny_model("llama", seed=4, vocab_size=len(tokenizer), **SHAPE)
    if silent_layers:
        policy.load_state_dict(silent(policy))
    save_policy(policy, tokenizer, root / "policy")
    save_drafter(EagleDrafter(drafter_config_from_target(policy.config)).float(), root / "ckpt")
    export_eagle(root / "ckpt", root / "policy", root / "eagle")
    return policy, tokenizer
