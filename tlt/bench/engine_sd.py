"""`tlt bench engine --part sd`: speculative decoding vs plain decoding on the warm-started policy,
with an EAGLE drafter trained on the policy's own outputs, plus the verify and drafter-step costs.

Sampled rows (T > 0) run GRPO-shaped groups: `group_size` samples of each prompt. The history and
mixed variants start every timed run from a fresh rollout-history store holding one earlier "step":
the same prompts' responses sampled with other seeds (the same policy; in RL it has moved a little
since). Greedy rows (T = 0) run one sample per prompt (a greedy group is G copies of one answer) and
their store starts empty: they draft from the row's own text and earlier waves only."""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.bench.bench_block_drafter import trained_block_drafter
from tlt.bench.bench_drafter import countdown_task, sample_context, trained_drafter
from tlt.bench.cost_timing import measure_costs
from tlt.bench.engine_vs_generate import DTYPES
from tlt.bench.sd_config import PLAIN_VARIANTS, SdBenchConfig
from tlt.bench.sd_costs import block_cost_fraction, block_step_costs, drafter_step_costs
from tlt.bench.sd_summary import (
    block_vs_best_chain,
    drafting_fraction,
    feature_keeping,
    history_summary,
    wide_vs_final_norm_block,
)
from tlt.drafter.evaluate import make_requests
from tlt.models.block_drafter import BlockDrafter
from tlt.models.drafter import EagleDrafter, load_drafter
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.drafting import EagleChainDrafter, NgramDrafter
from tlt.rollout.eagle_tree import EagleTreeDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.history import HistoryDrafter, HistoryStore
from tlt.rollout.mixed import MixedDrafter, RowGate
from tlt.rollout.sequence import Sequence
from tlt.rollout.speculative import AcceptanceStats, SpeculativeStepper
from tlt.rollout.step_timing import StepSplit, pool_ranges
from tlt.rollout.types import Request
from tlt.spec.plan import spread_layers
from tlt.tasks.countdown import generate
from tlt.tasks.warmstart import WarmstartConfig, deep_config, load_metadata, load_policy, reduced_config, warm_start

log = logging.getLogger(__name__)


WARMSTARTS = {"full": WarmstartConfig, "reduced": reduced_config, "deep": deep_config}


def _policy(cfg: SdBenchConfig) -> tuple[Path, PreTrainedModel, PreTrainedTokenizerBase]:
    if cfg.warmstart not in WARMSTARTS:
        raise ValueError(f"warmstart must be one of {sorted(WARMSTARTS)}, got {cfg.warmstart!r}")
    folder = warm_start(WARMSTARTS[cfg.warmstart]())
    model, tokenizer = load_policy(folder)
    return folder, model.eval(), tokenizer


def sd_engine(
    variant: str,
    cfg: SdBenchConfig,
    policy: PreTrainedModel,
    drafter: EagleDrafter,
    batch: int,
    context: int,
    block: BlockDrafter | None = None,
    wide: BlockDrafter | None = None,
) -> Engine:
    """An engine for one SD variant name from cfg.variants() (`block`: the block variants' drafter, `wide`: the
    `-wide` block variants', whose engine keeps its feature layers). `plain-hidden` / `plain-wide` decode plainly
    on an engine that returns the final-norm features (every run with a learned drafter) / keeps the block
    drafter's layers too (a run with block arms): what keeping them costs a step."""
    depth, _, suffix = variant.removeprefix("block-").partition("-")
    block_drafter = (wide if suffix == "wide" else block) if variant.startswith("block-") else None
    layers = () if block_drafter is None else block_drafter.feature_layers
    if variant == "plain-wide":  # plain decoding as a run with block arms does it: the engine keeps their layers
        layers = spread_layers(policy.config.num_hidden_layers)
    engine = Engine(
        policy,
        max_batch_size=batch,
        max_context=context,
        return_hidden=variant != "plain",
        compile=cfg.compile,
        feature_layers=layers,
    )
    embed = policy.get_input_embeddings()
    if variant.startswith("chain-"):
        depth, _, guess = variant[6:].partition("-")
        stepper_drafter = EagleChainDrafter(
            drafter, embed, int(depth), batch, context, compile=cfg.compile, guess=guess or "coupled"
        )
    elif variant.startswith("tree-"):
        topk, depth, budget = cfg.tree
        stepper_drafter = EagleTreeDrafter(
            drafter,
            embed,
            topk=topk,
            depth=depth,
            budget=budget,
            max_batch_size=batch,
            max_context=context,
            compile=cfg.compile,
        )
    elif variant.startswith("ngram-"):
        stepper_drafter = NgramDrafter(*cfg.ngram)
    elif variant.startswith("history-"):
        stepper_drafter = HistoryDrafter(_history_store(cfg, []), cfg.history[0])
    elif variant.startswith("mixed-"):
        k = cfg.history[0]
        stepper_drafter = MixedDrafter(
            _history_store(cfg, []), EagleChainDrafter(drafter, embed, k, batch, context, compile=cfg.compile), k
        )
    elif block_drafter is not None:
        stepper_drafter = BlockChainDrafter(block_drafter, int(depth), compile=cfg.compile)
    elif variant in PLAIN_VARIANTS:
        return engine
    else:
        raise ValueError(f"unknown SD variant {variant!r}; known: {cfg.variants()}")
    engine.stepper = SpeculativeStepper(engine.runner, stepper_drafter)
    return engine


@dataclass
class SdRow:
    variant: str
    batch: int
    temperature: float
    prompts: int
    tokens: int = 0
    accept_length: float = 1.0
    mean_running: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)  # mixed: row-steps by draft source
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    seconds: list[float] = field(default_factory=list)
    split: dict[str, float] = field(default_factory=dict)  # ms per decode step by part, timed rounds pooled

    def as_dict(self) -> dict:
        median = statistics.median(self.seconds)
        return {
            "variant": self.variant,
            "batch": self.batch,
            "temperature": self.temperature,
            "prompts": self.prompts,
            "tokens": self.tokens,
            "accept_length": self.accept_length,
            "mean_running": self.mean_running,
            "sources": self.sources,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens / median,
            "tokens_per_s_range": [self.tokens / max(self.seconds), self.tokens / min(self.seconds)],
            "split": self.split,
        }


def _split_label(row: SdRow) -> str:
    return f"{row.variant}@{row.batch}@{row.temperature}/"


def _history_store(cfg: SdBenchConfig, earlier: list[Sequence]) -> HistoryStore:
    """A store holding `earlier` (finished responses of an earlier step)."""
    k, min_match, max_match = cfg.history
    store = HistoryStore(max_nodes=cfg.history_nodes, min_match=min_match, max_match=max_match, max_draft=k)
    store.observe(earlier)
    return store


def _earlier_step(policy: PreTrainedModel, requests: list[Request], batch: int, context: int) -> list[Sequence]:
    """The same requests sampled with other seeds, as finished sequences (an earlier step's responses)."""
    other = [
        Request(r.request_id, r.prompt_ids, replace(r.params, seed=(r.params.seed or 0) + 1_000_003)) for r in requests
    ]
    out = Engine(policy, max_batch_size=batch, max_context=context, return_hidden=False).generate(other)
    seqs = []
    for request, c in zip(other, out):
        seq = Sequence(request, limit=request.params.max_new_tokens, tokens=list(c.token_ids))
        seq.finish_reason = c.finish_reason
        seqs.append(seq)
    return seqs


def _sd_runner(
    row: SdRow, engine: Engine, requests: list[Request], cfg: SdBenchConfig, earlier: list[Sequence]
) -> Callable[[], float]:
    def go() -> float:
        running: list[int] = []
        if isinstance(engine.stepper, SpeculativeStepper):
            engine.stepper.stats = AcceptanceStats()
            drafter = engine.stepper.drafter
            if isinstance(drafter, (HistoryDrafter, MixedDrafter)):  # a fresh store: this step's history only
                drafter.store = _history_store(cfg, earlier)
                engine.wave_observers = [drafter.store.observe]
            if isinstance(drafter, MixedDrafter):
                drafter.gate, drafter.sources = RowGate(), dict.fromkeys(drafter.sources, 0)
        t0 = time.perf_counter()
        out = engine.generate(requests, on_step=lambda m: running.append(m.running))
        seconds = time.perf_counter() - t0
        row.outputs = [c.token_ids for c in out]
        row.tokens = sum(len(ids) for ids in row.outputs)
        row.mean_running = statistics.fmean(running[1:] or running)  # decode steps (step 0 is prefill)
        if isinstance(engine.stepper, SpeculativeStepper):
            row.accept_length = engine.stepper.stats.accept_length
            if isinstance(engine.stepper.drafter, MixedDrafter):
                row.sources = {**engine.stepper.drafter.sources, "gated": engine.stepper.drafter.gate.skipped}
        return seconds

    return go


def _workload_policy(
    cfg: SdBenchConfig,
) -> tuple[SdBenchConfig, Path, PreTrainedModel, PreTrainedTokenizerBase, EagleDrafter, dict]:
    """(cfg with the workload's temperature and compile setting, folder, policy, tokenizer, drafter, its info)
    of `cfg.workload`."""
    from tlt.bench.workload import load_workload, warm_drafter
    from tlt.rollout.compiled import resolve_compile

    workload = load_workload(Path(cfg.workload))
    path, info = warm_drafter(workload)
    if path is None:
        raise ValueError(f"{cfg.workload}: the sd part needs the workload's drafterWarmstart (it has none)")
    folder = warm_start(workload.warmstart)
    policy, tokenizer = load_policy(folder)
    spec = workload.spec
    algorithm = spec.get("algorithm", {})
    compiled = resolve_compile(spec.get("rollout", {}).get("compile", "auto"), policy)
    cfg = replace(
        cfg,
        temperatures=(float(algorithm.get("temperature", 1.0)),),
        compile=compiled,
        max_new_tokens=int(algorithm.get("maxNewTokens", cfg.max_new_tokens)),
        group_size=int(algorithm.get("groupSize", cfg.group_size)),
    )
    return cfg, folder, policy.eval(), tokenizer, load_drafter(path, policy), {**info, "workload": workload.name}


def run_sd_bench(cfg: SdBenchConfig, on_row: Callable[[str], None] | None = None) -> dict:
    """{"sd": rows (accept length, tokens/s) and ratios vs plain, "costs": verify and drafter-step costs}."""
    torch.set_num_threads(cfg.threads)
    if cfg.workload is not None:
        cfg, folder, policy, tokenizer, drafter, drafter_info = _workload_policy(cfg)
    else:
        folder, policy, tokenizer = _policy(cfg)
        drafter, drafter_info = trained_drafter(cfg.drafter_budget(), folder, policy, tokenizer)
    block, block_info = trained_block_drafter(
        cfg.drafter_budget(), max(cfg.block_depths), cfg.block_layers, folder, policy, tokenizer
    )
    wide, wide_info = None, None
    if cfg.block_wide:
        layers = spread_layers(policy.config.num_hidden_layers)
        wide, wide_info = trained_block_drafter(
            cfg.drafter_budget(), max(cfg.block_depths), cfg.block_layers, folder, policy, tokenizer, layers
        )
    policy = policy.to(DTYPES[cfg.dtype])
    drafter, block = (copy.deepcopy(d).to(DTYPES[cfg.dtype]) for d in (drafter, block))
    wide = None if wide is None else copy.deepcopy(wide).to(DTYPES[cfg.dtype])
    for d in (drafter, block, wide):
        if d is not None:
            d.bind_policy(policy)
    task = countdown_task(folder)
    variants: list[tuple[SdRow, Callable[[], float]]] = []
    for batch in cfg.batches:
        n = max(batch, cfg.min_prompts)
        for temperature in cfg.temperatures:
            group = cfg.group_size if temperature > 0 else 1
            problems = generate(-(-n // group), cfg.seed + 1, task)
            requests = make_requests(
                tokenizer,
                [p for p in problems for _ in range(group)],
                max_new_tokens=cfg.max_new_tokens,
                temperature=temperature,
                seed=cfg.seed,
            )
            context = sample_context(policy, requests)
            earlier = _earlier_step(policy, requests, batch, context) if temperature > 0 else []
            for name in cfg.variants():
                row = SdRow(name, batch, temperature, len(problems))
                engine = sd_engine(name, cfg, policy, drafter, batch, context, block, wide)
                variants.append((row, _sd_runner(row, engine, requests, cfg, earlier)))
    for _, go in variants:  # warm-up round, not timed
        go()
    with StepSplit() as split:  # each decode step by part, in the rounds as timed (`step_split` below)
        for round_ in range(cfg.repeats):
            for row, go in variants:
                split.label = _split_label(row)
                row.seconds.append(go())
                if on_row is not None:
                    on_row(f"SD round {round_ + 1}/{cfg.repeats}: {row.variant} batch {row.batch} T={row.temperature}")
    table = split.table()
    for row, _ in variants:
        (stepper,) = [name for name in table if name.startswith(_split_label(row))]
        row.split = pool_ranges(table[stepper])
    plain = {(r.batch, r.temperature): r for r, _ in variants if r.variant == "plain"}
    ratios = []
    for row, _ in variants:
        base = plain[row.batch, row.temperature]
        per_round = [(row.tokens / s) / (base.tokens / sb) for s, sb in zip(row.seconds, base.seconds)]
        ratios.append(
            {
                "variant": row.variant,
                "batch": row.batch,
                "temperature": row.temperature,
                "over_plain": row.as_dict()["tokens_per_s"] / base.as_dict()["tokens_per_s"],
                "over_plain_range": [min(per_round), max(per_round)],
                "outputs_equal_plain": row.outputs == base.outputs,
            }
        )
    verify = measure_costs(
        policy,
        batches=list(cfg.batches),
        widths=list(cfg.cost_widths),
        context=cfg.cost_context,
        repeats=max(cfg.repeats, 3),
        clock="wall",
    )
    sd = {
        "config": {
            **asdict(cfg),
            "variants": cfg.variants(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "policy": {
            "folder": str(folder),
            "params": sum(p.numel() for p in policy.parameters()),
            "warmstart_metrics": load_metadata(folder)["metrics"],
        },
        "drafter": drafter_info,
        "block_drafter": block_info,
        "block_drafter_wide": wide_info,
        "rows": [r.as_dict() for r, _ in variants],
        "ratios": ratios,
    }
    costs = {
        "clock": "wall",
        "context": cfg.cost_context,
        "estimate": "fastest repeat",
        "verify": [p.__dict__ for p in verify],
        "drafter_step": drafter_step_costs(cfg.batches, cfg.cost_context, cfg.repeats, drafter, policy),
        "block_step": block_step_costs(cfg.batches, tuple(cfg.block_depths), cfg.repeats, block, policy),
    }
    if wide is not None:
        costs["block_step_wide"] = block_step_costs(cfg.batches, tuple(cfg.block_depths), cfg.repeats, wide, policy)
    if wide is not None and cfg.compile:  # what the compiled engine runs: its target step, the compiled draft
        costs["verify_compiled"] = [
            p.__dict__
            for p in measure_costs(
                policy,
                batches=list(cfg.batches),
                widths=[1],
                context=cfg.cost_context,
                repeats=max(cfg.repeats, 3),
                clock="wall",
                compile=True,
            )
        ]
        costs["block_step_wide_compiled"] = block_step_costs(
            cfg.batches, tuple(cfg.block_depths), cfg.repeats, wide, policy, compile=True
        )
    temperature = max(cfg.temperatures)  # GRPO samples
    return {
        "sd": sd,
        "costs": costs,
        "block_vs_best_chain": block_vs_best_chain(sd["rows"], cfg.batches, temperature),
        "block_cost_fraction": block_cost_fraction(costs),
        "block_cost_fraction_wide": block_cost_fraction(costs, "block_step_wide") if wide is not None else None,
        "block_cost_fraction_wide_compiled": (
            block_cost_fraction(costs, "block_step_wide_compiled", "verify_compiled")
            if "verify_compiled" in costs
            else None
        ),
        "wide_vs_final_norm_block": wide_vs_final_norm_block(sd["rows"], cfg.batches, temperature),
        "feature_keeping": feature_keeping(sd["rows"], cfg.batches, temperature),
        "drafting_fraction": drafting_fraction(sd["rows"], cfg.batches, temperature),
        **history_summary(sd["rows"], cfg.variants(), cfg.batches, temperature, cfg.ngram[0], cfg.history[0]),
    }
