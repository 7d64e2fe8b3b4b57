"""Resource types the fake serves: built-in kinds, and custom ones registered from CRD objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Validator = Callable[[dict[str, Any], dict[str, Any] | None, bool], tuple[dict[str, Any], dict[str, Any] | None]]
"""(new, old, strict) -> (the object as stored, None) or (_, the apiserver's Status body of the
rejection); strict: the request asked for `fieldValidation=Strict`."""


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    scale_paths: tuple[str, str] | None = None
    validator: Validator | None = field(default=None, compare=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return self.group, self.plural

    @property
    def qualified(self) -> str:
        """`pods`, `tltrainingruns.tlt.dev`: how the apiserver names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(plural: str, kind: str, namespaced: bool = True, sub: frozenset[str] = frozenset()) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, sub)


BUILTIN: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", namespaced=False, sub=frozenset({"status"})),
    _core("pods", "Pod", sub=frozenset({"status"})),
    _core("services", "Service", sub=frozenset({"status"})),
    _core("configmaps", "ConfigMap"),
    _core("events", "Event"),
    _core("serviceaccounts", "ServiceAccount"),
    _core("secrets", "Secret"),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceType("events.k8s.io", "v1", "events", "Event", True),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        frozenset({"status"}),
        ("crd", "crds"),
    ),
)


def from_crd(
    crd: Mapping[str, Any], validator_factory: Callable[[Mapping[str, Any]], Validator] | None
) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition as resource types."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        scale = sub.get("scale")
        types.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                subresources=frozenset(sub),
                short_names=tuple(names.get("shortNames", ())),
                scale_paths=(scale["specReplicasPath"], scale["statusReplicasPath"]) if scale else None,
                validator=validator_factory(crd) if validator_factory else None,
            )
        )
    return types
