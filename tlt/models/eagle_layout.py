"""The served EAGLE drafter's tensor layout: the exact key set vLLM's `EagleLlamaForCausalLM` maps onto
its draft model (shapes in `tlt.drafter.export`). vLLM skips tensors it does not know and leaves unknown
parameters at their initial values, so both the exporter and every loader check the key set strictly."""

from __future__ import annotations

EAGLE_ARCHITECTURE = "LlamaForCausalLM"
EAGLE_WEIGHT_NAMES: tuple[str, ...] = (
    "fc.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
)


def check_eagle_keys(names: set[str] | list[str], where: str) -> None:
    """Raise ValueError unless `names` is exactly the EAGLE tensor set, naming missing and extra keys."""
    present = set(names)
    missing = sorted(set(EAGLE_WEIGHT_NAMES) - present)
    extra = sorted(present - set(EAGLE_WEIGHT_NAMES))
    if missing or extra:
        raise ValueError(f"{where}: not an EAGLE drafter: missing keys {missing}, unexpected keys {extra}")
