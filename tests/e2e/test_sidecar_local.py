"""`drafter.placement: sidecar` on this machine: three "containers" as local processes on one IP, as in a
rollout pod: `tlt worker --role policy` (Ray head + coordinator), `tlt worker --role rollout`, and the rollout
pod's `tlt drafter-trainer` sidecar (a second Ray node on the same IP, its own temp dir and ports). The run
finishes, the drafter trains on the sidecar's node (not the rollout worker's), and its gradients reach the
hub. Without drafter-trainer nodes (`tlt train` on one machine) a sidecar run stops with an error naming
`drafter.placement`.

Each process stops only its own Ray node (SIGTERM to its `ray start --block`), never `ray stop`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from _local_pods import free_port, node_ip

from tlt.spec.manifest_io import load_run
from tlt.tasks.warmstart import reduced_config, warm_start

SIDECAR = {"placement": "sidecar", "deviceClassName": "gpu.nvidia.com"}


def _write_spec(path: Path, policy: Path, steps: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "sc"},
                "spec": {
                    "model": {"path": str(policy), "dtype": "float32", "maxContext": 256},
                    "dataset": {"builtin": {"numTrain": 32, "numEval": 8}},
                    "algorithm": {
                        "steps": steps,
                        "promptsPerStep": 2,
                        "groupSize": 2,
                        "maxNewTokens": 16,
                        "microBatchSize": 4,
                    },
                    "rollout": {"replicas": 1, "resources": {"cpu": "1"}},
                    "verifier": {"replicas": 0},
                    "speculative": {"mode": "tlt"},
                    "drafter": {**SIDECAR, "batchTokens": 64},
                },
            }
        )
    )
    return path


def _container(argv: list[str], role: str, ip: str, head: str, log: Path) -> subprocess.Popen[bytes]:
    pod = "sc-policy-0" if role == "policy" else "sc-rollout-0"
    env = {
        **os.environ,
        "TLT_RUN_NAME": "sc",
        "TLT_ROLE": role,
        "TLT_RANK": "0",
        "TLT_POD_NAME": pod,
        "TLT_NAMESPACE": "default",
        "TLT_POD_IP": ip,
        "TLT_HEAD_ADDRESS": head,
        "RAY_gcs_rpc_server_reconnect_timeout_s": "10",
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "e2e-local-token",
    }  # as the operator injects them
    for name in ("RAY_ADDRESS", "KUBERNETES_SERVICE_HOST"):
        env.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-m", "tlt.cli", *argv], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rollout_pod_with_drafter_trainer_sidecar_trains_the_drafter_on_the_sidecar_node(tmp_path):
    spec = _write_spec(tmp_path / "run.yaml", warm_start(reduced_config()), steps=2)
    ip, out = node_ip(), tmp_path / "work"
    head_address = f"{ip}:{free_port()}"
    worker = ["worker", "--spec", str(spec), "--join-timeout", "180"]
    procs = {
        "policy": _container(
            [*worker, "--role", "policy", "--out", str(out)], "policy", ip, head_address, tmp_path / "policy.log"
        ),
        "rollout": _container(
            [*worker, "--role", "rollout", "--out", str(tmp_path / "rw")],
            "rollout",
            ip,
            head_address,
            tmp_path / "rollout.log",
        ),
        "sidecar": _container(
            ["drafter-trainer", "--spec", str(spec)], "rollout", ip, head_address, tmp_path / "sidecar.log"
        ),
    }
    try:
        head_code = procs["policy"].wait(timeout=480)
        node_codes = {name: procs[name].wait(timeout=120) for name in ("rollout", "sidecar")}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:] for name in procs}
    assert head_code == 0, logs["policy"]
    metrics: list[dict[str, Any]] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert sum(m["drafter_updates"] for m in metrics) > 0, "no drafter gradient reached the hub"
    acks = [a for m in metrics for a in m["trainer_acks"]]
    assert acks, "the coordinator stopped no sidecar trainer between the steps"
    for ack in acks:
        assert ack["worker"] == "rollout-0" and ack["iterations"] > 0 and ack["error"] is None, ack
        assert ack["trainer_node"] != ack["worker_node"], "the drafter trained on the rollout worker's node"
    states = [s for m in metrics for s, _ in m["worker_states"]["rollout-0"]]
    assert "TRAINING" in states, "the rollout worker did not report its sidecar's training"
    assert node_codes["sidecar"] != 0, "a sidecar that lost its head must fail:\n" + logs["sidecar"]


def test_sidecar_run_without_trainer_nodes_stops_naming_drafter_placement(tmp_path, capsys):
    """`tlt train` on one machine: a local Ray cluster has no drafter-trainer node; no silent fallback."""
    import ray

    from tlt.runtime.ray_train import train_ray

    run = load_run(_write_spec(tmp_path / "run.yaml", warm_start(reduced_config()), steps=1))
    try:
        assert train_ray(run, tmp_path / "out", num_cpus=2) == 1
    finally:
        ray.shutdown()
    err = " ".join(capsys.readouterr().err.split())
    assert "drafter.placement is 'sidecar'" in err and "use drafter.placement 'in-container'" in err, err
    assert not (tmp_path / "out" / "metrics.jsonl").read_text().strip(), "a step ran without a trainer node"
