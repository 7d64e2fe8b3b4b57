"""`tlt drafter-trainer`: the rollout pod's sidecar builds an exact `ray start` argument list (a second Ray node
on the pod's IP with its own per-worker resource, temp dir and ports), checks the spec and the environment
contract, never runs a shell; the head waits for the sidecars; placement needs one trainer node per rollout
worker. No real Ray is started here."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tlt.cli import main
from tlt.commands import drafter_trainer, worker
from tlt.drafter.intake import policy_head
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.runtime import ray_sidecar
from tlt.runtime.ray_sidecar import (
    SidecarPlacementError,
    await_trainer_nodes,
    bound_head,
    require_trainer_nodes,
    trainer_resource,
)
from tlt.spec.run import RunSpec

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
HEAD = "policy-0.demo-workers:6379"
SIDECAR = {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com"}


def contract_env(pod: str = "demo-rollout-3", role: str = "rollout") -> dict[str, str]:
    return {
        "TLT_RUN_NAME": "demo",
        "TLT_ROLE": role,
        "TLT_RANK": "3",
        "TLT_POD_NAME": pod,
        "TLT_NAMESPACE": "ml",
        "TLT_POD_IP": "10.1.2.3",
        "TLT_HEAD_ADDRESS": HEAD,
        "RAY_AUTH_TOKEN": "t0k",
    }


def spec_file(tmp_path: Path, drafter: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "demo"},
                "spec": {"drafter": drafter},
            }
        )
    )
    return path


def args_for(spec: Path) -> argparse.Namespace:
    return argparse.Namespace(spec=spec, temp_dir=drafter_trainer.TEMP_DIR)


def test_sidecar_joins_the_head_as_a_second_node_with_its_workers_trainer_resource():
    assert drafter_trainer.sidecar_ray_start_args("rollout-3", HEAD, "10.1.2.3") == [
        *RAY,
        "start",
        "--address",
        HEAD,
        "--node-ip-address",
        "10.1.2.3",
        "--disable-usage-stats",
        "--resources",
        json.dumps({"tlt_trainer_rollout-3": 1}),
        "--temp-dir",
        "/tmp/ray-drafter-trainer",
        "--dashboard-agent-listen-port",
        "0",
        "--min-worker-port",
        "0",
        "--max-worker-port",
        "0",
        "--block",
    ]


def test_sidecar_node_keeps_clear_of_the_rollout_containers_node():
    sidecar = drafter_trainer.sidecar_ray_start_args("rollout-0", HEAD, "10.0.0.1")
    rollout = worker.ray_start_args("rollout", 0, HEAD, "10.0.0.1")
    assert sidecar[sidecar.index("--node-ip-address") + 1] == rollout[rollout.index("--node-ip-address") + 1]
    assert "--temp-dir" not in rollout and sidecar[sidecar.index("--temp-dir") + 1] != "/tmp/ray"
    assert "--dashboard-agent-listen-port" not in rollout, "the rollout node keeps Ray's fixed default port"
    assert json.loads(sidecar[sidecar.index("--resources") + 1]) == {trainer_resource("rollout-0"): 1}
    assert trainer_resource("rollout-0") != worker.ROLE_RESOURCES["rollout"]


def test_hostile_values_stay_single_arguments():
    ip = "1.2.3.4; rm -rf / #"
    argv = drafter_trainer.sidecar_ray_start_args("rollout-0", "h$(id):6379", ip)
    assert ip in argv and "h$(id):6379" in argv


def test_environment_gives_the_worker_name_of_the_rollout_pod():
    assert drafter_trainer.sidecar_worker(contract_env()) == ("rollout-3", HEAD, "10.1.2.3")


@pytest.mark.parametrize(
    "env,message",
    [
        (contract_env(role="verifier"), "TLT_ROLE is 'verifier' but --role is 'rollout'"),
        (contract_env(pod="demo-verifier-3"), "TLT_POD_NAME.*not a rollout pod name"),
        ({**contract_env(), "TLT_HEAD_ADDRESS": "policy-0"}, "TLT_HEAD_ADDRESS"),
    ],
)
def test_environment_of_another_role_or_a_bad_one_is_refused(env, message):
    with pytest.raises(worker.EnvError, match=message):
        drafter_trainer.sidecar_worker(env)


def test_spec_without_sidecar_placement_exits_2(tmp_path, capsys):
    assert drafter_trainer.run(args_for(spec_file(tmp_path, {})), contract_env()) == 2
    assert "drafter.placement is 'in-container'" in capsys.readouterr().err


def test_bad_spec_exits_2(tmp_path, capsys):
    bad = spec_file(tmp_path, {"placement": "sidecar"})  # no deviceClassName
    assert drafter_trainer.run(args_for(bad), contract_env()) == 2
    assert "deviceClassName" in capsys.readouterr().err


def test_missing_environment_exits_2_naming_the_variable(tmp_path, capsys):
    env = contract_env()
    del env["TLT_POD_IP"]
    assert drafter_trainer.run(args_for(spec_file(tmp_path, SIDECAR)), env) == 2
    assert "TLT_POD_IP" in capsys.readouterr().err


def test_drafter_trainer_is_a_registered_command(tmp_path, capsys, monkeypatch):
    for name in worker.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert main(["drafter-trainer", "--spec", str(spec_file(tmp_path, SIDECAR))]) == 2
    assert "TLT_RUN_NAME" in capsys.readouterr().err


class FakeProcess:
    """Stands in for subprocess.Popen: records argv and keyword arguments, exits with `code`."""

    calls: list[tuple[Any, dict[str, Any]]] = []
    code = 1

    def __init__(self, argv: Any, **kwargs: Any) -> None:
        FakeProcess.calls.append((argv, kwargs))
        self.returncode = FakeProcess.code

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def poll(self) -> int:
        return self.returncode


@pytest.mark.parametrize("ray_code,exit_code", [(1, 1), (0, 1), (-9, -9)])
def test_sidecar_runs_ray_start_as_a_list_without_shell_and_fails_when_it_returns(
    monkeypatch, tmp_path, ray_code, exit_code
):
    FakeProcess.calls, FakeProcess.code = [], ray_code
    monkeypatch.setattr(subprocess, "Popen", FakeProcess)
    assert drafter_trainer.run(args_for(spec_file(tmp_path, SIDECAR)), contract_env()) == exit_code
    [(argv, kwargs)] = FakeProcess.calls
    assert argv == drafter_trainer.sidecar_ray_start_args("rollout-3", HEAD, "10.1.2.3")
    assert kwargs.get("shell", False) is False
    assert kwargs["env"] == {**contract_env(), "RAY_AUTH_MODE": "token"}


def test_head_waits_for_every_sidecar_only_with_sidecar_placement():
    spec = RunSpec.model_validate({"rollout": {"replicas": 2}, "verifier": {"replicas": 0}, "drafter": SIDECAR})
    joined = {"tlt_rollout": 2.0}
    assert worker.missing_nodes(spec, joined) == {"tlt_trainer_*": 2}
    assert worker.missing_nodes(spec, {**joined, "tlt_trainer_rollout-0": 1.0}) == {"tlt_trainer_*": 1}
    assert worker.missing_nodes(spec, {**joined, "tlt_trainer_rollout-0": 1.0, "tlt_trainer_rollout-1": 1.0}) == {}
    in_container = RunSpec.model_validate({"rollout": {"replicas": 2}, "verifier": {"replicas": 0}})
    assert worker.missing_nodes(in_container, joined) == {}


def test_sidecar_placement_needs_a_trainer_node_per_rollout_worker_and_names_the_field():
    spec = RunSpec.model_validate({"rollout": {"replicas": 2}, "drafter": SIDECAR})
    with pytest.raises(SidecarPlacementError, match="drafter.placement.*found 0 of 2.*'in-container'"):
        require_trainer_nodes(spec, {"CPU": 4.0, "tlt_rollout": 2.0})
    with pytest.raises(SidecarPlacementError, match="missing tlt_trainer_rollout-1"):
        require_trainer_nodes(
            spec, {"tlt_trainer_rollout-0": 1.0, "tlt_trainer_rollout-7": 1.0}, ["rollout-0", "rollout-1"]
        )
    require_trainer_nodes(
        spec, {"tlt_trainer_rollout-0": 1.0, "tlt_trainer_rollout-1": 1.0}, ["rollout-0", "rollout-1"]
    )


def test_coordinator_waits_for_a_restarting_sidecar_only_when_asked(monkeypatch):
    spec = RunSpec.model_validate({"rollout": {"replicas": 1}, "drafter": SIDECAR})
    live = iter([{"tlt_rollout": 1.0}, {"tlt_rollout": 1.0, "tlt_trainer_rollout-0": 1.0}])
    monkeypatch.setattr(ray_sidecar.ray, "cluster_resources", lambda: next(live))
    monkeypatch.setattr(ray_sidecar.time, "sleep", lambda s: None)
    with pytest.raises(SidecarPlacementError):
        await_trainer_nodes(spec, {"tlt_rollout": 1.0}, ["rollout-0"])
    assert await_trainer_nodes(spec, {"tlt_rollout": 1.0}, ["rollout-0"], timeout=60) == {
        "tlt_rollout": 1.0,
        "tlt_trainer_rollout-0": 1.0,
    }


@pytest.mark.parametrize("tied", [False, True])
def test_sidecar_drafter_bound_to_the_shipped_head_matches_one_bound_to_the_policy(tied):
    """What the worker ships (embedding + LM head) is all the sidecar's drafter needs: same logits."""
    policy = tiny_model("qwen2", dtype=torch.float64, tie_word_embeddings=tied)
    config = drafter_config_from_target(policy.config)
    here, there = EagleDrafter(config).double(), EagleDrafter(config).double()
    there.load_state_dict(here.state_dict())
    here.bind_policy(policy)
    there.bind(*bound_head(policy_head(policy)))
    hidden = policy.config.hidden_size
    ids = torch.randint(0, policy.config.vocab_size, (1, 5))
    features, positions = torch.randn(1, 5, hidden, dtype=torch.float64), torch.arange(5)[None]
    pred_here, pred_there = here(ids, features, positions), there(ids, features, positions)
    assert torch.equal(here.logits(pred_here), there.logits(pred_there))
