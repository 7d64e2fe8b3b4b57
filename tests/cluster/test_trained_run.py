"""`kubectl apply -f` to a trained run on one machine: a CPU-sized run is scheduled onto the node whose
pods the test node agent runs as local processes (`tlt worker` for real: the Ray head and coordinator
on policy rank 0, a rollout pod joining it), trains to `phase: Succeeded` with its step progress in
the status, and `kubectl delete` leaves nothing behind. A rollout pod deleted in the middle of a run is
replaced by the operator, its worker by the coordinator, and the run finishes with the step metrics of an
undisturbed run, without restarting a step from its checkpoint."""

from __future__ import annotations

import json

import pytest
from conftest import EXEC_LABEL, EXEC_TAINT
from fake_node import why_pods_cannot_run
from kube_view import wait_for

from tlt.tasks.warmstart import reduced_config, warm_start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 2
# What a step learned (not how long it took): equal when recovery is exact.
LEARNED = (
    "step",
    "reward_mean",
    "response_lengths",
    "generated_tokens",
    "loss",
    "policy_loss",
    "grad_norm",
    "kl",
    "clip_fraction",
)


def local_run(name: str, policy: str, steps: int = STEPS, prompts: int = 2, new_tokens: int = 16) -> dict:
    """A run sized for this CPU whose pods all tolerate and select the node that runs processes."""
    template = {
        "nodeSelector": EXEC_LABEL,
        "tolerations": [{"key": EXEC_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
        "env": [
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "RAY_gcs_rpc_server_reconnect_timeout_s", "value": "10"},
        ],
    }
    cpu = {"cpu": "1", "memory": "2Gi", "gpus": 0}
    return {
        "apiVersion": "tlt.dev/v1alpha1",
        "kind": "TLTTrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": policy, "dtype": "float32", "maxContext": 256},
            "dataset": {"builtin": {"numTrain": 32, "numEval": 8}},
            "algorithm": {
                "steps": steps,
                "promptsPerStep": prompts,
                "groupSize": 2,
                "maxNewTokens": new_tokens,
                "microBatchSize": 4,
            },
            "policy": {"replicas": 1, "resources": cpu, "podTemplate": template},
            "rollout": {"replicas": 1, "resources": cpu, "podTemplate": template},
            "verifier": {"replicas": 0, "resources": cpu, "podTemplate": template},
            "speculative": {"mode": "off"},
        },
    }


def test_kubectl_apply_trains_a_run_to_succeeded_and_delete_leaves_nothing(view):
    if why := why_pods_cannot_run():
        pytest.skip(f"skipped: {why}")
    policy = str(warm_start(reduced_config()))
    view.apply(local_run("trained", policy))

    def logs() -> str:
        return (
            "\n".join(f"--- {name}\n{view.agent.log_of(view.namespace, name)[-2500:]}" for name in view.pods("trained"))
            + f"\nagent errors: {view.agent.errors[-5:]}"
        )

    status = wait_for(
        "the run Succeeded",
        lambda: (s := view.status("trained")).get("phase") in ("Succeeded", "Failed") and s,
        timeout=480,
        poll=2.0,
        describe=logs,
    )
    assert status["phase"] == "Succeeded", f"{status}\n{logs()}"
    assert status["step"]["current"] == STEPS, status
    head = view.pods("trained")["trained-policy-0"]
    assert head["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    uid = view.run("trained")["metadata"]["uid"]
    view.kubectl("delete", "tltrun/trained", "--wait=true", "--timeout=60s")
    wait_for(
        "nothing of the run left",
        lambda: not view.children(uid) and not view.labelled("trained"),
        timeout=120,
        poll=1.0,
    )


def _step_metrics(view, run: str) -> list[dict]:
    path = view.agent.root / "pods" / view.namespace / f"{run}-policy-0" / "volumes" / "work" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: row.get(k) for k in LEARNED} for row in rows]


def _finish(view, run: str, logs) -> dict:
    status = wait_for(
        f"{run} finished",
        lambda: (s := view.status(run)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=480,
        poll=2.0,
        describe=logs,
    )
    assert status["phase"] == "Succeeded", f"{status}\n{logs()}"
    return status


def _pod_logs(view):
    """`logs(run)` -> a function describing the run's pods' logs (for `wait_for`'s timeouts)."""

    def logs(run: str):
        return lambda: (
            "\n".join(f"--- {name}\n{view.agent.log_of(view.namespace, name)[-2500:]}" for name in view.pods(run))
            + f"\nagent errors: {view.agent.errors[-5:]}"
        )

    return logs


def _wait_for_step(view, run: str, step: int, logs) -> None:
    wait_for(
        f"step {step} done",
        lambda: (view.status(run).get("step") or {}).get("current", 0) >= step,
        timeout=300,
        poll=1.0,
        describe=logs(run),
    )


SIZED = {"steps": 40, "prompts": 4, "new_tokens": 32}  # ~10 s of steps: a fault lands mid-run
_CALM: list[list[dict]] = []  # the undisturbed run's step metrics, once per session (the same for every test)


def _calm_metrics(view, policy: str, logs) -> list[dict]:
    """The step metrics of an undisturbed run of SIZED (run in `view`'s namespace the first time)."""
    if not _CALM:
        view.apply(local_run("calm", policy, **SIZED))
        _finish(view, "calm", logs("calm"))
        _CALM.append(_step_metrics(view, "calm"))
    return _CALM[0]


def test_a_rollout_pod_deleted_mid_run_is_replaced_and_the_run_ends_as_an_undisturbed_one(view):
    if why := why_pods_cannot_run():
        pytest.skip(f"skipped: {why}")
    policy = str(warm_start(reduced_config()))
    logs = _pod_logs(view)
    calm = _calm_metrics(view, policy, logs)
    view.apply(local_run("shaken", policy, **SIZED))
    _wait_for_step(view, "shaken", 3, logs)
    old_uid = view.pods("shaken")["shaken-rollout-0"]["metadata"]["uid"]
    view.kubectl("delete", "pod", "shaken-rollout-0", "--wait=false")
    wait_for(
        "a new shaken-rollout-0",
        lambda: (p := view.pods("shaken").get("shaken-rollout-0")) and p["metadata"]["uid"] != old_uid,
        timeout=60,
        describe=logs("shaken"),
    )
    _finish(view, "shaken", logs("shaken"))
    work = view.agent.root / "pods" / view.namespace / "shaken-policy-0" / "volumes" / "work"
    events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    # its worker was lost: the step went on (its shard retried, or the step run again before the update) with
    # the replacement (the only rollout worker) on the new pod, and no restart from the checkpoint
    told = [e for e in events if e["type"] not in ("workers", "trainer", "phase", "checkpoint")]
    assert not [e for e in events if e["type"] == "restart"], json.dumps(told, indent=1)[-6000:]
    recovered = [e for e in events if e["type"] in ("shard_retry", "step_redone", "worker_replaced")]
    replaced = [e for e in recovered if e["type"] == "worker_replaced"]
    assert len(replaced) == 1 and replaced[0]["step"] >= 4, "the deletion must land mid-run: " + str(recovered)
    assert replaced[0]["worker"] == "rollout-0"
    assert _step_metrics(view, "shaken") == calm


def _claim(view, name: str) -> str:
    """A PersistentVolume pre-bound to claim `name` of the test's namespace, and the claim, bound: the checkpoint
    volume a suspended run comes back to (the node agent keeps one folder per claim). Returns the volume's name."""
    volume = f"{view.namespace}-{name}"
    storage = {"storageClassName": "tlt-test", "accessModes": ["ReadWriteOnce"]}
    view.plane.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    **storage,
                    "capacity": {"storage": "1Gi"},
                    "hostPath": {"path": f"/tmp/{volume}"},  # not read: the node agent mounts its own folder
                    "claimRef": {"namespace": view.namespace, "name": name},
                },
            }
        ),
    )
    view.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {**storage, "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}},
        }
    )
    wait_for("the claim bound", lambda: view.get("pvc", name)["status"].get("phase") == "Bound", timeout=60)
    return volume


def test_a_suspended_run_stops_with_its_checkpoint_and_resumes_to_an_undisturbed_runs_metrics(view):
    """`spec.suspend: true` deletes every pod of the run at once (the head SIGTERMed as its rollout pod leaves);
    the checkpoints on the run's claim stay, and `suspend: false` brings pods back whose head resumes from them:
    the run ends with the step metrics of an undisturbed run."""
    if why := why_pods_cannot_run():
        pytest.skip(f"skipped: {why}")
    policy = str(warm_start(reduced_config()))
    logs = _pod_logs(view)
    calm = _calm_metrics(view, policy, logs)
    volume = _claim(view, "checkpoints")
    try:
        paused = local_run("paused", policy, **SIZED)
        paused["spec"]["checkpoint"] = {"claimName": "checkpoints", "intervalSteps": 1}
        view.apply(paused)
        _wait_for_step(view, "paused", 3, logs)
        view.kubectl("patch", "tltrun/paused", "--type", "merge", "-p", json.dumps({"spec": {"suspend": True}}))
        wait_for(
            "Suspended without pods",
            lambda: view.status("paused").get("phase") == "Suspended" and not view.pods("paused"),
            timeout=120,
            describe=logs("paused"),
        )
        claim = view.agent.root / "claims" / view.namespace / "checkpoints"
        kept = sorted(p.name for p in claim.glob("step-*"))
        assert kept, f"no checkpoint on the claim: {sorted(p.name for p in claim.iterdir())}"
        view.kubectl("patch", "tltrun/paused", "--type", "merge", "-p", json.dumps({"spec": {"suspend": False}}))
        _finish(view, "paused", logs("paused"))
        work = view.agent.root / "pods" / view.namespace / "paused-policy-0" / "volumes" / "work"
        events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
        first = min(e["step"] for e in events)
        assert first == int(kept[-1].removeprefix("step-")) + 1, "the new head did not resume from the claim"
        assert _step_metrics(view, "paused") == calm
    finally:
        view.kubectl("delete", "tltrun/paused", "--ignore-not-found", "--wait=true", "--timeout=60s")
        view.plane.kubectl("delete", "pv", volume, "--ignore-not-found", "--wait=false")


def test_a_run_with_two_policy_pods_trains_its_update_on_both_to_succeeded(view):
    """`policy.replicas: 2`: the policy group's rank 1 runs on the second policy pod (it joins the head with
    `tlt_policy`), both ranks take their share of every update, and the checkpoints on the run's claim hold
    both ranks' shards."""
    if why := why_pods_cannot_run():
        pytest.skip(f"skipped: {why}")
    policy = str(warm_start(reduced_config()))
    logs = _pod_logs(view)
    volume = _claim(view, "shards")
    try:
        sharded = local_run("sharded", policy)
        sharded["spec"]["policy"]["replicas"] = 2
        sharded["spec"]["checkpoint"] = {"claimName": "shards", "intervalSteps": 1}
        view.apply(sharded)
        _finish(view, "sharded", logs("sharded"))
        pods = view.pods("sharded")
        assert {"sharded-policy-0", "sharded-policy-1"} <= set(pods), sorted(pods)
        work = view.agent.root / "pods" / view.namespace / "sharded-policy-0" / "volumes" / "work"
        events = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
        group = [e for e in events if e["type"] == "policy_group"]
        assert len(group) == 1 and group[0]["world"] == 2 and group[0]["sharding"] == "fsdp", group
        ips = [rank["ip"] for rank in group[0]["ranks"]]
        assert ips == [pods[f"sharded-policy-{i}"]["status"]["podIP"] for i in range(2)], ips
        rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == STEPS
        for row in rows:
            assert len(row["policy_rank_tokens"]) == 2 and min(row["policy_rank_tokens"]) > 0, row
        claim = view.agent.root / "claims" / view.namespace / "shards"
        shards = claim / f"step-{STEPS:08d}" / "policy_shards"
        assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    finally:
        view.kubectl("delete", "tltrun/sharded", "--ignore-not-found", "--wait=true", "--timeout=60s")
        view.plane.kubectl("delete", "pv", volume, "--ignore-not-found", "--wait=false")
