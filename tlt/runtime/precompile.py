"""Compile a run's graphs once per machine, before its rollout workers start, split over the cores.

A rollout worker compiles its engine's graphs when it starts (`tlt.rollout.warmup.warm_up`), and inductor
keeps what it compiled in an on-disk cache that every process of the machine reads (/tmp/torchinductor_<user>,
or TORCHINDUCTOR_CACHE_DIR). The workers of a local run start together, so from a cold cache each compiles
every graph itself, one core each: the target's graphs, then (with learned drafters) the drafter's and its
chains' (minutes from a cold cache on a small CPU, seconds from a warm one: docs/measurements-history.md;
a run's arms reach only some of the drafter's graphs: `tlt.adaptive.arms.drafter_graphs`).

`precompile` compiles each graph once instead, in parallel lanes (one per core). A job is one graph set
(the target's, the drafter's, or the block drafter's: `kind: block` arms) at one batch class (one row, or
several: their graphs are independent; a block set's few small graphs are one job);
a lane runs its jobs in order, each in a fresh process with the workers' thread count (inductor's CPU
kernels specialise on it; dynamo's graphs on what the process compiled before): a child forked from the
lane's process, which made the imports every job needs once. The target's jobs of one
batch class stay in one lane, plain before hidden-state output, since they share the decoder layer's
graph, which the later job then reads from the cache. The workers then start on a warm cache.

A job compiled once on this machine leaves a marker in the cache folder (keyed by the job, the policy's
config.json, and the versions of torch, transformers and this package's model and engine code) and is
skipped next time; a stale marker costs only what the workers did before: compiling for themselves. A
job that fails is logged and never fails the run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tlt.progress import phase
from tlt.spec.run import RunSpec

log = logging.getLogger(__name__)

MARKER_FOLDER = "tlt-precompiled"
_CODE_FOLDERS = ("models", "rollout")  # the code that shapes a graph (tlt/models, tlt/rollout)


@dataclass(frozen=True)
class GraphSet:
    """A compile job: the target's graphs (`drafter=False`), the drafter's and its chains', or (`block_depths`)
    the block drafter's blocks, for the engine a rollout worker builds (`tlt.workers.rollout.RolloutWorker`),
    at batch class `batch` (1: one row, 2: several rows, 0: both; a block job always compiles both)."""

    policy_path: str
    dtype: str
    rows: int  # the engine's max batch size
    max_context: int  # spec.model.max_context (the worker caps it at the model's positions)
    hidden: bool  # the target step also returns hidden states (modes static / tlt)
    drafter: bool
    chain_depths: tuple[int, ...]
    threads: int
    batch: int = 0
    guesses: tuple[str, ...] = ()  # the chains' draft kinds (`warm_up`'s guesses)
    step_widths: tuple[int, ...] = ()  # the drafter step's width classes (`warm_up`'s step_widths)
    draft_vocab: int = 0  # speculative.draftVocab: the drafter's graphs read its reduced head
    block_depths: tuple[int, ...] = ()  # the block arms' depths (`warm_up_blocks`'s depths)
    block_size: int = 0  # the run's block drafter's block size (its largest block arm)
    feature_layers: tuple[int, ...] = ()  # the target layers the engine keeps for its block drafter

    def describe(self) -> str:
        if self.block_depths:
            return f"block drafter (blocks {list(self.block_depths)})"
        what = (
            f"drafter (chains {list(self.chain_depths)})"
            if self.drafter
            else (
                "target"
                + (" with hidden states" if self.hidden else "")
                + (" and layers" if self.feature_layers else "")
            )
        )
        return what + {0: "", 1: ", one row", 2: ", several rows"}[self.batch]


def graph_sets(spec: RunSpec, policy_path: str, rows: int, threads: int) -> list[GraphSet]:
    """The graph sets a run's rollout workers compile: none for vLLM or an eager engine (`rollout.compile`),
    the target's, and with a drafter (modes static / tlt) the drafter graphs its arms and sampling reach
    (`tlt.adaptive.arms.drafter_graphs`) and the block drafter's (`block_graphs`), when there are any."""
    from tlt.adaptive.arms import block_graphs, drafter_graphs
    from tlt.models.loading import read_model_config
    from tlt.rollout.compiled import resolve_compile_for
    from tlt.spec.plan import learned_drafters, learns_drafters

    if spec.rollout.engine != "tlt":
        return []
    config = read_model_config(policy_path)
    if not resolve_compile_for(spec.rollout.compile, int(config["num_hidden_layers"]), torch.device("cpu")):
        return []
    hidden = learns_drafters(spec.speculative)
    learned = learned_drafters(spec.speculative, int(config["num_hidden_layers"]))
    base = dict(
        policy_path=str(policy_path),
        dtype=spec.model.dtype,
        rows=max(rows, 1),
        max_context=spec.model.max_context,
        hidden=hidden,
        threads=max(threads, 1),
        feature_layers=learned.feature_layers,
    )
    sets = [GraphSet(**base, drafter=False, chain_depths=())]
    if hidden:
        plan = drafter_graphs(spec.speculative, sampled=spec.algorithm.temperature > 0)
        if plan["chain_depths"] or plan["step_widths"]:
            sets.append(
                GraphSet(
                    **base,
                    drafter=True,
                    chain_depths=tuple(plan["chain_depths"]),
                    guesses=tuple(plan["guesses"]),
                    step_widths=tuple(plan["step_widths"]),
                    draft_vocab=spec.speculative.draft_vocab,
                )
            )
        blocks = block_graphs(spec.speculative, sampled=spec.algorithm.temperature > 0)
        if blocks["depths"]:
            sets.append(
                GraphSet(
                    **base,
                    drafter=True,
                    chain_depths=(),
                    guesses=tuple(blocks["guesses"]),
                    draft_vocab=spec.speculative.draft_vocab,
                    block_depths=tuple(blocks["depths"]),
                    block_size=learned.block_size,
                )
            )
    return sets


def jobs(sets: list[GraphSet]) -> list[GraphSet]:
    """Each set split by batch class (one class when its engine holds one row; a block set is one job),
    duplicates dropped."""
    out = [replace(s, batch=b) for s in sets for b in ((0,) if s.block_depths else (1, 2) if s.rows > 1 else (1,))]
    return list(dict.fromkeys(out))


def lanes(todo: list[GraphSet], processes: int) -> list[list[GraphSet]]:
    """Deal jobs into at most `processes` lanes that run in parallel, each in order. Units: the target jobs
    of one batch class (plain before hidden), in batch order, then each drafter job in reverse batch order;
    dealt round-robin. Two lanes thus pair one row's target graphs with several rows' drafter graphs and
    the other way round: several rows' graphs take longer to compile (docs/measurements-history.md). Empty lanes are
    left out."""
    targets: dict[int, list[GraphSet]] = {}
    for s in sorted((s for s in todo if not s.drafter), key=lambda s: (s.batch, s.hidden)):
        targets.setdefault(s.batch, []).append(s)
    drafters = sorted((s for s in todo if s.drafter), key=lambda s: -s.batch)
    units = list(targets.values()) + [[s] for s in drafters]
    out: list[list[GraphSet]] = [[] for _ in range(max(processes, 1))]
    for i, unit in enumerate(units):
        out[i % len(out)].extend(unit)
    return [lane for lane in out if lane]


@functools.cache
def _code_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for folder in _CODE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def marker_key(s: GraphSet) -> str:
    """What a set's compiled graphs depend on: its shapes, the policy's config (not its path or weights),
    the library versions and this package's model and engine code."""
    import transformers

    fields = asdict(s)
    fields.pop("policy_path")
    config = (Path(s.policy_path) / "config.json").read_text()
    blob = json.dumps([fields, config, torch.__version__, transformers.__version__, _code_hash()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def marker_path(s: GraphSet) -> Path:
    """The marker of a set compiled on this machine, in inductor's cache folder (it goes when that does)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / MARKER_FOLDER / f"{marker_key(s)}.json"


def compile_set(s: GraphSet) -> float:
    """Build the engine (and drafter) a worker builds and warm up this set's graphs; the seconds it took.
    Runs in a fresh process: dynamo's graphs depend on what else the process compiled before."""
    from tlt.drafter.drafter_set import new_drafter_set
    from tlt.models.drafter import EagleDrafter, drafter_config_from_target
    from tlt.models.loading import load_policy
    from tlt.rollout.engine import Engine
    from tlt.rollout.warmup import warm_up, warm_up_blocks
    from tlt.spec.plan import LearnedDrafters

    torch.set_num_threads(s.threads)
    model, _ = load_policy(s.policy_path, s.dtype)
    context = min(s.max_context, model.config.max_position_embeddings)
    engine = Engine(
        model,
        max_batch_size=s.rows,
        max_context=context,
        return_hidden=s.hidden,
        compile=True,
        feature_layers=s.feature_layers,
    )
    if s.block_depths:  # the worker's block drafter: the block member of its drafter set
        learned = LearnedDrafters(eagle=False, block_size=s.block_size, feature_layers=s.feature_layers)
        drafters = new_drafter_set(model, learned)
        drafters.set_draft_vocab(s.draft_vocab)
        return warm_up_blocks(engine, drafters.block, depths=s.block_depths, guesses=s.guesses)
    drafter = None
    if s.drafter:
        drafter = EagleDrafter(drafter_config_from_target(model.config)).float().eval()
        drafter.bind_policy(model)
        drafter.set_draft_vocab(s.draft_vocab)
    return warm_up(
        engine,
        drafter,
        chain_depths=s.chain_depths,
        target=not s.drafter,
        batches=None if s.batch == 0 else (s.batch,),
        guesses=s.guesses,
        step_widths=s.step_widths,
    )


def _child_env() -> None:
    # as a Ray worker of the local cluster (tlt.runtime.ray_cluster.connect)
    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def _lane_process() -> None:
    """A lane's process: the imports every job needs (~8 s of a fresh process here), made once; each job
    then runs in a child forked from it (`_forked`), with dynamo's state as fresh as a worker's."""
    _child_env()
    import torch._dynamo  # noqa: F401 - imports only: no thread or process starts before the forks
    import torch._inductor.compile_fx  # noqa: F401
    import transformers  # noqa: F401

    import tlt.models.drafter  # noqa: F401
    import tlt.models.loading  # noqa: F401
    import tlt.rollout.engine  # noqa: F401
    import tlt.rollout.warmup  # noqa: F401


def _forked(run: Callable[[GraphSet], float], s: GraphSet) -> float:
    """In a lane's process: `run(s)` in a forked child (one job a child; a child that dies fails its job only)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as pool:
        return pool.submit(run, s).result()


def _run_lane(
    lane: list[GraphSet],
    run: Callable[[GraphSet], float],
    report: dict[str, Any],
    progress: Callable[..., None] = lambda *_: None,
) -> None:
    context = multiprocessing.get_context("spawn")
    pool = None
    try:
        for s in lane:
            pool = pool or ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_lane_process)
            try:
                seconds = pool.submit(_forked, run, s).result()
            except Exception as exc:  # noqa: BLE001 - the workers compile for themselves then
                log.warning(
                    "precompile of the %s graphs failed (%s: %s); the workers compile them themselves",
                    s.describe(),
                    type(exc).__name__,
                    exc,
                )
                report["failed"].append(s.describe())
                progress(len(report["compiled"]) + len(report["failed"]), f"{s.describe()} failed")
                if isinstance(exc, BrokenProcessPool):  # the job's child or the lane's process died: start afresh
                    pool.shutdown(wait=False)
                    pool = None
                continue
            marker = marker_path(s)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({**asdict(s), "seconds": round(seconds, 1), "at": time.time()}))
            report["compiled"].append({"set": s.describe(), "seconds": round(seconds, 1)})
            progress(len(report["compiled"]) + len(report["failed"]), f"{s.describe()} in {seconds:.0f} s")
    finally:
        if pool is not None:
            pool.shutdown()


def precompile(
    sets: list[GraphSet], processes: int, *, min_lanes: int = 1, run: Callable[[GraphSet], float] = compile_set
) -> dict[str, Any]:
    """Compile every job of `sets` not compiled on this machine before, in `lanes(..., processes)` run in
    parallel; nothing when those are fewer than `min_lanes`.

    Returns {"compiled": [{"set", "seconds"}], "skipped": [names], "failed": [names], "seconds": wall,
    "lanes": n (0: nothing ran), "todo": jobs not compiled before}. `run` (picklable, top-level) compiles
    one job in the child process.
    """
    report: dict[str, Any] = {"compiled": [], "skipped": [], "failed": [], "seconds": 0.0, "lanes": 0}
    todo = []
    for s in jobs(sets):
        (report["skipped"].append(s.describe()) if marker_path(s).is_file() else todo.append(s))
    plan = lanes(todo, processes)
    report["todo"] = len(todo)
    if len(plan) < max(min_lanes, 1):
        return report
    report["lanes"] = len(plan)
    started = time.perf_counter()
    with (
        phase(f"compiling the engines' graphs ({len(plan)} in parallel)", len(todo), "graph sets") as progress,
        ThreadPoolExecutor(max_workers=len(plan), thread_name_prefix="precompile") as threads,
    ):
        for future in [threads.submit(_run_lane, lane, run, report, progress) for lane in plan]:
            future.result()
    report["seconds"] = round(time.perf_counter() - started, 1)
    log.info(
        "precompiled %s in %.0f s (%d lanes)%s",
        ", ".join(c["set"] for c in report["compiled"]) or "nothing",
        report["seconds"],
        len(plan),
        f"; failed: {', '.join(report['failed'])}" if report["failed"] else "",
    )
    return report
