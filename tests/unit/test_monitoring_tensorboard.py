"""TensorBoard events under <out>/tensorboard, read back with tensorboard's EventAccumulator: one scalar
per metric per step, the response-length histogram, the report's figures as images."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from tlt.monitoring import build_loggers  # noqa: E402
from tlt.spec.run import MonitoringSpec  # noqa: E402


def _figure(path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)
    ax.plot([0, 1], [1, 0])
    fig.savefig(path)
    plt.close(fig)
    return path


def test_scalars_histogram_and_figures_read_back(tmp_path: Path):
    loggers = build_loggers(MonitoringSpec(loggers=["tensorboard"]), tmp_path)
    for step in (1, 2, 3):
        loggers.log_step(
            {
                "step": step,
                "reward_mean": step / 10,
                "tokens_per_second": 100.0 * step,
                "accept_length": None,
                "sd_arms": {"plain": 1, "chain-d4": step},
                "response_lengths": [4, 8, 8 * step],
            }
        )
    loggers.log_figures([_figure(tmp_path / "lengths.png")], 3)
    loggers.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert {"tlt/reward_mean", "tlt/tokens_per_second", "tlt/sd_on_fraction"} <= set(tags["scalars"])
    assert "tlt/accept_length" not in tags["scalars"] and "tlt/step" not in tags["scalars"]
    reward = events.Scalars("tlt/reward_mean")
    assert [e.step for e in reward] == [1, 2, 3]
    assert [e.value for e in reward] == pytest.approx([0.1, 0.2, 0.3])
    assert [e.value for e in events.Scalars("tlt/sd_on_fraction")] == pytest.approx([1 / 2, 2 / 3, 3 / 4])
    lengths = events.Histograms("response_length")
    assert [h.step for h in lengths] == [1, 2, 3]
    assert lengths[-1].histogram_value.num == 3 and lengths[-1].histogram_value.max == 24
    image = events.Images("report/lengths")
    assert len(image) == 1 and image[0].step == 3 and (image[0].width, image[0].height) == (100, 75)
