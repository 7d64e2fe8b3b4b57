"""Per-pod GPU utilisation from Prometheus's HTTP API, for the trainer-slot decision.

One instant-vector query (`GET /api/v1/query`) per poll. The DCGM exporter runs as its own pod,
so when Prometheus scrapes it through Kubernetes service discovery the target's own `pod` /
`namespace` labels win and the workload's labels are renamed `exported_pod` /
`exported_namespace` (`honor_labels: false`, the default); with `honor_labels: true` or a
relabelling rule they stay `pod` / `namespace`. The label names are configurable
(`monitoring.podLabel`, `monitoring.namespaceLabel`), and a series that lacks the configured one
falls back to its counterpart (`exported_pod` <-> `pod`), so both setups work unchanged.

Synchronous and stdlib-only (`urllib`) on purpose: one small request per poll, no new
dependency; the operator calls it on its own small thread pool (`idleness.SlotTracker`), never on
the event loop's default executor that the API calls share. A read is bounded in total time (a
server that drips bytes cannot hold it past `timeout`) and in size (`max_bytes`): the server is
named by a tenant's spec, from the operator's allowlist.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tlt.spec.run import MonitoringSpec

log = logging.getLogger(__name__)

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_EXPORTED = "exported_"
MAX_ANSWER_BYTES = 4 * 1024 * 1024
_CHUNK = 64 * 1024


class PrometheusError(RuntimeError):
    """Prometheus could not be reached, refused the query, or answered something unexpected."""


def counterpart(label: str) -> str:
    """`exported_pod` <-> `pod`: the name the same label has on the other side of a scrape rename."""
    return label[len(_EXPORTED) :] if label.startswith(_EXPORTED) else _EXPORTED + label


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class GpuMetricsQuery:
    """Which metric and labels hold per-pod GPU utilisation.

    metric: a gauge in percent (DCGM_FI_DEV_GPU_UTIL) or any range given by `scale`.
    pod_label / namespace_label: labels holding the workload pod and namespace.
    scale: the metric's value at full utilisation (100 for percent).
    """

    metric: str = "DCGM_FI_DEV_GPU_UTIL"
    pod_label: str = "exported_pod"
    namespace_label: str = "exported_namespace"
    scale: float = 100.0

    def __post_init__(self) -> None:
        if not _METRIC_NAME.match(self.metric):
            raise ValueError(f"monitoring.gpuUtilMetric must be a Prometheus metric name, got {self.metric!r}")
        for what, label in (("podLabel", self.pod_label), ("namespaceLabel", self.namespace_label)):
            if not _LABEL_NAME.match(label):
                raise ValueError(f"monitoring.{what} must be a Prometheus label name, got {label!r}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    @classmethod
    def from_spec(cls, spec: MonitoringSpec) -> GpuMetricsQuery:
        return cls(spec.gpu_util_metric, spec.pod_label, spec.namespace_label)

    def promql(self, namespace: str) -> str:
        """Series of `namespace` under either spelling of the namespace label."""
        labels = (self.namespace_label, counterpart(self.namespace_label))
        return " or ".join(f"{self.metric}{{{label}={_quote(namespace)}}}" for label in labels)


def _label(labels: Mapping[str, str], name: str) -> str | None:
    return labels.get(name) or labels.get(counterpart(name))


def parse_utilization(payload: Any, query: GpuMetricsQuery, namespace: str) -> dict[str, float]:
    """{pod: mean utilisation in [0, 1]} from a decoded `/api/v1/query` answer.

    Series are matched to a pod and namespace by the configured labels, else their counterparts;
    series of other namespaces, without a pod, or with a NaN value are skipped; several GPUs of one
    pod are averaged; values are divided by `scale` and clipped to [0, 1].
    """
    if not isinstance(payload, dict):
        raise PrometheusError(f"Prometheus answer is not a JSON object: {str(payload)[:200]}")
    if payload.get("status") != "success":
        kind, error = payload.get("errorType", "unknown error"), payload.get("error", payload)
        raise PrometheusError(f"Prometheus query failed: {kind}: {error}")
    data = payload.get("data")
    result = data.get("result") if isinstance(data, dict) and data.get("resultType") == "vector" else None
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus answer is not an instant vector: {str(data)[:200]}")
    per_pod: dict[str, list[float]] = defaultdict(list)
    for series in result:
        try:
            labels, (_, raw) = series["metric"], series["value"]
            value = float(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusError(f"malformed series in Prometheus answer: {str(series)[:200]}") from exc
        pod = _label(labels, query.pod_label)
        if pod is None or _label(labels, query.namespace_label) != namespace or math.isnan(value):
            continue
        per_pod[pod].append(min(1.0, max(0.0, value / query.scale)))
    return {pod: sum(values) / len(values) for pod, values in sorted(per_pod.items())}


@dataclass(frozen=True)
class PrometheusClient:
    """Reads per-pod GPU utilisation from one Prometheus server.

    base_url: e.g. `http://prometheus.monitoring:9090` (`monitoring.prometheusUrl`).
    timeout: total seconds for connecting and reading the whole answer; also sent as the query's
    server-side timeout.
    headers: extra request headers, e.g. `Authorization` for a proxy in front of Prometheus.
    max_bytes: the largest answer read; a larger one is refused unread.
    """

    base_url: str
    query: GpuMetricsQuery = field(default_factory=GpuMetricsQuery)
    timeout: float = 5.0
    headers: Mapping[str, str] = field(default_factory=dict)
    max_bytes: int = MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"monitoring.prometheusUrl must start with http:// or https://, got {self.base_url!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")

    @classmethod
    def from_spec(cls, spec: MonitoringSpec, timeout: float = 5.0) -> PrometheusClient:
        if not spec.prometheus_url:
            raise ValueError("monitoring.prometheusUrl is empty: there is no Prometheus to query")
        return cls(spec.prometheus_url, GpuMetricsQuery.from_spec(spec), timeout)

    def utilization(self, namespace: str) -> dict[str, float]:
        """{pod: GPU utilisation in [0, 1]} of the pods of `namespace` that have GPU series now."""
        promql = self.query.promql(namespace)
        params = urllib.parse.urlencode({"query": promql, "timeout": f"{self.timeout:g}s"})
        url = f"{self.base_url.rstrip('/')}/api/v1/query?{params}"
        request = urllib.request.Request(url, headers={"Accept": "application/json", **self.headers})
        log.debug("querying Prometheus: %s", promql)
        return parse_utilization(self._get_json(request), self.query, namespace)

    def _get_json(self, request: urllib.request.Request) -> Any:
        where = f"Prometheus at {self.base_url}"
        deadline = time.monotonic() + self.timeout
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = self._read_bounded(response, deadline, where)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{where} answered HTTP {exc.code}: {_error_text(exc.read())}") from exc
        except TimeoutError as exc:
            raise PrometheusError(f"{where} did not answer within {self.timeout:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise PrometheusError(f"{where} did not answer within {self.timeout:g}s") from exc
            raise PrometheusError(f"{where} is unreachable: {exc.reason}") from exc
        try:
            return json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"{where} answered non-JSON: {body[:200]!r}") from exc

    def _read_bounded(self, response: Any, deadline: float, where: str) -> bytes:
        """The body, read in chunks until `deadline` and at most `max_bytes`. The socket timeout bounds
        each read, so a read ends at most `timeout` after the deadline, never later."""
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise PrometheusError(f"{where} answered {declared} bytes, more than the {self.max_bytes} allowed")
        body = bytearray()
        while chunk := response.read1(_CHUNK):
            body += chunk
            if len(body) > self.max_bytes:
                raise PrometheusError(f"{where} answered more than the {self.max_bytes} bytes allowed")
            if time.monotonic() > deadline:
                raise PrometheusError(f"{where} did not answer within {self.timeout:g}s")
        return bytes(body)


def _error_text(body: bytes) -> str:
    """Prometheus's `errorType: error` from an error answer, else the start of the body."""
    try:
        payload = json.loads(body)
    except ValueError:
        return repr(body[:200])
    if isinstance(payload, dict) and "error" in payload:
        return f"{payload.get('errorType', 'error')}: {payload['error']}"
    return repr(body[:200])
