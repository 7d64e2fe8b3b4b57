"""The EAGLE-style drafter: layout, binding, save/load, the training objective and its alignment."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from tlt.drafter.objective import (
    SOFT_CE_WEIGHT,
    drafter_inputs,
    drafter_loss,
    top1_agreement,
    train_drafter_steps,
)
from tlt.models.drafter import (
    EagleDrafter,
    drafter_config_from_target,
    load_drafter,
    save_drafter,
    target_features,
)
from tlt.models.tiny import tiny_model

LAYER_KEYS = {
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


def _bound_drafter(target: torch.nn.Module, seed: int = 0) -> EagleDrafter:
    torch.manual_seed(seed)
    drafter = EagleDrafter(drafter_config_from_target(target.config)).to(target.dtype)
    drafter.bind_policy(target)
    return drafter


def _random_inputs(batch: int, length: int, hidden: int, vocab: int = 64) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, vocab, (batch, length))
    feats = torch.randn(batch, length, hidden)
    positions = torch.arange(length).expand(batch, length)
    return ids, feats, positions


@pytest.mark.parametrize(("family", "head_dim"), [("qwen2", 16), ("qwen3", 32), ("llama", 16)])
def test_config_copies_target_shapes_rope_and_eps_with_one_biasless_layer(family, head_dim):
    target = tiny_model(family, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=96, rope_theta=5e5)
    config = drafter_config_from_target(target.config)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (64, 4, 2)
    assert (config.head_dim, config.intermediate_size, config.vocab_size) == (head_dim, 96, 64)
    assert config.rope_parameters == target.config.rope_parameters
    assert config.rms_norm_eps == target.config.rms_norm_eps
    assert config.num_hidden_layers == 1
    assert not config.attention_bias and not config.mlp_bias


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_state_dict_is_exactly_fc_and_layer0_without_embedding_head_or_input_norm(family):
    target = tiny_model(family)
    drafter = _bound_drafter(target)
    assert set(drafter.state_dict()) == {"fc.weight"} | LAYER_KEYS
    assert drafter.fc.weight.shape == (64, 128) and drafter.fc.bias is None
    assert isinstance(drafter.layers[0].input_layernorm, torch.nn.Identity)
    own = {id(p) for p in drafter.parameters()}
    assert id(target.lm_head.weight) not in own and id(target.model.embed_tokens.weight) not in own
    assert sum(p.numel() for p in drafter.parameters()) == sum(t.numel() for t in drafter.state_dict().values())


def test_qwen3_target_gets_a_llama_layer_with_its_head_dim_and_no_qk_norms():
    """vLLM's EAGLE drafters are Llama layers for every target (EagleLlamaForCausalLM has no q/k norms),
    so a Qwen3 target's drafter has none either; it keeps the target's head_dim (heads x head_dim != H)."""
    target = tiny_model("qwen3", hidden_size=64, num_heads=4, num_kv_heads=2)
    drafter = _bound_drafter(target)
    attn = drafter.layers[0].self_attn
    assert not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
    assert attn.q_proj.weight.shape == (4 * 32, 64) and attn.k_proj.weight.shape == (2 * 32, 64)
    assert attn.o_proj.weight.shape == (64, 4 * 32)
    ids, feats, positions = _random_inputs(2, 5, 64)
    assert drafter(ids, feats, positions).shape == (2, 5, 64)


def test_fc_reads_embedding_first_then_feature():
    target = tiny_model("llama")
    drafter = _bound_drafter(target)
    ids, feats, positions = _random_inputs(1, 5, 64)
    with torch.no_grad():
        drafter.fc.weight[:, 64:].zero_()  # keep only the embedding half
        only_embed = drafter(ids, feats, positions)
        same = drafter(ids, torch.randn_like(feats), positions)
    assert torch.equal(only_embed, same)


def test_unbound_drafter_refuses_to_run():
    drafter = EagleDrafter(drafter_config_from_target(tiny_model("qwen2").config))
    with pytest.raises(RuntimeError, match="not bound to a policy"):
        drafter(*_random_inputs(1, 3, 64))


def test_bind_refuses_a_head_of_the_wrong_width():
    drafter = EagleDrafter(drafter_config_from_target(tiny_model("qwen2", hidden_size=64).config))
    other = tiny_model("qwen2", hidden_size=32, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="embed_tokens has dim 32, the drafter's hidden_size is 64"):
        drafter.bind_policy(other)


def test_forward_is_causal_and_packed_rows_match_separate_rows():
    target = tiny_model("qwen2")
    drafter = _bound_drafter(target)
    ids, feats, positions = _random_inputs(1, 8, 64)
    with torch.no_grad():
        out = drafter(ids, feats, positions)
        changed = feats.clone()
        changed[:, 5:] += 1.0
        assert torch.allclose(drafter(ids, changed, positions)[:, :5], out[:, :5], atol=1e-6)
        assert not torch.allclose(drafter(ids, changed, positions)[:, 5:], out[:, 5:])

        first = drafter(ids[:, :3], feats[:, :3], positions[:, :3])
        second = drafter(ids[:, 3:], feats[:, 3:], positions[:, :5])
        block = torch.zeros(8, 8, dtype=torch.bool)
        block[:3, :3], block[3:, 3:] = True, True
        packed_positions = torch.cat([positions[:, :3], positions[:, :5]], dim=1)
        packed = drafter(ids, feats, packed_positions, attention_mask=(block.tril()).view(1, 1, 8, 8))
    assert torch.allclose(packed, torch.cat([first, second], dim=1), atol=1e-5)


def test_target_features_are_the_final_norm_state_that_produced_the_next_token():
    target = tiny_model("qwen2")
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        assert torch.allclose(target.lm_head(target_features(target, ids)), target(ids).logits, atol=1e-6)


@pytest.mark.parametrize(
    ("family", "dtype"), [("qwen2", torch.float32), ("qwen3", torch.float32), ("llama", torch.bfloat16)]
)
def test_save_load_round_trip_is_bitwise_and_binds_the_target(tmp_path, family, dtype):
    target = tiny_model(family, dtype=dtype)
    drafter = _bound_drafter(target)
    save_drafter(drafter, tmp_path)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == {"fc.weight"} | LAYER_KEYS

    loaded = load_drafter(tmp_path, target)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
        assert loaded.state_dict()[name].dtype == dtype
    ids, feats, positions = _random_inputs(2, 6, 64)
    with torch.no_grad():
        assert torch.equal(drafter.logits(drafter(ids, feats, positions)), loaded.logits(loaded(ids, feats, positions)))
    assert not load_drafter(tmp_path, target.config).is_bound


def _rewrite_weights(folder, edit) -> None:
    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))


def test_missing_and_extra_keys_are_named(tmp_path):
    target = tiny_model("qwen2")
    save_drafter(_bound_drafter(target), tmp_path)
    _rewrite_weights(tmp_path, lambda s: s.pop("layers.0.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing keys \['layers.0.mlp.up_proj.weight'\], unexpected keys \[\]"):
        load_drafter(tmp_path, target)

    save_drafter(_bound_drafter(target), tmp_path)
    _rewrite_weights(tmp_path, lambda s: s.update({"embed_tokens.weight": torch.zeros(64, 64)}))
    with pytest.raises(ValueError, match=r"missing keys \[\], unexpected keys \['embed_tokens.weight'\]"):
        load_drafter(tmp_path, target)


def test_loading_for_a_target_of_another_shape_is_refused(tmp_path):
    save_drafter(_bound_drafter(tiny_model("qwen2", hidden_size=64)), tmp_path)
    other = tiny_model("qwen2", hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64)
    with pytest.raises(
        ValueError, match=r"does not fit the target \(hidden_size: saved 64, target 32.*intermediate_size"
    ):
        load_drafter(tmp_path, other)


def test_tensor_shapes_are_checked_even_when_the_config_agrees(tmp_path):
    target = tiny_model("qwen2")
    save_drafter(_bound_drafter(target), tmp_path)
    _rewrite_weights(tmp_path, lambda s: s.update({"fc.weight": torch.zeros(64, 64)}))
    with pytest.raises(ValueError, match=r"fc.weight: saved \(64, 64\), expected \(64, 128\)"):
        load_drafter(tmp_path, target)


def test_missing_drafter_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_drafter(tmp_path, tiny_model("qwen2").config)


def test_head_follows_in_place_updates_and_rebinding_uses_the_new_policy():
    old, new = tiny_model("qwen2", seed=0), tiny_model("qwen2", seed=1)
    drafter = _bound_drafter(old)
    feats = torch.randn(1, 4, 64)
    with torch.no_grad():
        before = drafter.logits(feats)
        old.lm_head.weight.mul_(2.0)
        assert torch.allclose(drafter.logits(feats), 2.0 * before, atol=1e-6)
        drafter.bind_policy(new)
        assert torch.equal(drafter.logits(feats), new.lm_head(feats))


@pytest.mark.parametrize(("family", "tied"), [("llama", True), ("qwen3", False)])
def test_training_leaves_the_policy_untouched(family, tied):
    target = tiny_model(family, tie_word_embeddings=tied)
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    drafter = _bound_drafter(target)
    start = {name: tensor.clone() for name, tensor in drafter.state_dict().items()}
    tokens = torch.randint(3, 64, (2, 10))
    train_drafter_steps(drafter, [drafter_inputs(tokens, target_features(target, tokens))], steps=3, lr=1e-3)
    assert all(not torch.equal(start[name], tensor) for name, tensor in drafter.state_dict().items()), "drafter moves"
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())
    assert all(p.grad is None for p in target.parameters())


def test_drafter_inputs_pair_next_token_with_current_feature():
    tokens = torch.tensor([[10, 11, 12, 13]])
    hidden = torch.arange(4.0).view(1, 4, 1).expand(1, 4, 2)  # f[t] = t
    mask = torch.tensor([[False, False, True, True]])  # x[2], x[3] are the response
    batch = drafter_inputs(tokens, hidden, mask)
    assert batch.input_ids.tolist() == [[11, 12, 13]]
    assert batch.features[0, :, 0].tolist() == [0.0, 1.0, 2.0]
    assert batch.target[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    assert batch.position_ids.tolist() == [[0, 1, 2]]
    assert batch.mask.tolist() == [[False, True, True]]


def test_loss_is_smooth_l1_plus_tenth_soft_ce_on_masked_positions_only():
    pred, target = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    target[0, 1] = 5.0  # a huge error at the masked-out position must not count
    target_logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]]])
    pred_logits = torch.zeros(1, 2, 4)
    loss = drafter_loss(pred, pred_logits, target, target_logits, torch.tensor([[True, False]]))
    assert loss.regression.item() == 0.0
    assert loss.soft_ce.item() == pytest.approx(torch.log(torch.tensor(4.0)).item())
    assert loss.total.item() == pytest.approx(SOFT_CE_WEIGHT * loss.soft_ce.item())

    pred[0, 0, 0] = 3.0  # SmoothL1(3) = 2.5 on one of H=4 dims
    loss = drafter_loss(pred, pred_logits, target, target_logits, torch.tensor([[True, False]]))
    assert loss.regression.item() == pytest.approx(2.5 / 4)


def _generated(target: torch.nn.Module, n: int, seed: int, prompt_len: int = 4, new_tokens: int = 48) -> torch.Tensor:
    torch.manual_seed(seed)
    prompts = torch.randint(3, target.config.vocab_size, (n, prompt_len))
    return target.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        do_sample=True,
        temperature=0.3,
        top_k=0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )


def test_aligned_drafter_agrees_with_target_and_off_by_one_does_not(caplog):
    """A drafter trained on (x[t+1], f[t]) -> f[t+1] learns the target; one fed features shifted by
    one position reaches a similar loss yet agrees with the target almost never (the bug to catch)."""
    target = tiny_model("qwen2", vocab_size=32)
    train, held_out = _generated(target, 64, seed=1), _generated(target, 32, seed=2)
    response = torch.zeros_like(train, dtype=torch.bool)
    response[:, 4:] = True
    hidden = target_features(target, train)
    shifted = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)  # f'[t] = f[t-1]

    def trained(features: torch.Tensor) -> tuple[EagleDrafter, list[float]]:
        drafter = _bound_drafter(target)
        rows = [slice(i, i + 16) for i in range(0, 64, 16)]
        batches = [drafter_inputs(train[r], features[r], response[r]) for r in rows]
        return drafter, train_drafter_steps(drafter, batches, steps=300, lr=5e-3)

    aligned, aligned_losses = trained(hidden)
    off_by_one, off_losses = trained(shifted)
    held_hidden = target_features(target, held_out)
    held_mask = torch.zeros_like(held_out, dtype=torch.bool)
    held_mask[:, 4:] = True
    good = top1_agreement(aligned, held_out, held_hidden, held_mask)
    bad = top1_agreement(off_by_one, held_out, held_hidden, held_mask)
    logging.getLogger(__name__).info(
        "top-1 agreement aligned %.3f (loss %.3f) vs off-by-one %.3f (loss %.3f)",
        good,
        aligned_losses[-1],
        bad,
        off_losses[-1],
    )
    assert aligned_losses[-1] < 0.6 * aligned_losses[0]
    assert good >= 0.6, f"aligned drafter agrees only {good:.3f}"
    assert bad <= 0.3, f"off-by-one drafter agrees {bad:.3f}"
    assert good - bad >= 0.4, f"aligned {good:.3f} vs off-by-one {bad:.3f}"


def test_binding_refuses_a_drafter_on_another_device_than_the_policy():
    """A drafter left on the CPU beside a policy on a GPU fails when it is bound, saying what to do (not deep
    inside a matmul at the first draft)."""
    policy = tiny_model("qwen2", vocab_size=32, seed=1)
    drafter = EagleDrafter(drafter_config_from_target(policy.config)).to("meta")
    with pytest.raises(ValueError, match="move the drafter to the policy's device"):
        drafter.bind_policy(policy)
    drafter.to_empty(device="cpu").bind_policy(policy)  # on the policy's device: bound
    assert drafter.is_bound
