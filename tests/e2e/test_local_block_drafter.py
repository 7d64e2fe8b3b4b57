"""`tlt train --local` in every mode with learned and model-free arms: the bandit drafts with the EAGLE and the
block drafter, which train online and are published and checkpointed; the rollouts are token for token those
of `speculative.mode: off`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from _old_drafter import digests, write_final_norm_checkpoint  # tests/e2e is on sys.path
from safetensors.torch import load_file

from tlt import cli
from tlt.checkpoint.store import load_latest
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.tasks.tokenizer import build_task_tokenizer
from tlt.workers.local_rollout import LocalWorker

ROLLOUT = LocalWorker.rollout
ARMS = [
    {"kind": "block", "depth": 4},
    {"kind": "block", "depth": 2},
    {"kind": "chain", "depth": 2},
    {"kind": "tree", "depth": 2, "topk": 2},
    {"kind": "history", "depth": 4},
    {"kind": "ngram", "depth": 3},
    {"kind": "plain"},
]


def _run_file(root: Path, mode: str, temperature: float) -> Path:
    tokenizer = build_task_tokenizer()
    if not (root / "init").exists():
        save_policy(tiny_model("qwen2", vocab_size=len(tokenizer), seed=5), tokenizer, root / "init")
    spec = {
        "metadata": {"name": "block-loop"},
        "spec": {
            "model": {"path": str(root / "init"), "dtype": "float32"},
            "dataset": {"builtin": {"numTrain": 32}},
            "algorithm": {
                "steps": 2,
                "promptsPerStep": 2,
                "groupSize": 4,
                "maxNewTokens": 16,
                "temperature": temperature,
                "seed": 3,
            },
            "speculative": {"mode": mode, "arms": ARMS, "threshold": 8, "buckets": [2, 8]},
            "drafter": {"batchTokens": 64, "publish": "latest", "learningRate": 1e-3},
            "checkpoint": {"intervalSteps": 1, "keep": 2},
        },
    }
    path = root / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _train(root: Path, mode: str, temperature: float, monkeypatch) -> tuple[Path, list[list[list[int]]]]:
    """`tlt train --local` of the tiny run in `mode`; its output folder and each step's response tokens."""
    tokens: list[list[list[int]]] = []

    def recorded(*args, **kwargs):
        completions, scored, result = ROLLOUT(*args, **kwargs)
        tokens.append([list(c.token_ids) for c in completions])
        return completions, scored, result

    monkeypatch.setattr(LocalWorker, "rollout", recorded)
    out = root / f"out-{mode}"
    assert cli.main(["train", str(_run_file(root, mode, temperature)), "--out", str(out), "--local"]) == 0
    return out, tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_drafter_drafts_trains_online_and_changes_no_token(tmp_path: Path, monkeypatch, capsys, temperature):
    plain, want = _train(tmp_path, "off", temperature, monkeypatch)
    out, got = _train(tmp_path, "tlt", temperature, monkeypatch)
    assert got == want, "drafts changed the rollouts' tokens"
    assert "--local does not run" not in capsys.readouterr().err, "every arm runs in one process"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    chosen = {arm for r in rows for arm, n in r["sd_arms"].items() if n}
    assert {"block-d4", "block-d2"} & chosen and {"chain-d2", "tree-d2k2v4"} & chosen, chosen
    assert 0 < rows[0]["drafter_version"] < rows[1]["drafter_version"], "online training advances the version"
    assert rows[1]["drafter_served_version"] == rows[0]["drafter_version"], "publish latest serves the newest"
    assert rows[1]["drafter_agreement"] is not None
    ckpt = load_latest(out / "checkpoints")
    assert ckpt.state["drafter_version"] == rows[1]["drafter_version"]
    kept = {k.partition(".")[0] for k in ckpt.tensors["drafter"]}
    assert kept == {"block", "eagle"}, "the checkpoint keeps both drafters"
    assert ckpt.objects["drafter_buffers"][0]["optimizer"]["state"], "and its AdamW moments"
    final, reference = (load_file(str(o / "policy" / "model.safetensors")) for o in (out, plain))
    assert all(torch.equal(final[k], reference[k]) for k in reference), "the same tokens train the same policy"


@pytest.mark.parametrize("mode", ["ngram", "static"])
def test_the_other_modes_change_no_token_either(tmp_path: Path, monkeypatch, mode):
    _, want = _train(tmp_path, "off", 1.0, monkeypatch)
    out, got = _train(tmp_path, mode, 1.0, monkeypatch)
    assert got == want, f"mode {mode} changed the rollouts' tokens"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["sd_row_steps"] for r in rows) > 0, f"mode {mode} drafted"
    if mode == "static":
        assert rows[0]["drafter_updates"] > 0 and rows[1]["drafter_updates"] == 0, "static: trained in step 1 only"


def test_checkpoint_of_a_final_norm_block_drafter_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys):
    out, _ = _train(tmp_path, "tlt", 0.0, monkeypatch)
    old = tmp_path / "old"
    write_final_norm_checkpoint(out / "checkpoints", old / "checkpoints")
    before = digests(old)
    capsys.readouterr()
    run_file = yaml.safe_load(_run_file(tmp_path, "tlt", 0.0).read_text())
    run_file["spec"]["algorithm"]["steps"] = 3
    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump(run_file))
    assert cli.main(["train", str(longer), "--out", str(old), "--local"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    assert f"cannot resume from {old}" in err[0] and "a block drafter of 4 reading target layers 0" in err[0]
    assert "block.layer_norms.0.weight" in err[0] and "Traceback" not in err[0]
    assert digests(old) == before, "the refused checkpoint is left as it was"
