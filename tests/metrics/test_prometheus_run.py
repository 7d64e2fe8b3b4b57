"""A real Prometheus scrapes a local training run's /metrics (monitoring.loggers: prometheus) and a
PromQL query returns the run's series: the last step, its tokens per second, the step histogram."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.runtime.local_executor import local_trainer
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.tokenizer import build_task_tokenizer


def _query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_for(url: str, promql: str, seconds: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = _query(url, promql)
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"Prometheus returned nothing for {promql!r} within {seconds}s")


def _tiny_run(root: Path, port: int) -> TLTTrainingRun:
    tokenizer = build_task_tokenizer()
    save_policy(
        tiny_model("qwen2", vocab_size=len(tokenizer), seed=5, tie_word_embeddings=True), tokenizer, root / "init"
    )
    return TLTTrainingRun.model_validate(
        {
            "metadata": {"name": "prom-test"},
            "spec": {
                "model": {"path": str(root / "init"), "dtype": "float32"},
                "dataset": {"builtin": {"numTrain": 16}},
                "algorithm": {"steps": 2, "promptsPerStep": 2, "groupSize": 2, "maxNewTokens": 8},
                "speculative": {"mode": "off"},
                "checkpoint": {"intervalSteps": 2, "keep": 1},
                "monitoring": {"loggers": ["jsonl", "prometheus"], "metricsPort": port},
            },
        }
    )


def test_prometheus_scrapes_a_local_run(tmp_path: Path, start_prometheus, free_port: int):
    port = free_port
    trainer = local_trainer(_tiny_run(tmp_path, port), tmp_path / "out")
    try:
        history = trainer.train()
        url = start_prometheus("tlt", f"127.0.0.1:{port}")
        step = _wait_for(url, 'tlt_step{job="tlt"}')
        assert float(step[0]["value"][1]) == 2
        speed = _query(url, "tlt_rollout_tokens_per_second")
        assert float(speed[0]["value"][1]) == pytest.approx(history[-1]["tokens_per_second"])
        count = _query(url, "tlt_step_duration_seconds_count")
        assert float(count[0]["value"][1]) == 2
        quantiles = {r["metric"]["quantile"] for r in _query(url, "tlt_response_length_tokens")}
        assert quantiles == {"0.5", "0.9", "1"}
    finally:
        trainer.loggers.close()
