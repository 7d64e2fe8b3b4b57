"""The operator as a process, the way its Deployment runs it, but with a token of a chosen ServiceAccount so
that the installed RBAC is the real check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from controlplane import ControlPlane, free_port

OPERATOR_NAMESPACE = "tlt-system"


class OperatorProcess:
    """`tlt-operator` from this checkout, authenticated with a token of `service_account` (in the operator's
    namespace; by default the one the install made), watching `namespaces` (comma-separated; "": all)."""

    def __init__(
        self, plane: ControlPlane, root: Path, service_account: str = "tlt-operator", namespaces: str = ""
    ) -> None:
        self.plane = plane
        self.root = root
        self.service_account = service_account
        self.namespaces = namespaces
        self.log = root / "operator.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        token = self.plane.kubectl(
            "create", "token", self.service_account, "-n", OPERATOR_NAMESPACE, "--duration=4h"
        ).strip()
        config = self.plane.write_kubeconfig(self.root / "kubeconfig", token)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(
            KUBECONFIG=str(config),
            TLT_OPERATOR_RECONCILE_SECONDS="1",
            TLT_OPERATOR_REQUEST_TIMEOUT="10",
            TLT_OPERATOR_WATCH_SECONDS="60",
            TLT_OPERATOR_NAMESPACE=OPERATOR_NAMESPACE,
            TLT_OPERATOR_NAMESPACES=self.namespaces,
        )
        argv = [
            str(Path(sys.executable).absolute().parent / "tlt-operator"),
            "--metrics-port",
            "0",
            "--health-port",
            str(free_port()),
            "--listen-address",
            "127.0.0.1",
        ]
        self.process = subprocess.Popen(
            argv, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
