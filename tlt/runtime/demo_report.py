"""The demo's side-by-side report: the same RL run with plain decoding (vanilla) and with TLT.

`compare` is a pure function over the two runs' `metrics.jsonl` histories (same prompts, seeds and
steps; only `speculative.mode` differs): totals of rollout and step time and their ratios, reward
first / last, and per-step series (rollout and step seconds, reward, TLT's accept length and the
idle worker-seconds its drafter trainers harvested). `write_demo_report` draws them and writes
`report.md` beside the two runs' own reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from tlt.runtime.report import REPORT_FILE, read_jsonl  # noqa: E402
from tlt.runtime.shard_metrics import accept_by_position  # noqa: E402

PLOT = "side_by_side.png"


def compare(vanilla: list[dict[str, Any]], tlt: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals, ratios and per-step series of two runs of the same steps (the shorter one sets the steps)."""
    if not vanilla or not tlt:
        raise ValueError("both runs need at least one step of metrics to compare")
    n = min(len(vanilla), len(tlt))
    van, run = vanilla[:n], tlt[:n]

    def total(history: list[dict[str, Any]], key: str) -> float:
        return sum(m.get(key) or 0.0 for m in history)

    out: dict[str, Any] = {"steps": n}
    for key in ("rollout_seconds", "step_seconds", "update_seconds", "generated_tokens"):
        out[key] = {"vanilla": total(van, key), "tlt": total(run, key)}
    out["rollout_speedup"] = out["rollout_seconds"]["vanilla"] / max(out["rollout_seconds"]["tlt"], 1e-9)
    out["step_speedup"] = out["step_seconds"]["vanilla"] / max(out["step_seconds"]["tlt"], 1e-9)
    out["reward"] = {
        name: {"first": h[0]["reward_mean"], "last": h[-1]["reward_mean"]}
        for name, h in (("vanilla", van), ("tlt", run))
    }
    out["heldout"] = {
        name: [(m["step"], m["eval_accuracy"]) for m in h if "eval_accuracy" in m]
        for name, h in (("vanilla", van), ("tlt", run))
    }
    out["idle_seconds"] = total(run, "idle_seconds")
    out["harvested_seconds"] = total(run, "harvested_seconds")
    accepts = [m.get("accept_length") for m in run if m.get("accept_length") is not None]
    out["accept_length_mean"] = sum(accepts) / len(accepts) if accepts else None
    out["accept_by_position"] = accept_by_position(m.get("sd_by_position") for m in run)
    out["per_step"] = [
        {
            "step": v["step"],
            "vanilla_rollout": v["rollout_seconds"],
            "tlt_rollout": t["rollout_seconds"],
            "vanilla_step": v["step_seconds"],
            "tlt_step": t["step_seconds"],
            "vanilla_reward": v["reward_mean"],
            "tlt_reward": t["reward_mean"],
            "accept_length": t.get("accept_length"),
            "idle": t.get("idle_seconds") or 0.0,
            "harvested": t.get("harvested_seconds") or 0.0,
            "arms": t.get("sd_arms") or {},
        }
        for v, t in zip(van, run)
    ]
    return out


def _plot(c: dict[str, Any], path: Path) -> None:
    rows = c["per_step"]
    xs = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
    ax = axes[0][0]
    ax.plot(xs, [r["vanilla_rollout"] for r in rows], "o-", color="#888888", label="vanilla")
    ax.plot(xs, [r["tlt_rollout"] for r in rows], "s-", color="#4c72b0", label="TLT")
    ax.set(title=f"Rollout seconds per step (TLT {c['rollout_speedup']:.2f}x)", xlabel="step", ylabel="seconds")
    ax.legend()
    ax = axes[0][1]
    ax.plot(xs, [r["vanilla_step"] for r in rows], "o-", color="#888888", label="vanilla")
    ax.plot(xs, [r["tlt_step"] for r in rows], "s-", color="#4c72b0", label="TLT")
    ax.set(title=f"Step seconds (TLT {c['step_speedup']:.2f}x)", xlabel="step", ylabel="seconds")
    ax.legend()
    ax = axes[1][0]
    ax.plot(xs, [r["vanilla_reward"] for r in rows], "o-", color="#888888", label="vanilla")
    ax.plot(xs, [r["tlt_reward"] for r in rows], "s-", color="#55a868", label="TLT")
    ax.set(title="Mean reward per step (same prompts and seeds)", xlabel="step", ylabel="reward")
    ax.legend()
    ax = axes[1][1]
    ax.bar([x - 0.2 for x in xs], [r["idle"] for r in rows], width=0.4, color="#bbbbbb", label="idle (available)")
    ax.bar([x + 0.2 for x in xs], [r["harvested"] for r in rows], width=0.4, color="#55a868", label="harvested")
    ax.set(title="TLT: idle worker-seconds, accept length", xlabel="step", ylabel="worker-seconds")
    right = ax.twinx()
    right.plot(
        xs,
        [float("nan") if r["accept_length"] is None else r["accept_length"] for r in rows],
        "d--",
        color="#4c72b0",
        label="accept length",
    )
    right.set_ylabel("accept length")
    ax.legend(loc="upper left")
    right.legend(loc="upper right")
    for a in axes.flat:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _series(points: list[tuple[int, float]]) -> str:
    """`step 4: 0.250 -> step 8: 0.313` (held-out accuracy after those steps)."""
    return " -> ".join(f"step {step}: {value:.3f}" for step, value in points) or "-"


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _lossless_sentence(c: dict[str, Any]) -> str:
    """What the two runs' samples show: the same tokens (sampling is coupled) or, where a draw differed, why."""
    same = c["generated_tokens"]["vanilla"] == c["generated_tokens"]["tlt"] and all(
        row["vanilla_reward"] == row["tlt_reward"] for row in c["per_step"]
    )
    if same:
        return (
            "Lossless: TLT generated what vanilla generated, step for step (sampling is coupled: each token is "
            "drawn with the same uniform whether a plain step or a verified draft produces it): the generated "
            "tokens and every step's reward match; only the time differs."
        )
    return (
        "Lossless: TLT's rollouts follow vanilla's distribution; here some samples differ (the two paths' "
        "logits can round differently, which can tip a draw, and the runs then diverge)."
    )


def write_demo_report(
    out: Path, vanilla_dir: Path, tlt_dir: Path, machine: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """Compare the two runs' metrics; write `out/report.md` and its plot. Returns (path, comparison).
    machine: where it ran (`tlt.bench.machine.describe`), said under the table when given."""
    c = compare(read_jsonl(vanilla_dir / "metrics.jsonl"), read_jsonl(tlt_dir / "metrics.jsonl"))
    out.mkdir(parents=True, exist_ok=True)
    _plot(c, out / PLOT)
    r, s = c["reward"], c["step_seconds"]
    lines = [
        "# TLT demo: the same RL run, vanilla vs TLT",
        "",
        f"{c['steps']} GRPO steps each, same prompts, seeds and policy; only `speculative.mode` differs "
        f"(off vs tlt). {_lossless_sentence(c)}",
        "",
        "| | vanilla | TLT | TLT speed-up |",
        "|---|---:|---:|---:|",
        f"| rollout seconds | {c['rollout_seconds']['vanilla']:.1f} | {c['rollout_seconds']['tlt']:.1f} | "
        f"{c['rollout_speedup']:.2f}x |",
        f"| step seconds | {s['vanilla']:.1f} | {s['tlt']:.1f} | {c['step_speedup']:.2f}x |",
        f"| update seconds | {c['update_seconds']['vanilla']:.1f} | {c['update_seconds']['tlt']:.1f} | |",
        f"| reward first -> last | {r['vanilla']['first']:.3f} -> {r['vanilla']['last']:.3f} | "
        f"{r['tlt']['first']:.3f} -> {r['tlt']['last']:.3f} | |",
        f"| generated tokens | {c['generated_tokens']['vanilla']:.0f} | {c['generated_tokens']['tlt']:.0f} | |",
        *(
            [f"| held-out accuracy, by step | {_series(c['heldout']['vanilla'])} | {_series(c['heldout']['tlt'])} | |"]
            if c["heldout"]["vanilla"] or c["heldout"]["tlt"]
            else []
        ),
        "",
        f"TLT: mean accept length {_fmt(c['accept_length_mean'])} tokens per row-step; idle rollout-worker time "
        f"{c['idle_seconds']:.1f} s, of which its drafter trainers harvested {c['harvested_seconds']:.1f} s."
        + (
            " Accept length by response position (tokens generated before the step): "
            + ", ".join(
                f"{edge}+ {cell['accept_length']:.2f} ({cell['row_steps']} row-steps)"
                for edge, cell in c["accept_by_position"].items()
            )
            + "."
            if c.get("accept_by_position")
            else ""
        ),
        "One machine's timings are noisy: `tlt bench run` repeats and interleaves runs for numbers to quote."
        + (f" Measured on: {machine}." if machine else ""),
        "",
        "| step | vanilla rollout s | TLT rollout s | vanilla reward | TLT reward | accept length | harvested s "
        "| arms |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in c["per_step"]:
        arms = ", ".join(f"{k} {v}" for k, v in sorted(row["arms"].items(), key=lambda kv: -kv[1])[:3])
        lines.append(
            f"| {row['step']} | {row['vanilla_rollout']:.2f} | {row['tlt_rollout']:.2f} | "
            f"{row['vanilla_reward']:.3f} | {row['tlt_reward']:.3f} | {_fmt(row['accept_length'])} | "
            f"{row['harvested']:.2f} | {arms} |"
        )
    lines += [
        "",
        f"![side by side]({PLOT})",
        "",
        f"Each run's own report: [{vanilla_dir.name}]({vanilla_dir.name}/{REPORT_FILE}), "
        f"[{tlt_dir.name}]({tlt_dir.name}/{REPORT_FILE}).",
    ]
    path = out / REPORT_FILE
    path.write_text("\n".join(lines) + "\n")
    return path, c
