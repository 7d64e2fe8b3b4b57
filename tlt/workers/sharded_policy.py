"""The policy role over a policy group: the update runs on `policy.world` rank processes (Ray actors,
`PolicyRank`), sharded as `policy.sharding` says; the coordinator keeps the tokenizer, the config and a copy
of the full master weights (no gradients, no optimizer state) for the rollout engines, held-out evaluation
and the final Hugging Face folder.

Placement (as veRL's worker groups): rank r runs on the r // per_pod-th policy node, per_pod =
max(1, policy.resources.gpus) ranks a node; node 0 is the coordinator's own, the others the policy pods that
advertise `tlt_policy` (`tlt worker` on policy ranks > 0), in a fixed order. On one machine (`on_pods`
false) every rank runs there, each with its share of the cores. The group meets at rank 0's node (127.0.0.1
when all ranks share the coordinator's machine) on a free port; a rank that cannot join within
`join_timeout_s` fails the run in one line naming the rank and the address.

The group is one failure domain, as a torchrun job is: a lost rank fails the step, and the coordinator's
restart (`tlt.runtime.restarts`) starts a fresh group from the newest checkpoint.

Checkpoints: the shards through DCP into the checkpoint's folder `policy_shards` (`tlt.workers.policy_shards`),
written by every rank into the checkpoint's temporary folder, so the checkpoint root must be a filesystem
every policy rank sees (one machine, or `checkpoint.claimName` on Kubernetes). A checkpoint written at one
world size loads at any other, and one of a one-rank run (flat weights) loads too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ray
import torch
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tlt.checkpoint.store import Checkpoint
from tlt.models.loading import load_policy, resolve_dtype, save_policy
from tlt.rollout.types import Completion
from tlt.runtime.devices import to_cpu
from tlt.runtime.ray_cluster import ROLE_RESOURCES
from tlt.spec.run import RunSpec
from tlt.spec.spec_warnings import one_rank_sharding
from tlt.workers.policy import POLICY_DIR, PolicyRole, master_dtype
from tlt.workers.policy_rank import PolicyRank
from tlt.workers.policy_shards import POLICY_SHARDS

log = logging.getLogger(__name__)

POLICY_RESOURCE = ROLE_RESOURCES["policy"]  # advertised by policy pods > 0
JOIN_TIMEOUT_S = 300.0
LOOPBACK = "127.0.0.1"


class GroupJoinError(RuntimeError):
    """A policy rank could not join the group (its line names the rank and the address)."""


def policy_nodes(nodes: list[dict[str, Any]], here: str) -> list[str]:
    """Node ids the group's ranks run on, in rank order: `here` (the coordinator's), then every alive node
    advertising `tlt_policy`, ordered by address (then id)."""
    others = sorted(
        (n.get("NodeManagerAddress", ""), n["NodeID"])
        for n in nodes
        if n.get("Alive") and n["NodeID"] != here and n.get("Resources", {}).get(POLICY_RESOURCE, 0) > 0
    )
    return [here, *(node for _, node in others)]


def rank_nodes(world: int, per_node: int, nodes: list[str]) -> list[str]:
    """The node of each rank: `per_node` consecutive ranks a node. ValueError naming the shortfall."""
    needed = -(-world // per_node)
    if len(nodes) < needed:
        raise ValueError(
            f"policy: {world} ranks at {per_node} a node need {needed} policy nodes, {len(nodes)} joined "
            f"(the coordinator's and {len(nodes) - 1} advertising {POLICY_RESOURCE})"
        )
    return [nodes[r // per_node] for r in range(world)]


class ShardedPolicyRole:
    """`PolicyRole`'s interface over a group of `spec.policy.world` ranks."""

    def __init__(
        self,
        spec: RunSpec,
        policy_path: str,
        *,
        threads: int,
        on_pods: bool,
        join_timeout_s: float = JOIN_TIMEOUT_S,
    ) -> None:
        self.spec = spec
        self.world = spec.policy.world
        self.sharding = spec.policy.group_sharding
        self.policy, self.tokenizer = load_policy(policy_path, master_dtype(spec.model.dtype))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.compute_dtype = resolve_dtype(spec.model.dtype)
        gpus = spec.policy.resources.gpus
        per_node = max(1, gpus) if on_pods else self.world  # one machine: every rank on it
        here = ray.get_runtime_context().get_node_id()
        nodes = rank_nodes(self.world, per_node, policy_nodes(ray.nodes(), here))
        rank_cls = ray.remote(PolicyRank)
        rank_threads = max(1, threads // per_node)
        self.ranks = [
            rank_cls.options(
                num_cpus=0,  # its node's CPUs are the update's (the head offers Ray none)
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            ).remote(
                rank,
                self.world,
                spec,
                policy_path,
                rank_threads,
                f"cuda:{rank % per_node}" if gpus else "cpu",
            )
            for rank, node in enumerate(nodes)
        ]
        try:
            places = ray.get([r.place.remote() for r in self.ranks])
            address = LOOPBACK if all(p["node"] == here for p in places) else places[0]["ip"]
            port = ray.get(self.ranks[0].rendezvous.remote(address))
            joined = ray.get([r.join.remote(address, port, join_timeout_s) for r in self.ranks])
        except RayTaskError as exc:  # the rank's own line (`init_group`: the rank and the address it tried)
            self.kill()
            raise GroupJoinError(str(exc.cause).splitlines()[0] if exc.cause is not None else str(exc)) from None
        except BaseException:
            self.kill()
            raise
        self.state_bytes = [j["state_bytes"] for j in joined]
        self.places = [{"rank": r, "ip": p["ip"], "pid": p["pid"]} for r, p in enumerate(places)]
        log.info(
            "policy group: %d ranks (%s) at %s:%d, pids %s, %s state bytes a rank",
            self.world,
            self.sharding,
            address,
            port,
            [p["pid"] for p in places],
            self.state_bytes,
        )

    @property
    def config(self) -> Any:
        return self.policy.config

    def _each(self, method: str, *args: Any) -> list[Any]:
        return ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    def _pull_weights(self) -> None:
        """The coordinator's copy from the group's full weights (gathered tensor by tensor on rank 0)."""
        self.policy.load_state_dict(self._each("full_weights")[0])

    def update(self, completions: list[Completion], rewards: torch.Tensor) -> dict[str, float]:
        """One step's GRPO update on the group: the group's metrics (identical on every rank) and each rank's
        share (`policy_rank_sequences`, `policy_rank_tokens`, in rank order)."""
        step_input = ray.put((completions, rewards))
        results = self._each("update", step_input)
        shares = [r.pop("rank_share") for r in results]
        self._pull_weights()
        return {
            **results[0],
            "policy_rank_sequences": [s["sequences"] for s in shares],
            "policy_rank_tokens": [s["tokens"] for s in shares],
        }

    def rollout_weights(self) -> dict[str, torch.Tensor]:
        return to_cpu(self.policy.state_dict(), self.compute_dtype)

    def add_to(self, ckpt: Checkpoint) -> None:
        """The policy's part of a checkpoint: the shards (folder `policy_shards`, written by every rank), the
        coordinator's torch RNG, the world and sharding that wrote them."""
        ckpt.tensors["rng"] = {"torch": torch.get_rng_state()}
        ckpt.folders[POLICY_SHARDS] = lambda folder: self._each("save_shards", str(folder))
        ckpt.state["policy_group"] = {"world": self.world, "sharding": self.sharding}

    def load(self, ckpt: Checkpoint) -> None:
        """Restore a checkpoint of any world size: shards through DCP, or a one-rank run's flat weights."""
        if "policy" in ckpt.tensors:
            weights, optimizer = ray.put(ckpt.tensors["policy"]), ray.put(ckpt.objects["optimizer"])
            self._each("load_full", weights, optimizer)
        else:
            self._each("load_shards", str(ckpt.folder_path(POLICY_SHARDS)))
        self._pull_weights()
        torch.set_rng_state(ckpt.tensors["rng"]["torch"])

    def save(self, out_dir: Path) -> Path:
        folder = Path(out_dir) / POLICY_DIR
        save_policy(self.policy, self.tokenizer, folder)
        return folder

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []


def policy_role(
    spec: RunSpec, policy_path: str, warmstart: Any, placement: Any, on_pods: bool
) -> PolicyRole | ShardedPolicyRole:
    """The Ray loop's policy role: the group above one policy rank, else the coordinator's own (a sharding
    asked for at one rank is warned of and not applied). `placement`: `ray_cluster.Placement`."""
    if spec.policy.world > 1:
        return ShardedPolicyRole(spec, policy_path, threads=placement.driver_threads, on_pods=on_pods)
    if spec.policy.sharding in ("ddp", "fsdp"):
        log.warning(one_rank_sharding(spec))
    return PolicyRole(spec, warmstart, placement.gpus.policy_device)
