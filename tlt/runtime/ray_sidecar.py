"""The drafter trainer in its own container: `drafter.placement: sidecar`.

Each rollout pod then carries a second container, `drafter-trainer` (`tlt drafter-trainer`), that
shares the pod's GPU through one DRA ResourceClaim and joins the run's Ray cluster as a second node
on the pod's IP, advertising one unit of `tlt_trainer_<worker>` (`trainer_resource`), where
`<worker>` is the pod's worker name `rollout-<rank>`. The coordinator places one `SidecarTrainer`
actor on each such node, next to the rollout worker of the same pod, and attaches it to that worker:

- after each rollout the worker hands its fresh completions (with the target's hidden states), the
  policy's embedding and LM head (the drafter's frozen, shared parts) and the step's drafter to its
  sidecar, which buffers them and reports the drafter's top-1 agreement on them;
- the coordinator starts and stops training through the worker, exactly as with the in-container
  trainer (same rule: an enabled slot, the worker IDLE; same acknowledgement, with the sidecar's
  timestamps); the worker alone reports GENERATING / IDLE / TRAINING, on its pod too, so the pod's
  state annotation has one writer and its changes arrive in order.

Where the trainer nodes are missing (one machine, or pods without the sidecar) the run stops before
any actor starts, with an error naming `drafter.placement` (`require_trainer_nodes`): there is no
silent fallback to the in-container trainer. On rollout pods a missing trainer node is a sidecar the
kubelet is restarting (a native sidecar): the coordinator waits for it up to `TRAINER_REJOIN_SECONDS`
before giving up.

A sidecar trainer whose process is lost (killed, OOM-killed, its container restarted) restarts alone: Ray
starts it again on its node (`SIDECAR_RESTARTS`), with an empty buffer, and its worker goes on without a
trainer until it is back (`tlt.workers.rollout_drafter`: the rollouts of that step are not buffered; the
next stop's acknowledgement says "trainer_lost", the coordinator's event `trainer_restarted`). The tokens
never depend on it. A lost rollout worker's replacement is attached to its sidecar as it starts
(`tlt.runtime.ray_cluster.rollout_starter`), which stops any training it still ran for the lost worker.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import ray
import torch
from torch import nn

from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.intake import buffer_and_agreement
from tlt.drafter.trainer import SpotTrainer
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.spec.run import RunSpec
from tlt.workers.rollout_state import node_id
from tlt.workers.services import hub_push

log = logging.getLogger(__name__)

TRAINER_RESOURCE_PREFIX = "tlt_trainer_"
# The kubelet's restart back-off of a crashed container is capped at 5 minutes: a sidecar that
# died is back within that, or it will not come back without the operator replacing its pod.
TRAINER_REJOIN_SECONDS = 300.0
SIDECAR_RESTARTS = 3  # Ray restarts a lost sidecar trainer's process up to this many times in a run


class SidecarPlacementError(ValueError):
    """`drafter.placement: sidecar` but the cluster has no drafter-trainer node for a rollout worker."""


def trainer_resource(worker: str) -> str:
    """The custom resource of worker `rollout-<rank>`'s drafter-trainer node: `tlt_trainer_rollout-<rank>`."""
    return f"{TRAINER_RESOURCE_PREFIX}{worker}"


def trainer_nodes(resources: Mapping[str, float]) -> int:
    """How many drafter-trainer nodes the cluster's resources show (each advertises one unit of its own)."""
    return sum(int(n) for name, n in resources.items() if name.startswith(TRAINER_RESOURCE_PREFIX))


def require_trainer_nodes(spec: RunSpec, resources: Mapping[str, float], workers: list[str] | None = None) -> None:
    """Raise SidecarPlacementError unless every rollout worker has its drafter-trainer node: one per
    `rollout.replicas`, and, given the `workers`' names, each one's own `tlt_trainer_<worker>`."""
    wanted = max(spec.rollout.replicas, 1)
    missing = (
        [trainer_resource(w) for w in workers if resources.get(trainer_resource(w), 0) < 1]
        if workers is not None
        else []
    )
    have = trainer_nodes(resources)
    if have >= wanted and not missing:
        return
    detail = f"missing {', '.join(missing)}" if missing else f"found {have} of {wanted}"
    raise SidecarPlacementError(
        f"drafter.placement is 'sidecar' but not every rollout worker has its drafter-trainer node in the Ray "
        f"cluster ({detail}): the sidecar runs only on Kubernetes, as the `drafter-trainer` container of each "
        f"rollout pod (`tlt drafter-trainer`, added by the operator). On one machine (`tlt train`) or without "
        f"a GPU DRA driver use drafter.placement 'in-container' (the default)"
    )


def await_trainer_nodes(
    spec: RunSpec,
    resources: Mapping[str, float],
    workers: list[str] | None = None,
    timeout: float = 0.0,
    poll: float = 2.0,
) -> Mapping[str, float]:
    """`require_trainer_nodes` on `resources`; while it fails and `timeout` (seconds) has not passed, again
    on the cluster's live resources. Returns the resources that passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            require_trainer_nodes(spec, resources, workers)
            return resources
        except SidecarPlacementError as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("waiting for drafter-trainer nodes: %s", exc)
        time.sleep(poll)
        resources = ray.cluster_resources()


def bound_head(head: Mapping[str, torch.Tensor]) -> tuple[nn.Embedding, nn.Linear]:
    """Frozen modules over the policy's embedding [V, H], LM head [V, H] and optional bias [V]
    (`tlt.drafter.intake.policy_head`), for `EagleDrafter.bind`."""
    embed = nn.Embedding.from_pretrained(head["embed"], freeze=True)
    weight = head["head"]
    bias = head.get("head_bias")
    lm_head = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    lm_head.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lm_head.bias = nn.Parameter(bias, requires_grad=False)
    return embed, lm_head


class SidecarTrainer:
    """The online buffer and the spot trainer of one rollout worker, on its pod's drafter-trainer node."""

    def __init__(self, worker: str, spec: RunSpec, target_config: Any, hub: Any, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.worker = worker
        self.spec = spec
        drafter = EagleDrafter(drafter_config_from_target(target_config)).float().eval()
        self.buffer = OnlineBuffer(spec.drafter.buffer_steps, spec.drafter.batch_tokens, seed=spec.algorithm.seed)
        self.trainer = SpotTrainer(
            worker, drafter, self.buffer, hub_push(hub), learning_rate=spec.drafter.learning_rate
        )
        self.node = node_id()

    def node_id(self) -> str:
        return self.node

    def status(self) -> dict[str, Any]:
        """Its worker, process and node (a liveness probe)."""
        return {"worker": self.worker, "pid": os.getpid(), "node": self.node}

    def take_rollouts(
        self,
        step: int,
        completions: list[Any],
        head: dict[str, torch.Tensor],
        drafter: tuple[int, dict[str, torch.Tensor]] | None,
        candidate: tuple[int, dict[str, torch.Tensor]] | None = None,
    ) -> dict[str, Any]:
        """Bind the drafter to this step's policy head, take the step's drafter (if given), buffer the
        completions; returns the agreement dict of an in-container worker (the candidate's too)."""
        if self.trainer.active:
            raise RuntimeError(f"sidecar of {self.worker}: rollouts of step {step} handed in while it trains")
        self.trainer.drafter.bind(*bound_head(head))
        if drafter is not None:
            self.trainer.load(*drafter)
        return buffer_and_agreement(
            self.buffer, self.trainer, completions, step, self.spec.drafter.batch_tokens, candidate
        )

    def start_training(self, step: int) -> float:
        """Start training for `step`; a sidecar with no rollouts handed in yet (restarted since its worker's
        rollout) has nothing to train on and does not start."""
        if not self.trainer.drafter.is_bound:
            log.warning("sidecar of %s: no rollouts since it started; not training in step %d", self.worker, step)
            return time.time()
        return self.trainer.start(step)

    def stop_training(self) -> dict[str, Any]:
        """Stop (if running) and acknowledge with this process's timestamps and its node."""
        if not self.trainer.active:
            now = time.time()
            return {"was_training": False, "stop_received_at": now, "stopped_at": now, "trainer_node": self.node}
        return {"was_training": True, **self.trainer.stop(), "trainer_node": self.node}

    def trainer_state(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def iterations(self) -> int:
        run = self.trainer.current
        return run.iterations if run is not None else 0


def create_sidecars(
    spec: RunSpec,
    workers: list[str],
    target_config: Any,
    hub: Any,
    resources: Mapping[str, float],
    cpus: float,
    threads: int,
    wait: float = 0.0,
) -> list[Any]:
    """One SidecarTrainer per worker name, each on that worker's drafter-trainer node (waiting up to `wait`
    seconds for missing ones); ready when returned."""
    await_trainer_nodes(spec, resources, workers, timeout=wait)
    cls = ray.remote(SidecarTrainer)
    sidecars = [
        cls.options(
            num_cpus=cpus,
            max_concurrency=2,
            resources={trainer_resource(w): 1},
            max_restarts=SIDECAR_RESTARTS,
            max_task_retries=0,
        ).remote(w, spec, target_config, hub, threads)
        for w in workers
    ]
    nodes = ray.get([s.node_id.remote() for s in sidecars])
    log.info("started %d sidecar drafter trainers on nodes %s", len(sidecars), nodes)
    return sidecars
