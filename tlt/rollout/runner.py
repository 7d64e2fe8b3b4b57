"""A functional forward over a Hugging Face Qwen2 / Llama causal LM's own modules, with our KV cache.

The layers' modules are called as modules (norms, projections, MLP), never by reading their weights,
so in-place weight swaps are seen at once and the same code runs any Llama-shaped decoder layer
(e.g. a drafter layer whose input_layernorm is `nn.Identity`). Cos/sin come from the model's own
rotary embedding, so every RoPE variant it supports works.

Every forward says where each new token sits: `positions` (RoPE position: tree depth, not slot),
`write_slots` (cache slot its k/v go to) and `attn_mask` [B, Q, S] (which slots each query sees).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from tlt.models.feature_layers import check_feature_layers
from tlt.rollout.compiled import LAYER_REGIONS, CompiledStep
from tlt.rollout.kv_cache import KVCache, write_layer

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


def check_supported(model: nn.Module) -> None:
    """Raise ValueError unless model is a Qwen2 / Qwen2.5 / Qwen3 / Llama `*ForCausalLM` this runner can drive."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model: config.model_type must be one of {SUPPORTED_MODEL_TYPES} (a *ForCausalLM), got {model_type!r}"
        )
    if not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "layers"):
        raise ValueError(f"model: expected a *ForCausalLM with .model.layers and .lm_head, got {type(model).__name__}")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        raise ValueError("model: sliding-window attention layers are not supported (config.use_sliding_window)")


def prefix_mask(lengths: torch.Tensor, new_mask: torch.Tensor, span: int) -> torch.Tensor:
    """Attention mask for Q new tokens written at slots [lengths[b], lengths[b] + Q) of each row.

    lengths: [B] long, committed slots per row; new_mask: [Q, Q] or [B, Q, Q] bool, which new tokens
    each new token sees (causal for a chain, ancestors-and-self for a tree).
    Returns [B, Q, span] bool: every committed slot, plus the new slots new_mask allows.
    """
    q = new_mask.shape[-1]
    slots = torch.arange(span, device=lengths.device)
    offset = slots[None, :] - lengths[:, None]  # [B, S] index of the slot among the new tokens
    inside = (offset >= 0) & (offset < q)
    new_mask = new_mask.expand(lengths.shape[0], q, q)
    seen_new = torch.gather(new_mask, 2, offset.clamp(0, q - 1)[:, None, :].expand(-1, q, -1))
    return (offset < 0)[:, None, :] | (inside[:, None, :] & seen_new)


def causal_mask(lengths: torch.Tensor, num_new: int, span: int) -> torch.Tensor:
    """[B, num_new, span] bool: new token q of row b sees slots [0, lengths[b] + q]."""
    slots = torch.arange(span, device=lengths.device)
    last = lengths[:, None] + torch.arange(num_new, device=lengths.device)[None, :]  # [B, Q]
    return slots[None, None, :] <= last[:, :, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, Q, D]; cos, sin: [B, Q, D] -> x rotated, [B, H, Q, D]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def attention(
    attn: nn.Module,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_slots: torch.Tensor,
    attn_mask: torch.Tensor,
) -> torch.Tensor:
    """One self-attention block. x: [B, Q, H] (normed input) -> [B, Q, H] (after o_proj).

    k_cache, v_cache: the layer's [Bmax, Hkv, S, D] cache; the new k/v go to write_slots [B, Q] of
    rows [0, B), then every query attends to slots [0, attn_mask.shape[-1]) as attn_mask [B, Q, span] allows.
    """
    b, q, _ = x.shape
    d = attn.head_dim
    queries = attn.q_proj(x).view(b, q, -1, d)  # [B, Q, Hq, D]
    keys = attn.k_proj(x).view(b, q, -1, d)  # [B, Q, Hkv, D]
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head's q and k, before RoPE
        queries, keys = attn.q_norm(queries), attn.k_norm(keys)
    queries, keys = queries.transpose(1, 2), keys.transpose(1, 2)  # [B, H, Q, D]
    values = attn.v_proj(x).view(b, q, -1, d).transpose(1, 2)  # [B, Hkv, Q, D]
    cos, sin = rope
    queries, keys = apply_rope(queries, cos, sin), apply_rope(keys, cos, sin)
    write_layer(k_cache, v_cache, write_slots, keys, values)
    span = attn_mask.shape[-1]
    out = F.scaled_dot_product_attention(
        queries,
        k_cache[:b, :, :span],
        v_cache[:b, :, :span],
        attn_mask=attn_mask[:, None],
        scale=attn.scaling,
        enable_gqa=True,
    )  # [B, Hq, Q, D]
    return attn.o_proj(out.transpose(1, 2).reshape(b, q, -1))


def run_layers(
    layers: nn.ModuleList | list[nn.Module],
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    write_slots: torch.Tensor,
    attn_mask: torch.Tensor,
) -> torch.Tensor:
    """Llama-shaped decoder layers over x [B, Q, H]; layer i uses the caches ks[i], vs[i]. Returns [B, Q, H].

    Under torch.compile each layer is a nested compile region (`decoder_layer_region`): dynamo traces the
    first layer and stamps that trace out for the others (same structure, other weights and caches), where
    this torch can inline the stamped-out layers (`LAYER_REGIONS`); elsewhere every layer is traced."""
    return run_layers_keeping(layers, x, rope, ks, vs, write_slots, attn_mask, ())[0]


def run_layers_keeping(
    layers: nn.ModuleList | list[nn.Module],
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    write_slots: torch.Tensor,
    attn_mask: torch.Tensor,
    keep: tuple[int, ...],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`run_layers`, also returning the outputs of the layers `keep` names (indices, ascending): each [B, Q, H]."""
    step = decoder_layer_region if LAYER_REGIONS and torch.compiler.is_compiling() else decoder_layer
    kept = []
    for i, (layer, k_cache, v_cache) in enumerate(zip(layers, ks, vs)):
        x = step(layer, x, rope, k_cache, v_cache, write_slots, attn_mask)
        if i in keep:
            kept.append(x)
    return x, kept


def decoder_layer(
    layer: nn.Module,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_slots: torch.Tensor,
    attn_mask: torch.Tensor,
) -> torch.Tensor:
    """One pre-norm decoder layer (attention, then MLP, each with its residual): x [B, Q, H] -> [B, Q, H].
    Writes the layer's new k/v to k_cache, v_cache at write_slots."""
    x = x + attention(layer.self_attn, layer.input_layernorm(x), rope, k_cache, v_cache, write_slots, attn_mask)
    return x + layer.mlp(layer.post_attention_layernorm(x))


# Why a region: a compiled step's warm compile is ~90% dynamo tracing, most of it fake-tensor propagation
# through every layer; traced once and stamped out, 24 x 128's four target graphs compile in ~15 s warm
# instead of ~31 s. `tlt.rollout.compiled` turns on dynamo's `inline_invoke_subgraph`, which puts the
# stamped-out layers back into one flat graph before AOTAutograd and inductor: without it the region's
# in-place cache write is functionalised as a higher-order op whose fake run turns every symbolic size into
# a constant (a graph per batch and width), and inductor could not fuse across layer boundaries.
decoder_layer_region = torch.compiler.nested_compile_region(decoder_layer)


def decoder_forward(
    inner: nn.Module,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    write_slots: torch.Tensor,
    attn_mask: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
) -> torch.Tensor:
    """The decoder (`model.model`) over token_ids [B, Q] at positions [B, Q]: final-norm states [B, Q, H].

    A pure function of its arguments (the caches are written in place), so `tlt/rollout/compiled.py`
    can compile it as it is: the eager and the compiled step run the same code.
    """
    x = inner.embed_tokens(token_ids)
    rope = inner.rotary_emb(x, positions)
    return inner.norm(run_layers(inner.layers, x, rope, ks, vs, write_slots, attn_mask))


_TAPPED: dict[tuple[int, ...], Callable[..., torch.Tensor]] = {}


def tapped_decoder_forward(layers: tuple[int, ...]) -> Callable[..., torch.Tensor]:
    """`decoder_forward` that also returns the outputs of decoder `layers` (indices, ascending), after the
    final-norm states: [B, Q, H * (1 + len(layers))] (`tlt.models.feature_layers`). One function per tuple,
    so every runner of the process with the same layers shares its compiled graphs; () is decoder_forward."""
    if not layers:
        return decoder_forward
    if layers not in _TAPPED:

        def forward(
            inner: nn.Module,
            token_ids: torch.Tensor,
            positions: torch.Tensor,
            write_slots: torch.Tensor,
            attn_mask: torch.Tensor,
            ks: list[torch.Tensor],
            vs: list[torch.Tensor],
        ) -> torch.Tensor:
            x = inner.embed_tokens(token_ids)
            rope = inner.rotary_emb(x, positions)
            x, kept = run_layers_keeping(inner.layers, x, rope, ks, vs, write_slots, attn_mask, layers)
            return torch.cat([inner.norm(x), *kept], dim=-1)

        _TAPPED[layers] = forward
    return _TAPPED[layers]


class ModelRunner:
    """Drives a `*ForCausalLM` with a KVCache sized for max_batch_size rows and max_context slots.

    compile: run the decoder through `CompiledStep` (static cache allocated at max_context); the
    eager `decoder_forward` stays the reference path and computes the same function.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_batch_size: int,
        max_context: int,
        capacity: int = 256,
        compile: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        check_supported(model)
        self.model = model
        config = model.config
        self.feature_layers = check_feature_layers(feature_layers, len(model.model.layers), "feature_layers")
        self._forward = tapped_decoder_forward(self.feature_layers)
        attn = model.model.layers[0].self_attn
        self.cache = KVCache(
            num_layers=len(model.model.layers),
            num_kv_heads=config.num_key_value_heads,
            head_dim=attn.head_dim,
            max_batch_size=max_batch_size,
            capacity=min(capacity, max_context),
            max_capacity=max_context,
            dtype=model.dtype,
            device=model.device,
            static=compile,
        )
        self.compiled = CompiledStep(self._forward, name="target") if compile else None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.no_grad()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        attn_mask: torch.Tensor,
    ) -> torch.Tensor:
        """token_ids, positions, write_slots: [B, Q] long; attn_mask: [B, Q, S] bool.

        Writes the new tokens' k/v at write_slots of rows [0, B) and returns the final-norm hidden
        states [B, Q, H], followed by the `feature_layers` outputs when there are any: [B, Q, H * (1 + n)].
        S may be anything up to the cache capacity (slots past it are not read).
        """
        self.cache.ensure_capacity(max(attn_mask.shape[-1], int(write_slots.max()) + 1))
        step = self._forward if self.compiled is None else self.compiled
        return step(self.model.model, token_ids, positions, write_slots, attn_mask, self.cache.k, self.cache.v)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] (or `forward`'s wide features: their first H) -> logits [..., V] in the model's dtype."""
        return self.model.lm_head(hidden[..., : self.model.config.hidden_size])

    def compact(self, rows: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Move cache entries of rows [N] from src_slots [N, K] to dst_slots [N, K] (accepted tree path)."""
        self.cache.compact(rows, src_slots, dst_slots)
