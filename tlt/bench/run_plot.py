"""PNG of a `tlt bench run` report: times per variant (median, range), held-out accept length per
step, and vanilla's decode time by running-batch size."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_report(report: dict[str, Any], path: Path) -> Path:
    """Write the three-panel figure of `report` (from `tlt.bench.run_summary.summarize`) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = report["variants"]
    names = list(variants)
    fig, (ax_time, ax_accept, ax_batch) = plt.subplots(1, 3, figsize=(15, 4.5))
    for offset, key, label in ((-0.2, "rollout_seconds", "rollout"), (0.2, "step_seconds", "step (end to end)")):
        med = [variants[n][key]["median"] for n in names]
        low = [m - variants[n][key]["min"] for m, n in zip(med, names)]
        high = [variants[n][key]["max"] - m for m, n in zip(med, names)]
        ax_time.bar([i + offset for i in range(len(names))], med, width=0.4, yerr=[low, high], capsize=3, label=label)
    ax_time.set_xticks(range(len(names)), names, rotation=20)
    ax_time.set_ylabel("seconds, sum over steps (median, range)")
    ax_time.legend()
    for n in names:
        accept = variants[n]["heldout_accept_length"]
        if any(a is not None for a in accept):
            ax_accept.plot(range(1, len(accept) + 1), [float("nan") if a is None else a for a in accept], "o-", label=n)
    frozen = variants["vanilla"].get("frozen_accept_length") or []
    if any(a is not None for a in frozen):
        ax_accept.plot(
            range(1, len(frozen) + 1),
            [float("nan") if a is None else a for a in frozen],
            "k--",
            label="frozen drafter, vanilla's policy",
        )
    ax_accept.set_xlabel("RL step")
    ax_accept.set_ylabel("held-out accept length (fixed arm)")
    ax_accept.legend()
    kl = variants["vanilla"].get("heldout_kl") or []
    if any(k is not None for k in kl):
        right = ax_accept.twinx()
        right.plot(range(1, len(kl) + 1), [float("nan") if k is None else k for k in kl], ":", color="grey")
        right.set_ylabel("vanilla held-out KL(step 0 || step t), dotted")
    by_running = variants["vanilla"]["seconds_by_running"]
    ax_batch.bar([int(k) for k in by_running], list(by_running.values()))
    ax_batch.set_xlabel("running batch size")
    ax_batch.set_ylabel("vanilla decode seconds")
    fig.suptitle(
        f"tlt bench run ({report['workload']['name']}): rollout speedup {report['rollout_speedup']:.2f}x, "
        f"end to end {report['e2e_speedup']:.2f}x"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
