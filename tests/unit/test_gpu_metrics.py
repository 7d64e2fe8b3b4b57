"""Prometheus reader (tlt_operator.gpu_metrics): label spellings, GPU averaging, errors, timeouts."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tlt.spec.run import MonitoringSpec
from tlt_operator.gpu_metrics import GpuMetricsQuery, PrometheusClient, PrometheusError, parse_utilization

QUERY = GpuMetricsQuery()


def _answer(*series: tuple[dict[str, str], str]) -> dict:
    result = [{"metric": labels, "value": [1700000000.0, value]} for labels, value in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def _dcgm(pod: str, gpu: str, value: str, namespace: str = "team") -> tuple[dict[str, str], str]:
    """A DCGM series as Prometheus stores it after the scrape rename of the workload's labels."""
    labels = {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": gpu,
        "exported_pod": pod,
        "exported_namespace": namespace,
        "pod": "dcgm-exporter-x1",
        "namespace": "gpu-operator",
    }
    return labels, value


def test_gpus_of_one_pod_are_averaged_and_scaled_to_a_fraction():
    payload = _answer(_dcgm("rollout-0", "0", "100"), _dcgm("rollout-0", "1", "50"), _dcgm("rollout-1", "0", "10"))
    assert parse_utilization(payload, QUERY, "team") == {"rollout-0": 0.75, "rollout-1": 0.1}


def test_exported_labels_win_over_the_exporters_own_pod_label():
    payload = _answer(_dcgm("rollout-0", "0", "40"))
    assert parse_utilization(payload, QUERY, "team") == {"rollout-0": 0.4}
    assert parse_utilization(payload, QUERY, "gpu-operator") == {}


def test_plain_pod_and_namespace_labels_work_with_either_configuration():
    payload = _answer(({"pod": "rollout-0", "namespace": "team", "gpu": "0"}, "30"))
    assert parse_utilization(payload, QUERY, "team") == {"rollout-0": 0.3}
    plain = GpuMetricsQuery(pod_label="pod", namespace_label="namespace")
    assert parse_utilization(payload, plain, "team") == {"rollout-0": 0.3}


def test_series_without_pod_other_namespace_or_nan_are_skipped_and_values_clipped():
    payload = _answer(
        ({"gpu": "0", "exported_namespace": "team"}, "90"),
        _dcgm("a", "0", "NaN"),
        _dcgm("b", "0", "250"),
        _dcgm("c", "0", "-3"),
        _dcgm("d", "0", "20", namespace="other"),
    )
    assert parse_utilization(payload, QUERY, "team") == {"b": 1.0, "c": 0.0}


def test_promql_selects_both_namespace_spellings_and_quotes_values():
    assert QUERY.promql('te"am') == (
        'DCGM_FI_DEV_GPU_UTIL{exported_namespace="te\\"am"} or DCGM_FI_DEV_GPU_UTIL{namespace="te\\"am"}'
    )


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "not an instant vector"),
        ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}, "malformed series"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_bad_answers_raise_a_clear_error(payload, message):
    with pytest.raises(PrometheusError, match=message):
        parse_utilization(payload, QUERY, "team")


def test_bad_configuration_names_the_field():
    with pytest.raises(ValueError, match="gpuUtilMetric"):
        GpuMetricsQuery(metric="gpu util")
    with pytest.raises(ValueError, match="podLabel"):
        GpuMetricsQuery(pod_label="pod-name")
    with pytest.raises(ValueError, match="prometheusUrl"):
        PrometheusClient.from_spec(MonitoringSpec())


class _Stub(BaseHTTPRequestHandler):
    """Answers /api/v1/query with what the test put in `server.reply` = (status, body, delay); with
    `server.drip` seconds > 0 the body goes out one byte per `drip` (a server holding the socket)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.seen.append(urllib.parse.urlparse(self.path))
        status, body, delay = self.server.reply
        time.sleep(delay)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if not self.server.drip:
            self.wfile.write(body)
            return
        for byte in body:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(self.server.drip)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    server.seen, server.reply, server.drip = [], (200, b"{}", 0.0), 0.0
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _client(server: ThreadingHTTPServer, timeout: float = 2.0) -> PrometheusClient:
    spec = MonitoringSpec(prometheus_url=f"http://127.0.0.1:{server.server_address[1]}/")
    return PrometheusClient.from_spec(spec, timeout=timeout)


def test_client_sends_an_instant_query_and_parses_the_answer(stub):
    stub.reply = (200, json.dumps(_answer(_dcgm("rollout-0", "0", "64"))).encode(), 0.0)
    assert _client(stub).utilization("team") == {"rollout-0": 0.64}
    (url,) = stub.seen
    params = urllib.parse.parse_qs(url.query)
    assert url.path == "/api/v1/query"
    assert params["query"] == [QUERY.promql("team")] and params["timeout"] == ["2s"]


def test_client_reports_prometheus_errors_with_the_http_status(stub):
    error = {"status": "error", "errorType": "bad_data", "error": "invalid parameter"}
    stub.reply = (400, json.dumps(error).encode(), 0.0)
    with pytest.raises(PrometheusError, match="HTTP 400: bad_data: invalid parameter"):
        _client(stub).utilization("team")


def test_client_refuses_non_json(stub):
    stub.reply = (200, b"<html>login</html>", 0.0)
    with pytest.raises(PrometheusError, match="non-JSON"):
        _client(stub).utilization("team")


def test_client_times_out(stub):
    stub.reply = (200, b"{}", 1.5)
    with pytest.raises(PrometheusError, match="did not answer within 0.2s"):
        _client(stub, timeout=0.2).utilization("team")


def test_a_server_dripping_bytes_cannot_hold_a_read_past_its_deadline(stub):
    stub.reply, stub.drip = (200, json.dumps(_answer()).encode() + b" " * 200, 0.0), 0.05
    with pytest.raises(PrometheusError, match="did not answer within 0.3s"):
        _client(stub, timeout=0.3).utilization("team")


def test_an_answer_larger_than_the_cap_is_refused_unread(stub):
    stub.reply = (200, json.dumps(_answer()).encode() + b" " * (6 * 1024 * 1024), 0.0)
    with pytest.raises(PrometheusError, match="more than the 4194304 bytes allowed"):
        _client(stub).utilization("team")
    stub.reply = (200, json.dumps(_answer()).encode() + b" " * 100, 0.0)
    small = PrometheusClient(_client(stub).base_url, max_bytes=64)
    with pytest.raises(PrometheusError, match="more than the 64 bytes"):
        small.utilization("team")


def test_client_reports_an_unreachable_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = PrometheusClient(f"http://127.0.0.1:{port}", timeout=1.0)
    with pytest.raises(PrometheusError, match="unreachable"):
        client.utilization("team")
