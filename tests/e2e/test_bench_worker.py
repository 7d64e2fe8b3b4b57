"""`tlt bench worker`: one rollout worker alone, vanilla vs tlt, on a tiny workload (structure, not speed)."""

from __future__ import annotations

import json

import torch

from tlt.cli import main

WORKLOAD = """\
name: worker-bench-test
warmstart: reduced
drafterWarmstart: {prompts: 8, steps: 3, batch: 8, learningRate: 3.0e-3, maxNewTokens: 16, seed: 0}
spec:
  model: {maxContext: 256}
  dataset: {source: builtin, builtin: {numTrain: 16, numEval: 8, seed: 0}}
  algorithm: {promptsPerStep: 4, groupSize: 2, temperature: 1.0, maxNewTokens: 12, seed: 0}
  rollout: {replicas: 2, compile: "off"}
  speculative: {threshold: 4, buckets: [1, 4], arms: [{kind: plain}, {kind: chain, depth: 2}]}
variants:
  vanilla: {speculative: {mode: "off"}}
  static: {speculative: {mode: static}}
  tlt: {speculative: {mode: tlt}}
  tlt-shadow: {speculative: {mode: tlt, threshold: 0}}
repeats: 1
heldout: {prompts: 2, depth: 2, maxNewTokens: 8}
costs: {batches: [1], widths: [1], context: 16, repeats: 1}
"""


def test_both_variants_take_the_same_shards_and_tlt_drafts(tmp_path):
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    path = tmp_path / "worker.json"
    threads = torch.get_num_threads()
    assert (
        main(
            [
                "bench",
                "worker",
                "--workload",
                str(workload),
                "--shards",
                "3",
                "--repeats",
                "2",
                "--split",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    assert torch.get_num_threads() == threads, "the bench gives the process its threads back"
    result = json.loads(path.read_text())
    assert result["config"] == {"shards": 3, "threads": 1, "rows": 4, "repeats": 2, "device": "cpu"}
    assert result["repeats_done"] == 2
    vanilla, tlt = result["variants"]["vanilla"], result["variants"]["tlt"]
    assert len(vanilla["seconds"]) == len(tlt["seconds"]) == 6, "3 shards in each of 2 repeats"
    assert len(result["repeats"]) == 2
    low, high = result["rollout_speedup_range"]
    assert low <= result["rollout_speedup"] <= high
    assert sorted(r["rollout_speedup"] for r in result["repeats"]) == [low, high]
    for r in result["repeats"]:
        assert r["rollout_speedup"] == r["vanilla_seconds"] / r["tlt_seconds"]
    assert vanilla["tokens"] == tlt["tokens"] and result["mismatched_responses"] == 0, "coupled sampling: same tokens"
    assert tlt["steps_total"] < vanilla["steps_total"], "the tlt worker drafted (fewer decode steps)"
    for v in (vanilla, tlt):
        assert sum(v["decode_steps_by_running"].values()) == v["steps_total"] - 6, "one prefill per shard"
    # the same tokens, kept at other running sizes: per-token rates compare like with like
    assert sum(vanilla["decode_tokens_by_running"].values()) == sum(tlt["decode_tokens_by_running"].values()) > 0
    assert result["speedup_per_token_by_running"] and all(
        x > 0 for x in result["speedup_per_token_by_running"].values()
    )
    split = result["step_split"]  # every decode step counted once, under its variant
    for name, v in (("vanilla", vanilla), ("tlt", tlt)):
        counted = sum(c["steps"] for stepper, r in split.items() if stepper.startswith(f"{name}/") for c in r.values())
        assert counted == v["steps_total"] - 6
    assert any(stepper.startswith("tlt/sd:") for stepper in split) and "vanilla/plain" in split
    assert result["rollout_speedup"] > 0 and result["step_cost_ratio"] > 0


def test_bad_arguments_are_refused_naming_the_field(tmp_path, capsys):
    assert main(["bench", "worker", "--workload", str(tmp_path / "none.yaml")]) == 2
    assert "--workload: no such file" in capsys.readouterr().out
    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    assert main(["bench", "worker", "--workload", str(workload), "--shards", "0"]) == 2
    assert "shards must be >= 1, got 0" in capsys.readouterr().out
    assert main(["bench", "worker", "--workload", str(workload), "--repeats", "0"]) == 2
    assert "repeats must be >= 1, got 0" in capsys.readouterr().out
    workload.write_text(WORKLOAD.replace("  tlt: {speculative: {mode: tlt}}\n", ""))
    assert main(["bench", "worker", "--workload", str(workload)]) == 2
    assert "variants must include 'tlt'" in capsys.readouterr().out


def test_runs_where_ray_is_not_installed(tmp_path):
    """The GPU image has no Ray: the worker bench imports and runs without it (Ray blocked in a fresh process)."""
    import subprocess
    import sys

    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    path = tmp_path / "worker.json"
    code = (
        "import sys; sys.modules['ray'] = None\n"  # `import ray` now raises ImportError
        "from tlt.cli import main\n"
        f"rc = main(['bench', 'worker', '--workload', {str(workload)!r}, '--shards', '1', '--repeats', '1', "
        f"'--json', {str(path)!r}])\n"
        "assert 'ray' not in sys.modules or sys.modules['ray'] is None\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(path.read_text())
    assert result["config"]["device"] == "cpu" and result["rollout_speedup"] > 0


def test_a_workload_that_asks_for_a_gpu_is_refused_without_one(tmp_path, capsys):
    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has a CUDA device")
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        WORKLOAD.replace(
            'rollout: {replicas: 2, compile: "off"}', 'rollout: {replicas: 2, compile: "off", resources: {gpus: 1}}'
        )
    )
    assert main(["bench", "worker", "--workload", str(workload), "--shards", "1", "--repeats", "1"]) == 2
    assert "rollout.resources.gpus" in capsys.readouterr().out


def test_the_result_so_far_comes_after_every_repeat(tmp_path):
    """A run cut short (a time budget on a lent GPU) keeps its finished repeats: the JSON is rewritten after each."""
    from tlt.bench.worker_alone import WorkerBenchConfig, run_worker_bench

    workload = tmp_path / "workload.yaml"
    workload.write_text(WORKLOAD)
    partial: list[dict] = []
    result = run_worker_bench(WorkerBenchConfig(workload=workload, shards=1, repeats=2), on_repeat=partial.append)
    assert [p["repeats_done"] for p in partial] == [1, 2] and result["repeats_done"] == 2
    assert len(partial[0]["repeats"]) == 1 and partial[0]["config"]["repeats"] == 2
    assert partial[1]["rollout_speedup"] == result["rollout_speedup"]
