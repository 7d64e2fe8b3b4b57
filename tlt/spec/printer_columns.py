"""The CRD's `additionalPrinterColumns`: what `kubectl get tltrun` shows (priority 1: only with `-o wide`)."""

from __future__ import annotations

from typing import Any

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Coarse state of the run."},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step.current", "description": "RL steps finished."},
    {
        "name": "Rollout Ready",
        "type": "integer",
        "jsonPath": ".status.rollout.ready",
        "description": "Rollout pods running and ready.",
    },
    {
        "name": "Trainers Active",
        "type": "integer",
        "jsonPath": ".status.drafter.activeTrainers",
        "description": "Drafter trainers running now.",
    },
    {
        "name": "Slots",
        "type": "integer",
        "jsonPath": ".status.drafter.enabledTrainers",
        "description": "Rollout pods whose drafter-trainer slot is enabled.",
    },
    {
        "name": "Idle GPU-s",
        "type": "number",
        "jsonPath": ".status.drafter.idleGpuSeconds",
        "priority": 1,
        "description": "GPU-seconds observed idle on rollout pods.",
    },
    {
        "name": "Harvested GPU-s",
        "type": "number",
        "jsonPath": ".status.drafter.harvestedGpuSeconds",
        "priority": 1,
        "description": "Idle GPU-seconds spent training the drafter.",
    },
    {
        "name": "Accept Length",
        "type": "number",
        "jsonPath": ".status.drafter.acceptLength",
        "description": "Mean accepted tokens per verification, last step.",
    },
    {
        "name": "Mode",
        "type": "string",
        "jsonPath": ".spec.algorithm.rollout.mode",
        "priority": 1,
        "description": "How a step's rollout ends: sync or partial.",
    },
    {
        "name": "Off-Policy",
        "type": "number",
        "jsonPath": ".status.step.offPolicyFraction",
        "priority": 1,
        "description": "Share of the last step's trained tokens sampled by an older policy.",
    },
    {
        "name": "Drafter",
        "type": "integer",
        "jsonPath": ".status.drafter.version",
        "priority": 1,
        "description": "Newest drafter version on the hub.",
    },
    {
        "name": "Served",
        "type": "integer",
        "jsonPath": ".status.drafter.oldestServed",
        "priority": 1,
        "description": "Oldest drafter version a rollout engine serves.",
    },
    {
        "name": "Drafter Healthy",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="DrafterHealthy")].status',
        "priority": 1,
        "description": "False: an engine's drafter collapsed after a sync (see the condition's message).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
