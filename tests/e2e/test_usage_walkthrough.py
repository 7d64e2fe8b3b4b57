"""docs/usage.md's "Your own data" walk-through, run as written: its run.yaml and its two commands, read from
the page itself, with only what cannot exist here replaced (the model folder by a tiny chat policy, the data
files by GSM8K-format records, the reward module by a test plug-in, the sizes by a two-step run)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from chat_tokenizer import GSM8K, chat_tokenizer, gsm8k_records  # noqa: E402

from tlt.models.loading import save_policy  # noqa: E402
from tlt.models.tiny import tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Your own data: GSM8K with a chat template, an eval file and a custom reward"

pytestmark = pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K test split not at {GSM8K}")


def _walkthrough() -> tuple[str, list[str]]:
    """The section's run.yaml and its shell commands, as the page shows them."""
    text = (ROOT / "docs" / "usage.md").read_text()
    assert SECTION in text, "the walk-through this test runs is gone from docs/usage.md"
    section = text.split(SECTION, 1)[1].split("\n### ", 1)[0]
    manifest = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return manifest, [line.split("  #")[0].strip() for line in commands.splitlines() if line.strip()]


def _jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_the_walkthrough_runs_as_written(tmp_path: Path):
    manifest, commands = _walkthrough()
    tokenizer = chat_tokenizer()
    save_policy(
        tiny_model("qwen2", vocab_size=len(tokenizer) + 16, seed=3, tie_word_embeddings=True),
        tokenizer,
        tmp_path / "model",
    )
    written = (
        manifest.replace("/models/my-chat-model", str(tmp_path / "model"))
        .replace("/data/gsm8k/train.jsonl", _jsonl(tmp_path / "train.jsonl", gsm8k_records(4)))
        .replace("/data/gsm8k/test.jsonl", _jsonl(tmp_path / "test.jsonl", gsm8k_records(2, start=100)))
        .replace("my_rewards:gsm8k_reward", "reward_plugin:graded")
    )
    run = yaml.safe_load(written)
    run["spec"]["algorithm"].update(steps=2, promptsPerStep=2, groupSize=2, maxNewTokens=8, evalSamples=2)
    run["spec"]["algorithm"]["evalEvery"] = 1
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), *sys.path])}
    tlt = str(Path(sys.executable).absolute().parent / "tlt")
    assert len(commands) == 2, commands
    for command in commands:
        argv = shlex.split(command)
        assert argv[0].startswith("PYTHONPATH=") and argv[1] == ".venv/bin/tlt", command
        done = subprocess.run([tlt, *argv[2:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    rows = [json.loads(line) for line in (tmp_path / "runs" / "gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("eval_accuracy" in r for r in rows)
    assert (tmp_path / "runs" / "gsm8k" / "report.md").is_file()
