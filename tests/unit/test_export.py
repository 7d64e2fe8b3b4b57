"""Drafter export: a Hugging Face EAGLE folder named as vLLM's EAGLE loader expects, loaded back
strictly, usable by this engine (greedy speculative decoding equals plain decoding), and the
`tlt export-drafter` command. vLLM running the export as its EAGLE drafter is tested in the vLLM tier
(tests/vllm_tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _models_helpers import char_tokenizer
from safetensors.torch import load_file, save_file

from tlt.cli import main as tlt_main
from tlt.drafter.async_ckpt import AsyncCheckpointer
from tlt.drafter.evaluate import evaluate_drafter
from tlt.drafter.export import (
    SERVED_DIR,
    SERVED_INFO,
    export_eagle,
    load_eagle,
    resolve_checkpoint,
    write_served_drafter,
)
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, load_drafter, save_drafter
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.problem import Problem

# What vLLM's EagleLlamaForCausalLM maps onto its draft model, written out independently of the code.
VLLM_EAGLE_KEYS = {
    "fc.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
}


def make_drafter(policy, seed: int = 5, dtype: torch.dtype = torch.float32) -> EagleDrafter:
    torch.manual_seed(seed)
    drafter = EagleDrafter(drafter_config_from_target(policy.config)).to(dtype)
    with torch.no_grad():  # non-trivial norms, so a dropped or swapped tensor changes outputs
        drafter.layers[0].post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return drafter


@pytest.fixture(params=["qwen2", "qwen3", "llama"])
def policy(request):
    return tiny_model(request.param, seed=2, vocab_size=64, dtype=torch.float32)


def test_export_writes_the_vllm_eagle_names_and_config(policy, tmp_path: Path):
    save_drafter(make_drafter(policy), tmp_path / "ckpt")
    result = export_eagle(tmp_path / "ckpt", policy.config, tmp_path / "eagle")
    weights = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    assert set(weights) == VLLM_EAGLE_KEYS
    assert weights["fc.weight"].shape == (64, 128)
    assert result.tensors == len(VLLM_EAGLE_KEYS)
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1
    assert config["attention_bias"] is False and config["mlp_bias"] is False
    assert config["rope_theta"] == 10000.0
    assert config["torch_dtype"] == "float32"
    assert config["hidden_size"] == policy.config.hidden_size
    assert config["head_dim"] == policy.config.head_dim  # Qwen3: heads x head_dim != hidden_size
    assert config["tlt"]["target_model_type"] == policy.config.model_type
    assert sorted(p.name for p in (tmp_path / "eagle").iterdir()) == ["config.json", "model.safetensors"]


def test_export_round_trip_predicts_the_same_features(policy, tmp_path: Path):
    drafter = make_drafter(policy)
    drafter.bind_policy(policy)
    save_drafter(drafter, tmp_path / "ckpt")
    export_eagle(tmp_path / "ckpt", policy, tmp_path / "eagle")
    loaded = load_eagle(tmp_path / "eagle", policy)
    ids = torch.randint(3, 64, (2, 7))
    features = torch.randn(2, 7, 64)
    positions = torch.arange(7)[None].expand(2, 7)
    torch.testing.assert_close(loaded(ids, features, positions), drafter(ids, features, positions), rtol=0, atol=0)


def test_export_converts_dtype(policy, tmp_path: Path):
    save_drafter(make_drafter(policy), tmp_path / "ckpt")
    result = export_eagle(tmp_path / "ckpt", policy.config, tmp_path / "eagle", dtype="bfloat16")
    assert result.dtype == "bfloat16"
    assert {t.dtype for t in load_file(str(tmp_path / "eagle" / "model.safetensors")).values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "eagle" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert load_eagle(tmp_path / "eagle", policy.config).fc.weight.dtype == torch.bfloat16


def test_export_takes_the_latest_snapshot_of_a_run_drafter_folder(policy, tmp_path: Path):
    drafter = make_drafter(policy)
    writer = AsyncCheckpointer(tmp_path / "drafter", drafter.config)
    writer.submit(1, {k: torch.zeros_like(v) for k, v in drafter.state_dict().items()})
    writer.wait()
    writer.submit(2, drafter.state_dict())
    writer.close()
    assert resolve_checkpoint(tmp_path / "drafter").name.startswith("step-00000002")
    export_eagle(tmp_path / "drafter", policy.config, tmp_path / "eagle")
    exported = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    torch.testing.assert_close(exported["fc.weight"], drafter.fc.weight.detach())


def test_a_run_folder_exports_its_served_drafter_and_its_drafter_folder_the_hubs_newest(policy, tmp_path: Path):
    """RUN (a finished run's output folder) -> RUN/drafter-served, the drafter the next step would draft
    with; RUN/drafter -> the hub's newest snapshot, explicitly; the served folder is replaced atomically."""
    run, newest, served = tmp_path / "run", make_drafter(policy, seed=1), make_drafter(policy, seed=2)
    writer = AsyncCheckpointer(run / "drafter", newest.config)
    writer.submit(3, newest.state_dict())
    writer.close()
    with pytest.raises(FileNotFoundError, match=f"run folder '{run}' has no {SERVED_DIR}/.*pass '{run / 'drafter'}'"):
        resolve_checkpoint(run)
    write_served_drafter(
        run, (1, make_drafter(policy, seed=3).state_dict()), policy.config, publish="validated", step=2
    )
    folder = write_served_drafter(run, (2, served.state_dict()), policy.config, publish="validated", step=3)
    assert folder == run / SERVED_DIR and sorted(p.name for p in run.iterdir()) == ["drafter", SERVED_DIR]
    assert json.loads((folder / SERVED_INFO).read_text()) == {"version": 2, "publish": "validated", "step": 3}
    assert resolve_checkpoint(run) == folder
    assert resolve_checkpoint(folder) == folder
    assert resolve_checkpoint(run / "drafter").name.startswith("step-00000003")
    loaded = load_drafter(folder, policy.config)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in served.state_dict().items())
    for source, expected in ((run, served), (run / "drafter", newest)):
        export_eagle(source, policy.config, tmp_path / "eagle")
        exported = load_file(str(tmp_path / "eagle" / "model.safetensors"))
        torch.testing.assert_close(exported["fc.weight"], expected.fc.weight.detach())
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=f"served drafter folder '{folder}' lacks model.safetensors"):
        resolve_checkpoint(run)


def _rewrite_weights(folder: Path, change) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    change(weights)
    save_file(weights, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda w: w.update({"fc.bias": torch.zeros(64)}), "fc.bias"),
        (lambda w: w.update({"layers.0.input_layernorm.weight": torch.ones(64)}), "layers.0.input_layernorm.weight"),
        (lambda w: w.pop("layers.0.mlp.up_proj.weight"), "layers.0.mlp.up_proj.weight"),
        (lambda w: w.update({"model.fc.weight": w.pop("fc.weight")}), "model.fc.weight"),
    ],
    ids=["extra-fc-bias", "extra-input-norm", "missing-up-proj", "prefixed-name"],
)
def test_load_back_refuses_a_missing_or_extra_key(policy, tmp_path: Path, change, named):
    save_drafter(make_drafter(policy), tmp_path / "ckpt")
    export_eagle(tmp_path / "ckpt", policy.config, tmp_path / "eagle")
    _rewrite_weights(tmp_path / "eagle", change)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        load_eagle(tmp_path / "eagle", policy.config)


def test_load_back_refuses_a_config_that_is_not_a_one_layer_llama(policy, tmp_path: Path):
    save_drafter(make_drafter(policy), tmp_path / "ckpt")
    export_eagle(tmp_path / "ckpt", policy.config, tmp_path / "eagle")
    config_file = tmp_path / "eagle" / "config.json"
    config = json.loads(config_file.read_text())
    config.update(architectures=["Qwen2ForCausalLM"], num_hidden_layers=2)
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="architectures.*num_hidden_layers"):
        load_eagle(tmp_path / "eagle", policy.config)


def test_export_refuses_a_drafter_of_another_target(tmp_path: Path):
    small = tiny_model("qwen2", hidden_size=64)
    wide = tiny_model("qwen2", hidden_size=128, num_heads=4)
    save_drafter(make_drafter(small), tmp_path / "ckpt")
    with pytest.raises(ValueError, match="hidden_size"):
        export_eagle(tmp_path / "ckpt", wide.config, tmp_path / "eagle")
    assert not (tmp_path / "eagle").exists()


def test_exported_drafter_drives_lossless_greedy_speculative_decoding(tmp_path: Path):
    """This engine loads the export: greedy SD with it equals plain greedy decoding (float64)."""
    tokenizer = char_tokenizer()
    policy = tiny_model("qwen2", seed=4, vocab_size=len(tokenizer), dtype=torch.float64)
    save_drafter(make_drafter(policy, dtype=torch.float64), tmp_path / "ckpt")
    export_eagle(tmp_path / "ckpt", policy, tmp_path / "eagle")
    drafter = load_eagle(tmp_path / "eagle", policy)
    problems = [Problem(f"{i}+{i + 3}=", "x") for i in range(4)]
    result = evaluate_drafter(policy, tokenizer, drafter, problems, draft_tokens=3, max_new_tokens=24, batch_size=2)
    assert result.outputs_equal
    assert result.new_tokens > 0
    assert 1.0 <= result.accept_length <= 4.0


def test_cli_export_drafter(tmp_path: Path, capsys):
    tokenizer = char_tokenizer()
    policy = tiny_model("llama", seed=1, vocab_size=len(tokenizer))
    save_policy(policy, tokenizer, tmp_path / "policy")
    save_drafter(make_drafter(policy), tmp_path / "ckpt")
    code = tlt_main(
        [
            "export-drafter",
            str(tmp_path / "ckpt"),
            "--target",
            str(tmp_path / "policy"),
            "--out",
            str(tmp_path / "eagle"),
            "--dtype",
            "bfloat16",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "9 tensors" in capsys.readouterr().out
    assert load_eagle(tmp_path / "eagle", policy.config).fc.weight.dtype == torch.bfloat16
    assert (
        tlt_main(
            [
                "export-drafter",
                str(tmp_path / "nothing"),
                "--target",
                str(tmp_path / "policy"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "no drafter checkpoint" in err and "drafter-served/" in err and "LATEST" in err
