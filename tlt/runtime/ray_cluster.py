"""Connecting to Ray and placing the run's actors.

Local (the default): `ray.init(num_cpus=...)` starts a private cluster in this process (~4 s).
Actors ask for fractional CPUs so that a 2-core machine holds every role at once, and each sets
its own torch thread count (Ray's CPU numbers are bookkeeping; torch would otherwise start one
thread per core in every process and the cores would thrash).

A cluster: `ray.init(address=...)` joins it unchanged. Where nodes advertise the custom resources
`tlt_rollout` / `tlt_verifier` (`ray start --resources '{"tlt_rollout": 1}'` on rollout pods),
each actor asks for one unit of its role's resource, so it lands on a pod of that role and no
two actors share a pod, and for the CPUs of ONE such pod (the role's `resources.cpu`), not a share
of the whole cluster's; the coordinator stays in the driver (policy rank 0), and so does the policy update at
one policy rank; above one, the policy group's ranks run on the policy pods (`tlt_policy`,
`tlt.workers.sharded_policy`).

`drafter.placement: sidecar`: each rollout pod's drafter-trainer container is one more node,
advertising `tlt_trainer_<worker>`; a `SidecarTrainer` actor lands on it, with the CPUs of one
rollout pod's container, and is attached to the pod's rollout worker (`tlt.runtime.ray_sidecar`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from tlt.rl.reward_plugin import plugin_search_path
from tlt.runtime.devices import GpuPlan, gpu_plan
from tlt.runtime.precompile import graph_sets, precompile
from tlt.runtime.ray_reaper import start_reaper
from tlt.runtime.ray_sidecar import TRAINER_REJOIN_SECONDS, await_trainer_nodes, create_sidecars
from tlt.spec.plan import learns_drafters
from tlt.spec.run import RunSpec
from tlt.workers.rollout import RolloutWorker
from tlt.workers.services import VerifierWorker, hub_actor

log = logging.getLogger(__name__)

ROLE_RESOURCES = {"rollout": "tlt_rollout", "verifier": "tlt_verifier", "policy": "tlt_policy"}


@dataclass(frozen=True)
class Placement:
    """CPU shares and torch threads of each actor kind; the policy's device and each rollout worker's GPU
    share (`tlt.runtime.devices`)."""

    rollout_cpus: float
    rollout_threads: int
    verifier_cpus: float
    hub_cpus: float
    driver_threads: int
    gpus: GpuPlan = GpuPlan()


def connect(address: str | None = None, num_cpus: int | None = None) -> dict[str, float]:
    """Join the cluster at `address`, else start a local one; returns the cluster's resources."""
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            cpus = num_cpus or os.cpu_count() or 1
            # address="local": always a new private cluster, even where /tmp/ray/ray_current_cluster
            # names one that `ray start` left on this machine (plain ray.init() would join it).
            context = ray.init(
                address="local",
                num_cpus=cpus,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}},
            )
            start_reaper(context.address_info["session_dir"])  # ends what Ray leaves behind a killed driver
    return ray.cluster_resources()


def placement(spec: RunSpec, resources: dict[str, float], *, cuda_available: bool | None = None) -> Placement:
    """Share the CPUs: most to rollout workers (their trainers run in the same processes), a little to
    verifiers and the hub. Works for any core count >= 1; threads are at least one per actor. GPUs as the
    roles' `resources.gpus` ask (`tlt.runtime.devices.gpu_plan`; `cuda_available` defaults to this
    process's `torch.cuda.is_available()`); ValueError where a role asks for a GPU that is not there."""
    role_pods = resources.get(ROLE_RESOURCES["rollout"], 0) > 0
    gpus = gpu_plan(
        spec.policy.resources.gpus,
        spec.rollout.resources.gpus,
        spec.rollout.replicas,
        resources,
        role_pods=role_pods,
        cuda_available=torch.cuda.is_available() if cuda_available is None else cuda_available,
    )
    if role_pods:  # one actor per pod, that pod's CPUs
        rollout = cpu_quantity(spec.rollout.resources.cpu)
        small = min(0.1, cpu_quantity(spec.verifier.resources.cpu))
        return Placement(
            rollout_cpus=_floor4(rollout),
            rollout_threads=max(1, math.floor(rollout)),
            verifier_cpus=_floor4(small),
            hub_cpus=_floor4(small),
            driver_threads=max(1, math.floor(cpu_quantity(spec.policy.resources.cpu))),
            gpus=gpus,
        )
    cpus = float(resources.get("CPU", 1.0))
    workers = max(spec.rollout.replicas, 1)
    verifiers = max(spec.verifier.replicas, 1)
    small = min(0.1, cpus / (10 * (verifiers + 1)))
    rollout = (cpus - small * (verifiers + 1)) / workers
    return Placement(
        rollout_cpus=_floor4(rollout),
        rollout_threads=max(1, math.floor(rollout)),
        verifier_cpus=_floor4(small),
        hub_cpus=_floor4(small),
        driver_threads=max(1, int(cpus)),
        gpus=gpus,
    )


def cpu_quantity(quantity: str) -> float:
    """A Kubernetes CPU quantity as cores: "2" -> 2.0, "500m" -> 0.5."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _floor4(x: float) -> float:
    """x rounded down to 4 decimals (shares never add up to more than the cluster has)."""
    return math.floor(x * 10_000) / 10_000


def _role_options(role: str, resources: dict[str, float], cpus: float, gpus: float = 0.0) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": cpus}
    if gpus > 0:
        options["num_gpus"] = gpus
    custom = ROLE_RESOURCES.get(role)
    if custom is not None and resources.get(custom, 0) > 0:
        options["resources"] = {custom: 1}
    return options


def _plugin_runtime_env(target: str) -> dict[str, Any]:
    """Actor options that put the folder the driver imports `target` from on the verifiers' PYTHONPATH
    (Ray merges these env_vars into the job's); none where the driver cannot locate it."""
    root = plugin_search_path(target)
    if root is None:
        return {}
    inherited = os.environ.get("PYTHONPATH", "")
    return {"runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (root, inherited) if p)}}}


@dataclass
class Actors:
    """The run's actors; `names`: the rollout workers' (`worker_identity`), in rank order like `rollout`;
    `replace(rank)` starts a rollout worker like rank's (with `drafter.placement: sidecar` attached to rank's
    sidecar trainer, which Ray restarts on its own); `replace_verifier()` a verifier."""

    rollout: list[Any]
    verifiers: list[Any]
    hub: Any | None
    sidecars: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    replace: Callable[[int], Any] | None = None
    replace_verifier: Callable[[], Any] | None = None

    def all(self) -> list[Any]:
        return [*self.rollout, *self.verifiers, *([self.hub] if self.hub is not None else []), *self.sidecars]

    def kill(self) -> None:
        for actor in self.all():
            ray.kill(actor, no_restart=True)


def worker_rows(spec: RunSpec) -> int:
    """Rows of one rollout worker's engine: its shard of a step's groups (promptsPerStep, more with partial
    rollouts' `overProvision`) times the group size."""
    groups = spec.algorithm.rollout.groups_started(spec.algorithm.prompts_per_step)
    return math.ceil(groups / max(spec.rollout.replicas, 1)) * spec.algorithm.group_size


def local_graph_sets(spec: RunSpec, policy_path: str, resources: dict[str, float]) -> list[Any]:
    """The graph sets the rollout workers of `spec` compile when they all start on this machine (a local
    cluster of `resources`, no role pods), for `tlt.runtime.precompile`; [] with role pods (each pod
    compiles into its own cache) or when the workers roll out on GPUs (this compiles CPU graphs)."""
    if resources.get(ROLE_RESOURCES["rollout"], 0) > 0:
        return []
    plan = placement(spec, resources)
    if plan.gpus.rollout_gpus > 0:
        return []
    return graph_sets(spec, policy_path, worker_rows(spec), plan.rollout_threads)


def precompile_local(sets: list[Any], resources: dict[str, float]) -> dict[str, Any]:
    """Compile `sets` before the workers start, when at least two lanes can run at once (one per core):
    then the workers start on a warm cache. With one lane the workers, compiling side by side, are as fast.
    Returns `tlt.runtime.precompile.precompile`'s report."""
    processes = max(1, int(resources.get("CPU", 1)))
    report = precompile(sets, processes, min_lanes=2)
    if report["compiled"] or report["failed"]:
        log.info("precompiled before the workers started: %s", report)
    return report


def rollout_worker_class(spec: RunSpec) -> type:
    """The rollout worker of `rollout.engine`: this project's engine, or vLLM (imported only then)."""
    if spec.rollout.engine == "vllm":
        from tlt.workers.vllm_rollout import VllmRolloutWorker

        return VllmRolloutWorker
    return RolloutWorker


def verifier_starter(spec: RunSpec, resources: dict[str, float], plan: Placement) -> Callable[[], Any]:
    """A function that starts one verifier (not waiting for it); the run's verifiers, and a lost one's
    replacement."""
    verifier_cls = ray.remote(VerifierWorker)
    options = _role_options("verifier", resources, plan.verifier_cpus)
    if spec.verifier.reward is not None:
        options.update(_plugin_runtime_env(spec.verifier.reward))

    def start() -> Any:
        return verifier_cls.options(name=None, **options).remote(
            spec.dataset.answer_format, reward=spec.verifier.reward
        )

    return start


def rollout_starter(
    spec: RunSpec, policy_path: str, resources: dict[str, float], plan: Placement, verifiers: list[Any], hub: Any
) -> Callable[[int], Any]:
    """A function that starts the rollout worker of a rank (not waiting for it: its calls queue until it is
    up), optionally attached to a sidecar trainer; the run's workers at the start, and a lost one's
    replacement."""
    rollout_cls = ray.remote(rollout_worker_class(spec))
    options = _role_options("rollout", resources, plan.rollout_cpus, plan.gpus.rollout_gpus)
    rows = worker_rows(spec)

    def start(rank: int, sidecar: Any | None = None) -> Any:
        attach = {} if sidecar is None else {"sidecar": sidecar}  # its constructor attaches it
        return rollout_cls.options(max_concurrency=4, **options).remote(
            rank, spec, policy_path, rows, verifiers, hub, plan.rollout_threads, **attach
        )

    return start


def create_actors(
    spec: RunSpec, policy_path: str, target_config: Any, resources: dict[str, float], snapshot_dir: str | None
) -> Actors:
    """Start the verifiers, the drafter hub (modes static / tlt) and the rollout workers, and with
    `drafter.placement: sidecar` one sidecar trainer per rollout worker; wait until ready. Raises
    SidecarPlacementError before starting anything when the sidecars' nodes are missing (on rollout pods
    after waiting up to TRAINER_REJOIN_SECONDS for them)."""
    plan = placement(spec, resources)
    learns = learns_drafters(spec.speculative)
    sidecar = learns and spec.drafter.placement == "sidecar"
    # on rollout pods a missing sidecar is one the kubelet restarts; anywhere else it never comes
    rejoin = TRAINER_REJOIN_SECONDS if resources.get(ROLE_RESOURCES["rollout"], 0) > 0 else 0.0
    if sidecar:
        resources = dict(await_trainer_nodes(spec, resources, timeout=rejoin))
    start_verifier = verifier_starter(spec, resources, plan)
    verifiers = [start_verifier() for _ in range(max(spec.verifier.replicas, 1))]
    hub = None
    if learns:
        hub = hub_actor(plan.hub_cpus).remote(
            target_config, spec.drafter.learning_rate, spec.algorithm.seed, snapshot_dir
        )
    if not sidecar and len([n for n in ray.nodes() if n.get("Alive")]) == 1:
        precompile_local(local_graph_sets(spec, policy_path, resources), resources)
    start_worker = rollout_starter(spec, policy_path, resources, plan, verifiers, hub)
    workers = [start_worker(i) for i in range(max(spec.rollout.replicas, 1))]
    statuses = ray.get([w.status.remote() for w in workers])
    if hub is not None:
        ray.get(hub.ping.remote())
    warmups = " / ".join(f"{s.get('warmup_seconds', 0.0):.1f}" for s in statuses)
    frozen = " / ".join(f"{s['heap']['seconds']:.2f}" for s in statuses if s.get("heap"))
    log.info(
        "started %d rollout workers (%.2f CPU, %d threads, %s each; compile warm-up %s s%s), %d verifiers%s",
        len(workers),
        plan.rollout_cpus,
        plan.rollout_threads,
        f"{plan.gpus.rollout_gpus:g} GPU" if plan.gpus.rollout_gpus else "no GPU",
        warmups,
        f"; heap frozen after a {frozen} s collection" if frozen else "",
        len(verifiers),
        ", a drafter hub" if hub is not None else "",
    )
    names = [s["worker"] for s in statuses]
    actors = Actors(
        rollout=workers,
        verifiers=verifiers,
        hub=hub,
        names=names,
        replace=start_worker,
        replace_verifier=start_verifier,
    )
    if sidecar:
        try:
            actors.sidecars = create_sidecars(
                spec,
                [s["worker"] for s in statuses],
                target_config,
                hub,
                resources,
                plan.rollout_cpus,
                plan.rollout_threads,
                wait=rejoin,
            )
            ray.get([w.attach_sidecar.remote(s) for w, s in zip(workers, actors.sidecars)])
            sidecars = actors.sidecars
            actors.replace = lambda rank: start_worker(rank, sidecars[rank])
        except BaseException:
            actors.kill()
            raise
    return actors
