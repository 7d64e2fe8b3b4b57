"""The checks and the carry of `bench/gpu/run.sh`, the one-shot measurement script for a lent GPU machine.

A device call is short (minutes of device time in all) and its machine is bare: an image with torch and
CUDA but without Ray, pydantic or math-verify, no network, and only what the call carries beside the source
tree (64 MiB together). So the script checks everything that can be checked before it spends GPU time,
and its dry run checks on the CPU what the device will need:

- `cuda`: torch sees a CUDA device with at least N GiB free (the first thing the device run checks);
- `carry`: the warm starts the GPU workload and its quick version start from (policy and drafter, in
  `$TLT_CACHE_DIR/warmstart`) are there, so the device never trains them;
- `build`: makes them (on the CPU, minutes), for `make gpu-carry`;
- `machine`: the device's description (GPU, driver, torch, CUDA, `nvidia-smi`) as JSON;
- `imports`: the distributions a set of modules pulls in that neither the device image
  (`bench/gpu/device-packages.txt`) nor the carried wheels hold (run in a process with Ray blocked);
- `sizes`: what a device call sends: the source tree (tracked and untracked-not-ignored files) and the
  carried folder, in bytes.

Only the standard library is imported at the top: `cuda` must answer where the project cannot import yet.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
# What a device call may send: the working tree (tracked and untracked-not-ignored files) and the carried paths.
CALL_LIMIT_BYTES = 64 * MIB
PROJECT_MODULES = frozenset({"tlt", "tlt_operator", "tlt_components"})


def cuda_problem(min_free_gib: float) -> str | None:
    """Why this process cannot measure on a GPU (no torch, no CUDA device, too little free memory), or None."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable by {sys.executable}: {exc}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    free, total = torch.cuda.mem_get_info()
    if free < min_free_gib * GIB:
        return (
            f"{torch.cuda.get_device_name(0)} has {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB; "
            f"the script needs {min_free_gib:g} GiB (a 7B shape in bfloat16 and its cache)"
        )
    return None


def expected_warm_starts(workload: Path) -> list[dict[str, Any]]:
    """Per version of `workload` (full, quick): its warm-start folder under `$TLT_CACHE_DIR/warmstart` and the
    settings its warm drafter was trained with (`tlt.bench.workload.drafter_warm_start`, recorded in the drafter
    folder's bench.json)."""
    from tlt.bench.workload import load_workload
    from tlt.tasks.warmstart import cache_root

    out = []
    for quick in (False, True):
        w = load_workload(workload, quick=quick)
        key = w.warmstart.cache_key()
        d = w.drafter_warmstart
        drafter = (
            None
            if not d
            else {
                "policy": key,
                "prompts": int(d["prompts"]),
                "steps": int(d["steps"]),
                "batch": int(d["batch"]),
                "lr": float(d["learningRate"]),
                "max_new_tokens": int(d["maxNewTokens"]),
                "seed": int(d["seed"]),
            }
        )
        out.append(
            {
                "version": "quick" if quick else "full",
                "folder": cache_root() / "warmstart" / key,
                "drafter_settings": drafter,
            }
        )
    return out


def missing_warm_starts(workload: Path) -> list[str]:
    """One line per warm start (policy or drafter) of `workload` that is not in the cache; [] when all are."""
    from tlt.tasks.warmstart import METADATA_FILE

    missing = []
    for entry in expected_warm_starts(workload):
        folder = entry["folder"]
        if not (folder / METADATA_FILE).is_file():
            missing.append(f"{entry['version']} warm-start policy: {folder} (no {METADATA_FILE})")
            continue
        wanted = entry["drafter_settings"]
        found = [json.loads(p.read_text()).get("settings") for p in folder.glob("bench-drafter-*/bench.json")]
        if wanted is not None and wanted not in found:
            missing.append(
                f"{entry['version']} warm drafter: no {folder}/bench-drafter-*/bench.json with settings {wanted}"
            )
    return missing


def build_warm_starts(workload: Path) -> list[Path]:
    """Make (or find) every warm start of `workload`, quick version first; the drafter folders."""
    import torch

    from tlt.bench.workload import load_workload, warm_drafter

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    folders = []
    for quick in (True, False):
        drafter, _ = warm_drafter(load_workload(workload, quick=quick))
        folders.append(drafter)
    return folders


def _run(argv: list[str]) -> str | None:
    """stdout of `argv`, or None when it cannot run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def machine_description() -> dict[str, Any]:
    """GPU name, driver, torch, its CUDA, Python, CPUs and `nvidia-smi`'s output (None where absent)."""
    import torch

    cuda = torch.cuda.is_available()
    smi = shutil.which("nvidia-smi")
    driver = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]) if smi else None
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 1) if cuda else None,
        "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
        "driver": driver.strip() if driver else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "nvidia_smi": _run([smi]) if smi else None,
    }


def normalize(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(path: Path) -> str:
    """The distribution a wheel file installs, from its file name (`name-version-...whl`)."""
    return normalize(path.name.split("-", 1)[0])


def allowed_distributions(device_list: Path, wheels: Path) -> set[str]:
    """The device image's distributions (one a line, `#` comments) and the carried wheels'."""
    names = {
        normalize(line.strip())
        for line in device_list.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    return names | {wheel_distribution(p) for p in wheels.glob("*.whl")}


class _ImportRecorder:
    """A meta-path finder that finds nothing and records, per top-level module first imported, the top-level
    module whose code imported it."""

    def __init__(self) -> None:
        self.importers: dict[str, set[str]] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        top = name.split(".", 1)[0]
        if top in sys.modules:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = (frame.f_globals.get("__name__") or "") if frame is not None else ""
        self.importers.setdefault(top, set()).add(importer.split(".", 1)[0])
        return None


def recorded_imports(action: Callable[[], Any]) -> dict[str, set[str]]:
    """Run `action`; per top-level module it imported first, the top-level modules whose code imported it."""
    recorder = _ImportRecorder()
    sys.meta_path.insert(0, recorder)
    try:
        action()
    finally:
        sys.meta_path.remove(recorder)
    return recorder.importers


def collect_and_import(collect: list[str], modules: list[str]) -> None:
    """Collect the `gpu` tests under `collect` (pytest, ValueError when collection fails), then import `modules`."""
    if collect:
        import pytest

        rc = pytest.main(
            [
                "--collect-only",
                "-q",
                "-m",
                "gpu",
                "-p",
                "no:cacheprovider",
                "-W",
                "ignore::pytest.PytestConfigWarning",
                *collect,
            ]
        )
        if rc != 0:
            raise ValueError(f"the gpu tests under {' '.join(collect)} do not collect here (pytest exit {rc})")
    for name in modules:
        importlib.import_module(name)


def foreign_distributions(importers: dict[str, set[str]], allowed: set[str]) -> dict[str, list[str]]:
    """Distributions not in `allowed` that the imports recorded in `importers` (`recorded_imports`) needed:
    {distribution: its top-level modules}. A module counts when our code imports it (the project, the tests
    and their helpers: code of no distribution and not the standard library), or a counted module does;
    one that only an allowed distribution imports is that distribution's affair (the device's version
    brings its own needs)."""
    owners = importlib.metadata.packages_distributions()

    def foreign(top: str) -> list[str]:
        return [normalize(d) for d in owners.get(top, []) if normalize(d) not in allowed]

    def ours(importer: str) -> bool:
        return importer in PROJECT_MODULES or (importer not in owners and importer not in sys.stdlib_module_names)

    needed: set[str] = set()
    changed = True
    while changed:  # to a fixed point: what our code imports, then what those import
        changed = False
        for top, by in importers.items():
            if top not in needed and foreign(top) and any(ours(i) or i in needed for i in by):
                needed.add(top)
                changed = True
    found: dict[str, list[str]] = {}
    for top in sorted(needed):
        for dist in foreign(top):
            found.setdefault(dist, []).append(top)
    return found


def tree_bytes(root: Path) -> int:
    """Bytes of the files a device call sends from the checkout at `root`: tracked, and untracked not ignored."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sum((root / p).stat().st_size for p in out.decode().split("\0") if p and (root / p).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tlt.bench.gpu_check", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="check", required=True)
    p = sub.add_parser("cuda")
    p.add_argument("--min-free-gib", type=float, default=20.0)
    for name in ("carry", "build"):
        sub.add_parser(name).add_argument("--workload", type=Path, required=True)
    sub.add_parser("machine").add_argument("--out", type=Path, required=True)
    p = sub.add_parser("imports")
    p.add_argument("--device-list", type=Path, required=True)
    p.add_argument("--wheels", type=Path, required=True)
    p.add_argument("--collect", action="append", default=[], help="first collect the gpu tests under this path")
    p.add_argument("modules", nargs="+")
    p = sub.add_parser("sizes")
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--carry", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.check == "cuda":
        problem = cuda_problem(args.min_free_gib)
        print(problem or "cuda: ok")
        return 1 if problem else 0
    if args.check == "carry":
        missing = missing_warm_starts(args.workload)
        print("\n".join(f"missing: {m}" for m in missing) or "warm starts: ok")
        return 1 if missing else 0
    if args.check == "build":
        print("\n".join(str(f) for f in build_warm_starts(args.workload)))
        return 0
    if args.check == "machine":
        args.out.write_text(json.dumps(machine_description(), indent=2) + "\n")
        return 0
    if args.check == "imports":
        try:
            importers = recorded_imports(lambda: collect_and_import(args.collect, args.modules))
        except (ImportError, ValueError) as exc:
            print(f"imports: {exc}")
            return 1
        foreign = foreign_distributions(importers, allowed_distributions(args.device_list, args.wheels))
        print(
            "\n".join(f"not on the device: {d} (imported as {', '.join(m)})" for d, m in foreign.items())
            or "imports: ok"
        )
        return 1 if foreign else 0
    tree, carry = tree_bytes(args.root), folder_bytes(args.carry)
    print(
        json.dumps(
            {"tree_bytes": tree, "carry_bytes": carry, "total_bytes": tree + carry, "limit_bytes": CALL_LIMIT_BYTES}
        )
    )
    return 0 if tree + carry <= CALL_LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
