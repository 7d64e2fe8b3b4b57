"""A PNG of one simulated step: one row per replica, coloured by what it does (prefill, plain decode,
SD, idle, drafter training, update, sync). Many replicas are thinned to at most `max_rows`."""

from __future__ import annotations

from pathlib import Path

from tlt.sim.replica import Segment

COLORS = {
    "prefill": "#9e9e9e",
    "decode": "#1f77b4",
    "sd": "#2ca02c",
    "idle": "#d62728",
    "train": "#ff7f0e",
    "update": "#9467bd",
    "sync": "#8c564b",
}


def plot_timelines(timelines: dict[str, list[list[Segment]]], path: Path, title: str, max_rows: int = 32) -> Path:
    """One panel per variant (same time axis), replicas as rows; writes `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    if not timelines:
        raise ValueError("no timelines to plot")
    fig, axes = plt.subplots(len(timelines), 1, sharex=True, squeeze=False, figsize=(11, 1.2 + 2.2 * len(timelines)))
    for ax, (variant, rows) in zip(axes[:, 0], timelines.items()):
        stride = max(1, -(-len(rows) // max_rows))
        shown = rows[::stride]
        for y, segments in enumerate(shown):
            for kind in COLORS:
                spans = [(s.start, s.end - s.start) for s in segments if s.kind == kind and s.end > s.start]
                if spans:
                    ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLORS[kind])
        ax.set_ylim(-0.6, len(shown) - 0.4)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _, stride=stride: f"{int(y) * stride}"))
        ax.set_ylabel(f"{variant}\nreplica" + (f" (one in {stride})" if stride > 1 else ""))
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("seconds into the step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.legend(
        handles=[Patch(color=c, label=k) for k, c in COLORS.items()],
        loc="upper center",
        ncol=len(COLORS),
        frameon=False,
        bbox_to_anchor=(0.5, 0.95),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
