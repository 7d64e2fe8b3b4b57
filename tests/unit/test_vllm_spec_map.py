"""What a spec asks of a vLLM rollout worker (`tlt.rollout.vllm.spec_map`), the drafter features the
vLLM worker computes (equal to the TLT engine's hidden states), and `tlt train`'s refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from tlt.cli import main
from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams
from tlt.rollout.vllm.spec_map import eagle_draft_tokens, kv_cache_bytes, vllm_drafts, vllm_spec_problem
from tlt.spec.run import RunSpec
from tlt.workers.vllm_rollout import with_features


def vllm_spec(**over) -> RunSpec:
    body = {"rollout": {"engine": "vllm"}, **over}
    return RunSpec.model_validate(body)


def test_the_draft_length_is_the_deepest_learned_drafter_arm():
    spec = vllm_spec(
        speculative={
            "arms": [
                {"kind": "chain", "depth": 2},
                {"kind": "tree", "depth": 3, "topk": 2},
                {"kind": "ngram", "depth": 8},
                {"kind": "plain"},
            ]
        }
    )
    assert eagle_draft_tokens(spec.speculative) == 3  # ngram's 8 is not the drafter's


def test_a_spec_without_a_learned_drafter_arm_is_refused_naming_the_arms():
    spec = vllm_spec(
        speculative={"mode": "tlt", "arms": [{"kind": "ngram", "depth": 4}, {"kind": "plain"}]},
        algorithm={"temperature": 0.0},
    )
    with pytest.raises(ValueError, match=r"speculative\.arms has no arm of kind chain, tree, mixed"):
        eagle_draft_tokens(spec.speculative)
    assert "speculative.arms" in vllm_spec_problem(spec, cuda=True)


@pytest.mark.parametrize(
    "mode, threshold, drafts", [("off", 8, False), ("static", 8, True), ("tlt", 8, True), ("tlt", 0, False)]
)
def test_vllm_drafts_with_a_learned_drafter_that_may_draft(mode, threshold, drafts):
    assert vllm_drafts(vllm_spec(speculative={"mode": mode, "threshold": threshold}).speculative) is drafts


def test_what_vllm_can_and_cannot_honour():
    greedy = {"temperature": 0.0}
    assert vllm_spec_problem(vllm_spec(algorithm=greedy), cuda=False) is None
    assert vllm_spec_problem(vllm_spec(speculative={"mode": "off"}), cuda=False) is None  # sampling, no SD
    assert vllm_spec_problem(vllm_spec(speculative={"threshold": 0}), cuda=False) is None  # trains, never drafts
    assert vllm_spec_problem(vllm_spec(), cuda=True) is None  # a CUDA build samples with EAGLE
    cpu_sampled = vllm_spec_problem(vllm_spec(), cuda=False)
    assert "algorithm.temperature 1.0" in cpu_sampled and "speculative.mode 'tlt'" in cpu_sampled
    assert "speculative.mode 'ngram'" in vllm_spec_problem(vllm_spec(speculative={"mode": "ngram"}), cuda=True)
    assert vllm_spec_problem(RunSpec.model_validate({"speculative": {"mode": "ngram"}}), cuda=False) is None
    block = vllm_spec(speculative={"arms": [{"kind": "chain", "depth": 2}, {"kind": "block", "depth": 4}]})
    assert "speculative.arms of kind block" in vllm_spec_problem(block, cuda=True)


def test_the_kv_cache_holds_every_row_at_full_context():
    # 2 rows x (ceil(100 / 32) + 1 = 5 blocks of 32 tokens) x (k and v: 2 x 3 layers x 1 head x 32 x 4 bytes)
    assert kv_cache_bytes(2, 100, layers=3, kv_heads=1, head_dim=32, dtype_bytes=4) == 2 * 5 * 32 * 768
    assert kv_cache_bytes(0, 32, layers=1, kv_heads=1, head_dim=32, dtype_bytes=2) == 2 * 32 * 128


def test_features_over_a_finished_rollout_are_the_engines_hidden_states():
    policy = tiny_model("llama", seed=3, num_layers=2).eval()
    requests = [
        Request(f"r{i}", [1, 5 + i, 9, 4], SamplingParams(temperature=1.0, max_new_tokens=12, seed=i)) for i in range(3)
    ]
    completions = Engine(policy, max_batch_size=3, max_context=64, return_hidden=True).generate(requests)
    for completion in completions:
        mine = with_features(policy, dataclasses.replace(completion, hidden=None)).hidden
        assert mine.shape == completion.hidden.shape  # [P + T - 1, H]
        torch.testing.assert_close(mine, completion.hidden, rtol=1e-4, atol=1e-5)


def test_train_refuses_vllm_settings_it_cannot_honour_before_starting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tlt.commands.train.rollout_engine_problem", lambda engine: None)  # as if installed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cases = [
        ({"speculative": {"mode": "ngram"}}, [], "speculative.mode 'ngram'"),
        ({}, [], "algorithm.temperature 1.0"),
        ({"algorithm": {"temperature": 0.0}}, ["--local"], "drop --local"),
    ]
    for body, flags, message in cases:
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump({"spec": {"rollout": {"engine": "vllm"}, **body}}))
        assert main(["train", str(path), "--out", str(tmp_path / "out"), *flags]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()


def test_validate_refuses_what_no_vllm_honours_and_warns_of_the_cpu_build(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"spec": {"rollout": {"engine": "vllm"}, "speculative": {"mode": "ngram"}}}))
    assert main(["validate", str(path)]) == 1
    assert "speculative.mode 'ngram'" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"spec": {"rollout": {"engine": "vllm"}}}))  # tlt at temperature 1
    assert main(["validate", str(path)]) == 0
    assert "warning: on vLLM's CPU build this run is refused: algorithm.temperature 1.0" in capsys.readouterr().err
