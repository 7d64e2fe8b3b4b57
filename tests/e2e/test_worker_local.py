"""Two `tlt worker` "pods" as local processes on this machine: policy rank 0 (Ray head + coordinator) and
one rollout pod joining it. The one-step run finishes with exit 0 on the head (the run's Succeeded) and
a checkpoint, and the rollout pod exits non-zero once the head is gone (as the operator's contract asks).
SIGTERM to the head (the kubelet stopping its pod) in the middle of a longer run: it finishes the step,
writes its checkpoint and exits 143, not 0 (which would be the run's Succeeded).

The head listens on a free port of its own and each process stops only its own Ray node (SIGTERM to its
`ray start --block`), never `ray stop`, so Ray clusters of other processes on this machine are left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from _local_pods import free_port, node_ip

from tlt.tasks.warmstart import reduced_config, warm_start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _pod(role: str, spec: Path, ip: str, head: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TLT_RUN_NAME": "wl",
        "TLT_ROLE": role,
        "TLT_RANK": "0",
        "TLT_POD_NAME": f"wl-{role}-0",
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
    argv = [
        sys.executable,
        "-m",
        "tlt.cli",
        "worker",
        "--role",
        role,
        "--spec",
        str(spec),
        "--out",
        str(out),
        "--join-timeout",
        "180",
    ]
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _spec(tmp_path: Path, steps: int) -> Path:
    policy = warm_start(reduced_config())
    spec = tmp_path / "run.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "wl"},
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
                    "rollout": {"replicas": 1},
                    "verifier": {"replicas": 0},
                    "speculative": {"mode": "off"},
                },
            }
        )
    )
    return spec


@contextmanager
def _head_and_rollout_pod(tmp_path: Path, spec: Path) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    """Policy rank 0 (output in tmp_path/work, log policy.log) and one rollout pod (rollout.log); whichever
    still runs at the end is terminated."""
    ip = node_ip()
    head_address = f"{ip}:{free_port()}"
    pods = (
        _pod("policy", spec, ip, head_address, tmp_path / "work", tmp_path / "policy.log"),
        _pod("rollout", spec, ip, head_address, tmp_path / "rollout-work", tmp_path / "rollout.log"),
    )
    try:
        yield pods
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.terminate()
                pod.wait(timeout=60)


def test_head_and_rollout_pod_finish_a_one_step_run(tmp_path):
    out = tmp_path / "work"
    with _head_and_rollout_pod(tmp_path, _spec(tmp_path, 1)) as (head, rollout):
        head_code = head.wait(timeout=420)
        rollout_code = rollout.wait(timeout=120)
    logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:] for name in ("policy", "rollout")}
    assert head_code == 0, logs["policy"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert (out / "checkpoints" / "LATEST").read_text() == "step-00000001"
    assert rollout_code != 0, "a rollout pod that lost its head must fail:\n" + logs["rollout"]


def test_sigterm_to_the_head_checkpoints_the_step_and_exits_143(tmp_path):
    out = tmp_path / "work"
    with _head_and_rollout_pod(tmp_path, _spec(tmp_path, 40)) as (head, _):
        deadline = time.monotonic() + 420
        while len(_steps(out)) < 2:
            assert head.poll() is None and time.monotonic() < deadline, "the head ended or stalled before step 2"
            time.sleep(0.1)
        head.send_signal(signal.SIGTERM)
        head_code = head.wait(timeout=180)
    log = (tmp_path / "policy.log").read_text(errors="replace")
    assert head_code == 128 + signal.SIGTERM, log[-3000:]
    step = len(_steps(out))
    assert 2 <= step < 40
    assert (out / "checkpoints" / "LATEST").read_text() == f"step-{step:08d}"
    assert f"stopped wl on SIGTERM after step {step}/40" in log
    stops = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines() if '"stop"' in line]
    assert [e["checkpoint"] for e in stops] == [str(out / "checkpoints" / f"step-{step:08d}")]


def _steps(out: Path) -> list[str]:
    path = out / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []
