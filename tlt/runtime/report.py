"""The end-of-run report: PNG plots and a Markdown summary from `metrics.jsonl` (and `events.jsonl`).

Plots: step time split into rollout (before the tail) / tail / update / other; drafter accept
length (top-1 agreement until the speculative stepper reports accept length) and reward per step;
the response-length histogram; idle seconds available vs harvested by drafter trainers.
`summarize` is a pure function over the metrics; `write_report` draws and writes. With partial rollouts
(`algorithm.rollout.mode: partial`) the report adds the off-policy share and the groups kept, dropped and
continued per step, and the trained tokens by staleness; a run from before partial rollouts reads as sync.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

REPORT_FILE = "report.md"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def step_split(m: dict[str, Any]) -> dict[str, float]:
    """Seconds of one step: rollout before the tail, tail, update, and everything else."""
    rollout, tail, update = m["rollout_seconds"], m["tail_seconds"], m["update_seconds"]
    return {
        "rollout": rollout - tail,
        "tail": tail,
        "update": update,
        "other": max(0.0, m["step_seconds"] - rollout - update),
    }


def drafter_quality(m: dict[str, Any]) -> float | None:
    return m.get("accept_length") if m.get("accept_length") is not None else m.get("drafter_agreement")


def rollout_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout mode (`sync` for rows without `rollout_mode`), and in partial mode each step's
    (step, off-policy share, groups trained, kept, dropped, continued) and the trained tokens by staleness
    in steps, summed over the run."""
    modes = {m.get("rollout_mode", "sync") for m in history}
    mode = "partial" if "partial" in modes else "sync"
    rows = [
        (
            m["step"],
            m.get("off_policy_fraction"),
            *(m.get(f"groups_{k}") for k in ("trained", "kept", "dropped", "continued")),
        )
        for m in history
        if m.get("rollout_mode") == "partial"
    ]
    staleness: dict[int, int] = {}
    for m in history:
        for age, tokens in (m.get("staleness_tokens") or {}).items():
            staleness[int(age)] = staleness.get(int(age), 0) + tokens
    return {"mode": mode, "steps": rows, "staleness_tokens": dict(sorted(staleness.items()))}


def summarize(history: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Totals of a run: step time split, idle seconds, stop latencies (p50 / p99 / max), restarts."""
    events = events or []
    splits = [step_split(m) for m in history]
    latencies = [a["acked_at"] - a["requested_at"] for m in history for a in m.get("trainer_acks", [])]
    lengths = [n for m in history for n in m.get("response_lengths", [])]
    return {
        "steps": len(history),
        "seconds": {k: sum(s[k] for s in splits) for k in ("rollout", "tail", "update", "other")},
        "idle_seconds": sum(m.get("idle_seconds", 0.0) for m in history),
        "harvested_seconds": sum(m.get("harvested_seconds") or 0.0 for m in history),
        "drafter_updates": sum(m.get("drafter_updates") or 0 for m in history),
        "stop_latency": {
            "count": len(latencies),
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies) if latencies else None,
        },
        "restarts": [e for e in events if e.get("type") == "restart"],
        "reward_first": history[0]["reward_mean"] if history else None,
        "reward_last": history[-1]["reward_mean"] if history else None,
        "drafter_first": drafter_quality(history[0]) if history else None,
        "drafter_last": drafter_quality(history[-1]) if history else None,
        "response_length_median": statistics.median(lengths) if lengths else None,
        "response_length_max": max(lengths) if lengths else None,
        "heldout": [
            (m["step"], m["eval_reward_mean"], m["eval_accuracy"], m["eval_samples"], m["eval_seconds"])
            for m in history
            if "eval_accuracy" in m
        ],
        "rollout": rollout_summary(history),
    }


def _plot_steps(history: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [m["step"] for m in history]
    bottom = [0.0] * len(history)
    for part, color in (("rollout", "#4c72b0"), ("tail", "#dd8452"), ("update", "#55a868"), ("other", "#bbbbbb")):
        values = [step_split(m)[part] for m in history]
        ax.bar(xs, values, bottom=bottom, label=part, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="step", ylabel="seconds", title="Step time: rollout / tail / update")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_quality(history: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [m["step"] for m in history]
    ax.plot(xs, [m["reward_mean"] for m in history], "o-", label="reward", color="#55a868")
    ax.set(xlabel="step", ylabel="mean reward")
    quality = [drafter_quality(m) for m in history]
    if any(q is not None for q in quality):
        right = ax.twinx()
        label = (
            "accept length" if any(m.get("accept_length") is not None for m in history) else "drafter top-1 agreement"
        )
        right.plot(xs, [float("nan") if q is None else q for q in quality], "s--", color="#4c72b0", label=label)
        right.set_ylabel(label)
        right.legend(loc="lower right")
    ax.legend(loc="upper left")
    ax.set_title("Reward and drafter quality per step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_lengths(history: list[dict[str, Any]], path: Path) -> None:
    lengths = [n for m in history for n in m.get("response_lengths", [])]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(lengths, bins=min(40, max(5, len(set(lengths)))), color="#4c72b0")
    ax.set(xlabel="response tokens", ylabel="responses", title="Response lengths (all steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_idle(history: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = [m["step"] for m in history]
    ax.bar(
        [x - 0.2 for x in xs],
        [m.get("idle_seconds", 0.0) for m in history],
        width=0.4,
        label="idle (available)",
        color="#bbbbbb",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [m.get("harvested_seconds") or 0.0 for m in history],
        width=0.4,
        label="harvested (trainer)",
        color="#55a868",
    )
    ax.set(xlabel="step", ylabel="worker-seconds", title="Idle rollout-worker time harvested by drafter trainers")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# the report's figures, each drawn from the history into <out>/<name>
PLOTS = {
    "step_time.png": _plot_steps,
    "reward_drafter.png": _plot_quality,
    "lengths.png": _plot_lengths,
    "idle.png": _plot_idle,
}


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _partial_lines(rollout: dict[str, Any]) -> list[str]:
    """The partial-rollout section: the share of off-policy tokens and the groups of each step."""
    shares = [row[1] for row in rollout["steps"] if row[1] is not None]
    by_age = ", ".join(f"{age}: {tokens}" for age, tokens in rollout["staleness_tokens"].items())
    lines = [
        "Partial rollouts (`algorithm.rollout.mode: partial`): off-policy share of trained tokens mean "
        f"{_fmt(statistics.mean(shares) if shares else None)}, max {_fmt(max(shares) if shares else None)}; "
        f"trained tokens by staleness in steps: {by_age or '-'}.",
        "",
        "| step | off-policy | groups trained | kept | dropped | continued |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {step} | {_fmt(share)} | " + " | ".join("-" if n is None else str(n) for n in groups) + " |"
        for step, share, *groups in rollout["steps"]
    ]
    return [*lines, ""]


def write_report(out_dir: str | Path, title: str = "TLT run") -> Path:
    """Draw the plots into `out_dir` and write `report.md`; returns its path."""
    out = Path(out_dir)
    history = read_jsonl(out / "metrics.jsonl")
    if not history:
        raise ValueError(f"{out}: metrics.jsonl has no steps to report")
    events = read_jsonl(out / "events.jsonl")
    s = summarize(history, events)
    for name, draw in PLOTS.items():
        draw(history, out / name)
    sec, lat = s["seconds"], s["stop_latency"]
    lines = [
        f"# {title}",
        "",
        f"{s['steps']} steps. Time: rollout {sec['rollout']:.1f} s + tail {sec['tail']:.1f} s + update "
        f"{sec['update']:.1f} s + other {sec['other']:.1f} s.",
        f"Idle rollout-worker seconds: {s['idle_seconds']:.1f} available, {s['harvested_seconds']:.1f} harvested by "
        f"drafter trainers ({s['drafter_updates']} drafter updates).",
        f"Trainer stop latency (request to acknowledgement, {lat['count']} stops): p50 {_fmt(lat['p50'], '.4f')} s, "
        f"p99 {_fmt(lat['p99'], '.4f')} s, max {_fmt(lat['max'], '.4f')} s.",
        f"Reward {_fmt(s['reward_first'])} -> {_fmt(s['reward_last'])}; drafter {_fmt(s['drafter_first'])} -> "
        f"{_fmt(s['drafter_last'])}; response length median {s['response_length_median']}, max "
        f"{s['response_length_max']}.",
        f"Rollout mode: {s['rollout']['mode']}.",
        f"Restarts: {len(s['restarts'])}"
        + "".join(
            f"\n- step {r['failed_step']} failed ({r['error']}), resumed from step {r['resumed_step']}"
            for r in s["restarts"]
        ),
        "",
        "| step | reward | drafter | rollout s | tail s | update s | idle s | harvested s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in history:
        lines.append(
            f"| {m['step']} | {m['reward_mean']:.3f} | {_fmt(drafter_quality(m))} | {m['rollout_seconds']:.2f} "
            f"| {m['tail_seconds']:.2f} | {m['update_seconds']:.2f} | {m.get('idle_seconds', 0.0):.2f} "
            f"| {m.get('harvested_seconds') or 0.0:.2f} |"
        )
    lines += [
        "",
        "drafter: accept length where the speculative stepper reports it, else top-1 agreement of the "
        "step's drafter on the step's fresh rollouts (before training on them).",
        "",
    ]
    if s["heldout"]:
        lines += [
            "Held-out evaluation (`algorithm.evalEvery`; its time is not part of the steps'):",
            "",
            "| after step | reward | accuracy | problems | seconds |",
            "|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {step} | {reward:.3f} | {accuracy:.3f} | {n} | {seconds:.1f} |"
            for step, reward, accuracy, n, seconds in s["heldout"]
        ]
        lines += [""]
    if s["rollout"]["mode"] == "partial":
        lines += _partial_lines(s["rollout"])
    lines += [f"![{name}]({name})" for name in PLOTS]
    path = out / REPORT_FILE
    path.write_text("\n".join(lines) + "\n")
    return path
