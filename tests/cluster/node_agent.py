"""A test-only stand-in for the kubelet of some fake Nodes, so pods scheduled by the real scheduler run here.

For each Node it owns the agent posts a Ready status every few seconds (the node lifecycle controller
then lifts the `not-ready` taint and keeps the node schedulable) and, for each pod bound to it:
- `execute` nodes run the pod's one container as a local process in a mount namespace of its own
  (`unshare --mount`, see `pod_exec.py`): ConfigMap and Secret volumes written under the agent's root,
  emptyDirs as folders (tmpfs for `medium: Memory`), PersistentVolumeClaims as one folder per claim,
  each bind-mounted at its `mountPath`; an `/etc/hosts` naming every pod of the namespace by
  `<hostname>.<subdomain>` (the headless Service's DNS records); env with `fieldRef`, `secretKeyRef`,
  `configMapKeyRef` resolved; the pod's IP a 127.0.0.x address of its own;
  a projected ServiceAccount token (TokenRequest, bound to the pod) with `KUBERNETES_SERVICE_HOST/PORT`
  naming the real API server;
- `hold` nodes (the GPU mocks: nothing here can run a GPU pod) report the pod Running and run nothing.
Phase, IP, readiness and exit code go to the pod's status; a pod deleted gracefully gets SIGTERM, then
SIGKILL after its grace period, and the agent completes the deletion as the kubelet does. Pods with
init containers or more than one container are failed with a reason: nothing the operator builds for
these tests needs them. Processes run as root (no user namespaces here); the pod's `runAsUser` is not
applied.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
from fake_node import FakeNode
from pod_volumes import PodVolumes, downward_field

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0
POLL_S = 0.3
POD_EXEC = Path(__file__).with_name("pod_exec.py")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    ip: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    finished: bool = False


class NodeAgent:
    """Plays the kubelet of `nodes` against the API server `api` (a `kubernetes.client.ApiClient`)."""

    def __init__(self, api: kubernetes.client.ApiClient, nodes: list[FakeNode], root: Path) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        host, _, port = api.configuration.host.removeprefix("https://").partition(":")
        self.api_host, self.api_port = host, port or "443"
        self.nodes = {n.name: n for n in nodes}
        self.root = root
        self.volumes = PodVolumes(self.core, root)
        self.pods: dict[str, _Pod] = {}
        self._next_ip = 2
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self._last_beat = 0.0
        self._made_dirs: list[Path] = []
        self.errors: list[str] = []

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        for node in self.nodes.values():
            body = {
                "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name, **node.labels}},
                "spec": {"taints": node.taints} if node.taints else {},
            }
            self.core.create_node(body)
        self._heartbeat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in self.pods.values():
            self._kill(pod, grace=5)
        for path in reversed(self._made_dirs):
            with contextlib.suppress(OSError):
                path.rmdir()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._last_beat > HEARTBEAT_S:
                    self._heartbeat()
                self._sync()
            except Exception as exc:  # noqa: BLE001 - an API hiccup must not end the agent; the tests read errors
                self.errors.append(repr(exc))
                log.warning("node agent: %r", exc)
            self._stop.wait(POLL_S)

    def _heartbeat(self) -> None:
        now = _now()
        for node in self.nodes.values():
            status = {
                "capacity": node.capacity,
                "allocatable": node.capacity,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": node.name},
                ],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node agent",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.36.0-test",
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "containerRuntimeVersion": "local-process://",
                    "kernelVersion": "",
                    "osImage": "",
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            }
            self.core.patch_node_status(node.name, {"status": status})
        self._last_beat = time.monotonic()

    # -- pods ------------------------------------------------------------------------------------
    def _sync(self) -> None:
        live = {
            p.metadata.uid: p for p in self.core.list_pod_for_all_namespaces().items if p.spec.node_name in self.nodes
        }
        for uid, pod in list(self.pods.items()):
            if uid not in live:  # gone from the API (force-deleted): nothing may keep running
                self._kill(pod, grace=0)
                del self.pods[uid]
        for uid, obj in live.items():
            try:
                self._sync_pod(uid, obj)
            except kubernetes.client.ApiException as exc:  # one pod's trouble must not starve the others
                if exc.status != 404:
                    self.errors.append(f"{obj.metadata.namespace}/{obj.metadata.name}: {exc.status} {exc.reason}")

    def _sync_pod(self, uid: str, obj: Any) -> None:
        pod = self.pods.get(uid)
        if obj.metadata.deletion_timestamp is not None:
            if pod is not None:
                self._kill(pod, grace=obj.metadata.deletion_grace_period_seconds or 0)
            # The kubelet's final delete; with a body, the apiserver reads the options from it alone.
            self.core.delete_namespaced_pod(
                obj.metadata.name, obj.metadata.namespace, body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            )
            self.pods.pop(uid, None)
            return
        if pod is None and obj.status.phase == "Pending":
            self.pods[uid] = self._admit(obj)
            self._refresh_hosts(obj.metadata.namespace)
        elif pod is not None and pod.process is not None and not pod.finished:
            code = pod.process.poll()
            if code is not None:
                pod.finished = True
                self._report_exit(obj, code)

    def _admit(self, obj: Any) -> _Pod:
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        pod = _Pod(obj.metadata.uid, obj.metadata.namespace, obj.metadata.name, ip)
        node = self.nodes[obj.spec.node_name]
        if node.mode == "execute":
            raw = self.core.api_client.sanitize_for_serialization(obj)
            try:
                self._launch(pod, raw)
            except (ValueError, OSError, kubernetes.client.ApiException) as exc:
                pod.finished = True
                self._report_failure(obj, str(exc))
                return pod
        self._report_running(obj, ip)
        return pod

    def _report_running(self, obj: Any, ip: str) -> None:
        now = _now()
        container = obj.spec.containers[0]
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
        self.core.patch_namespaced_pod_status(obj.metadata.name, obj.metadata.namespace, {"status": status})

    def _report_exit(self, obj: Any, code: int) -> None:
        now = _now()
        container = obj.spec.containers[0]
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {"type": t, "status": "False", "lastTransitionTime": now} for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "finishedAt": now,
                        }
                    },
                }
            ],
        }
        self.core.patch_namespaced_pod_status(obj.metadata.name, obj.metadata.namespace, {"status": status})

    def _report_failure(self, obj: Any, why: str) -> None:
        self.errors.append(f"{obj.metadata.namespace}/{obj.metadata.name}: {why}")
        status = {"phase": "Failed", "reason": "NodeAgentRefused", "message": why[:1000]}
        self.core.patch_namespaced_pod_status(obj.metadata.name, obj.metadata.namespace, {"status": status})

    def _kill(self, pod: _Pod, grace: float) -> None:
        proc = pod.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    # -- launching -------------------------------------------------------------------------------
    def _launch(self, pod: _Pod, raw: dict[str, Any]) -> None:
        spec = raw["spec"]
        if spec.get("initContainers") or len(spec["containers"]) != 1:
            raise ValueError("the test node agent runs pods of exactly one container and no init containers")
        container = spec["containers"][0]
        pod_dir = self.root / "pods" / pod.namespace / pod.name
        shutil.rmtree(pod_dir, ignore_errors=True)
        volumes = {
            v["name"]: self.volumes.volume(pod, v, pod_dir / "volumes" / v["name"]) for v in spec.get("volumes", [])
        }
        mounts = []
        for mount in container.get("volumeMounts", []):
            source, kind = volumes[mount["name"]]
            mounts.append(
                {
                    "source": str(source),
                    "target": mount["mountPath"],
                    "kind": kind,
                    "readOnly": bool(mount.get("readOnly")),
                }
            )
        hosts = pod_dir / "hosts"
        self._write_hosts(pod.namespace, hosts, pod.name, pod.ip)
        mounts.append({"source": str(hosts), "target": "/etc/hosts", "kind": "file", "readOnly": True})
        for m in mounts:  # top-level mount points must exist on the host; nested ones are made inside
            target = Path(m["target"])
            if m["kind"] != "file" and not any(
                target.is_relative_to(o["target"]) and o["target"] != m["target"] for o in mounts
            ):
                self._ensure_dir(target)
        env = self._env(pod, raw, container)
        argv = [*container.get("command", []), *container.get("args", [])]
        targets = [Path(m["target"]) for m in mounts]
        needed = {Path(sys.prefix).absolute(), Path(__file__).resolve().parents[2]}  # virtualenv, source tree
        keep = sorted(str(p) for p in needed if any(p.is_relative_to(t) for t in targets))
        plan = {
            "mounts": mounts,
            "cwd": container.get("workingDir", "/"),
            "argv": argv,
            "env": env,
            "keep": keep,
            "aside": str(pod_dir / "aside"),
        }
        (pod_dir / "plan.json").write_text(json.dumps(plan))
        pod.log_path = pod_dir / "log"
        pod.process = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                str(Path(sys.executable).absolute()),
                str(POD_EXEC),
                str(pod_dir / "plan.json"),
            ],
            stdout=pod.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _ensure_dir(self, path: Path) -> None:
        missing = []
        for part in [path, *path.parents]:
            if part.exists():
                break
            missing.append(part)
        for part in reversed(missing):
            part.mkdir()
            self._made_dirs.append(part)

    def _refresh_hosts(self, namespace: str) -> None:
        """Rewrite (in place: the pods bind-mounted these inodes) every running pod's hosts file."""
        for pod in self.pods.values():
            hosts = self.root / "pods" / pod.namespace / pod.name / "hosts"
            if pod.namespace == namespace and pod.process is not None and hosts.exists():
                self._write_hosts(namespace, hosts, pod.name, pod.ip)

    def _write_hosts(self, namespace: str, path: Path, own_name: str, own_ip: str) -> None:
        lines = ["127.0.0.1 localhost"]
        for item in self.core.list_namespaced_pod(namespace).items:
            known = self.pods.get(item.metadata.uid)
            ip = own_ip if item.metadata.name == own_name else (known.ip if known else item.status.pod_ip)
            if ip and item.spec.hostname and item.spec.subdomain:
                fqdn = f"{item.spec.hostname}.{item.spec.subdomain}"
                lines.append(f"{ip} {fqdn} {fqdn}.{namespace}.svc {fqdn}.{namespace}.svc.cluster.local")
        with path.open("r+" if path.exists() else "w") as out:  # same inode: a bind mount keeps seeing it
            out.write("\n".join(lines) + "\n")
            out.truncate()

    def _env(self, pod: _Pod, raw: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        # The kubelet's `kubernetes` Service variables, pointing at the real API server (no Service network here).
        # This interpreter's bin folder first (where `tlt` is), absolute: the pod runs in its own working directory.
        path = os.pathsep.join([str(Path(sys.executable).absolute().parent), os.environ.get("PATH", "/usr/bin:/bin")])
        env = {
            "PATH": path,
            "HOSTNAME": raw["spec"].get("hostname", pod.name),
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": self.api_port,
        }
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
                continue
            ref = var.get("valueFrom", {})
            if "fieldRef" in ref:
                env[var["name"]] = downward_field(raw, ref["fieldRef"]["fieldPath"], pod.ip)
            elif "secretKeyRef" in ref:
                secret = self.core.read_namespaced_secret(ref["secretKeyRef"]["name"], pod.namespace)
                env[var["name"]] = base64.b64decode(secret.data[ref["secretKeyRef"]["key"]]).decode()
            elif "configMapKeyRef" in ref:
                cm = self.core.read_namespaced_config_map(ref["configMapKeyRef"]["name"], pod.namespace)
                env[var["name"]] = cm.data[ref["configMapKeyRef"]["key"]]
            else:
                raise ValueError(f"env {var['name']}: unsupported valueFrom {sorted(ref)}")
        return env

    def log_of(self, namespace: str, name: str) -> str:
        path = self.root / "pods" / namespace / name / "log"
        return path.read_text(errors="replace") if path.exists() else ""
