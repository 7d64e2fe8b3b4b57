"""`kubectl apply -f` to a trained run on one machine: a CPU-sized run is scheduled onto the node whose
pods the test node agent runs as local processes (`tlt worker` for real: the Ray head and coordinator
on policy rank 0, a rollout pod joining it), trains to `phase: Succeeded` with its step progress in
the status, and `kubectl delete` leaves nothing behind."""

from __future__ import annotations

import pytest
from conftest import EXEC_LABEL, EXEC_TAINT
from kube_view import wait_for
from node_agent import why_pods_cannot_run

from tlt.tasks.warmstart import reduced_config, warm_start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 2


def local_run(name: str, policy: str) -> dict:
    """A run sized for this CPU whose pods all tolerate and select the node that runs processes."""
    template = {"nodeSelector": EXEC_LABEL,
                "tolerations": [{"key": EXEC_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                        {"name": "RAY_gcs_rpc_server_reconnect_timeout_s", "value": "10"}]}
    cpu = {"cpu": "1", "memory": "2Gi", "gpus": 0}
    return {"apiVersion": "tlt.dev/v1alpha1", "kind": "TLTTrainingRun", "metadata": {"name": name}, "spec": {
        "model": {"path": policy, "dtype": "float32", "maxContext": 256},
        "dataset": {"builtin": {"numTrain": 32, "numEval": 8}},
        "algorithm": {"steps": STEPS, "promptsPerStep": 2, "groupSize": 2, "maxNewTokens": 16, "microBatchSize": 4},
        "policy": {"replicas": 1, "resources": cpu, "podTemplate": template},
        "rollout": {"replicas": 1, "resources": cpu, "podTemplate": template},
        "verifier": {"replicas": 0, "resources": cpu, "podTemplate": template},
        "speculative": {"mode": "off"}}}


def test_kubectl_apply_trains_a_run_to_succeeded_and_delete_leaves_nothing(view):
    if why := why_pods_cannot_run():
        pytest.skip(f"skipped: {why}")
    policy = str(warm_start(reduced_config()))
    view.apply(local_run("trained", policy))

    def logs() -> str:
        return "\n".join(f"--- {name}\n{view.agent.log_of(view.namespace, name)[-2500:]}"
                         for name in view.pods("trained")) + f"\nagent errors: {view.agent.errors[-5:]}"

    status = wait_for("the run Succeeded", lambda: (s := view.status("trained")).get("phase") in ("Succeeded", "Failed")
                      and s, timeout=480, poll=2.0, describe=logs)
    assert status["phase"] == "Succeeded", f"{status}\n{logs()}"
    assert status["step"]["current"] == STEPS, status
    head = view.pods("trained")["trained-policy-0"]
    assert head["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    uid = view.run("trained")["metadata"]["uid"]
    view.kubectl("delete", "tltrun/trained", "--wait=true", "--timeout=60s")
    wait_for("nothing of the run left", lambda: not view.children(uid) and not view.labelled("trained"),
             timeout=120, poll=1.0)
