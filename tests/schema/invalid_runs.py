"""Invalid `TLTTrainingRun` manifests, one per schema rule and CEL rule, with the field path each must be
refused at: shared by the schema tier (pydantic and the fake's validator) and the real API server tier."""

from __future__ import annotations

from typing import Any

from tlt.spec.crd import (
    MSG_BLOCK_ARM,
    MSG_BUCKETS,
    MSG_DATASET_PATH,
    MSG_DATASET_SYSTEM,
    MSG_DRAFT_VOCAB,
    MSG_ENV,
    MSG_HISTORY_DEPTH,
    MSG_HISTORY_MATCH,
    MSG_NGRAM,
    MSG_SIDECAR,
    MSG_TOLERATION,
    MSG_TRAINERS,
)
from tlt.spec.rollout_mode import MSG_OVER_PROVISION, MSG_STALENESS
from tlt.spec.run import (
    API_GROUP,
    API_VERSION,
    KIND,
    MSG_CHECKPOINT_CANONICAL,
    MSG_CHECKPOINT_MOUNT,
    MSG_CHECKPOINT_PATH,
    MSG_METRICS_PORT,
    MSG_PARTIAL_VLLM,
    MSG_RESERVED,
)


def manifest(spec: dict[str, Any], name: str = "run") -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec}


# (case, spec, the field path both must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("min trainers above max", {"drafter": {"minTrainers": 4, "maxTrainers": 2}}, "spec.drafter"),
    ("metrics port on Ray's GCS port", {"monitoring": {"metricsPort": 6379}}, "spec.monitoring"),
    ("unknown metrics logger", {"monitoring": {"loggers": ["statsd"]}}, "spec.monitoring.loggers[0]"),
    ("min trainers above defaulted max", {"drafter": {"minTrainers": 9}}, "spec.drafter"),
    (
        "collapse at the healthy level",
        {"drafter": {"health": {"collapsedAt": 1.5, "healthyAt": 1.5}}},
        "spec.drafter.health",
    ),
    ("collapse above the defaulted healthy level", {"drafter": {"health": {"collapsedAt": 2}}}, "spec.drafter.health"),
    ("sidecar without device class", {"drafter": {"placement": "sidecar"}}, "spec.drafter"),
    ("sidecar with empty device class", {"drafter": {"placement": "sidecar", "deviceClassName": ""}}, "spec.drafter"),
    ("buckets descending", {"speculative": {"buckets": [1, 8, 4]}}, "spec.speculative"),
    ("buckets repeated", {"speculative": {"buckets": [1, 2, 2, 4]}}, "spec.speculative"),
    ("ngram min above max", {"speculative": {"ngramMin": 5, "ngramMax": 3}}, "spec.speculative"),
    (
        "history match min above max",
        {"speculative": {"history": {"minMatch": 5, "maxMatch": 3}}},
        "spec.speculative.history",
    ),
    (
        "history arm deeper than maxDraft",
        {"speculative": {"arms": [{"kind": "mixed", "depth": 9}]}},
        "spec.speculative",
    ),
    (
        "block arm deeper than a block",
        {"speculative": {"arms": [{"kind": "block", "depth": 9}]}},
        "spec.speculative.arms[0]",
    ),
    (
        "block arm with topk",
        {"speculative": {"arms": [{"kind": "block", "depth": 4, "topk": 2}]}},
        "spec.speculative.arms[0]",
    ),
    ("file dataset without path", {"dataset": {"source": "file"}}, "spec.dataset"),
    ("unknown field", {"algorithm": {"stepz": 3}}, "spec.algorithm.stepz"),
    ("steps zero", {"algorithm": {"steps": 0}}, "spec.algorithm.steps"),
    ("steps not a number", {"algorithm": {"steps": "ten"}}, "spec.algorithm.steps"),
    ("unsupported algorithm", {"algorithm": {"name": "ppo"}}, "spec.algorithm.name"),
    ("learning rate zero (exclusive bound)", {"algorithm": {"learningRate": 0}}, "spec.algorithm.learningRate"),
    ("top-p above one", {"algorithm": {"topP": 1.5}}, "spec.algorithm.topP"),
    ("arm without kind", {"speculative": {"arms": [{"depth": 3}]}}, "spec.speculative.arms[0].kind"),
    ("no arms", {"speculative": {"arms": []}}, "spec.speculative.arms"),
    ("too many buckets", {"speculative": {"buckets": list(range(1, 18))}}, "spec.speculative.buckets"),
    ("managedBy not controller-shaped", {"managedBy": "Kueue"}, "spec.managedBy"),
    (
        "label value too long",
        {"policy": {"podTemplate": {"labels": {"team": "x" * 64}}}},
        "spec.policy.podTemplate.labels.team",
    ),
    ("memory quantity spelled GB", {"rollout": {"resources": {"memory": "4GB"}}}, "spec.rollout.resources.memory"),
    (
        "toleration operator",
        {"rollout": {"podTemplate": {"tolerations": [{"operator": "In"}]}}},
        "spec.rollout.podTemplate.tolerations[0].operator",
    ),
    (
        "env name starting with a digit",
        {"verifier": {"podTemplate": {"env": [{"name": "1X"}]}}},
        "spec.verifier.podTemplate.env[0].name",
    ),
    (
        "env name '..'",
        {"verifier": {"podTemplate": {"env": [{"name": ".."}]}}},
        "spec.verifier.podTemplate.env[0].name",
    ),
    ("env name '.'", {"rollout": {"podTemplate": {"env": [{"name": "."}]}}}, "spec.rollout.podTemplate.env[0].name"),
    (
        "env name starting with '..'",
        {"policy": {"podTemplate": {"env": [{"name": "..X"}]}}},
        "spec.policy.podTemplate.env[0].name",
    ),
    ("checkpoint path with a newline", {"checkpoint": {"path": "ck\npt"}}, "spec.checkpoint.path"),
    ("model path with a tab", {"model": {"path": "/models/\tq"}}, "spec.model.path"),
    (
        "secret ref without key",
        {"verifier": {"podTemplate": {"env": [{"name": "T", "secretKeyRef": {"name": "s"}}]}}},
        "spec.verifier.podTemplate.env[0].secretKeyRef.key",
    ),
    ("prometheus url not http", {"monitoring": {"prometheusUrl": "ftp://prom"}}, "spec.monitoring.prometheusUrl"),
    ("gang scheduler", {"schedulingPolicy": {"gang": {"scheduler": "kube"}}}, "spec.schedulingPolicy.gang.scheduler"),
    ("checkpoint keep zero", {"checkpoint": {"keep": 0}}, "spec.checkpoint.keep"),
    (
        "toleration Exists with a value",
        {"policy": {"podTemplate": {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}}},
        "spec.policy.podTemplate.tolerations[0]",
    ),
    (
        "env value and secret",
        {
            "rollout": {
                "podTemplate": {
                    "env": [{"name": "OK"}, {"name": "T", "value": "v", "secretKeyRef": {"name": "s", "key": "k"}}]
                }
            }
        },
        "spec.rollout.podTemplate.env[1]",
    ),
    ("suspend not a boolean", {"suspend": [True]}, "spec.suspend"),
    ("replicas negative", {"rollout": {"replicas": -1}}, "spec.rollout.replicas"),
    (
        "negative grace period",
        {"policy": {"podTemplate": {"terminationGracePeriodSeconds": -1}}},
        "spec.policy.podTemplate.terminationGracePeriodSeconds",
    ),
    ("metric not a Prometheus name", {"monitoring": {"gpuUtilMetric": "gpu util"}}, "spec.monitoring.gpuUtilMetric"),
    ("label not a Prometheus name", {"monitoring": {"podLabel": "exported-pod"}}, "spec.monitoring.podLabel"),
    ("policy replicas zero (rank 0 is the coordinator)", {"policy": {"replicas": 0}}, "spec.policy.replicas"),
    (
        "label value with a space",
        {"policy": {"podTemplate": {"labels": {"team": "a b"}}}},
        "spec.policy.podTemplate.labels.team",
    ),
    (
        "nodeSelector value ending in a dash",
        {"rollout": {"podTemplate": {"nodeSelector": {"gpu": "h100-"}}}},
        "spec.rollout.podTemplate.nodeSelector.gpu",
    ),
    ("queue not a label value", {"schedulingPolicy": {"queue": "team/a"}}, "spec.schedulingPolicy.queue"),
    ("checkpoint path leaving its folder", {"checkpoint": {"path": "ckpt/../../etc"}}, "spec.checkpoint"),
    ("checkpoint volume over /tmp", {"checkpoint": {"path": "/tmp", "claimName": "ckpt"}}, "spec.checkpoint"),
    (
        "checkpoint volume over the spec mount, not canonical",
        {"checkpoint": {"path": "/etc/tlt/.", "claimName": "c"}},
        "spec.checkpoint",
    ),
    ("checkpoint volume over the root", {"checkpoint": {"path": "/", "claimName": "ckpt"}}, "spec.checkpoint"),
    (
        "checkpoint volume over the token directory",
        {"checkpoint": {"path": "/var/run/secrets/kubernetes.io/serviceaccount", "claimName": "ckpt"}},
        "spec.checkpoint",
    ),
    (
        "checkpoint volume over a folder holding a mount",
        {"checkpoint": {"path": "/etc", "claimName": "ckpt"}},
        "spec.checkpoint",
    ),
    ("checkpoint volume over the working dir", {"checkpoint": {"path": ".", "claimName": "ckpt"}}, "spec.checkpoint"),
    (
        "toleration value with a space",
        {"rollout": {"podTemplate": {"tolerations": [{"key": "gpu", "value": "a b"}]}}},
        "spec.rollout.podTemplate.tolerations[0].value",
    ),
    (
        "toleration key with two slashes",
        {"rollout": {"podTemplate": {"tolerations": [{"key": "a/b/c", "operator": "Exists"}]}}},
        "spec.rollout.podTemplate.tolerations[0].key",
    ),
    ("image with a space", {"rollout": {"image": "ghcr.io/tlt worker:1"}}, "spec.rollout.image"),
    ("image with two tags", {"verifier": {"image": "tlt:1:2"}}, "spec.verifier.image"),
    (
        "secret key with a slash",
        {"verifier": {"podTemplate": {"env": [{"name": "T", "secretKeyRef": {"name": "s", "key": "a/b"}}]}}},
        "spec.verifier.podTemplate.env[0].secretKeyRef.key",
    ),
    (
        "device class not a DNS name",
        {"drafter": {"placement": "sidecar", "deviceClassName": "GPU_Class"}},
        "spec.drafter.deviceClassName",
    ),
    ("system message without chat", {"dataset": {"system": "Be brief."}}, "spec.dataset"),
    (
        "draft vocabulary below a tree's topk",
        {"speculative": {"draftVocab": 2, "arms": [{"kind": "tree", "depth": 2, "topk": 4}]}},
        "spec.speculative",
    ),
    ("reward not module:function", {"verifier": {"reward": "my_rewards.score"}}, "spec.verifier.reward"),
    ("eval fraction of 1", {"dataset": {"evalFraction": 1}}, "spec.dataset.evalFraction"),
    (
        "reserved label",
        {"rollout": {"podTemplate": {"labels": {"tlt.dev/run": "other-run"}}}},
        "spec.rollout.podTemplate",
    ),
    (
        "reserved annotation",
        {"policy": {"podTemplate": {"annotations": {"tlt.dev/progress": '{"step": 1}'}}}},
        "spec.policy.podTemplate",
    ),
    ("over-provision in sync mode", {"algorithm": {"rollout": {"overProvision": 0.25}}}, "spec.algorithm.rollout"),
    (
        "whole over-provision in sync mode",
        {"algorithm": {"rollout": {"mode": "sync", "overProvision": 1}}},
        "spec.algorithm.rollout",
    ),
    (
        "partial rollouts keeping nothing across steps",
        {"algorithm": {"rollout": {"mode": "partial", "maxStaleness": 0}}},
        "spec.algorithm.rollout",
    ),
    (
        "partial rollouts on the vLLM engine",
        {"algorithm": {"rollout": {"mode": "partial"}}, "rollout": {"engine": "vllm"}},
        "spec",
    ),
    ("unknown rollout mode", {"algorithm": {"rollout": {"mode": "async"}}}, "spec.algorithm.rollout.mode"),
    (
        "over-provision above 4",
        {"algorithm": {"rollout": {"mode": "partial", "overProvision": 5}}},
        "spec.algorithm.rollout.overProvision",
    ),
    ("negative staleness", {"algorithm": {"rollout": {"maxStaleness": -1}}}, "spec.algorithm.rollout.maxStaleness"),
    (
        "importance cap below 1",
        {"algorithm": {"rollout": {"importanceCap": 0.5}}},
        "spec.algorithm.rollout.importanceCap",
    ),
]

CEL_MESSAGES = {
    "min trainers above max": MSG_TRAINERS,
    "metrics port on Ray's GCS port": MSG_METRICS_PORT,
    "min trainers above defaulted max": MSG_TRAINERS,
    "sidecar without device class": MSG_SIDECAR,
    "sidecar with empty device class": MSG_SIDECAR,
    "buckets descending": MSG_BUCKETS,
    "buckets repeated": MSG_BUCKETS,
    "ngram min above max": MSG_NGRAM,
    "file dataset without path": MSG_DATASET_PATH,
    "system message without chat": MSG_DATASET_SYSTEM,
    "history match min above max": MSG_HISTORY_MATCH,
    "history arm deeper than maxDraft": MSG_HISTORY_DEPTH,
    "block arm deeper than a block": MSG_BLOCK_ARM,
    "block arm with topk": MSG_BLOCK_ARM,
    "draft vocabulary below a tree's topk": MSG_DRAFT_VOCAB,
    "toleration Exists with a value": MSG_TOLERATION,
    "env value and secret": MSG_ENV,
    "checkpoint path leaving its folder": MSG_CHECKPOINT_PATH,
    "checkpoint volume over /tmp": MSG_CHECKPOINT_MOUNT,
    "checkpoint volume over the spec mount, not canonical": MSG_CHECKPOINT_CANONICAL,
    "checkpoint volume over the root": MSG_CHECKPOINT_MOUNT,
    "checkpoint volume over the token directory": MSG_CHECKPOINT_MOUNT,
    "checkpoint volume over a folder holding a mount": MSG_CHECKPOINT_MOUNT,
    "checkpoint volume over the working dir": MSG_CHECKPOINT_MOUNT,
    "reserved label": MSG_RESERVED,
    "reserved annotation": MSG_RESERVED,
    "over-provision in sync mode": MSG_OVER_PROVISION,
    "whole over-provision in sync mode": MSG_OVER_PROVISION,
    "partial rollouts keeping nothing across steps": MSG_STALENESS,
    "partial rollouts on the vLLM engine": MSG_PARTIAL_VLLM,
}
