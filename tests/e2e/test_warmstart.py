"""`tlt warmstart` on the reduced config: trains in seconds, caches by config hash, hits the cache."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tlt.cli import main
from tlt.tasks import warmstart as ws
from tlt.tasks.warmstart import METADATA_FILE, WarmstartConfig, load_metadata, reduced_config, warm_start


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an 81k-param model gains nothing from a second thread on a shared CPU
    try:
        return root, warm_start(reduced_config(), root=root)
    finally:
        torch.set_num_threads(threads)


def test_policy_folder_is_a_standard_hf_folder(trained):
    _, folder = trained
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    assert folder.name == reduced_config().cache_key()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_reduced_policy_has_some_reward_and_a_length_tail(trained):
    metrics = load_metadata(trained[1])["metrics"]
    assert metrics["greedy_accuracy"] > 0.0, "RL needs some reward signal"
    lengths = metrics["sampled_length"]
    assert lengths["max"] >= 3 * lengths["p50"], "sampled responses have a long tail"
    assert metrics["train_tokens"] > 0 and metrics["params"] > 0


def test_second_call_hits_the_cache(trained, monkeypatch):
    root, folder = trained

    def no_training(*_a, **_k):
        raise AssertionError("the cached policy must not be retrained")

    monkeypatch.setattr(ws, "train_policy", no_training)
    assert warm_start(reduced_config(), root=root) == folder


def test_cache_key_follows_the_config():
    base = reduced_config()
    assert base.cache_key() == reduced_config().cache_key()
    assert WarmstartConfig.from_dict({"steps": base.steps + 1}).cache_key() != WarmstartConfig().cache_key()
    with pytest.raises(ValueError, match="unknown warm-start config keys"):
        WarmstartConfig.from_dict({"stpes": 3})


def test_cli_reuses_the_cache_and_copies_out(trained, tmp_path, monkeypatch, capsys):
    root, _ = trained
    monkeypatch.setattr(ws, "train_policy", lambda *_a, **_k: pytest.fail("retrained"))
    out = tmp_path / "policy"
    assert main(["warmstart", "--test", "--cache-dir", str(root), "--out", str(out)]) == 0
    assert (out / METADATA_FILE).is_file() and (out / "tokenizer.json").is_file()
    printed = capsys.readouterr().out
    assert "greedy_accuracy" in printed
    assert json.loads((out / METADATA_FILE).read_text())["cache_key"] == reduced_config().cache_key()


def test_cli_refuses_a_bad_config_file(tmp_path, capsys):
    bad = tmp_path / "ws.yaml"
    bad.write_text("steps: 10\nbogus: 1\n")
    assert main(["warmstart", "--config", str(bad), "--cache-dir", str(tmp_path)]) == 2
    assert "bogus" in capsys.readouterr().err
