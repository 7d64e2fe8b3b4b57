"""`tlt drafter-trainer --spec FILE`: the `drafter-trainer` sidecar of a rollout pod.

With `drafter.placement: sidecar` the operator gives every rollout pod this second container (see the
worker contract in `tlt_operator.builders.pod`), with the rollout container's environment. It joins
the run's Ray head as a SECOND Ray node on the pod's IP that advertises one unit of
`tlt_trainer_<worker>` (`tlt.runtime.ray_sidecar.trainer_resource`; `<worker>` is the pod's
`rollout-<rank>`), so the coordinator's `SidecarTrainer` for this pod's rollout worker lands here and
nowhere else; `ray start --block` holds the container.

Two Ray nodes share the pod's network namespace and /tmp, so this one keeps clear of the rollout
container's: its own temp dir (`--temp-dir`; the default one would put both nodes' sockets in one
session folder), and OS-assigned ports where Ray's defaults are fixed (dashboard agent, worker ports).
GCS, node manager, object manager, metrics and runtime-env ports are OS-assigned already.

Same environment contract and Ray token-authentication handling as `tlt worker --role rollout`
(`TLT_ROLE` must be `rollout`); every command is an argument list run without a shell.

Exit status: 1 this node lost the cluster (`ray start --block` returned: the head is gone or a Ray
daemon died), 2 the spec or the environment is wrong (including a spec whose `drafter.placement` is not
`sidecar`), 143 terminated (SIGTERM from the kubelet). It never exits 0: the pod builder makes it a native
sidecar, which the kubelet restarts (it rejoins the head, e.g. a replaced one) while the rollout worker
runs and stops once the worker has exited; the worker's exit alone decides the pod's phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from tlt.commands.worker import RAY, EnvError, checked_ray_environment, exit_on_sigterm, hold_node, read_env
from tlt.runtime.k8s_slots import worker_name
from tlt.runtime.ray_sidecar import trainer_resource
from tlt.spec.manifest_io import SpecError, load_run

TEMP_DIR = "/tmp/ray-drafter-trainer"


def sidecar_ray_start_args(worker: str, head_address: str, pod_ip: str, temp_dir: str = TEMP_DIR) -> list[str]:
    """The `ray start --block` argument list of the drafter-trainer node of worker `worker` (`rollout-<rank>`)."""
    return [
        *RAY,
        "start",
        "--address",
        head_address,
        "--node-ip-address",
        pod_ip,
        "--disable-usage-stats",
        "--resources",
        json.dumps({trainer_resource(worker): 1}),
        "--temp-dir",
        temp_dir,
        "--dashboard-agent-listen-port",
        "0",
        "--min-worker-port",
        "0",
        "--max-worker-port",
        "0",
        "--block",
    ]


def sidecar_worker(environ: Mapping[str, str]) -> tuple[str, str, str]:
    """(worker name, head address, pod IP) from the rollout pod's environment; raises EnvError."""
    env = read_env(environ, "rollout")
    try:
        worker = worker_name(env.pod_name)
    except ValueError as exc:
        raise EnvError(f"TLT_POD_NAME: {exc}; the drafter-trainer sidecar runs only in rollout pods") from None
    return worker, env.head_address, env.pod_ip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, type=Path, help="the run's manifest (the mounted ConfigMap)")
    parser.add_argument(
        "--temp-dir",
        default=TEMP_DIR,
        help=f"this node's Ray temp dir, apart from the rollout container's (default {TEMP_DIR})",
    )


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    try:
        spec = load_run(args.spec)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    placement = spec.spec.drafter.placement
    if placement != "sidecar":
        print(
            f"error: drafter.placement is {placement!r}: the drafter trainer runs inside the rollout worker; "
            "`tlt drafter-trainer` is the container of drafter.placement 'sidecar' only",
            file=sys.stderr,
        )
        return 2
    environ = os.environ if environ is None else environ
    try:
        worker, head_address, pod_ip = sidecar_worker(environ)
        ray_env = checked_ray_environment(environ)
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with exit_on_sigterm():
        return hold_node(sidecar_ray_start_args(worker, head_address, pod_ip, args.temp_dir), ray_env)
