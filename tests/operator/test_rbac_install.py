"""The operator's RBAC for both installs (`tlt_operator.rbac`): the cluster-wide ClusterRole and the
namespace-scoped overlay's Roles come from one list of rules, and the overlay holds no cluster-wide verb."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from tlt_operator import handlers, rbac, settings
from tlt_operator.kube import KubeError

ROOT = Path(__file__).resolve().parents[2]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def test_the_clusterrole_grants_exactly_the_rules() -> None:
    (role,) = [d for d in _docs(ROOT / "manifests/base/rbac.yaml") if d["kind"] == "ClusterRole"]
    assert role["rules"] == rbac.RULES


def test_a_role_cannot_name_cluster_scoped_resources_so_they_are_left_out() -> None:
    kept = {r for rule in rbac.namespaced_rules() for r in rule["resources"]}
    assert not kept & rbac.CLUSTER_SCOPED
    assert {"pods", "tltrainingruns", "tltrainingruns/status", "configmaps", "secrets"} <= kept
    assert len(rbac.namespaced_rules()) == len(rbac.RULES) - 2


def test_one_role_and_binding_per_namespace_bound_to_the_operators_account() -> None:
    docs = rbac.namespaced_rbac(["a", "b", "a"], "ops", "op-sa")
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs] == [
        ("Role", "a"),
        ("RoleBinding", "a"),
        ("Role", "b"),
        ("RoleBinding", "b"),
    ]
    binding = docs[1]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tlt-operator"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op-sa", "namespace": "ops"}]


def test_the_namespaced_overlay_is_what_print_rbac_makes_and_names_the_same_namespaces() -> None:
    overlay = ROOT / "manifests/namespaced"
    assert _docs(overlay / "rbac.yaml") == rbac.namespaced_rbac(["tlt-runs"])
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    patches = [yaml.safe_load(p["patch"]) for p in kustomization["patches"]]
    deleted = {p["kind"] for p in patches if p.get("$patch") == "delete"}
    assert deleted == {"ClusterRole", "ClusterRoleBinding"}
    (deployment,) = [p for p in patches if p["kind"] == "Deployment"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TLT_OPERATOR_NAMESPACES", "value": "tlt-runs"} in env
    assert _docs(overlay / "namespace.yaml")[0]["metadata"]["name"] == "tlt-runs"


def _print_rbac(*args: str) -> subprocess.CompletedProcess[str]:
    command = str(Path(sys.executable).absolute().parent / "tlt-operator")
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_print_rbac_prints_yaml_and_refuses_a_bad_namespace_in_one_line() -> None:
    done = _print_rbac("--print-rbac", "team-a, team-b", "--operator-namespace", "ops")
    assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all(done.stdout)) == rbac.namespaced_rbac(["team-a", "team-b"], "ops")
    bad = _print_rbac("--print-rbac", "Team_A")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "tlt-operator: error: --print-rbac: namespaces must be DNS labels (lowercase letters, digits, '-', "
        "at most 63), comma-separated; got ['Team_A']"
    )


def test_exact_namespaces_turn_kopfs_cluster_wide_scanning_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for listed, exact in (
        ("", False),
        ("team-a", True),
        ("team-a, team-b", True),
        ("team-*", False),
        ("!kube-system", False),
    ):
        monkeypatch.setenv("TLT_OPERATOR_NAMESPACES", listed)
        assert settings.exact_namespaces() is exact, listed
        configured = kopf.OperatorSettings()
        settings.configure(configured)
        assert configured.scanning.disabled is exact


class _Discovery:
    """Kube.request for the API group's discovery document: 404 `missing` times, then served."""

    def __init__(self, missing: int) -> None:
        self.missing, self.calls = missing, 0

    async def request(self, method: str, path: str) -> dict[str, Any]:
        self.calls += 1
        assert (method, path) == ("GET", "/apis/tlt.dev/v1alpha1")
        if self.calls <= self.missing:
            raise KubeError(404, "the server could not find the requested resource")
        return {"resources": [{"name": "tltrainingruns"}, {"name": "tltrainingruns/status"}]}


async def test_a_namespace_scoped_operator_waits_for_the_crd_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    served = _Discovery(missing=2)
    await handlers._wait_for_crd(served, timeout=60)
    assert served.calls == 3
    with pytest.raises(kopf.PermanentError, match="tltrainingruns.tlt.dev/v1alpha1 is not served after 0s"):
        await handlers._wait_for_crd(_Discovery(missing=10**6), timeout=0)


_real_sleep = asyncio.sleep


async def _no_sleep(_: float) -> None:
    await _real_sleep(0)
