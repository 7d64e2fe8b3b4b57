"""A cluster run's outputs on its checkpoint volume, as the steps after `train` read them.

A `TLTTrainingRun` writes its whole-run checkpoints (`tlt.checkpoint.store`) onto the
`checkpoint.claimName` PVC, which the operator mounts at `checkpoint.path` in the policy pods:
the checkpoints sit under the claim's root. The last one (LATEST) is the final step and holds the
policy weights (`policy.safetensors`), the drafter weights (`drafter.safetensors`: the hub's newest,
when the run trained one; `served_drafter.safetensors`: the drafter the rollouts draft with, see
`tlt.drafter.publish`) and the run's spec in its manifest.

`train` (mode cluster) records in its Model artifacts where that is (`location.json`, also the
artifacts' metadata): `claimName`, `pathInClaim` (the checkpoint root relative to the claim's
root) and the final `step`. The `tlt-cluster` pipeline mounts the claim at `CHECKPOINT_MOUNT` on
every step that reads the run's outputs; `final_checkpoint` resolves the location to that mount
and says which claim, path or file is missing when it cannot. The policy is rebuilt from the
run's base model (`model.path`, else the built-in warm start) with the trained weights; the
drafter (the served one under `drafter.publish: validated`, else the hub's newest) is written as a
`save_drafter` folder for `tlt.drafter.export.export_eagle`.
"""

from __future__ import annotations

import json
import logging
import posixpath
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from tlt.checkpoint.store import LATEST, MANIFEST, file_sha256
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, save_drafter
from tlt.models.loading import load_policy
from tlt.spec.run import TLTTrainingRun
from tlt_components.common import CHECKPOINT_MOUNT, parse_run_spec

log = logging.getLogger(__name__)

LOCATION_FILE = "location.json"
PATH_IN_CLAIM = "."  # the operator mounts the whole claim at checkpoint.path: the checkpoints are at its root
POLICY_FILE = "policy.safetensors"
DRAFTER_FILE = "drafter.safetensors"  # the hub's newest parameters
SERVED_DRAFTER_FILE = "served_drafter.safetensors"  # the drafter the rollouts draft with (drafter.publish)


class VolumeError(FileNotFoundError):
    """The run's outputs are not where its location says, on the mounted volume; the message says which."""


def claim_of(run: TLTTrainingRun) -> str:
    """The run's checkpoint claim; ValueError when it has none (its outputs would stay in its pods)."""
    if not run.spec.checkpoint.claim_name:
        raise ValueError(
            "run_spec checkpoint.claimName is required in cluster mode: the steps after train read the run's "
            "outputs from that PersistentVolumeClaim (pipeline parameter checkpoint_claim)"
        )
    return run.spec.checkpoint.claim_name


def cluster_location(run: TLTTrainingRun, *, namespace: str, name: str) -> dict[str, Any]:
    """What `train` (mode cluster) records about where run `namespace/name` keeps its outputs."""
    return {
        "location": "cluster",
        "namespace": namespace,
        "run": name,
        "claimName": claim_of(run),
        "checkpointPath": run.spec.checkpoint.path,
        "pathInClaim": PATH_IN_CLAIM,
        "step": run.spec.algorithm.steps,
    }


def write_location(artifact_dir: Path, location: dict[str, Any]) -> None:
    """Record `location` in a Model artifact's folder."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    (artifact_dir / LOCATION_FILE).write_text(json.dumps(location, indent=2, sort_keys=True))


def read_location(artifact_dir: str | Path) -> dict[str, Any]:
    """The location a cluster-mode Model artifact records; VolumeError naming the artifact when it has none."""
    path = Path(artifact_dir) / LOCATION_FILE
    if not path.is_file():
        raise VolumeError(
            f"the Model artifact {str(artifact_dir)!r} has no {LOCATION_FILE}: not written by train in cluster mode"
        )
    return json.loads(path.read_text())


def _inside(mount: Path, relative: str) -> Path:
    """`relative` under `mount`; ValueError for an absolute path or one that leaves the mount."""
    normal = posixpath.normpath(relative or ".")
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
        raise ValueError(f"location pathInClaim {relative!r} must be a relative path inside the claim")
    return mount / normal


def final_checkpoint(location: dict[str, Any], mount: str | Path = CHECKPOINT_MOUNT) -> Path:
    """The run's final checkpoint folder on the volume mounted at `mount`, checked (see the module docstring)."""
    if location.get("location") != "cluster":
        raise ValueError(f"not the location of a cluster run: {location!r}")
    claim, run = location.get("claimName"), f"{location.get('namespace')}/{location.get('run')}"
    if not claim:
        raise VolumeError(f"TLTTrainingRun {run} has no checkpoint.claimName: its outputs stayed in its pods")
    mount = Path(mount)
    if not mount.is_dir():
        raise VolumeError(
            f"the checkpoint claim {claim!r} of TLTTrainingRun {run} is not mounted at {mount}: run the tlt-cluster "
            f"pipeline with checkpoint_claim={claim!r}"
        )
    root = _inside(mount, str(location.get("pathInClaim", PATH_IN_CLAIM)))
    pointer = root / LATEST
    if not pointer.is_file():
        raise VolumeError(
            f"no {LATEST} in {root} (claim {claim!r}, path {location.get('pathInClaim')!r}): TLTTrainingRun {run} "
            f"wrote no checkpoint there; is {claim!r} the run's checkpoint.claimName?"
        )
    folder = root / pointer.read_text().strip()
    manifest_file = folder / MANIFEST
    if not manifest_file.is_file():
        raise VolumeError(f"{pointer} names {folder.name}, which has no {MANIFEST} (claim {claim!r})")
    step = json.loads(manifest_file.read_text()).get("step")
    if location.get("step") is not None and step != location["step"]:
        raise VolumeError(
            f"the newest checkpoint in claim {claim!r} is step {step}, not the final step {location['step']} of "
            f"TLTTrainingRun {run}: another run wrote to the claim, or this one did not finish"
        )
    return folder


def read_tensors(folder: Path, name: str) -> dict[str, torch.Tensor]:
    """The tensor file `name` of a checkpoint folder, checked against the manifest's digest."""
    files = json.loads((folder / MANIFEST).read_text()).get("files", {})
    path = folder / name
    if name not in files or not path.is_file():
        raise VolumeError(f"checkpoint {folder} has no {name}")
    if file_sha256(path) != files[name]:
        raise VolumeError(f"{path} is corrupt (sha256 differs from {MANIFEST})")
    return load_file(str(path))


def checkpoint_run(folder: Path) -> TLTTrainingRun:
    """The run that wrote the checkpoint, from the spec in its manifest."""
    spec = json.loads((folder / MANIFEST).read_text()).get("state", {}).get("spec")
    if not isinstance(spec, dict):
        raise VolumeError(f"{folder / MANIFEST} records no run spec")
    return parse_run_spec(spec)


def base_policy_folder(run: TLTTrainingRun) -> Path:
    """The folder the run started from: `model.path`, else the built-in warm start (built and cached here)."""
    if run.spec.model.path is None:
        from tlt.tasks.warmstart import WarmstartConfig, warm_start

        return warm_start(WarmstartConfig())
    folder = Path(run.spec.model.path)
    if not folder.is_dir():
        raise VolumeError(f"the run's model.path {str(folder)!r} is not a folder in this step's container")
    return folder


def trained_policy(folder: Path, dtype: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The trained policy of a final checkpoint: its base model with the checkpoint's weights, in `dtype`."""
    model, tokenizer = load_policy(base_policy_folder(checkpoint_run(folder)), dtype)
    model.load_state_dict(read_tensors(folder, POLICY_FILE), strict=True)
    return model, tokenizer


def write_drafter(folder: Path, target: PretrainedConfig, out: Path) -> Path:
    """The checkpoint's drafter as a `save_drafter` folder at `out`; VolumeError when the run trained none.

    Under `drafter.publish: validated` the served drafter (`served_drafter.safetensors`, the one the run
    measured best and drafted with) when the checkpoint holds it; otherwise (`latest`, where the served
    one lags the hub, or a checkpoint without it) the hub's newest (`drafter.safetensors`)."""
    if not (folder / DRAFTER_FILE).is_file():
        spec = checkpoint_run(folder).spec
        raise VolumeError(
            f"checkpoint {folder} holds no drafter (speculative.mode {spec.speculative.mode!r}): train with "
            "speculative.mode static or tlt"
        )
    manifest = json.loads((folder / MANIFEST).read_text())
    served = (
        SERVED_DRAFTER_FILE in manifest.get("files", {}) and checkpoint_run(folder).spec.drafter.publish == "validated"
    )
    name = SERVED_DRAFTER_FILE if served else DRAFTER_FILE
    state = manifest.get("state", {})
    version = state.get("served_drafter_version" if served else "drafter_version")
    log.info(
        "drafter from checkpoint %s: %s (%s, version %s)",
        folder,
        name,
        "the served drafter" if served else "the hub's newest",
        version,
    )
    drafter = EagleDrafter(drafter_config_from_target(target))
    drafter.load_state_dict(read_tensors(folder, name), strict=True)
    save_drafter(drafter, out)
    return out
