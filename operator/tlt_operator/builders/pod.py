"""A worker pod of one role and rank.

The worker contract (what `tlt worker`, implemented by the runtime, relies on):

- Command, exec form, never a shell and no CR field in it:
  `["tlt", "worker", "--role", <policy|rollout|verifier>, "--spec", "/etc/tlt/run.yaml"]`.
  The spec is the run's full manifest, mounted read-only from the ConfigMap at /etc/tlt/run.yaml.
- Environment: `TLT_RUN_NAME`, `TLT_ROLE`, `TLT_RANK` (from
  the pod's `tlt.dev/rank` label via the downward API), `TLT_POD_NAME`, `TLT_NAMESPACE`,
  `TLT_POD_IP` (downward API), `TLT_HEAD_ADDRESS` = `policy-0.<service>:6379`: the fixed DNS
  name of policy rank 0 under the headless Service, where it serves the Ray head (GCS) and the
  coordinator; every other pod joins it. `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` from the run's
  Secret `<run>-ray-token-<random>` (by reference, `builders.security`). User `env` from the spec comes after
  these and cannot replace them. Replica counts are read from the spec file, not the environment, so scaling a
  role adds or removes pods without replacing the others.
- Writable paths: /tmp, $HOME (/home/tlt), /var/lib/tlt (working directory; relative
  `checkpoint.path` resolves against it, where the `checkpoint.claimName` PVC is mounted for
  policy and rollout pods) and a memory-backed /dev/shm (Ray's object store). The root file
  system is read-only; the process runs as uid/gid 1000, no capabilities, no privilege escalation,
  seccomp RuntimeDefault.
- restartPolicy Never: a failed worker is a failed pod, which the operator counts against
  `runPolicy.backoffLimit` and replaces under the same name (same DNS name, same rank). A worker
  that loses the head must exit non-zero; a replaced head restarts from the last checkpoint.
- Reports (`builders.reports`): workers write to the ConfigMap named by `TLT_REPORTS_CONFIGMAP`
  (`<run>-reports`) by JSON merge patch of its `data`, never to a pod. `TLT_POD_UID` (downward API)
  tells a report of this pod from one an earlier pod of the same name left behind.
- Progress: the coordinator (policy rank 0) writes key `progress`, e.g. `{"step": 3, "lastStepSeconds":
  41.2, "drafterVersion": 2, "acceptLength": 3.1, "activeTrainers": 2}`; the operator mirrors it into
  `.status.step` and `.status.drafter` at its next pass (`TLT_OPERATOR_RECONCILE_SECONDS`).
  The run Succeeded when the policy rank-0 pod exits 0 (phase Succeeded) after the last step.
- Identity: every pod runs as the run's ServiceAccount `<run>-worker` (or the template's
  `serviceAccountName`, where the operator's configuration allows it), whose Role grants `patch` on the
  reports ConfigMap alone and `get` on the run's status (`builders.security`); only the policy rank-0
  and rollout pods mount its token.
- Trainer slots (`tlt.runtime.k8s_slots` implements both directions):
  - each rollout worker reports its state at every change under key `state.rollout-<rank>`:
    `{"state": "GENERATING"|"IDLE"|"TRAINING", "since": "<RFC 3339, UTC>", "uid": "<pod uid>"}`.
    `since` is when the state was entered; TRAINING means a drafter trainer is running on that pod's
    GPU. A pod without a report of its own is judged from GPU utilisation alone (Prometheus) or not at all.
  - the operator writes its decision to the run's `.status.drafter.enabledSlots` (rollout pod
    names; absent until the operator has observed something). The coordinator reads it through the
    status subresource (verb `get` on `tltrainingruns/status`, nothing else), maps pod
    `<run>-rollout-<rank>` to worker `rollout-<rank>` (the pod's hostname), and starts a trainer
    only on an IDLE worker whose slot is enabled; it stops a trainer whose slot was disabled.
- `drafter.placement: sidecar`: rollout pods carry a second container, `drafter-trainer`
  (`["tlt", "drafter-trainer", "--spec", "/etc/tlt/run.yaml"]`, same image, environment, mounts, cpu,
  memory and security as the worker), as a native sidecar (an init container with `restartPolicy:
  Always`, Kubernetes >= 1.29; DRA needs >= 1.34 anyway): the kubelet restarts it when it exits while
  the worker runs, and stops it once the worker has exited, so the pod's phase is the worker's alone
  (with a plain second container a dead trainer would leave a Running pod that nothing replaces).
  Both containers name the pod's DRA ResourceClaim `gpu` (generated per pod from the run's
  ResourceClaimTemplate, `builders.resourceclaim`) instead of requesting `nvidia.com/gpu`, so they share
  the same device(s): a sidecar with its own `nvidia.com/gpu` request would get a different GPU.
  `tlt drafter-trainer` joins the Ray head as a second Ray node on the pod's IP (its own Ray temp dir
  under /tmp, OS-assigned ports) advertising `tlt_trainer_rollout-<rank>`; the head waits for one per
  rollout pod. The coordinator places the worker's buffer and spot trainer there; the worker hands it
  each step's rollouts and forwards start / stop, and still alone reports the state; the
  sidecar trains only in an enabled slot while the worker is IDLE. It exits non-zero when it loses the
  cluster, 2 on a bad spec or environment.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from tlt.spec.run import RoleSpec, RunSpec

from .. import names
from .common import RunRef, metadata
from .podgroup import SCHEDULER_NAMES
from .security import api_caller

UID = 1000
SIDECAR = "drafter-trainer"
GPU_CLAIM = "gpu"
WORK_DIR = "/var/lib/tlt"
HOME_DIR = "/home/tlt"


def role_spec(spec: RunSpec, role: names.Role) -> RoleSpec:
    return {"policy": spec.policy, "rollout": spec.rollout, "verifier": spec.verifier}[role]


def _env(run: RunRef, spec: RunSpec, role: names.Role, token_secret: str) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    fixed: list[dict[str, Any]] = [
        {"name": "TLT_RUN_NAME", "value": run.name},
        {"name": "TLT_ROLE", "value": role},
        {"name": "TLT_RANK", "valueFrom": field(f"metadata.labels['{names.RANK_LABEL}']")},
        {"name": "TLT_POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "TLT_POD_UID", "valueFrom": field("metadata.uid")},
        {"name": "TLT_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "TLT_POD_IP", "valueFrom": field("status.podIP")},
        {"name": "TLT_HEAD_ADDRESS", "value": names.head_address(run.name)},
        {"name": "TLT_REPORTS_CONFIGMAP", "value": names.reports_name(run.name)},
        {"name": "HOME", "value": HOME_DIR},
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": token_secret, "key": names.RAY_TOKEN_KEY}}},
    ]
    taken = {e["name"] for e in fixed}
    for var in role_spec(spec, role).pod_template.env:
        if var.name in taken:
            continue
        if var.secret_key_ref is not None:
            ref = var.secret_key_ref
            fixed.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            fixed.append({"name": var.name, "value": var.value or ""})
    return fixed


def _resources(role: RoleSpec, shared_claim: bool) -> dict[str, Any]:
    """Requests = limits; the GPUs as `nvidia.com/gpu`, or as the pod's shared DRA claim."""
    amounts: dict[str, Any] = {"cpu": role.resources.cpu, "memory": role.resources.memory}
    if shared_claim:
        return {"requests": amounts, "limits": dict(amounts), "claims": [{"name": GPU_CLAIM}]}
    limits = dict(amounts)
    if role.resources.gpus:
        limits["nvidia.com/gpu"] = str(role.resources.gpus)
        amounts = {**amounts, "nvidia.com/gpu": str(role.resources.gpus)}
    return {"requests": amounts, "limits": limits}


def sidecar_placement(spec: RunSpec, role: names.Role) -> bool:
    """Rollout pods of a run with `drafter.placement: sidecar` carry the drafter-trainer sidecar."""
    if role != "rollout" or spec.drafter.placement != "sidecar":
        return False
    if not spec.drafter.device_class_name:
        raise ValueError(
            "drafter.deviceClassName is required when drafter.placement is 'sidecar' "
            "(the DRA DeviceClass whose device the worker and the trainer share)"
        )
    return True


def _container(
    name: str,
    image: str,
    command: list[str],
    env: list[dict[str, Any]],
    resources: dict[str, Any],
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "command": command,
        "workingDir": WORK_DIR,
        "env": env,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _volumes(run: RunRef, spec: RunSpec, role: names.Role) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": "spec",
            "configMap": {
                "name": names.configmap_name(run.name),
                "items": [{"key": names.SPEC_FILE, "path": names.SPEC_FILE}],
            },
        },
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "work", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": names.SPEC_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": HOME_DIR},
        {"name": "work", "mountPath": WORK_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if spec.checkpoint.claim_name and role in ("policy", "rollout"):
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}})
        mounts.append({"name": "checkpoints", "mountPath": posixpath.join(WORK_DIR, spec.checkpoint.path)})
    return volumes, mounts


def _ports(spec: RunSpec, role: names.Role) -> list[dict[str, Any]]:
    ports = [{"name": "metrics", "containerPort": spec.monitoring.metrics_port, "protocol": "TCP"}]
    if role == "policy":
        ports += [
            {"name": "gcs", "containerPort": names.GCS_PORT, "protocol": "TCP"},
            {"name": "ray-client", "containerPort": names.RAY_CLIENT_PORT, "protocol": "TCP"},
        ]
    return ports


def spec_hash(pod: dict[str, Any]) -> str:
    """Digest of the pod's spec and labels: a live pod with another hash is replaced."""
    content = {"spec": pod["spec"], "labels": pod["metadata"]["labels"]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def build_pod(run: RunRef, spec: RunSpec, role: names.Role, rank: int, token_secret: str) -> dict[str, Any]:
    """Pod `<run>-<role>-<rank>`; see the module docstring for the worker contract. `token_secret`: the
    name of the run's Ray token Secret (`status.rayTokenSecret`)."""
    rs = role_spec(spec, role)
    overrides = rs.pod_template
    volumes, mounts = _volumes(run, spec, role)
    sidecar = sidecar_placement(spec, role)
    spec_file = posixpath.join(names.SPEC_DIR, names.SPEC_FILE)
    env, resources = _env(run, spec, role, token_secret), _resources(rs, sidecar)
    worker = _container(
        "worker", rs.image, ["tlt", "worker", "--role", role, "--spec", spec_file], env, resources, mounts
    )
    worker["ports"] = _ports(spec, role)
    containers = [worker]
    labels = {**overrides.labels, names.ROLE_LABEL: role, names.RANK_LABEL: str(rank)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": names.hostname(role, rank),
        "subdomain": names.service_name(run.name),
        "enableServiceLinks": False,
        "securityContext": {
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": containers,
        "volumes": volumes,
    }
    if sidecar:
        trainer = _container(SIDECAR, rs.image, ["tlt", "drafter-trainer", "--spec", spec_file], env, resources, mounts)
        pod_spec["initContainers"] = [{**trainer, "restartPolicy": "Always"}]
        pod_spec["resourceClaims"] = [
            {"name": GPU_CLAIM, "resourceClaimTemplateName": names.claim_template_name(run.name)}
        ]
    if overrides.node_selector:
        pod_spec["nodeSelector"] = dict(overrides.node_selector)
    if overrides.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in overrides.tolerations]
    # Every pod runs as the run's own identity (never the namespace's `default` ServiceAccount, which a
    # fresh namespace may not have yet); only the API callers mount its token.
    pod_spec["serviceAccountName"] = overrides.service_account_name or names.worker_account_name(run.name)
    pod_spec["automountServiceAccountToken"] = api_caller(role, rank)
    if overrides.termination_grace_period_seconds is not None:  # a graceful stop's step + checkpoint
        pod_spec["terminationGracePeriodSeconds"] = overrides.termination_grace_period_seconds
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in overrides.image_pull_secrets]
    if spec.scheduling_policy.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling_policy.priority_class_name
    if spec.scheduling_policy.gang is not None:
        pod_spec["schedulerName"] = SCHEDULER_NAMES[spec.scheduling_policy.gang.scheduler]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(
            run, spec, names.pod_name(run.name, role, rank), role, labels, dict(overrides.annotations)
        ),
        "spec": pod_spec,
    }
    pod["metadata"]["annotations"][names.SPEC_HASH_ANNOTATION] = spec_hash(pod)
    return pod
