"""What a benchmark ran on and from: the host's CPU and the exact warm-start weights.

Two results are comparable only when both match. The CPU sets every cost term (the same forward can take
three times as long on one x86 machine as on another: docs/measurements-history.md), and a warm start is
trained from pinned settings on whatever CPU first builds the cache: vector kernels round differently from
one instruction set to another and training amplifies it, so the same settings can give different weights,
and with them a different RL trajectory. Each result names
the CPU and the sha256 of the weights it started from, so a reader can tell.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

import torch
from transformers.utils import SAFE_WEIGHTS_NAME

_CHUNK = 1 << 20


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (Linux's /proc/cpuinfo, else `platform.processor()`); None when neither says."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_info() -> dict[str, Any]:
    """The host as a benchmark result records it: CPU model, logical CPUs and those this process may use,
    the vector instruction set torch's CPU kernels use here, the GPU (None without CUDA), torch, Python and the OS."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def describe(machine: dict[str, Any] | None) -> str:
    """One line for reports: "CPU model, N usable CPUs, ISA kernels, torch X" (a missing field reads '?')."""
    m = machine or {}
    return (
        f"{m.get('cpu_model') or 'unknown CPU'}, {m.get('usable_cpus', '?')} usable CPUs, "
        f"{m.get('cpu_capability', '?')} kernels, torch {m.get('torch', '?')}"
    )


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(folder: Path) -> str | None:
    """sha256 of a saved model folder's weights file (`model.safetensors`: Hugging Face's and the drafter's);
    None when it has none (sharded or other formats are not hashed)."""
    path = Path(folder) / SAFE_WEIGHTS_NAME
    return file_sha256(path) if path.is_file() else None
