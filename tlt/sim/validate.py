"""`tlt simulate --validate`: the checks the simulator is held to.

- local_error: a `tlt train` run on this machine predicted from its own response lengths and
  `tlt bench engine`'s measured costs (`calibrate.compare_run`); needs both files.
- h20_sd_off: on an H20 (about 37 FLOPs per byte of bandwidth, against ~300 on an H100) verifying
  drafts stops being free at small batches; with SD allowed up to a running batch of 256 and a
  `plain` arm among the bandit's, TLT must pick plain decoding where drafting does not pay and not be
  slower than vanilla, while the same arms without `plain` are (the control).
- paper: the predicted speedups for the TLT paper's models at 8 to 1024 GPUs, beside the paper's
  published end-to-end speedup per model (H100 cluster, against veRL; the paper's headline as recorded
  in the project's design notes: its GPU counts per model are not, so one number stands for every count).
"""

from __future__ import annotations

from typing import Any

from tlt.config import ArmSpec, SpeculativeSpec
from tlt.sim.accept import AcceptCurve
from tlt.sim.profiles import load_cost_model
from tlt.sim.simulator import build_variants, simulate
from tlt.sim.step import ClusterConfig
from tlt.sim.trace import parametric_trace

WIDE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
# SD counts as switched off at large batches when the bandit decodes plainly at least this share of
# the time there: its epsilon (0.1) keeps re-trying the other arms, and each bucket tries every arm once.
PLAIN_SHARE = 0.7


def _wide_spec(with_plain: bool) -> SpeculativeSpec:
    base = SpeculativeSpec()
    arms = [*base.arms, ArmSpec(kind="plain")] if with_plain else base.arms
    return base.model_copy(update={"threshold": 256, "buckets": WIDE_BUCKETS, "arms": arms})


def plain_share(result_steps: list, min_batch: int) -> float:
    """Of the decode time at running batch >= min_batch, the share without drafts."""
    spans = [s for step in result_steps for row in step.timelines for s in row
             if s.kind in ("decode", "sd") and s.batch >= min_batch]
    total = sum(s.end - s.start for s in spans)
    return sum(s.end - s.start for s in spans if s.kind == "decode") / total if total else 1.0


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
        out[label] = {"speedup": summary["tlt"]["speedup"], "plain_share_batch_ge_32": plain_share(
            result.steps["tlt"][-1:], 32)}
    adaptive, forced = out["adaptive"], out["forced"]
    out["sd_off"] = (adaptive["plain_share_batch_ge_32"] >= PLAIN_SHARE and adaptive["speedup"] >= 0.98
                     and adaptive["speedup"] >= forced["speedup"])
    return out


# The TLT paper's models; tensor-parallel widths as a rollout engine would shard them on 80 GB GPUs.
PAPER_MODELS = {"qwen2.5-7b": 1, "qwen2.5-32b": 4, "llama-3.3-70b": 8}
# The paper's end-to-end speedups over veRL (Qwen2.5-7B, Qwen2.5-32B, "Llama-70B").
PUBLISHED_SPEEDUP = {"qwen2.5-7b": 1.76, "qwen2.5-32b": 2.12, "llama-3.3-70b": 1.86}


def scale_sweep(gpu: str = "h100", gpus_list: tuple[int, ...] = (8, 64, 1024), steps: int = 2,
                responses_per_replica: int = 32) -> dict[str, dict[str, float]]:
    """TLT's predicted speedup over vanilla per '<model>@<gpus>' (colocated: rollout and update share the
    GPUs; `responses_per_replica` responses per engine, so the step grows with the cluster)."""
    out = {}
    curve = AcceptCurve()
    spec = SpeculativeSpec()
    for model, tp in PAPER_MODELS.items():
        cost = load_cost_model(gpu, model=model, tp=tp)
        for gpus in gpus_list:
            if gpus < tp:
                continue
            cluster = ClusterConfig(replicas=gpus // tp, gpus_per_replica=tp, update_gpus=gpus, prompt_len=256)
            n = responses_per_replica * cluster.replicas
            trace = parametric_trace(f"lognormal:median=1500,sigma=0.8,n={n},max=16384", steps, 0)
            summary = simulate(trace, build_variants(spec, ("vanilla", "tlt")), cost, cluster, spec, curve).summary()
            out[f"{model}@{gpus}"] = {"predicted": summary["tlt"]["speedup"], "published": PUBLISHED_SPEEDUP[model]}
    return out
