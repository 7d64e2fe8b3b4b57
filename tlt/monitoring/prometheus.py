"""The coordinator's Prometheus endpoint: per-step gauges, counters and histograms on `/metrics`.

Names follow Prometheus conventions: the `tlt_` prefix, base units in the name (`_seconds`,
`_tokens`, `_ratio`), `_total` for counters. Labels are bounded: `quantile` takes three values,
`bucket` and `arm` come from the spec's `speculative.buckets` and `speculative.arms`. A gauge
holds the last finished step's value; the histograms and counters accumulate over the process
(they restart at zero after a resume, which `rate()` and `increase()` handle as a counter reset).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from tlt.monitoring.base import scalars

log = logging.getLogger(__name__)

# metrics.jsonl key -> (metric name, help): the last step's value
GAUGES = {
    "step": ("tlt_step", "Last finished training step."),
    "step_seconds": ("tlt_step_seconds", "Wall time of the last step."),
    "rollout_seconds": ("tlt_rollout_seconds", "Rollout wall time of the last step."),
    "tail_seconds": ("tlt_rollout_tail_seconds", "Long-tail part of the last rollout (few rows still running)."),
    "update_seconds": ("tlt_update_seconds", "Policy update wall time of the last step."),
    "tokens_per_second": ("tlt_rollout_tokens_per_second", "Generated response tokens over rollout wall time."),
    "accept_length": ("tlt_sd_accept_length_tokens", "Tokens emitted per speculative verify step."),
    "sd_on_fraction": ("tlt_sd_on_ratio", "Share of decode steps that drafted (arm other than plain)."),
    "stop_latency_max": (
        "tlt_drafter_trainer_stop_latency_seconds",
        "Longest drafter-trainer stop (request to acknowledgement) of the last step.",
    ),
    "drafter_loss": ("tlt_drafter_loss", "Mean drafter training loss over the last step's pushes."),
    "drafter_version": ("tlt_drafter_version", "Version of the drafter the hub last published."),
    "reward_mean": ("tlt_reward_mean", "Mean reward of the last step's responses."),
    "reward_group_solved": ("tlt_reward_group_solved_ratio", "Share of prompts with a rewarded response."),
    "truncation_rate": ("tlt_response_truncated_ratio", "Share of responses cut at the token limit."),
    "eval_reward_mean": ("tlt_eval_reward_mean", "Mean reward on the held-out problems, last evaluation."),
    "eval_accuracy": ("tlt_eval_accuracy_ratio", "Share of held-out problems with the full reward, last evaluation."),
    "eval_seconds": ("tlt_eval_seconds", "Wall time of the last held-out evaluation (not part of the step's)."),
}
# metrics.jsonl key -> (histogram name, help, bucket upper bounds), one observation per step
HISTOGRAMS = {
    "step_seconds": (
        "tlt_step_duration_seconds",
        "Step wall time.",
        (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
    ),
    "rollout_seconds": (
        "tlt_rollout_duration_seconds",
        "Rollout wall time.",
        (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
    ),
    "tail_seconds": (
        "tlt_rollout_tail_duration_seconds",
        "Rollout long-tail time.",
        (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    ),
}
# metrics.jsonl key -> counter name, help: summed over steps (a step's own value: increase() over it)
COUNTERS = {
    "idle_seconds": (
        "tlt_rollout_idle_seconds_total",
        "Rollout-worker seconds idle while the slowest worker ran, summed over steps.",
    ),
    "harvested_seconds": (
        "tlt_drafter_harvested_seconds_total",
        "Idle rollout-worker seconds spent training the drafter, summed over steps.",
    ),
    "generated_tokens": ("tlt_generated_tokens_total", "Response tokens generated."),
}
LENGTH_QUANTILES = {"response_length_p50": "0.5", "response_length_p90": "0.9", "response_length_max": "1"}
LENGTH_BUCKETS = tuple(float(2**i) for i in range(3, 16))  # 8 .. 32768 tokens


class PrometheusLogger:
    """Serves its own registry on `addr:port` from a daemon thread until `close`."""

    def __init__(self, port: int, addr: str = "0.0.0.0"):
        self.registry = CollectorRegistry()
        self.gauges = {k: Gauge(name, doc, registry=self.registry) for k, (name, doc) in GAUGES.items()}
        self.histograms = {
            k: Histogram(name, doc, buckets=b, registry=self.registry) for k, (name, doc, b) in HISTOGRAMS.items()
        }
        self.counters = {k: Counter(name, doc, registry=self.registry) for k, (name, doc) in COUNTERS.items()}
        self.steps = Counter("tlt_steps_total", "Training steps finished by this process.", registry=self.registry)
        self.length_quantiles = Gauge(
            "tlt_response_length_tokens",
            "Response length quantiles of the last step.",
            ["quantile"],
            registry=self.registry,
        )
        self.lengths = Histogram(
            "tlt_response_tokens", "Response lengths.", buckets=LENGTH_BUCKETS, registry=self.registry
        )
        self.arm_steps = Gauge(
            "tlt_sd_arm_steps",
            "Decode steps of each arm in each batch-size bucket, last step.",
            ["bucket", "arm"],
            registry=self.registry,
        )
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        shown = "localhost" if addr in ("0.0.0.0", "::") else addr
        log.info("Prometheus metrics at http://%s:%d/metrics (monitoring.metricsPort)", shown, self.port)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def log_step(self, metrics: Mapping[str, Any]) -> None:
        values = scalars(metrics)
        for key, value in values.items():
            if key in self.gauges:
                self.gauges[key].set(value)
            if key in self.histograms:
                self.histograms[key].observe(value)
            if key in self.counters:
                self.counters[key].inc(max(value, 0.0))
            if key in LENGTH_QUANTILES:
                self.length_quantiles.labels(quantile=LENGTH_QUANTILES[key]).set(value)
        for length in metrics.get("response_lengths") or []:
            self.lengths.observe(length)
        self.arm_steps.clear()
        for bucket, arms in (metrics.get("sd_arm_rates") or {}).items():
            for arm, cell in arms.items():
                self.arm_steps.labels(bucket=str(bucket), arm=str(arm)).set(cell["steps"])
        self.steps.inc()

    def log_figures(self, figures: Sequence[Path], step: int) -> None:
        pass

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
