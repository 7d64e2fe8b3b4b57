"""The operator's own RBAC, for the two installs.

- Cluster-wide (`manifests/base`): one ClusterRole with `RULES` (its YAML carries the why of each rule;
  a test keeps the two equal) bound to the operator's ServiceAccount.
- Namespace-scoped (`manifests/namespaced`, or `tlt-operator --print-rbac a,b` for any list): a Role and
  RoleBinding with the same rules in each watched namespace, and no cluster-wide verb at all: many platform
  teams grant no cluster-wide pod create/delete. The operator then runs with `TLT_OPERATOR_NAMESPACES`
  set to exactly those namespaces. What is left out is cluster-scoped and only needed cluster-wide: kopf's
  watch of CRDs (without it kopf finds the CRD once, at start) and of namespaces (namespace globs).
"""

from __future__ import annotations

from typing import Any

Rule = dict[str, list[str]]

RULES: list[Rule] = [
    {"apiGroups": ["tlt.dev"], "resources": ["tltrainingruns"], "verbs": ["get", "list", "watch", "patch", "delete"]},
    {"apiGroups": ["tlt.dev"], "resources": ["tltrainingruns/status"], "verbs": ["get", "patch"]},
    {"apiGroups": ["tlt.dev"], "resources": ["tltrainingruns/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create", "patch"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "create", "patch"],
    },
    {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
    {
        "apiGroups": ["scheduling.x-k8s.io", "scheduling.volcano.sh"],
        "resources": ["podgroups"],
        "verbs": ["get", "create", "patch"],
    },
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
]
CLUSTER_SCOPED = frozenset({"customresourcedefinitions", "namespaces"})
NAME = "tlt-operator"


def namespaced_rules() -> list[Rule]:
    """`RULES` without the cluster-scoped resources (a Role cannot grant them)."""
    return [rule for rule in RULES if not CLUSTER_SCOPED & set(rule["resources"])]


def namespaced_rbac(
    namespaces: list[str], operator_namespace: str = "tlt-system", service_account: str = NAME
) -> list[dict[str, Any]]:
    """A Role `tlt-operator` and a RoleBinding to `operator_namespace`/`service_account` in each of
    `namespaces` (in order, duplicates once)."""
    docs: list[dict[str, Any]] = []
    for namespace in dict.fromkeys(namespaces):
        meta = {"name": NAME, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "tlt"}}
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta,
                "rules": namespaced_rules(),
            }
        )
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": dict(meta),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
                "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": operator_namespace}],
            }
        )
    return docs
