"""`tlt worker --role R --spec FILE`: the entry point of a TLTTrainingRun's pods.

Implements the worker contract of `tlt_operator.builders.pod` (its docstring is the reference):
- policy rank 0 starts the Ray head (GCS on the port of `$TLT_HEAD_ADDRESS`), waits until every rollout
  and verifier pod of the spec has joined (with `drafter.placement: sidecar` also every rollout pod's
  drafter-trainer container, `tlt drafter-trainer`), then runs the coordinator in this process
  (`tlt.runtime.ray_train.train_ray`) into /var/lib/tlt, the pod's working directory, where a relative
  `checkpoint.path` resolves onto the checkpoint volume (so a replaced head resumes from the last
  checkpoint). It stops the head at the end and exits 0 when every step is done: the run's Succeeded.
  SIGTERM (the kubelet stopping the pod) while the coordinator runs: it finishes the step under way,
  writes a checkpoint of it, stops Ray and exits 143 (`tlt.runtime.graceful_stop`), so the pod is Failed,
  not Succeeded, and its replacement resumes from that checkpoint. The pod's
  terminationGracePeriodSeconds must cover one step and one checkpoint, or the kubelet's SIGKILL ends it
  first (the previous checkpoint then stands).
- rollout / verifier pods join the head as Ray nodes that advertise one unit of their role's custom
  resource (`tlt_rollout` / `tlt_verifier`, the names `tlt.runtime.ray_cluster` asks for), so the
  coordinator's actors of that role land on them; `ray start --block` holds the pod.
- policy ranks > 0 join as Ray nodes advertising `tlt_policy`: above one policy rank
  (`policy.sharding`), the coordinator waits for them and runs the policy group's ranks there
  (`tlt.workers.sharded_policy`); at one rank they only add capacity for actors that ask for no role
  resource (the drafter hub). They hold their pod like rollout pods.
A node that returns from `ray start --block` has lost its Ray processes (the head is gone, or a
daemon died): the worker exits non-zero and the operator replaces the pod. After a successful run the
head stops first; the other nodes notice only after Ray's GCS reconnect timeout, by which time the
policy rank-0 pod has Succeeded, and the operator judges the run by that pod.

Every command is an argument list run without a shell; the only values from outside are the pod's IP
and the head address from the environment, each passed as one argument. Ray's token authentication is
the same on every pod: `RAY_AUTH_MODE` from the pod's environment, else `token`, with the token in
`RAY_AUTH_TOKEN` (the operator injects both, the token from the run's Secret; `ray_environment`).
Policy rank 0 must have `RAY_AUTH_MODE` set itself: it is also a Ray driver, and Ray fixes a driver's
mode when it is imported (checked here with Ray 2.60: a driver given only the token is refused).

Exit status: 0 done (policy rank 0), 1 the run failed or this node lost the cluster, 2 the spec or the
environment is wrong, 143 terminated (SIGTERM from the kubelet; on policy rank 0 after the checkpoint of
the step under way, or without one when it could not be written or no step was running).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal, get_args

from tlt.runtime.graceful_stop import EXIT_TERMINATED
from tlt.runtime.ray_cluster import ROLE_RESOURCES
from tlt.runtime.ray_sidecar import TRAINER_RESOURCE_PREFIX, trainer_nodes
from tlt.spec.manifest_io import SpecError, load_run
from tlt.spec.run import RunSpec, TLTTrainingRun

log = logging.getLogger(__name__)

Role = Literal["policy", "rollout", "verifier"]
ROLES: tuple[str, ...] = get_args(Role)
WORK_DIR = Path("/var/lib/tlt")
ENV_VARS = ("TLT_RUN_NAME", "TLT_ROLE", "TLT_RANK", "TLT_POD_NAME", "TLT_NAMESPACE", "TLT_POD_IP", "TLT_HEAD_ADDRESS")
RAY = (sys.executable, "-m", "ray.scripts.scripts")
AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"


class EnvError(ValueError):
    """The pod's environment does not follow the worker contract."""


@dataclass(frozen=True)
class WorkerEnv:
    """The worker contract's environment, checked."""

    run_name: str
    role: Role
    rank: int
    pod_name: str
    namespace: str
    pod_ip: str
    head_address: str

    @property
    def is_head(self) -> bool:
        return self.role == "policy" and self.rank == 0


def head_port(head_address: str) -> int:
    """The GCS port of `host:port` (TLT_HEAD_ADDRESS)."""
    host, sep, port = head_address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EnvError(f"TLT_HEAD_ADDRESS must be host:port with a port in 1-65535, got {head_address!r}")
    return int(port)


def read_env(environ: Mapping[str, str], role: str) -> WorkerEnv:
    """The contract's variables from `environ`; `role` (from --role) must match TLT_ROLE."""
    if role not in ROLES:
        raise EnvError(f"--role must be one of {list(ROLES)}, got {role!r}")
    missing = [name for name in ENV_VARS if not environ.get(name)]
    if missing:
        raise EnvError(
            f"missing environment variable(s) {', '.join(missing)}: the operator's pods set them "
            f"(tlt_operator.builders.pod); set them by hand to run a worker elsewhere"
        )
    if environ["TLT_ROLE"] != role:
        raise EnvError(f"TLT_ROLE is {environ['TLT_ROLE']!r} but --role is {role!r}; they must agree")
    rank = environ["TLT_RANK"]
    if not rank.isdigit():
        raise EnvError(f"TLT_RANK must be a non-negative integer, got {rank!r}")
    head_port(environ["TLT_HEAD_ADDRESS"])
    return WorkerEnv(
        run_name=environ["TLT_RUN_NAME"],
        role=role,
        rank=int(rank),  # type: ignore[arg-type]
        pod_name=environ["TLT_POD_NAME"],
        namespace=environ["TLT_NAMESPACE"],
        pod_ip=environ["TLT_POD_IP"],
        head_address=environ["TLT_HEAD_ADDRESS"],
    )


def ray_start_args(role: Role, rank: int, head_address: str, pod_ip: str) -> list[str]:
    """The `ray start --block` argument list of a pod: the head (GCS on the head address's port) for policy
    rank 0, else a node joining `head_address`; rollout and verifier nodes carry their role's resource.
    `--block` on the head too: SIGTERM to that one process stops this node's Ray processes, and only them.
    The head offers no CPUs or GPUs to Ray: they are the policy update's, which runs in the coordinator's
    process outside Ray's bookkeeping, and the coordinator shares the cluster's CPUs among its actors."""
    common = ["--node-ip-address", pod_ip, "--disable-usage-stats"]
    if role == "policy" and rank == 0:
        return [
            *RAY,
            "start",
            "--head",
            "--port",
            str(head_port(head_address)),
            *common,
            "--num-cpus",
            "0",
            "--num-gpus",
            "0",
            "--include-dashboard",
            "false",
            "--block",
        ]
    resource = ROLE_RESOURCES.get(role)
    resources = ["--resources", json.dumps({resource: 1})] if resource is not None else []
    return [*RAY, "start", "--address", head_address, *common, *resources, "--block"]


def ray_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of this pod's Ray processes: `environ` with Ray's token authentication pinned.

    Ray 2.60 turns token auth on for a head that finds a token file in $HOME, while a driver that connects
    to an explicit address never turns it on: left to chance the coordinator is refused by its own head.
    `RAY_AUTH_MODE` from the pod's environment is kept; unset, it is `token` on every pod alike, and
    token mode needs `RAY_AUTH_TOKEN` (the operator sets it from the run's Secret `<run>-ray-token`):
    without it EnvError, rather than a head that makes up a token no other pod knows."""
    mode = environ.get(AUTH_MODE) or "token"
    if mode == "token" and not environ.get(AUTH_TOKEN):
        raise EnvError(
            f"Ray token authentication is on ({AUTH_MODE}=token, the default) but {AUTH_TOKEN} is not "
            f"set: the operator injects it from the run's Secret <run>-ray-token; set {AUTH_MODE}="
            "disabled in every role's podTemplate.env only on a network nobody else can reach"
        )
    return {**environ, AUTH_MODE: mode}


def missing_nodes(spec: RunSpec, resources: Mapping[str, float]) -> dict[str, int]:
    """Role resource -> pods of that role that have not joined yet (each joined pod adds one unit); with
    `drafter.placement: sidecar` also `tlt_trainer_*` -> drafter-trainer sidecars not joined yet."""
    wanted = {ROLE_RESOURCES["rollout"]: spec.rollout.replicas, ROLE_RESOURCES["verifier"]: spec.verifier.replicas}
    if spec.policy.world > 1:  # the policy group's ranks beyond the coordinator's pod
        wanted[ROLE_RESOURCES["policy"]] = spec.policy.replicas - 1
    have = {name: int(resources.get(name, 0)) for name in wanted}
    if spec.drafter.placement == "sidecar":
        trainers = f"{TRAINER_RESOURCE_PREFIX}*"
        wanted[trainers], have[trainers] = spec.rollout.replicas, trainer_nodes(resources)
    return {name: n - have[name] for name, n in wanted.items() if have[name] < n}


def wait_for_head(host: str, port: int, head: subprocess.Popen[bytes], deadline: float, poll: float = 0.5) -> None:
    """Until the GCS port accepts connections (`ray.init` against a GCS that is not up yet blocks for minutes).
    Raises ConnectionError when the head process exits first, TimeoutError past `deadline` (monotonic)."""
    while True:
        if head.poll() is not None:
            raise ConnectionError(f"ray start --head exited {head.returncode} before its GCS at {host}:{port} was up")
        try:
            with socket.create_connection((host, port), timeout=poll):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head's GCS at {host}:{port} was not up in time") from None
            time.sleep(poll)


def wait_for_nodes(address: str, spec: RunSpec, deadline: float, poll: float = 2.0) -> None:
    """Connect to the head and wait until every rollout and verifier pod has joined: the coordinator
    places its actors by the resources it sees when it starts. Raises TimeoutError naming the missing."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
        signal.signal(signal.SIGTERM, _terminate)  # over Ray's own (exit 15): SIGTERM while waiting is 143
    while missing := missing_nodes(spec, ray.cluster_resources()):
        if time.monotonic() > deadline:
            raise TimeoutError(
                "still waiting for nodes: " + ", ".join(f"{n} with {name}" for name, n in sorted(missing.items()))
            )
        log.info("waiting for nodes: %s", missing)
        time.sleep(poll)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", required=True, choices=ROLES, help="this pod's role")
    parser.add_argument("--spec", required=True, type=Path, help="the run's manifest (the mounted ConfigMap)")
    parser.add_argument(
        "--out",
        type=Path,
        default=WORK_DIR,
        help=f"policy rank 0: output folder; relative checkpoint.path resolves here (default {WORK_DIR})",
    )
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=600.0,
        help="policy rank 0: seconds to wait for the head and every rollout and verifier pod (default 600)",
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(EXIT_TERMINATED)


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    try:
        spec = load_run(args.spec)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    environ = os.environ if environ is None else environ
    try:
        env = read_env(environ, args.role)
        ray_env = checked_ray_environment(environ)
        if env.is_head and not environ.get(AUTH_MODE):
            raise EnvError(
                f"policy rank 0 is also a Ray driver (the coordinator), and Ray reads {AUTH_MODE} when it "
                f"is imported: set {AUTH_MODE}=token (with {AUTH_TOKEN}) in the pod's environment, as the "
                "operator does, so the driver and its head agree"
            )
        if env.is_head and (problem := shared_checkpoint_problem(spec.spec)):
            raise EnvError(problem)
    except EnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with exit_on_sigterm():
        if env.is_head:
            return run_head(env, spec, args.out, args.join_timeout, ray_env)
        return run_node(env, ray_env)


def shared_checkpoint_problem(spec: RunSpec) -> str | None:
    """Why a policy group over several pods cannot checkpoint (each rank writes its shards into the checkpoint
    root, which must be one filesystem for every policy pod), or None."""
    if spec.policy.world > 1 and spec.policy.replicas > 1 and not spec.checkpoint.claim_name:
        return (
            f"policy: {spec.policy.world} policy ranks on {spec.policy.replicas} pods write their checkpoint "
            "shards into one checkpoint folder: set checkpoint.claimName to a claim every policy pod mounts "
            "(ReadWriteMany across nodes), or policy.sharding: none"
        )
    return None


def checked_ray_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`ray_environment(environ)`, with a warning when Ray's token authentication is off."""
    ray_env = ray_environment(environ)
    if ray_env[AUTH_MODE] == "disabled":
        log.warning(
            "Ray token authentication is off (%s=disabled): any process that reaches this pod's Ray ports "
            "can run code in the cluster",
            AUTH_MODE,
        )
    return ray_env


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """SIGTERM (the kubelet stopping the pod) exits with EXIT_TERMINATED, through every `finally`."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_head(env: WorkerEnv, run_spec: TLTTrainingRun, out: Path, join_timeout: float, ray_env: dict[str, str]) -> int:
    """Start the head, run the coordinator, stop the head; the coordinator's exit status."""
    head = subprocess.Popen(ray_start_args(env.role, env.rank, env.head_address, env.pod_ip), shell=False, env=ray_env)
    port = head_port(env.head_address)
    address = f"{env.pod_ip}:{port}"
    deadline = time.monotonic() + join_timeout
    try:
        try:
            wait_for_head(env.pod_ip, port, head, deadline)
            wait_for_nodes(address, run_spec.spec, deadline)
        except (TimeoutError, ConnectionError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        from tlt.runtime.ray_train import train_ray

        return train_ray(run_spec, out, address=address, stopped_exit=EXIT_TERMINATED)
    finally:
        import ray

        ray.shutdown()
        _stop(head)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM a `ray start --block` (it stops its node's Ray processes); SIGKILL after 30 s."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def run_node(env: WorkerEnv, ray_env: dict[str, str]) -> int:
    """Join the head and hold the pod; non-zero once `ray start --block` returns (the cluster is lost)."""
    return hold_node(ray_start_args(env.role, env.rank, env.head_address, env.pod_ip), ray_env)


def hold_node(args: list[str], ray_env: dict[str, str]) -> int:
    """Run `ray start ... --block` (`args`, no shell) until it returns; then non-zero (the cluster is lost)."""
    child = subprocess.Popen(args, shell=False, env=ray_env)
    try:
        code = child.wait()
    finally:
        _stop(child)
    print(
        f"error: ray start --block exited {code}: this node lost the cluster (head gone or a Ray daemon died)",
        file=sys.stderr,
    )
    return code if code != 0 else 1
