"""The coordinator's /metrics: Prometheus names (tlt_ prefix, base units, _total counters), the last
step's gauges, histograms and counters over steps, bounded labels (quantile; bucket and arm)."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tlt.monitoring.prometheus import PrometheusLogger

STEP = {
    "step": 2,
    "step_seconds": 3.0,
    "rollout_seconds": 2.0,
    "tail_seconds": 0.5,
    "tokens_per_second": 400.0,
    "accept_length": 2.5,
    "idle_seconds": 1.5,
    "harvested_seconds": 1.0,
    "stop_latency_max": 0.02,
    "drafter_loss": 1.25,
    "drafter_version": 7,
    "reward_mean": 0.75,
    "generated_tokens": 800,
    "response_length_p50": 90,
    "response_length_p90": 200,
    "response_length_max": 300,
    "response_lengths": [90, 200, 300],
    "sd_arms": {"plain": 1, "chain-d4": 3},
    "sd_arm_rates": {
        "4": {"chain-d4": {"steps": 3, "seconds": 0.3, "tokens": 9}},
        "16": {"plain": {"steps": 1, "seconds": 0.1, "tokens": 1}},
    },
}


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_endpoint_serves_the_step():
    logger = PrometheusLogger(0, addr="127.0.0.1")
    try:
        logger.log_step(
            {
                **STEP,
                "step": 1,
                "idle_seconds": 0.5,
                "sd_arm_rates": {"64": {"tree-d4k2v8": {"steps": 5, "seconds": 1.0, "tokens": 20}}},
            }
        )
        logger.log_step(STEP)
        got = _samples(logger.port)
    finally:
        logger.close()
    assert got[("tlt_step", ())] == 2 and got[("tlt_steps_total", ())] == 2
    assert got[("tlt_rollout_tokens_per_second", ())] == 400.0
    assert got[("tlt_sd_accept_length_tokens", ())] == 2.5 and got[("tlt_sd_on_ratio", ())] == 0.75
    assert got[("tlt_rollout_idle_seconds_total", ())] == 2.0
    assert got[("tlt_drafter_harvested_seconds_total", ())] == 2.0
    assert got[("tlt_drafter_trainer_stop_latency_seconds", ())] == 0.02
    assert got[("tlt_drafter_loss", ())] == 1.25 and got[("tlt_drafter_version", ())] == 7
    assert got[("tlt_reward_mean", ())] == 0.75 and got[("tlt_generated_tokens_total", ())] == 1600
    assert got[("tlt_response_length_tokens", (("quantile", "0.9"),))] == 200
    assert got[("tlt_response_tokens_count", ())] == 6
    assert got[("tlt_response_tokens_bucket", (("le", "128.0"),))] == 2
    assert got[("tlt_step_duration_seconds_count", ())] == 2 and got[("tlt_step_duration_seconds_sum", ())] == 6.0
    assert got[("tlt_rollout_tail_duration_seconds_count", ())] == 2
    arms = {labels: v for (name, labels), v in got.items() if name == "tlt_sd_arm_steps"}
    assert arms == {(("arm", "chain-d4"), ("bucket", "4")): 3, (("arm", "plain"), ("bucket", "16")): 1}, (
        "the arm table is the last step's: step 1's bucket 64 is gone"
    )


def test_names_follow_prometheus_conventions():
    logger = PrometheusLogger(0, addr="127.0.0.1")
    try:
        logger.log_step(STEP)
        samples = _samples(logger.port)
    finally:
        logger.close()
    ours = {(name, labels) for name, labels in samples if not name.startswith(("python_", "process_"))}
    assert ours and all(re.fullmatch(r"tlt_[a-z0-9_]+", name) for name, _ in ours), ours
    assert not any(name.endswith(("_ms", "_milliseconds", "_percent")) for name, _ in ours)
    assert {key for _, labels in ours for key, _ in labels} == {"quantile", "bucket", "arm", "le"}


def test_the_endpoint_url_is_logged(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="tlt.monitoring.prometheus"):
        logger = PrometheusLogger(0, addr="127.0.0.1")
        logger.close()
    assert f"Prometheus metrics at http://127.0.0.1:{logger.port}/metrics (monitoring.metricsPort)" in caplog.text
