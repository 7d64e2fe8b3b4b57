"""manifests/monitoring: the PodMonitor scrapes exactly the coordinator (policy pod of rank 0) on the
named port the pod builder exposes, the metrics port follows spec.monitoring.metricsPort on the pod,
the Service and the NetworkPolicy, and every series the Grafana dashboard queries is one the
coordinator or the operator exports."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import yaml
from prometheus_client import REGISTRY, CollectorRegistry

from tlt.monitoring.prometheus import PrometheusLogger
from tlt.spec.run import RunSpec
from tlt_operator import metrics as operator_metrics  # noqa: F401 (registers the operator's metrics)
from tlt_operator.builders import build_pod, build_service
from tlt_operator.builders.common import RunRef
from tlt_operator.builders.security import build_network_policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RUN = RunRef("demo", "ml", "0c6f3e1a-0000-4000-8000-000000000001")
TOKEN_SECRET = "demo-ray-token-x7k2p"  # the run's Ray token Secret, as the server would name it
SPEC = RunSpec.model_validate(
    {"rollout": {"replicas": 2}, "monitoring": {"loggers": ["prometheus"], "metricsPort": 9400}}
)


def _podmonitors() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((MONITORING / "podmonitor.yaml").read_text()) if d]
    assert all(d["kind"] == "PodMonitor" and d["apiVersion"] == "monitoring.coreos.com/v1" for d in docs)
    return {d["metadata"]["name"]: d for d in docs}


def _selected(monitor: dict[str, Any], pod: dict[str, Any]) -> bool:
    labels = pod["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())


def test_podmonitor_scrapes_the_coordinator_on_its_named_metrics_port():
    runs = _podmonitors()["tlt-runs"]
    policy = build_pod(RUN, SPEC, "policy", 0, TOKEN_SECRET)
    others = [build_pod(RUN, SPEC, "policy", 1, TOKEN_SECRET)] if SPEC.policy.replicas > 1 else []
    others += [build_pod(RUN, SPEC, "rollout", rank, TOKEN_SECRET) for rank in range(SPEC.rollout.replicas)]
    assert _selected(runs, policy) and not any(_selected(runs, p) for p in others)
    (endpoint,) = runs["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for c in policy["spec"]["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == 9400 and endpoint["path"] == "/metrics"
    (relabel,) = endpoint["relabelings"]
    (source,) = relabel["sourceLabels"]
    run_labels = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in policy["metadata"]["labels"].items()}
    assert source.removeprefix("__meta_kubernetes_pod_label_") in run_labels and relabel["targetLabel"] == "run"


def test_service_and_network_policy_follow_the_metrics_port():
    (service_port,) = [p for p in build_service(RUN, SPEC)["spec"]["ports"] if p["name"] == "metrics"]
    assert service_port["port"] == service_port["targetPort"] == 9400
    ingress = build_network_policy(RUN, SPEC, "tlt-system")["spec"]["ingress"]
    assert {"protocol": "TCP", "port": 9400} in [p for rule in ingress for p in rule.get("ports", [])]


def _exported(registry: CollectorRegistry) -> set[str]:
    """Series names a registry can serve: counters with _total, histograms with _bucket/_sum/_count."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {family.name + s for family in registry.collect() for s in suffixes.get(family.type, [""])}


def test_dashboard_queries_only_exported_series():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queried = {name for e in exprs for name in re.findall(r"\b(tlt_[a-z0-9_]+)", e)}
    logger = PrometheusLogger(0, addr="127.0.0.1")
    try:
        exported = _exported(logger.registry) | _exported(REGISTRY)
    finally:
        logger.close()
    assert queried and queried <= exported, sorted(queried - exported)
    assert any(n.startswith("tlt_operator_") for n in queried) and any(n.startswith("tlt_sd_") for n in queried)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    used = {v for e in exprs for v in re.findall(r"\$(\w+)", e)} - {"__rate_interval"}
    assert used <= variables


def test_kustomization_lists_existing_files():
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    files = kustomization["resources"] + [f for g in kustomization["configMapGenerator"] for f in g["files"]]
    assert all((MONITORING / f).is_file() for f in files)
