"""bench/gpu/run.sh, the one-shot GPU measurement: its dry run on this machine (the plan within 8 minutes, the
carry within a device call's 64 MiB, every command parsed), and its real run failing fast without CUDA."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "run.sh"
CARRY = ROOT / "bench" / "gpu" / "carry"
PHASES = ["prereq", "gpu-tests", "costs-0.5b", "costs-7b", "update-0.5b", "workload", "costs-7b-compiled"]
LIMIT = 64 * 2**20

pytestmark = pytest.mark.slow  # the dry run starts a few Pythons that import torch: ~40 s on 2 cores


def _script(*args: str, carry: Path, out: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "TLT_GPU_PYTHON": sys.executable, "TLT_GPU_CARRY": str(carry)}
    env.pop("OUT", None)
    if out is not None:
        env["OUT"] = str(out)
    started = time.perf_counter()
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    return done, time.perf_counter() - started


def _plan(stdout: str) -> dict[str, int]:
    """phase -> budget seconds, from the dry run's plan table."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+(\d+)  ", stdout, re.MULTILINE)}


def test_dry_run_plans_eight_minutes_parses_every_command_and_names_a_missing_carry(tmp_path):
    done, _ = _script("--dry-run", carry=tmp_path / "no-carry")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    budgets = _plan(done.stdout)
    assert list(budgets) == PHASES
    total = int(re.search(r"total budget: (\d+) s", out).group(1))
    assert total == sum(budgets.values()) <= 8 * 60
    assert "6 tlt commands parse" in out, "every bench command the phases run (both workload forms) parses"
    assert "tlt.cli bench costs --device cuda" in out and "--shape qwen2.5-7b --compile" in out
    assert "tlt.cli bench policy-group --device cuda" in out
    assert "bench worker --workload bench/workload-gpu-v1.yaml" in out
    assert "bench run --workload bench/workload-gpu-v1.yaml" in out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert any("warm-start policy" in p and "make gpu-carry" in p for p in problems), problems
    assert any("no wheels" in p for p in problems), problems
    assert any("not on the device: pydantic" in p for p in problems), "without the wheels the device lacks pydantic"
    sizes = json.loads(re.search(r"sizes \(bytes\): (\{.*\})", out).group(1))
    assert sizes["carry_bytes"] == 0 and sizes["total_bytes"] == sizes["tree_bytes"] < LIMIT


@pytest.mark.skipif(not (CARRY / "wheels").is_dir(), reason="bench/gpu/carry is not built here (make gpu-carry)")
def test_dry_run_passes_with_the_built_carry_well_under_a_calls_limit():
    done, _ = _script("--dry-run", carry=CARRY)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "dry run: ok" in out and "imports: ok" in out and "warm starts: ok" in out
    sizes = json.loads(re.search(r"sizes \(bytes\): (\{.*\})", out).group(1))
    assert 0 < sizes["carry_bytes"] and sizes["total_bytes"] < LIMIT - 8 * 2**20, "8 MiB to spare at least"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_real_run_without_cuda_fails_fast_with_the_reason(tmp_path):
    done, seconds = _script(carry=CARRY, out=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert seconds < 30
    assert "prerequisite failed: torch" in done.stdout and "sees no CUDA device" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["name"] for p in summary["phases"]] == PHASES
    assert summary["phases"][0]["status"] == "failed" and "sees no CUDA device" in summary["phases"][0]["reason"]
    assert all(p["status"] == "skipped" for p in summary["phases"][1:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.tar.gz", "run.log", "summary.json"]


def test_bad_usage_and_a_missing_out_are_refused(tmp_path):
    done, _ = _script("--bogus", carry=tmp_path)
    assert done.returncode == 2 and "usage: bash bench/gpu/run.sh [--dry-run]" in done.stderr
    done, _ = _script(carry=tmp_path)
    assert done.returncode == 2 and "OUT must name an existing folder" in done.stderr
