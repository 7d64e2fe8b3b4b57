"""`tlt worker`: the operator's pod entry point builds exact `ray start` argument lists, checks the spec and
the environment contract, and never runs a shell. No real Ray is started here."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tlt.cli import main
from tlt.commands import worker
from tlt.runtime import ray_train
from tlt.runtime.ray_cluster import ROLE_RESOURCES
from tlt.spec.manifest_io import load_run

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "run.yaml"
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
HEAD = "policy-0.demo-workers:6379"


def contract_env(role: str = "rollout", rank: str = "1") -> dict[str, str]:
    return {
        "TLT_RUN_NAME": "demo",
        "TLT_ROLE": role,
        "TLT_RANK": rank,
        "TLT_POD_NAME": f"demo-{role}-{rank}",
        "TLT_NAMESPACE": "ml",
        "TLT_POD_IP": "10.1.2.3",
        "TLT_HEAD_ADDRESS": HEAD,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "t0k",
    }


def args_for(role: str, spec: Path = SPEC, out: Path = Path("/var/lib/tlt")) -> argparse.Namespace:
    return argparse.Namespace(role=role, spec=spec, out=out, join_timeout=5.0)


def test_head_args_start_the_gcs_on_the_head_address_port():
    assert worker.ray_start_args("policy", 0, HEAD, "10.1.2.3") == [
        *RAY,
        "start",
        "--head",
        "--port",
        "6379",
        "--node-ip-address",
        "10.1.2.3",
        "--disable-usage-stats",
        "--num-cpus",
        "0",
        "--num-gpus",
        "0",
        "--include-dashboard",
        "false",
        "--block",
    ]


@pytest.mark.parametrize("role,resource", [("rollout", "tlt_rollout"), ("verifier", "tlt_verifier")])
def test_rollout_and_verifier_join_the_head_with_their_role_resource(role, resource):
    assert worker.ray_start_args(role, 2, HEAD, "10.1.2.4") == [
        *RAY,
        "start",
        "--address",
        HEAD,
        "--node-ip-address",
        "10.1.2.4",
        "--disable-usage-stats",
        "--resources",
        json.dumps({resource: 1}),
        "--block",
    ]


def test_policy_ranks_above_zero_join_advertising_the_policy_resource():
    assert worker.ray_start_args("policy", 1, HEAD, "10.1.2.5") == [
        *RAY,
        "start",
        "--address",
        HEAD,
        "--node-ip-address",
        "10.1.2.5",
        "--disable-usage-stats",
        "--resources",
        json.dumps({"tlt_policy": 1}),
        "--block",
    ]


def test_node_resources_are_the_ones_the_coordinator_asks_for():
    for role in ("rollout", "verifier"):
        argv = worker.ray_start_args(role, 0, HEAD, "10.0.0.1")
        assert json.loads(argv[argv.index("--resources") + 1]) == {ROLE_RESOURCES[role]: 1}


def test_hostile_values_stay_single_arguments():
    ip = "1.2.3.4; rm -rf / #"
    argv = worker.ray_start_args("rollout", 0, "h$(id):6379", ip)
    assert ip in argv and "h$(id):6379" in argv


@pytest.mark.parametrize("address", ["policy-0", "policy-0:", ":6379", "policy-0:http", "policy-0:70000"])
def test_head_address_without_a_valid_port_is_refused(address):
    with pytest.raises(worker.EnvError, match="TLT_HEAD_ADDRESS"):
        worker.head_port(address)


def test_missing_environment_variables_are_all_named():
    env = contract_env()
    del env["TLT_POD_IP"], env["TLT_HEAD_ADDRESS"]
    with pytest.raises(worker.EnvError, match="TLT_POD_IP, TLT_HEAD_ADDRESS"):
        worker.read_env(env, "rollout")


@pytest.mark.parametrize(
    "change,message",
    [({"TLT_RANK": "x"}, "TLT_RANK"), ({"TLT_ROLE": "verifier"}, "TLT_ROLE"), ({"TLT_HEAD_ADDRESS": "nohost"}, "port")],
)
def test_bad_environment_values_are_refused(change, message):
    with pytest.raises(worker.EnvError, match=message):
        worker.read_env({**contract_env(), **change}, "rollout")


def test_environment_is_read_into_the_contract():
    env = worker.read_env(contract_env("policy", "0"), "policy")
    assert env.is_head and env.rank == 0 and env.pod_ip == "10.1.2.3" and env.head_address == HEAD


def test_ray_auth_is_token_mode_by_default_on_every_pod():
    environ = {"HOME": "/home/tlt", "RAY_AUTH_TOKEN": "t"}
    assert worker.ray_environment(environ) == {**environ, "RAY_AUTH_MODE": "token"}
    assert worker.ray_environment({"RAY_AUTH_MODE": "disabled"})["RAY_AUTH_MODE"] == "disabled"


def test_token_mode_without_a_token_is_an_environment_error(tmp_path):
    with pytest.raises(worker.EnvError, match="RAY_AUTH_TOKEN"):
        worker.ray_environment({"HOME": "/home/tlt"})
    environ = {k: v for k, v in contract_env("rollout", "1").items() if k != "RAY_AUTH_TOKEN"}
    assert worker.run(args_for("rollout"), environ) == 2


def test_the_head_needs_the_auth_mode_in_its_own_environment(processes):
    """Ray fixes a driver's auth mode at import: the head (a driver too) cannot default it."""
    environ = {k: v for k, v in contract_env("policy", "0").items() if k != "RAY_AUTH_MODE"}
    assert worker.run(args_for("policy"), environ) == 2
    assert processes.calls == [], "no Ray head started"


def test_missing_nodes_counts_pods_not_yet_joined():
    spec = load_run(SPEC).spec.model_copy(
        update={
            "rollout": load_run(SPEC).spec.rollout.model_copy(update={"replicas": 3}),
            "verifier": load_run(SPEC).spec.verifier.model_copy(update={"replicas": 1}),
        }
    )
    assert worker.missing_nodes(spec, {"CPU": 8.0, "tlt_rollout": 1.0}) == {"tlt_rollout": 2, "tlt_verifier": 1}
    assert worker.missing_nodes(spec, {"tlt_rollout": 3.0, "tlt_verifier": 1.0}) == {}


def test_the_coordinator_waits_for_the_policy_pods_of_a_policy_group_only():
    base = load_run(SPEC).spec
    joined = {"tlt_rollout": float(base.rollout.replicas), "tlt_verifier": float(base.verifier.replicas)}
    group = base.model_copy(update={"policy": base.policy.model_copy(update={"replicas": 3})})
    assert group.policy.world == 3
    assert worker.missing_nodes(group, joined) == {"tlt_policy": 2}
    assert worker.missing_nodes(group, {**joined, "tlt_policy": 2.0}) == {}
    alone = base.model_copy(update={"policy": base.policy.model_copy(update={"replicas": 3, "sharding": "none"})})
    assert worker.missing_nodes(alone, joined) == {}


def test_bad_spec_exits_2_listing_the_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"algorithm": {"steps": -1}, "nope": 1}))
    assert worker.run(args_for("rollout", bad), contract_env()) == 2
    err = capsys.readouterr().err
    assert "algorithm.steps" in err and "nope" in err


def test_missing_environment_exits_2_naming_the_variable(capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", _forbidden)
    monkeypatch.setattr(subprocess, "run", _forbidden)
    env = contract_env()
    del env["TLT_RANK"]
    assert worker.run(args_for("rollout"), env) == 2
    assert "TLT_RANK" in capsys.readouterr().err


def test_worker_is_a_registered_command(tmp_path, capsys, monkeypatch):
    for name in worker.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert main(["worker", "--role", "verifier", "--spec", str(SPEC)]) == 2
    assert "TLT_RUN_NAME" in capsys.readouterr().err


def _forbidden(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("must not be called")


class FakeProcess:
    """Stands in for subprocess.Popen: records argv and keyword arguments; `code` None means it runs until
    terminated."""

    calls: list[tuple[Any, dict[str, Any]]] = []
    started: list[FakeProcess] = []
    code: int | None = 1

    def __init__(self, argv: Any, **kwargs: Any) -> None:
        FakeProcess.calls.append((argv, kwargs))
        FakeProcess.started.append(self)
        self.returncode = FakeProcess.code
        self.terminated = False

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise AssertionError("would block forever")
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated, self.returncode = True, -15


@pytest.fixture
def processes(monkeypatch):
    FakeProcess.calls, FakeProcess.started, FakeProcess.code = [], [], 1
    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(subprocess, "run", _forbidden)
    return FakeProcess


@pytest.mark.parametrize("ray_code,exit_code", [(1, 1), (0, 1), (-9, -9)])
def test_node_runs_ray_start_as_a_list_without_shell_and_fails_when_it_returns(processes, ray_code, exit_code):
    processes.code = ray_code
    assert worker.run(args_for("rollout"), contract_env("rollout", "1")) == exit_code
    [(argv, kwargs)] = processes.calls
    assert argv == worker.ray_start_args("rollout", 1, HEAD, "10.1.2.3")
    assert kwargs.get("shell", False) is False
    assert kwargs["env"] == {**contract_env("rollout", "1"), "RAY_AUTH_MODE": "token"}


def _head_started(monkeypatch, processes, calls: list[Any]) -> None:
    processes.code = None
    monkeypatch.setattr(worker, "wait_for_head", lambda host, port, head, deadline: calls.append(("head", host, port)))
    monkeypatch.setattr(worker, "wait_for_nodes", lambda address, spec, deadline: calls.append(("nodes", address)))


@pytest.mark.parametrize("train_code", [0, 1])
def test_head_starts_ray_trains_in_process_and_stops_ray(monkeypatch, processes, tmp_path, train_code):
    calls: list[Any] = []
    _head_started(monkeypatch, processes, calls)
    monkeypatch.setattr(
        ray_train,
        "train_ray",
        lambda run, out, address, stopped_exit: calls.append(("train", out, address, stopped_exit)) or train_code,
    )
    assert worker.run(args_for("policy", out=tmp_path), contract_env("policy", "0")) == train_code
    [(argv, kwargs)] = processes.calls
    assert argv == worker.ray_start_args("policy", 0, HEAD, "10.1.2.3")
    assert kwargs.get("shell", False) is False
    # a head stopped by SIGTERM after its checkpoint exits 143, never 0 (the pod's Succeeded: the run's)
    assert calls == [
        ("head", "10.1.2.3", 6379),
        ("nodes", "10.1.2.3:6379"),
        ("train", tmp_path, "10.1.2.3:6379", 128 + signal.SIGTERM),
    ]
    assert processes.started[0].terminated, "the Ray head was left running"


def test_head_is_stopped_when_the_coordinator_raises(monkeypatch, processes, tmp_path):
    _head_started(monkeypatch, processes, [])

    def crash(run: Any, out: Path, address: str, stopped_exit: int) -> int:
        assert not processes.started[0].terminated, "the head must run while the coordinator trains"
        raise RuntimeError("boom")

    monkeypatch.setattr(ray_train, "train_ray", crash)
    with pytest.raises(RuntimeError):
        worker.run(args_for("policy", out=tmp_path), contract_env("policy", "0"))
    assert processes.started[0].terminated, "the head outlived a coordinator that raised"


def test_head_fails_when_nodes_never_join(monkeypatch, processes, tmp_path, capsys):
    calls: list[Any] = []
    _head_started(monkeypatch, processes, calls)

    def never(address: str, spec: Any, deadline: float) -> None:
        raise TimeoutError("still waiting for nodes: 2 with tlt_rollout")

    monkeypatch.setattr(worker, "wait_for_nodes", never)
    monkeypatch.setattr(ray_train, "train_ray", _forbidden)
    assert worker.run(args_for("policy", out=tmp_path), contract_env("policy", "0")) == 1
    assert "tlt_rollout" in capsys.readouterr().err


def test_waiting_for_the_head_fails_when_ray_start_exits(processes):
    head = FakeProcess(["ray"])
    with pytest.raises(ConnectionError, match="exited 1"):
        worker.wait_for_head("127.0.0.1", 1, head, deadline=0.0)  # type: ignore[arg-type]


def test_waiting_for_the_head_times_out(processes):
    processes.code = None
    head = FakeProcess(["ray"])
    with pytest.raises(TimeoutError, match="127.0.0.1:1"):
        worker.wait_for_head("127.0.0.1", 1, head, deadline=0.0, poll=0.01)  # type: ignore[arg-type]


@pytest.mark.parametrize("role,rank", [("policy", 0), ("policy", 1), ("rollout", 0), ("verifier", 3)])
def test_ray_cli_parses_the_argument_lists_as_meant(role, rank):
    from ray.scripts.scripts import start

    argv = worker.ray_start_args(role, rank, HEAD, "10.1.2.3")
    assert argv[:4] == [*RAY, "start"]
    params = start.make_context("start", argv[4:]).params
    assert params["node_ip_address"] == "10.1.2.3" and params["disable_usage_stats"]
    assert params["head"] is (rank == 0 and role == "policy")
    assert params["block"]
    assert params["port"] == (6379 if params["head"] else None)
    assert params["num_cpus"] == (0 if params["head"] else None)
    assert params["address"] == (None if params["head"] else HEAD)
    assert json.loads(params["resources"]) == ({} if params["head"] else {ROLE_RESOURCES[role]: 1})


def test_a_policy_group_over_pods_needs_one_checkpoint_filesystem():
    base = load_run(SPEC).spec
    group = base.model_copy(update={"policy": base.policy.model_copy(update={"replicas": 2})})
    unclaimed = group.model_copy(update={"checkpoint": base.checkpoint.model_copy(update={"claim_name": None})})
    problem = worker.shared_checkpoint_problem(unclaimed)
    assert problem is not None and "checkpoint.claimName" in problem and "2 policy ranks on 2 pods" in problem
    claimed = group.model_copy(update={"checkpoint": base.checkpoint.model_copy(update={"claim_name": "ckpt"})})
    assert worker.shared_checkpoint_problem(claimed) is None
    alone = base.model_copy(update={"policy": base.policy.model_copy(update={"replicas": 2, "sharding": "none"})})
    assert worker.shared_checkpoint_problem(alone) is None
    assert worker.shared_checkpoint_problem(base) is None
