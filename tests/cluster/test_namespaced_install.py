"""The namespace-scoped install on a real API server: `manifests/namespaced` is accepted as a whole, and an
operator holding only the per-namespace Role (no ClusterRole at all) runs a run to Running with every child,
mirrors its reports, and can do nothing in a namespace it does not watch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from controlplane import ControlPlane
from kube_view import KubeView, wait_for
from node_agent import NodeAgent
from operator_process import OPERATOR_NAMESPACE, OperatorProcess
from test_worker_identity import small_run

from tlt_operator.rbac import namespaced_rbac

ROOT = Path(__file__).resolve().parents[2]
SCOPED = "tlt-operator-scoped"


def test_the_overlay_holds_no_cluster_wide_rbac_and_the_server_accepts_it(installed: ControlPlane) -> None:
    rendered = [d for d in yaml.safe_load_all(installed.kubectl("kustomize", str(ROOT / "manifests/namespaced"))) if d]
    kinds = {d["kind"] for d in rendered}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, kinds
    assert {"Role", "RoleBinding", "Deployment", "CustomResourceDefinition"} <= kinds
    installed.kubectl("apply", "-f", str(ROOT / "manifests/namespaced/namespace.yaml"))
    try:
        done = installed.kubectl_result("apply", "-k", str(ROOT / "manifests/namespaced"), "--dry-run=server")
        assert done.returncode == 0, done.stderr
    finally:
        installed.kubectl("delete", "namespace", "tlt-runs", "--wait=false")


@pytest.fixture
def scoped_operator(
    installed: ControlPlane, operator_process: OperatorProcess, nodes: NodeAgent, tmp_path: Path
) -> Iterator[tuple[KubeView, OperatorProcess]]:
    """The cluster-wide operator stopped; one with only the namespaced Role of a fresh namespace running."""
    view = KubeView(installed).create_namespace()
    view.agent = nodes
    installed.kubectl("create", "serviceaccount", SCOPED, "-n", OPERATOR_NAMESPACE)
    installed.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": namespaced_rbac([view.namespace], OPERATOR_NAMESPACE, SCOPED)}
        ),
    )
    operator_process.stop()
    scoped = OperatorProcess(installed, tmp_path, SCOPED, view.namespace).start()
    try:
        yield view, scoped
    finally:
        scoped.stop()
        operator_process.start()
        installed.kubectl("delete", "serviceaccount", SCOPED, "-n", OPERATOR_NAMESPACE)
        view.delete_namespace()


def test_an_operator_with_only_a_role_runs_a_run(
    scoped_operator: tuple[KubeView, OperatorProcess], installed: ControlPlane
) -> None:
    view, scoped = scoped_operator
    view.apply(small_run("scoped"))
    view.wait_phase("scoped", "Running", timeout=120)
    uid = view.run("scoped")["metadata"]["uid"]
    children = view.children(uid)
    assert {
        "pods",
        "configmaps",
        "services",
        "secrets",
        "serviceaccounts",
        "roles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
        "networkpolicies.networking.k8s.io",
    } <= set(children)
    view.kubectl(
        "patch", "configmap", "scoped-reports", "--type=merge", "-p", json.dumps({"data": {"progress": '{"step": 2}'}})
    )
    wait_for("the reported step in status", lambda: view.status("scoped").get("step", {}).get("current") == 2)
    log = scoped.text()
    assert "forbidden" not in log.lower(), log[-4000:]
    token_config = scoped.root / "kubeconfig"  # written by OperatorProcess.start with the scoped token
    for namespace, expected in ((view.namespace, "yes"), ("default", "no"), (OPERATOR_NAMESPACE, "no")):
        answer = installed.kubectl_result(
            "auth", "can-i", "create", "pods", "-n", namespace, kubeconfig_file=token_config
        )
        assert answer.stdout.strip() == expected, (namespace, answer.stdout, answer.stderr)
