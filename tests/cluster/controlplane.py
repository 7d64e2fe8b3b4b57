"""A real Kubernetes control plane on loopback, the way controller-runtime's envtest starts one.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler come from `$KUBEBUILDER_ASSETS`
(default /usr/local/kubebuilder/bin; `setup-envtest use <version> -p path` fills such a folder on a
machine with internet), with kubectl beside them. Everything binds to 127.0.0.1 on free ports; the
apiserver runs with RBAC, a static admin token (group system:masters), service-account keys made with
openssl (so `kubectl create token` works) and a self-signed serving certificate from `--cert-dir`.
The controller manager runs every default controller (garbage collection, service accounts, the node
lifecycle), the scheduler places pods on whatever Node objects the tests create. `stop()` ends each
process it started, by PID.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEFAULT_ASSETS = "/usr/local/kubebuilder/bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
HOST = "127.0.0.1"


def assets_dir() -> Path:
    return Path(os.environ.get("KUBEBUILDER_ASSETS") or DEFAULT_ASSETS)


def missing_binaries() -> str | None:
    """Why no control plane can start here (one line), or None."""
    assets = assets_dir()
    missing = [b for b in BINARIES if not os.access(assets / b, os.X_OK)]
    if missing:
        return f"no control plane binaries in $KUBEBUILDER_ASSETS ({assets}): missing {', '.join(missing)}"
    if shutil.which("openssl") is None:
        return "openssl is not installed (the apiserver's service-account keys are made with it)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def kubeconfig(server: str, ca_file: Path, token: str, namespace: str = "default") -> dict[str, object]:
    """A kubeconfig for one bearer token."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "envtest",
        "clusters": [{"name": "envtest", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "user", "namespace": namespace}}],
    }


@dataclass
class ControlPlane:
    """One running control plane; `kubectl(...)` runs the assets' kubectl as the admin."""

    root: Path
    assets: Path = field(default_factory=assets_dir)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    url: str = ""

    @property
    def ca_file(self) -> Path:
        return self.root / "certs" / "apiserver.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        path.write_text(yaml.safe_dump(kubeconfig(self.url, self.ca_file, token, namespace)))
        return path

    # -- processes -------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "logs" / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
        )

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.log_tail(name)}")

    def start(self, timeout: float = 120.0) -> ControlPlane:
        for sub in ("etcd", "certs", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self._spawn(
            "etcd",
            [
                str(self.assets / "etcd"),
                "--name",
                "envtest",
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                f"http://{HOST}:{etcd_port}",
                "--advertise-client-urls",
                f"http://{HOST}:{etcd_port}",
                "--listen-peer-urls",
                f"http://{HOST}:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://{HOST}:{peer_port}",
                "--initial-cluster",
                f"envtest=http://{HOST}:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        key, pub = self.root / "sa.key", self.root / "sa.pub"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True
        )
        tokens = self.root / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin,"system:masters"\n')
        self._spawn(
            "kube-apiserver",
            [
                str(self.assets / "kube-apiserver"),
                f"--etcd-servers=http://{HOST}:{etcd_port}",
                f"--cert-dir={self.root / 'certs'}",
                f"--secure-port={api_port}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                f"--token-auth-file={tokens}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                # GPU nodes are tainted `nvidia.com/gpu:NoSchedule` (as GKE and the GPU operator do); this
                # admission plugin gives every pod that requests the resource the matching toleration.
                "--enable-admission-plugins=ExtendedResourceToleration",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ],
        )
        self.url = f"https://{HOST}:{api_port}"
        self._wait_ready(timeout)
        self.write_kubeconfig(self.admin_kubeconfig, self.admin_token)
        common = [
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            f"--bind-address={HOST}",
            "--leader-elect=false",
            "--v=1",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                str(self.assets / "kube-controller-manager"),
                *common,
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={key}",
                f"--root-ca-file={self.ca_file}",
                "--controllers=*",
                "--allocate-node-cidrs=false",
            ],
        )
        self._spawn("kube-scheduler", [str(self.assets / "kube-scheduler"), *common, f"--secure-port={free_port()}"])
        deadline = time.monotonic() + timeout
        while "default" not in self.kubectl("get", "serviceaccounts", "-n", "default", "-o", "name", check=False):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    "kube-controller-manager made no `default` ServiceAccount in time:\n"
                    + self.log_tail("kube-controller-manager")
                )
            time.sleep(0.5)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            if self.ca_file.exists():
                context = ssl.create_default_context(cafile=str(self.ca_file))
                request = urllib.request.Request(
                    f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
                )
                try:
                    with urllib.request.urlopen(request, context=context, timeout=5) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
                    last = str(exc)
            time.sleep(0.5)
        raise TimeoutError(f"kube-apiserver not ready in {timeout}s ({last}):\n{self.log_tail('kube-apiserver')}")

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        self.processes.clear()

    # -- kubectl ---------------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig_file: Path | None = None,
        timeout: float = 120,
    ) -> str:
        result = self.kubectl_result(*args, stdin=stdin, kubeconfig_file=kubeconfig_file, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr[-3000:]}")
        return result.stdout

    def kubectl_result(
        self, *args: str, stdin: str | None = None, kubeconfig_file: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        config = kubeconfig_file or self.admin_kubeconfig
        return subprocess.run(
            [str(self.assets / "kubectl"), f"--kubeconfig={config}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
