"""A cluster run's outputs read from its mounted checkpoint volume (tlt_components.volume): the
location train records resolves to the final checkpoint under the mount; export_drafter and
evaluate_drafter use its drafter and trained policy; a claim that is not mounted, a claim without
the run's checkpoints, and missing or corrupt files each fail naming what is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _kfp_helpers import cached_warm_start, small_run_spec
from safetensors.torch import load_file

from tlt.checkpoint.store import Checkpoint, save_checkpoint
from tlt.drafter.export import load_eagle
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.loading import load_policy
from tlt_components.common import parse_run_spec
from tlt_components.evaluate import evaluate_export
from tlt_components.prepare import prepare_dataset
from tlt_components.train import export_trained_drafter
from tlt_components.volume import (
    VolumeError,
    cluster_location,
    final_checkpoint,
    read_location,
    trained_policy,
    write_location,
)

CLAIM = "tlt-ckpt"


def cluster_spec(mode: str = "static") -> dict[str, Any]:
    return {**small_run_spec(cached_warm_start(), mode), "checkpoint": {"claimName": CLAIM}}


def write_run_checkpoint(
    mount: Path, spec: dict[str, Any], *, drafter: bool = True, served: bool = False
) -> dict[str, torch.Tensor]:
    """What a finished run leaves on its claim (mounted at `mount`): the final whole-run checkpoint, with
    trained (here: shifted) policy weights and, when `drafter`, a seeded drafter (the hub's newest) and, when
    `served`, another one as the served drafter. Returns the policy weights."""
    run = parse_run_spec(spec)
    policy, _ = load_policy(cached_warm_start(), "float32")
    weights = {name: tensor + 0.01 for name, tensor in policy.state_dict().items()}
    tensors = {"policy": weights}
    state: dict[str, Any] = {"spec": run.spec.model_dump(mode="json", by_alias=True)}
    if drafter:
        torch.manual_seed(0)
        tensors["drafter"] = EagleDrafter(drafter_config_from_target(policy.config)).state_dict()
        state["drafter_version"] = 7
    if served:
        torch.manual_seed(1)
        tensors["served_drafter"] = EagleDrafter(drafter_config_from_target(policy.config)).state_dict()
        state["served_drafter_version"] = 5
    save_checkpoint(mount, Checkpoint(step=run.spec.algorithm.steps, tensors=tensors, state=state))
    return weights


def artifacts(tmp_path: Path, spec: dict[str, Any]) -> tuple[Path, Path, dict[str, Any]]:
    """The policy and drafter artifact folders train (mode cluster) writes for run ml/r1, and their metadata."""
    location = cluster_location(parse_run_spec(spec), namespace="ml", name="r1")
    policy_dir, drafter_dir = tmp_path / "policy", tmp_path / "drafter"
    for folder in (policy_dir, drafter_dir):
        write_location(folder, location)
    return policy_dir, drafter_dir, location


def test_export_and_evaluate_read_the_final_checkpoint_on_the_mount(tmp_path: Path):
    spec, mount = cluster_spec(), tmp_path / "mount"
    weights = write_run_checkpoint(mount, spec)
    policy_dir, drafter_dir, location = artifacts(tmp_path, spec)
    assert final_checkpoint(read_location(drafter_dir), mount) == mount / "step-00000002"

    result = export_trained_drafter(drafter_dir, location, policy_dir, tmp_path / "eagle", dtype="float32", mount=mount)
    assert result.tensors == 9 and result.dtype == "float32"
    policy, _ = trained_policy(mount / "step-00000002", "float32")
    assert all(torch.equal(policy.state_dict()[name], tensor) for name, tensor in weights.items()), (
        "the policy carries the run's trained weights, not the base model's"
    )
    exported = load_eagle(tmp_path / "eagle", policy)
    saved = load_file(str(mount / "step-00000002" / "drafter.safetensors"))
    assert all(torch.equal(exported.state_dict()[name].float(), tensor.float()) for name, tensor in saved.items())

    prepare_dataset(spec, tmp_path / "data")
    metrics = evaluate_export(
        tmp_path / "eagle",
        policy_dir,
        tmp_path / "data",
        num_prompts=1,
        draft_tokens=2,
        max_new_tokens=4,
        batch_size=1,
        temperature=0.0,
        dtype="float32",
        policy_metadata=location,
        mount=mount,
    )
    assert metrics["prompts"] == 1 and metrics["outputs_equal"] == 1.0


@pytest.mark.parametrize(("publish", "expected"), [("validated", "served_drafter"), ("latest", "drafter")])
def test_export_takes_the_served_drafter_under_validated(tmp_path: Path, caplog, publish: str, expected: str):
    """The checkpoint holds the hub's newest (drafter) and the served drafter: under drafter.publish validated
    the served one is exported (the one measured best); under latest, where the served one lags, the newest."""
    spec, mount = {**cluster_spec(), "drafter": {"publish": publish}}, tmp_path / "mount"
    write_run_checkpoint(mount, spec, served=True)
    policy_dir, drafter_dir, location = artifacts(tmp_path, spec)
    with caplog.at_level("INFO", logger="tlt_components.volume"):
        export_trained_drafter(drafter_dir, location, policy_dir, tmp_path / "eagle", dtype="float32", mount=mount)
    exported = load_file(str(tmp_path / "eagle" / "model.safetensors"))
    saved = load_file(str(mount / "step-00000002" / f"{expected}.safetensors"))
    assert all(torch.equal(exported[name], tensor) for name, tensor in saved.items())
    version = 5 if expected == "served_drafter" else 7
    assert f"{expected}.safetensors" in caplog.text and f"version {version}" in caplog.text


def test_claim_not_mounted_names_the_claim_and_the_mount(tmp_path: Path):
    _, drafter_dir, location = artifacts(tmp_path, cluster_spec())
    with pytest.raises(
        VolumeError,
        match=f"checkpoint claim '{CLAIM}' of TLTTrainingRun ml/r1 is not mounted at "
        f"{tmp_path / 'absent'}: run the tlt-cluster pipeline with "
        f"checkpoint_claim='{CLAIM}'",
    ):
        export_trained_drafter(
            drafter_dir, location, tmp_path / "policy", tmp_path / "eagle", dtype="auto", mount=tmp_path / "absent"
        )


def test_a_claim_without_the_runs_checkpoints_is_refused(tmp_path: Path):
    spec, mount = cluster_spec(), tmp_path / "mount"
    _, _, location = artifacts(tmp_path, spec)
    mount.mkdir()
    with pytest.raises(VolumeError, match=f"no LATEST in {mount}.*is '{CLAIM}' the run's checkpoint.claimName"):
        final_checkpoint(location, mount)
    write_run_checkpoint(mount, spec, drafter=False)
    with pytest.raises(VolumeError, match="newest checkpoint in claim 'tlt-ckpt' is step 2, not the final step 5"):
        final_checkpoint({**location, "step": 5}, mount)
    with pytest.raises(ValueError, match="pathInClaim '../other' must be a relative path inside the claim"):
        final_checkpoint({**location, "pathInClaim": "../other"}, mount)
    with pytest.raises(VolumeError, match="TLTTrainingRun ml/r1 has no checkpoint.claimName"):
        final_checkpoint({**location, "claimName": None}, mount)


def test_missing_and_corrupt_files_are_named(tmp_path: Path):
    spec, mount = cluster_spec(), tmp_path / "mount"
    write_run_checkpoint(mount, spec, drafter=False)
    policy_dir, drafter_dir, location = artifacts(tmp_path, spec)
    with pytest.raises(VolumeError, match=r"holds no drafter \(speculative.mode 'static'\)"):
        export_trained_drafter(drafter_dir, location, policy_dir, tmp_path / "eagle", dtype="auto", mount=mount)
    folder = mount / "step-00000002"
    (folder / "policy.safetensors").write_bytes(b"truncated")
    with pytest.raises(VolumeError, match="policy.safetensors is corrupt"):
        trained_policy(folder, "float32")
    (folder / "policy.safetensors").unlink()
    with pytest.raises(VolumeError, match="has no policy.safetensors"):
        trained_policy(folder, "float32")
    (folder / "manifest.json").unlink()
    with pytest.raises(VolumeError, match="names step-00000002, which has no manifest.json"):
        final_checkpoint(location, mount)
    with pytest.raises(VolumeError, match="has no location.json: not written by train in cluster mode"):
        read_location(tmp_path / "eagle-less")
