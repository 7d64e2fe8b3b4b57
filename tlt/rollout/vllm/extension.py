"""Methods mixed into vLLM's worker (`LLM(..., worker_extension_cls=...)`) and called through
`llm.collective_rpc(name, args=...)`: new policy and drafter weights in place, no restart, no disk.

vLLM's CPU build repacks every linear weight into its GEMM kernel's layout after loading (and drops
the plain copy), so loading straight into the parameters fails or leaves the kernels stale. vLLM's
in-place reload (`model_loader.reload.reload_weights`) restores the checkpoint-format parameters,
loads, and repacks layer by layer: both the policy and the EAGLE drafter go through it. A tied LM head
shares the embedding's parameter but has its own packed copy: `refresh_tied_head` repacks it.

This module runs inside vLLM's worker process and imports vLLM: never import it from the engine.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.model_loader.reload.inplace import reload_weights


class WeightSync:
    """vLLM worker extension; `self` is vLLM's worker (`model_runner`, `vllm_config`)."""

    def tlt_update_policy(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load the policy's HF-named tensors in place; returns how many were given."""
        model = self.model_runner.get_model()
        reload_weights(
            self.vllm_config, model, weights_iterator=iter(named), weights_path=None, is_checkpoint_format=True
        )
        refresh_tied_head(model)
        self.model_runner.reset_encoder_cache()
        return len(named)

    def tlt_update_drafter(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load EAGLE-named drafter tensors (`tlt.models.eagle_layout.EAGLE_WEIGHT_NAMES`) in place."""
        drafter = getattr(self.model_runner, "drafter", None)
        if drafter is None or not hasattr(drafter, "model"):
            raise RuntimeError(
                "tlt_update_drafter: this vLLM engine runs no EAGLE drafter "
                "(start it with speculative_config method 'eagle')"
            )
        reload_weights(
            self.vllm_config, drafter.model, weights_iterator=iter(named), weights_path=None, is_checkpoint_format=True
        )
        return len(named)


def refresh_tied_head(model: Any) -> None:
    """Repack a tied LM head from the (reloaded) embedding it shares; a no-op for an untied head."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight:
        return
    head.quant_method.process_weights_after_loading(head)
