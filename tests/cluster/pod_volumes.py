"""What the test node agent's kubelet puts into a pod's volumes (configMap, secret, projected: the
ServiceAccount token, configMaps and the downward API; emptyDir; a claim's folder) and its downward-API fields."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any


def downward_field(raw: dict[str, Any], path: str, ip: str) -> str:
    """A downward-API field of a pod (`raw`: the pod as a dict; `ip`: the address the agent gave it)."""
    meta = raw["metadata"]
    if path.startswith("metadata.labels['"):
        return str(meta.get("labels", {}).get(path[len("metadata.labels['") : -2], ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "status.podIP": ip,
        "status.hostIP": "127.0.0.1",
        "spec.nodeName": raw["spec"]["nodeName"],
        "spec.serviceAccountName": raw["spec"].get("serviceAccountName", ""),
    }
    if path not in values:
        raise ValueError(f"fieldRef {path}: not supported by the test node agent")
    return str(values[path])


class PodVolumes:
    """Fills the host folders behind pod volumes, reading from the API as the kubelet does. core: a
    `CoreV1Api`; root: the agent's folder (claims live under root/claims/<namespace>/<claim>)."""

    def __init__(self, core: Any, root: Path) -> None:
        self.core, self.root = core, root

    def volume(self, pod: Any, volume: dict[str, Any], path: Path) -> tuple[Path, str]:
        """The host folder that backs one pod volume, filled, and its kind (`dir` or `tmpfs`)."""
        path.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume or "secret" in volume:
            source = volume.get("configMap") or volume["secret"]
            name = source.get("name") or source.get("secretName")
            if "configMap" in volume:
                data = self.core.read_namespaced_config_map(name, pod.namespace).data or {}
            else:
                raw = self.core.read_namespaced_secret(name, pod.namespace).data or {}
                data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (path / item["path"]).write_text(data[item["key"]])
            return path, "dir"
        if "projected" in volume:
            for source in volume["projected"].get("sources", []):
                self._project(pod, source, path)
            return path, "dir"
        if "emptyDir" in volume:
            return path, "tmpfs" if (volume["emptyDir"] or {}).get("medium") == "Memory" else "dir"
        if "persistentVolumeClaim" in volume:
            claim = self.root / "claims" / pod.namespace / volume["persistentVolumeClaim"]["claimName"]
            claim.mkdir(parents=True, exist_ok=True)
            return claim, "dir"
        raise ValueError(
            f"volume {volume['name']}: the test node agent supports configMap, secret, emptyDir and "
            "persistentVolumeClaim volumes"
        )

    def _project(self, pod: Any, source: dict[str, Any], path: Path) -> None:
        """One source of a projected volume (what the ServiceAccount admission plugin adds for the API token)."""
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            raw = self.core.read_namespaced_pod(pod.name, pod.namespace)
            spec = {
                "expirationSeconds": sat.get("expirationSeconds", 3600),
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.uid},
            }
            if sat.get("audience"):
                spec["audiences"] = [sat["audience"]]
            token = self.core.create_namespaced_service_account_token(
                raw.spec.service_account_name, pod.namespace, {"spec": spec}
            )
            (path / sat["path"]).write_text(token.status.token)
        elif "configMap" in source:
            data = self.core.read_namespaced_config_map(source["configMap"]["name"], pod.namespace).data or {}
            for item in source["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                (path / item["path"]).write_text(data[item["key"]])
        elif "downwardAPI" in source:
            live = self.core.read_namespaced_pod(pod.name, pod.namespace)
            raw = self.core.api_client.sanitize_for_serialization(live)
            for item in source["downwardAPI"].get("items", []):
                (path / item["path"]).write_text(downward_field(raw, item["fieldRef"]["fieldPath"], pod.ip))
        else:
            raise ValueError(f"projected volume source {sorted(source)}: not supported by the test node agent")
