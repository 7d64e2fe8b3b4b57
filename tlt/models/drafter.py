"""The EAGLE-style drafter: `fc` fusion of (token embedding, target feature), one decoder layer.

At draft position t the drafter reads x[t+1] (the token the target just produced) and f[t]
(the target's final-norm output at position t, the state that produced x[t+1]):

    h = layers.0(fc(cat(embed(x[t+1]), f[t])))      # predicts f[t+1]
    logits = lm_head(h)                              # the target's own head

The decoder layer is Llama-shaped for every target: its input norm is the identity and there
is no final norm (the layout fastrl and vLLM's EAGLE loader expect: `fc.weight`, `layers.0.*`).
Qwen2 targets have q/k/v biases; the drafter layer has none, like EAGLE's drafters for Qwen.
Qwen3 targets have per-head q/k RMSNorms; the drafter layer has none either, because vLLM runs
every EAGLE-1 drafter as `EagleLlamaForCausalLM` (Llama layers, no q/k norm: a `q_norm` tensor
would be skipped on load). It keeps the target's `head_dim`, which for Qwen3 may differ from
hidden_size / num_attention_heads.

The embedding and LM head are the current policy's. They are bound with `bind` (again after
every policy update that replaces the modules), kept outside the module tree so they never
appear in `parameters()` / `state_dict()`, and read through `.detach()`: drafter training
never moves policy weights and never needs `requires_grad` flipped on them.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from tlt.models.draft_vocab import DraftVocab
from tlt.models.segment_attention import SEGMENT_ATTENTION

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# Fields that fix tensor shapes: a saved drafter must agree with its target on each of them.
SHAPE_FIELDS: tuple[str, ...] = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)


def drafter_config_from_target(target_config: PretrainedConfig) -> LlamaConfig:
    """A one-layer Llama config with the target's widths, heads, RoPE and RMSNorm epsilon."""
    head_dim = getattr(target_config, "head_dim", None) or (
        target_config.hidden_size // target_config.num_attention_heads
    )
    config = LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=target_config.num_key_value_heads,
        head_dim=head_dim,
        hidden_act=target_config.hidden_act,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps,
        rope_parameters=copy.deepcopy(target_config.rope_parameters),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    config._attn_implementation = SEGMENT_ATTENTION  # SDPA, and per segment for packed rows
    return config


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """Boolean attention mask [1, 1, T, T]; True where query t may attend to key s (s <= t)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril().view(1, 1, seq_len, seq_len)


class BoundDrafter(nn.Module):
    """What every learned drafter shares: `fc` (2H -> H, no bias) over (token embedding, target feature),
    Llama decoder layers (the first with identity input norm, `num_layers` of them), the policy's embedding
    and head bound by reference, and drafting's reduced vocabulary. `forward` is the subclass's."""

    def __init__(self, config: LlamaConfig, num_layers: int = 1) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        layers = [LlamaDecoderLayer(config, layer_idx=i) for i in range(num_layers)]
        layers[0].input_layernorm = nn.Identity()
        self.layers = nn.ModuleList(layers)
        # Plain tuples keep these out of the module tree: no parameters, no state_dict entries,
        # and `.to(bfloat16)` leaves RoPE's inverse frequencies in float32.
        self._rotary: tuple[LlamaRotaryEmbedding] = (LlamaRotaryEmbedding(config),)
        self._bound: tuple[nn.Embedding, nn.Linear] | None = None
        self._draft_vocab: DraftVocab | None = None  # drafting's reduced vocabulary; training never reads it

    def bind(self, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> None:
        """Use the policy's embedding and LM head (frozen, by reference); call again after each policy update."""
        hidden = self.config.hidden_size
        if embed_tokens.embedding_dim != hidden:
            raise ValueError(
                f"embed_tokens has dim {embed_tokens.embedding_dim}, the drafter's hidden_size is {hidden}"
            )
        if lm_head.in_features != hidden:
            raise ValueError(f"lm_head takes {lm_head.in_features} features, the drafter's hidden_size is {hidden}")
        if lm_head.out_features != embed_tokens.num_embeddings:
            raise ValueError(
                f"lm_head has {lm_head.out_features} outputs but embed_tokens has {embed_tokens.num_embeddings} rows"
            )
        devices = {self.fc.weight.device, embed_tokens.weight.device, lm_head.weight.device}
        if len(devices) > 1:
            raise ValueError(
                f"the drafter is on {self.fc.weight.device}, the policy's embedding on "
                f"{embed_tokens.weight.device} and its LM head on {lm_head.weight.device}: move the "
                "drafter to the policy's device (drafter.to(device)) before binding"
            )
        self._bound = (embed_tokens, lm_head)
        if self._draft_vocab is not None:  # the new head's rows for the same ids
            self._draft_vocab.update(self._draft_vocab.ids.clone(), lm_head)

    def bind_policy(self, policy: PreTrainedModel) -> None:
        """Bind the input embedding and output head of a Qwen2 / Qwen3 / Llama causal LM."""
        self.bind(policy.get_input_embeddings(), policy.get_output_embeddings())

    @property
    def device(self) -> torch.device:
        """The device of the drafter's own parameters (its bound embedding and head are there too)."""
        return next(self.parameters()).device

    @property
    def is_bound(self) -> bool:
        return self._bound is not None

    def _require_bound(self) -> tuple[nn.Embedding, nn.Linear]:
        if self._bound is None:
            raise RuntimeError(
                "drafter is not bound to a policy: call bind(embed_tokens, lm_head) or bind_policy(model)"
            )
        return self._bound

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of predicted (or target) features [B, T, H] through the bound LM head; of wide
        target features (`tlt.models.feature_layers`) their final-norm part, the first H."""
        _, head = self._require_bound()
        bias = head.bias.detach() if head.bias is not None else None
        pred = pred[..., : self.config.hidden_size]
        return F.linear(pred.to(head.weight.dtype), head.weight.detach(), bias)

    def set_draft_vocab(self, size: int) -> DraftVocab | None:
        """Draft from `size` tokens of the bound head (`tlt.models.draft_vocab`; ids 0 .. size - 1 until
        updated); 0: from the whole vocabulary. Set it before the drafter's steps compile: the graphs
        read the subset's tensors, which later updates refresh in place."""
        _, head = self._require_bound()
        self._draft_vocab = DraftVocab(head, size) if size else None
        return self._draft_vocab

    def share_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft from another drafter's reduced vocabulary (one subset, refreshed in place, for every drafter
        bound to the same head)."""
        self._draft_vocab = vocab

    @property
    def draft_vocab(self) -> DraftVocab | None:
        return self._draft_vocab

    def draft_logits(self, pred: torch.Tensor) -> torch.Tensor:
        """What drafting ranks tokens by: `logits`, -inf outside the draft vocabulary when one is set.
        pred [..., H] -> [..., V]."""
        return self.logits(pred) if self._draft_vocab is None else self._draft_vocab.logits(pred)


class EagleDrafter(BoundDrafter):
    """fc (2H -> H, no bias) + one Llama decoder layer with identity input norm; head bound from the policy."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config, num_layers=1)

    def forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        segments: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Predict the next target features.

        input_ids [B, T] are x[t+1], features [B, T, H] are f[t] (of wide features, `tlt.models.feature_layers`,
        the final-norm part, the first H, is read), position_ids [B, T] are t.
        attention_mask: optional boolean [B or 1, 1, T, T] (True = attend), e.g. block-diagonal for
        packed sequences; causal over the whole row when omitted. segments: instead of a mask, the lengths
        of one packed row's sequences (B = 1, sum T): attention runs causally per sequence, the same result
        as the block-diagonal mask at a fraction of its cost (`tlt.models.segment_attention`).
        Returns f[t+1] predictions [B, T, H].
        """
        embed, _ = self._require_bound()
        dtype = self.fc.weight.dtype
        tokens = F.embedding(input_ids, embed.weight.detach()).to(dtype)  # [B, T, H]
        features = features[..., : self.config.hidden_size].to(dtype)
        fused = self.fc(torch.cat([tokens, features], dim=-1))  # [B, T, H]
        position_embeddings = self._rotary[0](fused, position_ids)  # cos, sin: [B, T, head_dim]
        if segments is not None:
            if self.config._attn_implementation != SEGMENT_ATTENTION:
                raise ValueError(
                    f"segments need the drafter config's attention {SEGMENT_ATTENTION!r}, it has "
                    f"{self.config._attn_implementation!r}"
                )
            return self.layers[0](
                fused,
                attention_mask=attention_mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
                segments=tuple(segments),
            )
        mask = attention_mask if attention_mask is not None else causal_mask(input_ids.shape[1], input_ids.device)
        return self.layers[0](
            fused, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings
        )


def target_features(
    policy: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The target's final-norm outputs f [B, T, H] for tokens [B, T]; f[t] is what produced x[t+1]."""
    with torch.no_grad():
        return policy.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def save_drafter(drafter: BoundDrafter, path: str | Path) -> None:
    """Write the trainable weights (safetensors, no embedding or head) and config.json into a folder."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().contiguous() for name, tensor in drafter.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(drafter.config.to_dict(), indent=2, sort_keys=True))
    log.info("saved drafter (%d tensors) to %s", len(state), folder)


def _check_saved_shapes(saved: dict, expected: LlamaConfig, config_file: Path) -> None:
    mismatched = [
        f"{field}: saved {saved.get(field)!r}, target {getattr(expected, field)!r}"
        for field in SHAPE_FIELDS
        if saved.get(field) != getattr(expected, field)
    ]
    if mismatched:
        raise ValueError(f"drafter in {config_file.parent} does not fit the target ({'; '.join(mismatched)})")


def load_drafter(path: str | Path, target: PretrainedConfig | PreTrainedModel) -> EagleDrafter:
    """Load a drafter saved by save_drafter for this target; on its device and bound to it when a model is given.

    The key set must match exactly and every shape must fit the target, or ValueError names the
    offending keys / fields. The weights keep the dtype they were saved in.
    """
    return load_saved(path, target, lambda config, saved: EagleDrafter(config))


def load_saved(
    path: str | Path, target: PretrainedConfig | PreTrainedModel, build: Callable[[LlamaConfig, dict], BoundDrafter]
) -> BoundDrafter:
    """`load_drafter` for any drafter kind: `build(config from the target, the saved config.json)` makes the
    empty module the saved weights must fit exactly."""
    folder = Path(path)
    config_file, weights_file = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for required in (config_file, weights_file):
        if not required.is_file():
            raise FileNotFoundError(
                f"drafter folder {str(folder)!r} has no {required.name}; write it with save_drafter"
            )
    target_config = target.config if isinstance(target, PreTrainedModel) else target
    config = drafter_config_from_target(target_config)
    saved = json.loads(config_file.read_text())
    _check_saved_shapes(saved, config, config_file)

    state = load_file(str(weights_file))
    drafter = build(config, saved)
    expected = drafter.state_dict()
    missing, extra = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or extra:
        raise ValueError(
            f"drafter weights in {weights_file} do not match: missing keys {missing}, unexpected keys {extra}"
        )
    wrong_shape = [
        f"{name}: saved {tuple(state[name].shape)}, expected {tuple(tensor.shape)}"
        for name, tensor in expected.items()
        if state[name].shape != tensor.shape
    ]
    if wrong_shape:
        raise ValueError(f"drafter weights in {weights_file} do not fit the target: {'; '.join(wrong_shape)}")
    dtypes = {tensor.dtype for tensor in state.values()}
    if len(dtypes) != 1:
        raise ValueError(f"drafter weights in {weights_file} mix dtypes {sorted(map(str, dtypes))}; expected one")
    drafter.to(dtypes.pop())
    drafter.load_state_dict(state, strict=True)
    if isinstance(target, PreTrainedModel):
        drafter.to(target.device)
        drafter.bind_policy(target)
    log.info("loaded drafter from %s", folder)
    return drafter
