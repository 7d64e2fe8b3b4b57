"""Children as the builders make them: valid Kubernetes objects (checked field by field against
the `kubernetes` client's models, which mirror the upstream OpenAPI), secure pods, exec-form
commands, scheduling metadata on every child, and a CRD under the size the apiserver handles well."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes
import pytest
import yaml

from tlt.spec.crd import build_crd
from tlt.spec.run import RunSpec, TLTTrainingRun
from tlt_operator.builders import build_configmap, build_event, build_pod, build_podgroup, build_service
from tlt_operator.builders.common import RunRef

RUN = RunRef("demo", "ml", "0c6f3e1a-0000-4000-8000-000000000001")
TOKEN_SECRET = "demo-ray-token-x7k2p"  # the run's Ray token Secret, as the server would name it
FULL = RunSpec.model_validate(
    {
        "policy": {
            "replicas": 2,
            "resources": {"gpus": 1},
            "podTemplate": {
                "labels": {"team": "rl"},
                "annotations": {"note": "x"},
                "nodeSelector": {"gpu": "h100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "env": [
                    {"name": "HF_TOKEN", "secretKeyRef": {"name": "hf", "key": "token"}},
                    {"name": "A", "value": "1"},
                ],
                "serviceAccountName": "tlt-worker",
                "imagePullSecrets": ["regcred"],
                "terminationGracePeriodSeconds": 600,
            },
        },
        "rollout": {"replicas": 3, "resources": {"gpus": 1}},
        "verifier": {"replicas": 1},
        "checkpoint": {"claimName": "ckpt"},
        "schedulingPolicy": {"queue": "team-a", "priorityClassName": "high", "gang": {"scheduleTimeoutSeconds": 60}},
    }
)
MODELS = kubernetes.client.models


def _model_type(type_name: str) -> Any:
    return getattr(MODELS, type_name, None)


def check_against_model(value: Any, type_name: str, where: str) -> list[str]:
    """Every key of `value` must be a field of the client's model `type_name`, recursively."""
    problems: list[str] = []
    if type_name.startswith("list["):
        inner = type_name[5:-1]
        return [p for i, item in enumerate(value) for p in check_against_model(item, inner, f"{where}[{i}]")]
    if type_name.startswith("dict("):
        inner = type_name[5:-1].split(", ", 1)[1]
        return [p for k, item in value.items() for p in check_against_model(item, inner, f"{where}.{k}")]
    model = _model_type(type_name)
    if model is None:
        basic = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object, "datetime": str}
        if not isinstance(value, basic[type_name]):
            problems.append(f"{where}: {value!r} is not {type_name}")
        return problems
    if not isinstance(value, dict):
        return [f"{where}: expected an object ({type_name})"]
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            problems.append(f"{where}.{key}: no such field in {type_name}")
            continue
        problems += check_against_model(item, model.openapi_types[by_json[key]], f"{where}.{key}")
    return problems


def all_children(spec: RunSpec) -> list[tuple[dict[str, Any], str]]:
    pods = [
        build_pod(RUN, spec, role, rank, TOKEN_SECRET)
        for role, n in (
            ("policy", spec.policy.replicas),
            ("rollout", spec.rollout.replicas),
            ("verifier", spec.verifier.replicas),
        )
        for rank in range(n)
    ]
    return [(p, "V1Pod") for p in pods] + [
        (build_configmap(RUN, spec), "V1ConfigMap"),
        (build_service(RUN, spec), "V1Service"),
    ]


@pytest.mark.parametrize("spec", [RunSpec(), FULL], ids=["defaults", "every-override"])
def test_children_are_valid_upstream_objects(spec: RunSpec) -> None:
    for child, model in all_children(spec):
        assert check_against_model(child, model, child["kind"]) == []
        kubernetes.client.ApiClient()._ApiClient__deserialize(child, model)
    event = build_event(
        {
            "apiVersion": "tlt.dev/v1alpha1",
            "kind": "TLTTrainingRun",
            "metadata": {"name": "demo", "namespace": "ml", "uid": RUN.uid},
        },
        "Normal",
        "AllPodsRunning",
        "ok",
        __import__("datetime").datetime(2026, 1, 1),
    )
    assert check_against_model(event, "CoreV1Event", "Event") == []


def test_a_mistyped_field_is_caught_by_the_model_check() -> None:
    pod = build_pod(RUN, RunSpec(), "policy", 0, TOKEN_SECRET)
    pod["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    assert check_against_model(pod, "V1Pod", "Pod") == [
        "Pod.spec.containers[0].securityContext.runAsNonroot: no such field in V1SecurityContext"
    ]


def test_pods_run_locked_down_with_writable_emptydirs() -> None:
    pod = build_pod(RUN, FULL, "rollout", 1, TOKEN_SECRET)
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    for path in ("/tmp", "/home/tlt", "/dev/shm", "/var/lib/tlt"):
        assert "emptyDir" in volumes[mounts[path]], path
    assert mounts["/etc/tlt"] == "spec" and mounts["/var/lib/tlt/checkpoints"] == "checkpoints"
    assert spec["restartPolicy"] == "Never"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_commands_are_exec_form_without_spec_fields() -> None:
    env = [{"name": "X", "value": "$(rm -rf /); `id`"}]
    hostile = RunSpec.model_validate({"policy": {"podTemplate": {"env": env}}})
    for role in ("policy", "rollout", "verifier"):
        pod = build_pod(RUN, hostile, role, 0, TOKEN_SECRET)
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["tlt", "worker", "--role", role, "--spec", "/etc/tlt/run.yaml"]
        assert "args" not in container
        env = {e["name"]: e for e in container["env"]}
        assert env["TLT_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['tlt.dev/rank']"
        assert env["TLT_HEAD_ADDRESS"]["value"] == "policy-0.demo:6379"
    assert pod["spec"]["hostname"] == "verifier-0" and pod["spec"]["subdomain"] == "demo"


def test_spec_file_is_the_full_manifest() -> None:
    data = yaml.safe_load(build_configmap(RUN, FULL)["data"]["run.yaml"])
    manifest = TLTTrainingRun.model_validate(data)
    assert manifest.spec == FULL and manifest.metadata.name == "demo"


def test_scheduling_metadata_on_every_child_and_gang_podgroup() -> None:
    children = [c for c, _ in all_children(FULL)] + [build_podgroup(RUN, FULL)]
    for child in children:
        labels, annotations = child["metadata"]["labels"], child["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a", child["metadata"]["name"]
        assert labels["kueue.x-k8s.io/pod-group-name"] == "demo"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "6"
        assert labels["scheduling.x-k8s.io/pod-group"] == "demo"
        assert child["metadata"]["ownerReferences"][0]["uid"] == RUN.uid
    podgroup = build_podgroup(RUN, FULL)
    assert podgroup["spec"] == {"minMember": 6, "scheduleTimeoutSeconds": 60}
    pod = build_pod(RUN, FULL, "policy", 0, TOKEN_SECRET)
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 600, "a graceful stop's step and checkpoint fit in it"
    assert "terminationGracePeriodSeconds" not in build_pod(RUN, FULL, "rollout", 0, TOKEN_SECRET)["spec"]
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    volcano = RunSpec.model_validate({"schedulingPolicy": {"gang": {"scheduler": "volcano"}}})
    assert build_podgroup(RUN, volcano)["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    annotations = build_pod(RUN, volcano, "rollout", 0, TOKEN_SECRET)["metadata"]["annotations"]
    assert annotations["scheduling.k8s.io/group-name"] == "demo"
    assert build_podgroup(RUN, RunSpec()) is None


def test_long_run_names_still_give_valid_names_and_labels() -> None:
    run = RunRef("a" * 250, "ml", RUN.uid)
    pod = build_pod(run, RunSpec(), "verifier", 0, TOKEN_SECRET)
    assert len(pod["metadata"]["name"]) <= 253
    assert all(len(v) <= 63 for v in pod["metadata"]["labels"].values())
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", pod["spec"]["subdomain"]) and len(pod["spec"]["subdomain"]) <= 63


def test_crd_stays_small() -> None:
    size = len(json.dumps(build_crd()).encode())
    assert size < 200 * 1024, f"CRD is {size} bytes"
