"""A step's shards on real Ray actors, one of them SIGKILLed in the middle of its shard.

The actors stand in for rollout workers (`rollout` sleeps, then echoes its shard): what is tested is the
dispatch, the retry of a lost worker's shard on a free worker or on its replacement, the order of the
results, the events, and how failures are classified (`tlt.runtime.failure_kinds`) on Ray's own errors.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from tlt.runtime.failure_kinds import LOST, PERMANENT, TRANSIENT, classify, failure_line
from tlt.runtime.ray_cluster import Actors
from tlt.runtime.restarts import RunFailed
from tlt.runtime.rollout_dispatch import StepRollout
from tlt.runtime.step_recovery import StepRecovery
from tlt.runtime.worker_replacement import ask_each, lost_ranks
from tlt.tasks.problem import Problem

pytestmark = pytest.mark.slow


class FakeWorker:
    """A rollout worker's calls the dispatch makes; `seconds`: how long a rollout takes."""

    def __init__(self, rank: int, seconds: float, boot: float = 0.0) -> None:
        time.sleep(boot)
        self.name = f"rollout-{rank}"
        self.seconds = seconds
        self.rollouts = 0

    def status(self) -> dict:
        return {"worker": self.name, "pid": os.getpid()}

    def rollout(self, step, ids, problems, weights, drafter, candidate) -> dict:
        time.sleep(self.seconds)
        self.rollouts += 1
        return {"worker": self.name, "ids": list(ids), "answers": [p.answer for p in problems], "n": self.rollouts}

    def settle(self) -> None:
        return None

    def count(self) -> int:
        return self.rollouts


@pytest.fixture(scope="module")
def local_ray():
    here = os.path.dirname(__file__)  # the workers import this module's actor classes
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = {"env_vars": {"PYTHONPATH": path}}
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env=env)
    yield
    ray.shutdown()


def problems(n: int) -> list[Problem]:
    return [Problem(prompt=f"q{i}", answer=str(i)) for i in range(n)]


def start(rank: int, seconds: float, boot: float = 0.0):
    return ray.remote(FakeWorker).options(num_cpus=0, max_concurrency=2).remote(rank, seconds, boot)


def run_step(workers, replace, kill_rank: int | None):
    events: list[tuple[str, dict]] = []
    names = [ray.get(w.status.remote())["worker"] for w in workers]
    pids = [ray.get(w.status.remote())["pid"] for w in workers]
    actors = Actors(rollout=workers, verifiers=[], hub=None, names=names, replace=replace)
    rollout = StepRollout(actors, 1, list(range(6)), problems(6), (None, None, None))
    assert rollout.dispatch() == len(workers)
    if kill_rank is not None:
        os.kill(pids[kill_rank], signal.SIGKILL)
    collected = rollout.collect(None, lambda kind, **info: events.append((kind, info)), lambda skip=(): None)
    return collected, events, rollout


def test_a_killed_workers_shard_is_generated_by_a_free_worker_and_the_results_keep_shard_order(local_ray):
    workers = [start(0, 2.0), start(1, 0.2), start(2, 0.2)]
    replacement_ranks: list[int] = []

    def replace(rank: int):
        replacement_ranks.append(rank)
        return start(rank, 0.2, boot=5.0)  # slower to start than the survivors are to finish

    collected, events, rollout = run_step(workers, replace, kill_rank=0)
    assert [r["ids"] for r in collected.results] == [[0, 1], [2, 3], [4, 5]]
    assert [r["answers"] for r in collected.results] == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert replacement_ranks == [0]
    kinds = [kind for kind, _ in events]
    assert kinds == ["worker_replaced", "shard_retry"]
    retry = events[1][1]
    assert retry["lost"] == "rollout-0" and retry["shard"] == 0 and retry["prompts"] == 2 and retry["attempt"] == 1
    assert retry["retried_on"] in ("rollout-1", "rollout-2") and "died" in retry["reason"].lower()
    assert collected.recoveries == [retry]
    assert collected.results[0]["worker"] == retry["retried_on"]
    # the dead actor is swapped in place; the replacement serves the next step
    assert (
        rollout.actors.rollout[0] is not None
        and ray.get(rollout.actors.rollout[0].status.remote())["worker"] == "rollout-0"
    )
    assert ray.get(rollout.actors.rollout[0].rollout.remote(2, [9], problems(10)[9:], None, None, None))["ids"] == [9]


def test_a_replacement_that_is_up_first_takes_the_lost_shard(local_ray):
    # the other worker's shard takes 20 s: a replacement process starts in ~2 s on an idle machine, and the
    # margin covers one under a full test run's load (8 s did not, once)
    workers = [start(0, 3.0), start(1, 20.0)]
    collected, events, rollout = run_step(workers, lambda rank: start(rank, 0.2), kill_rank=0)
    retry = dict(events)["shard_retry"]
    assert retry["retried_on"] == "rollout-0", "the replacement, up in well under 20 s, took its own shard"
    assert [r["ids"] for r in collected.results] == [[0, 1, 2], [3, 4, 5]]


def test_ask_each_asks_each_worker_once_gives_its_value_to_its_last_shard_and_skips_the_lost(local_ray):
    worker, other, doomed = start(0, 0.0), start(1, 0.0), start(2, 0.0)
    ray.get([worker.rollout.remote(1, [0], problems(1), None, None, None) for _ in range(2)])
    os.kill(ray.get(doomed.status.remote())["pid"], signal.SIGKILL)
    assert ask_each([worker, other, worker, doomed], "count", -1) == [-1, 0, 2, -1]
    assert lost_ranks([worker, doomed, other]) == [1]


def test_without_a_replacement_a_lost_worker_fails_the_step(local_ray):
    workers = [start(0, 2.0), start(1, 0.2)]
    with pytest.raises(ray.exceptions.RayActorError):
        run_step(workers, None, kill_rank=0)


@ray.remote(num_cpus=0)
def raises(kind: str):
    if kind == "value":
        raise ValueError("speculative.arms[0]: head_dim 16 is not supported")
    raise RuntimeError("CUDA error: an illegal memory access")


class BadInit:
    def __init__(self) -> None:
        raise FileNotFoundError("no such file: /models/policy/config.json")

    def ping(self) -> None:
        return None


def failure(ref) -> BaseException:
    with pytest.raises(Exception) as caught:
        ray.get(ref, timeout=60)
    return caught.value


def test_failures_are_classified_on_rays_own_errors(local_ray):
    value = failure(raises.remote("value"))
    assert classify(value) == PERMANENT
    assert failure_line(value) == "ValueError: speculative.arms[0]: head_dim 16 is not supported"
    runtime = failure(raises.remote("runtime"))
    assert classify(runtime) == TRANSIENT and failure_line(runtime).startswith("RuntimeError: CUDA error")
    bad = ray.remote(BadInit).options(num_cpus=0).remote()
    init = failure(bad.ping.remote())
    assert classify(init) == PERMANENT and "FileNotFoundError" in failure_line(init)
    victim = start(5, 30.0)
    pid = ray.get(victim.status.remote())["pid"]
    ref = victim.rollout.remote(1, [0], problems(1), None, None, None)
    os.kill(pid, signal.SIGKILL)
    assert classify(failure(ref)) == LOST


def test_the_coordinator_fails_at_once_on_a_permanent_error_and_restarts_on_a_transient_one(local_ray):
    emitted: list = []
    recovery = StepRecovery(lambda kind, **info: emitted.append((kind, info)))
    with pytest.raises(
        RunFailed, match=r"^step 2 failed: ValueError: speculative.arms\[0\]: head_dim 16 .*not retried"
    ):
        recovery.fail_if_permanent(failure(raises.remote("value")), 2)
    assert emitted == [
        ("failed", {"reason": "ValueError: speculative.arms[0]: head_dim 16 is not supported", "retried": False})
    ]
    recovery.fail_if_permanent(failure(raises.remote("runtime")), 2)  # returns: the step restarts
    assert len(emitted) == 1
