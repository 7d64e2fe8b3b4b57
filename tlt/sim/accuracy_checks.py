"""`tlt simulate --validate`: the checks the simulator is held to.

- local_error: a `tlt train` run on this machine predicted from its own response lengths and
  `tlt bench engine`'s measured costs (`calibrate.compare_run`); needs both files.
- h20_sd_off: on an H20 (about 37 FLOPs per byte of bandwidth, against ~300 on an H100) verifying
  drafts stops being free at small batches; with SD allowed up to a running batch of 256 and a
  `plain` arm among the bandit's, TLT must pick plain decoding where drafting does not pay and not be
  slower than vanilla, while the same arms without `plain` are (the control).
- paper: the predicted speedups for the TLT paper's setups (its models at its cluster sizes, its
  drafting arms and accept lengths), beside the published end-to-end speedups over veRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlt.bench.cost_timing import amdahl
from tlt.sim.accept import AcceptCurve, accept_length, alpha_for_accept
from tlt.sim.cost_model import CostModel
from tlt.sim.profiles import load_cost_model
from tlt.sim.replica import round_seconds
from tlt.sim.simulator import build_variants, simulate
from tlt.sim.step import ClusterConfig
from tlt.sim.trace import parametric_trace
from tlt.spec.run import ArmSpec, SpeculativeSpec

WIDE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
# SD counts as switched off at large batches when the bandit decodes plainly at least this share of
# the time there: its epsilon (0.1) keeps re-trying the other arms, and each bucket tries every arm once.
PLAIN_SHARE = 0.7


def _wide_spec(with_plain: bool) -> SpeculativeSpec:
    base = SpeculativeSpec()
    arms = [*base.arms, ArmSpec(kind="plain")] if with_plain else base.arms
    return base.model_copy(update={"threshold": 256, "buckets": WIDE_BUCKETS, "arms": arms})


def _decode_spans(result_steps: list) -> list:
    """Every engine's decode segments (plain and SD rounds) over the steps."""
    return [s for step in result_steps for row in step.timelines for s in row if s.kind in ("decode", "sd")]


def _share(spans: list, part: Any, empty: float) -> float:
    total = sum(s.end - s.start for s in spans)
    return sum(s.end - s.start for s in spans if part(s)) / total if total else empty


def decode_share_at_most(result_steps: list, max_batch: int) -> float:
    """Of the engines' decode time, the share at running batch <= max_batch."""
    return _share(_decode_spans(result_steps), lambda s: s.batch <= max_batch, 0.0)


def plain_share(result_steps: list, min_batch: int) -> float:
    """Of the decode time at running batch >= min_batch, the share without drafts."""
    spans = [s for s in _decode_spans(result_steps) if s.batch >= min_batch]
    return _share(spans, lambda s: s.kind == "decode", 1.0)


def h20_check(gpu: str = "h20", model: str = "qwen2.5-7b", gpus: int = 8, steps: int = 3) -> dict[str, Any]:
    """Vanilla vs TLT with a plain arm (adaptive) vs TLT without one (forced), SD allowed up to batch 256.
    sd_off: adaptive drafts little at running batches >= 32 in the last step (the bandits have learned by
    then), is not slower than vanilla over the steps, and beats forced."""
    cost = load_cost_model(gpu, model=model)
    cluster = ClusterConfig(replicas=gpus, update_gpus=gpus, prompt_len=256)
    trace = parametric_trace(f"lognormal:median=1500,sigma=0.8,n={64 * gpus},max=16384", steps, 0)
    curve = AcceptCurve()
    out: dict[str, Any] = {"gpu": gpu, "model": model, "gpus": gpus}
    for label, with_plain in (("adaptive", True), ("forced", False)):
        spec = _wide_spec(with_plain)
        result = simulate(trace, build_variants(spec, ("vanilla", "tlt")), cost, cluster, spec, curve)
        summary = result.summary()
        out[label] = {
            "speedup": summary["tlt"]["speedup"],
            "plain_share_batch_ge_32": plain_share(result.steps["tlt"][-1:], 32),
        }
    adaptive, forced = out["adaptive"], out["forced"]
    out["sd_off"] = (
        adaptive["plain_share_batch_ge_32"] >= PLAIN_SHARE
        and adaptive["speedup"] >= 0.98
        and adaptive["speedup"] >= forced["speedup"]
    )
    return out


@dataclass(frozen=True)
class PaperSetup:
    """One published TLT-over-veRL measurement and the cluster it ran on (H100, colocated).

    tp: the rollout engines' tensor-parallel width; responses: responses per RL step (prompts x 8);
    published: TLT's end-to-end speedup over veRL as reported (arXiv 2511.16665, see below)."""

    model: str
    gpus: int
    tp: int
    responses: int
    published: float


# Sources (read from secondary copies of the paper's tables; docs/simulate.md says which and where they
# disagree): Table 3 (cluster scale: Qwen2.5-7B on 1/2/4/8 DGX H100 nodes, Qwen2.5-32B on 4/8) and
# Fig. 11 (end-to-end at 8 nodes). Batch and parallelism as in the public TLT code's GRPO scripts
# (examples/grpo_7B.sh: 64 prompts x 8 a node, rollout TP 4; grpo_32B_multi_nodes.sh: 32 x 8 a node,
# TP 8; max response 32K); Llama-3.3-70B assumed set up as the 32B.
PAPER_SETUPS = (
    PaperSetup("qwen2.5-7b", 8, 4, 512, 1.21),
    PaperSetup("qwen2.5-7b", 16, 4, 1024, 1.45),
    PaperSetup("qwen2.5-7b", 32, 4, 2048, 1.62),
    PaperSetup("qwen2.5-7b", 64, 4, 4096, 1.76),
    PaperSetup("qwen2.5-32b", 32, 8, 1024, 1.83),
    PaperSetup("qwen2.5-32b", 64, 8, 2048, 2.12),
    PaperSetup("llama-3.3-70b", 64, 8, 2048, 1.86),
)
# The paper's response lengths are not published as numbers: the lognormal tail used throughout these
# checks (median 1500, sigma 0.8), capped at the scripts' 32K.
PAPER_TRACE = "lognormal:median=1500,sigma=0.8,n={n},max=32768"
# The paper's drafting: an EAGLE tree of depth 8, top-k 4, its bandit choosing 48 / 32 / 16 / 8 verified
# tokens for running batches of 1 / 2-4 / 5-20 / 21-32 (SD on at <= 32 rows); accept length 4.59 for
# the static drafter and 6.53 for the adaptive one during RL training.
PAPER_ACCEPT = {"static": 4.59, "adaptive": 6.53}
# The rollout's share of a veRL step in the paper's setting ("about 85%").
PAPER_ROLLOUT_SHARE = 0.85
# The context of the one-row speculative round in `implied_sd_share` (prompt + the tail's median, rounded).
PAPER_CONTEXT = 2048


def paper_spec() -> SpeculativeSpec:
    arms = [ArmSpec(kind="tree", depth=8, topk=4, verify_tokens=v) for v in (48, 32, 16, 8)]
    return SpeculativeSpec().model_copy(update={"threshold": 32, "buckets": [1, 4, 20, 32], "arms": arms})


def paper_curve(spec: SpeculativeSpec) -> AcceptCurve:
    """The acceptance curve whose first arm yields the paper's static accept length untrained and its
    adaptive one fully trained."""
    arm = spec.arms[0]
    return AcceptCurve(
        alpha0=alpha_for_accept(arm, PAPER_ACCEPT["static"]), alpha_max=alpha_for_accept(arm, PAPER_ACCEPT["adaptive"])
    )


def paper_sweep(
    gpu: str = "h100", steps: int = 3, setups: tuple[PaperSetup, ...] = PAPER_SETUPS, trace: str = PAPER_TRACE
) -> dict[str, dict[str, float]]:
    """Predicted TLT-over-vanilla speedup per '<model>@<gpus>' beside the published one (colocated:
    rollout on gpus / tp engines, the update on every GPU), with the terms that make it: the rollout
    speed-up, vanilla's rollout share, the decode time SD may act on, the accept length reached.
    trace: a parametric tail with `{n}` for the step's responses (the sensitivity to the unpublished tail)."""
    spec = paper_spec()
    curve = paper_curve(spec)
    out = {}
    for setup in setups:
        cost = load_cost_model(gpu, model=setup.model, tp=setup.tp)
        cluster = ClusterConfig(
            replicas=setup.gpus // setup.tp, gpus_per_replica=setup.tp, update_gpus=setup.gpus, prompt_len=256
        )
        lengths = parametric_trace(trace.format(n=setup.responses), steps, 0)
        result = simulate(lengths, build_variants(spec, ("vanilla", "tlt")), cost, cluster, spec, curve)
        summary = result.summary()
        rollout = {v: sum(r.rollout_seconds for r in result.steps[v]) for v in ("vanilla", "tlt")}
        rollout_speedup = rollout["vanilla"] / rollout["tlt"]
        out[f"{setup.model}@{setup.gpus}"] = {
            "predicted": summary["tlt"]["speedup"],
            "published": setup.published,
            "rollout_speedup": rollout_speedup,
            "vanilla_step_seconds": summary["vanilla"]["step_seconds"],
            "vanilla_rollout_share": summary["vanilla"]["rollout_share"],
            # The same rollout speed-up had the rollout been the paper's share of veRL's step (Amdahl).
            "at_paper_rollout_share": amdahl(PAPER_ROLLOUT_SHARE, rollout_speedup),
            # Of vanilla's engine decode time, the share at running batches SD may run at (<= threshold).
            "vanilla_decode_share_sd_eligible": decode_share_at_most(result.steps["vanilla"], spec.threshold),
            "final_accept_length": accept_length(spec.arms[0], summary["tlt"]["final_alpha"], curve.ngram),
        }
        # What the published number implies, with the paper's rollout share and the cost model's own
        # speculative round at one row (the paper's accept length, a context of PAPER_CONTEXT tokens).
        speedup_1 = round_speedup(cost, spec.arms[0], PAPER_ACCEPT["adaptive"], PAPER_CONTEXT)
        out[f"{setup.model}@{setup.gpus}"].update(
            round_speedup_batch1=speedup_1,
            implied_sd_share=implied_sd_share(setup.published, PAPER_ROLLOUT_SHARE, speedup_1),
        )
    return out


def implied_sd_share(published: float, rollout_share: float, round_speedup: float) -> float:
    """The share of the rollout's decode time that must run speculatively, each round `round_speedup` times
    faster than a plain one, for a step whose rollout is `rollout_share` of it to speed up `published`
    times (Amdahl twice; the rest of the decode and of the step as before). Above 1: not reachable so."""
    if not 0.0 < rollout_share <= 1.0 or published < 1.0 or round_speedup <= 1.0:
        raise ValueError(
            f"need 0 < rollout_share <= 1, published >= 1 and round_speedup > 1, got {rollout_share}, "
            f"{published} and {round_speedup}"
        )
    if 1.0 / published <= 1.0 - rollout_share:
        return float("inf")  # past Amdahl's bound: no rollout speed-up gives it
    needed = rollout_share / (1.0 / published - (1.0 - rollout_share))  # the rollout speed-up it takes
    return (1.0 - 1.0 / needed) / (1.0 - 1.0 / round_speedup)


def round_speedup(cost: CostModel, arm: ArmSpec, accept: float, context: int) -> float:
    """One row's speed-up of a speculative round of `arm` yielding `accept` tokens over plain rounds, from
    the cost model (the simulator's own round, `round_seconds`)."""
    return accept * cost.target_seconds(1, 1, context) / round_seconds(cost, arm, 1, context)
