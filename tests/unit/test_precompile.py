"""`tlt.runtime.precompile`: which graph sets a run compiles, how they split into parallel lanes, markers, a
failed set, and the contract that matters: a rollout worker started after `precompile` compiles nothing
cold (every graph it builds is a hit in inductor's on-disk cache)."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.rollout.compiled import compile_available
from tlt.runtime.precompile import GraphSet, graph_sets, jobs, lanes, marker_key, marker_path, precompile
from tlt.spec.manifest_io import load_run
from tlt.tasks.tokenizer import build_task_tokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
NO_COMPILER = compile_available(torch.device("cpu"))


def _policy(folder: Path, layers: int = 1) -> str:
    tokenizer = build_task_tokenizer()
    model = tiny_model(
        "qwen2", vocab_size=max(64, len(tokenizer)), num_layers=layers, hidden_size=48, seed=3, dtype=torch.float32
    )
    save_policy(model, tokenizer, folder)
    return str(folder)


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    return _policy(tmp_path_factory.mktemp("policy"))


def _spec(mode: str = "tlt", compile_: str = "on", engine: str = "tlt"):
    run = load_run(EXAMPLE)
    spec = run.spec
    spec.speculative.mode = mode
    spec.rollout.compile = compile_
    spec.rollout.engine = engine
    spec.model.max_context = 64
    return spec


def _set(drafter: bool = False, hidden: bool = True, depths: tuple[int, ...] = (), path: str = "p") -> GraphSet:
    return GraphSet(
        policy_path=path,
        dtype="float32",
        rows=4,
        max_context=64,
        hidden=hidden,
        drafter=drafter,
        chain_depths=depths,
        threads=1,
    )


@pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))
def test_graph_sets_follow_the_mode_engine_and_compile_setting(policy):
    tlt = graph_sets(_spec("tlt"), policy, rows=8, threads=1)
    assert [(s.drafter, s.hidden) for s in tlt] == [(False, True), (True, True)]
    assert tlt[1].chain_depths == (2, 3)  # the demo's chain and mixed arms
    assert tlt[1].guesses == ("coupled",) and tlt[1].step_widths == (2,)  # it samples; its tree has topk 2
    greedy = _spec("tlt")
    greedy.algorithm.temperature = 0.0
    assert graph_sets(greedy, policy, rows=8, threads=1)[1].guesses == ("argmax",)
    free = _spec("tlt")
    free.speculative.arms = [a for a in free.speculative.arms if a.kind in ("plain", "history")]
    assert [(s.drafter, s.hidden) for s in graph_sets(free, policy, rows=8, threads=1)] == [(False, True)]
    assert tlt[0].rows == 8 and tlt[0].max_context == 64 and tlt[0].dtype == "float32"
    off = graph_sets(_spec("off"), policy, rows=8, threads=1)
    assert [(s.drafter, s.hidden) for s in off] == [(False, False)]
    assert graph_sets(_spec(engine="vllm"), policy, rows=8, threads=1) == []
    assert graph_sets(_spec(compile_="off"), policy, rows=8, threads=1) == []
    assert graph_sets(_spec(compile_="auto"), policy, rows=8, threads=1) == []  # 1 layer: auto runs eager
    blocks = _spec("tlt")
    blocks.speculative.arms += [_arm(kind="block", depth=4), _arm(kind="block", depth=2)]
    *_, block = graph_sets(blocks, policy, rows=8, threads=1)
    assert block.block_depths == (2, 4) and block.block_size == 4 and block.guesses == ("coupled",)
    assert block.chain_depths == () and block.describe() == "block drafter (blocks [2, 4])"


def _arm(**fields):
    from tlt.spec.run import ArmSpec

    return ArmSpec.model_validate(fields)


def test_jobs_split_sets_by_batch_class():
    target, one_row = _set(), GraphSet(**{**_set().__dict__, "rows": 1})
    assert [j.batch for j in jobs([target, target])] == [1, 2]
    assert [j.batch for j in jobs([one_row])] == [1]
    assert jobs([target])[1].describe() == "target with hidden states, several rows"
    block = GraphSet(**{**_set(drafter=True).__dict__, "block_depths": (2,), "block_size": 2})
    assert [j.batch for j in jobs([block])] == [0]  # one job compiles both batch classes' blocks


@pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))
def test_local_graph_sets_use_the_workers_rows_and_threads_and_skip_role_pods(policy):
    from tlt.runtime.ray_cluster import local_graph_sets, placement, worker_rows

    spec = _spec("tlt")
    spec.rollout.replicas = 2
    sets = local_graph_sets(spec, policy, {"CPU": 4.0})
    assert [s.drafter for s in sets] == [False, True]
    assert all(s.rows == worker_rows(spec) == 32 for s in sets)  # 16 prompts / 2 workers x 4 answers
    assert all(s.threads == placement(spec, {"CPU": 4.0}).rollout_threads == 1 for s in sets)
    assert local_graph_sets(spec, policy, {"CPU": 4.0, "tlt_rollout": 2.0}) == []  # each pod compiles its own


def test_lanes_keep_a_batch_class_of_target_jobs_together_and_deal_the_rest():
    plain, hidden, drafter = _set(hidden=False), _set(), _set(drafter=True, depths=(2,))
    p1, p2, h1, h2, d1, d2 = jobs([plain, hidden, drafter])[0:2] + jobs([hidden])[0:2] + jobs([drafter])[0:2]
    assert lanes(jobs([drafter, hidden, plain]), 2) == [[p1, h1, d2], [p2, h2, d1]]
    assert lanes(jobs([drafter, hidden]), 4) == [[h1], [h2], [d2], [d1]]
    assert lanes(jobs([drafter, hidden]), 3) == [[h1, d1], [h2], [d2]]
    assert lanes(jobs([drafter, hidden]), 1) == [[h1, h2, d2, d1]]
    assert lanes([d2], 2) == [[d2]]
    assert lanes([], 4) == []


def test_marker_key_follows_the_config_and_shapes_not_the_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, layers in ((a, 2), (b, 2)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": layers}))
    assert marker_key(_set(path=str(a))) == marker_key(_set(path=str(b)))
    assert marker_key(_set(path=str(a))) != marker_key(_set(path=str(a), hidden=False))
    assert marker_key(_set(path=str(a))) != marker_key(GraphSet(**{**_set(path=str(a)).__dict__, "threads": 2}))
    (b / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 3}))
    assert marker_key(_set(path=str(a))) != marker_key(_set(path=str(b)))


def fake_compile(s: GraphSet) -> float:
    """Runs in the child: fails for the drafter set, 'compiles' the others."""
    if s.drafter:
        raise RuntimeError("no compiler today")
    return 1.5


def test_precompile_marks_what_compiled_skips_it_next_time_and_survives_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2}))
    # engines of one row: one job a set, so two jobs in two lanes (each job is a process: keep them few)
    target = GraphSet(**{**_set(path=str(folder)).__dict__, "rows": 1})
    drafter = GraphSet(**{**_set(drafter=True, depths=(2,), path=str(folder)).__dict__, "rows": 1})
    report = precompile([target, drafter], processes=2, run=fake_compile)
    assert report["lanes"] == 2 and report["todo"] == 2
    assert report["compiled"] == [{"set": "target with hidden states, one row", "seconds": 1.5}]
    assert report["failed"] == ["drafter (chains [2]), one row"]
    (t1,), (d1,) = jobs([target]), jobs([drafter])
    assert marker_path(t1).is_file() and not marker_path(d1).exists()
    # the compiled job is skipped; the failed one is left (one lane: with min_lanes 2 nothing runs)
    again = precompile([target, drafter], processes=2, min_lanes=2, run=fake_compile)
    assert again["skipped"] == ["target with hidden states, one row"] and again["todo"] == 1
    assert again["lanes"] == 0 and again["compiled"] == [] and again["failed"] == []


def crash_one_row(s: GraphSet) -> float:
    """Runs in the child: the one-row job's process dies, the several-rows job 'compiles'."""
    if s.batch == 1:
        os._exit(3)
    return float(os.getpid())


def test_a_job_whose_process_dies_fails_alone_and_its_lane_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2}))
    target = _set(path=str(folder))  # rows 4: a one-row job, then a several-rows job, in one lane
    report = precompile([target], processes=1, run=crash_one_row)
    assert report["lanes"] == 1 and report["failed"] == ["target with hidden states, one row"]
    (done,) = report["compiled"]
    assert done["set"] == "target with hidden states, several rows"
    assert int(done["seconds"]) != os.getpid()  # it ran in a process of its own


def worker_cache_counters(spec, policy_path: str, rows: int) -> dict[str, int]:
    """Runs in a fresh child: start a rollout worker as a Ray actor would, return inductor's counters."""
    from torch._dynamo.utils import counters

    from tlt.workers.rollout import RolloutWorker

    RolloutWorker(0, spec, policy_path, rows, [], None, threads=1)
    return dict(counters["inductor"])


@pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))
def test_a_worker_started_after_precompile_compiles_nothing_cold(policy, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    spec = _spec("tlt")
    # plain, chain-2 (its coupled graphs: the run samples), the tree (the drafter step at width > 1), a block
    spec.speculative.arms = [
        a for a in spec.speculative.arms if a.kind in ("plain", "tree") or (a.kind == "chain" and a.depth == 2)
    ] + [_arm(kind="block", depth=2)]
    rows = 4
    sets = graph_sets(spec, policy, rows=rows, threads=1)
    report = precompile(sets, processes=2)
    assert report["failed"] == [] and len(report["compiled"]) == 5 and report["lanes"] == 2, report
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        counters = pool.submit(worker_cache_counters, spec, policy, rows).result()
    assert counters.get("fxgraph_cache_hit", 0) > 0, counters
    assert counters.get("fxgraph_cache_miss", 0) == 0, counters
