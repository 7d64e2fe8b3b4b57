"""`tlt train` on a CUDA device (`tlt.runtime.devices`): the single-process loop and the Ray runtime place the
policy, its update, the rollout engines and the drafter trainers on the GPU where the roles'
`resources.gpus` ask, hand tensors between processes on the CPU, and write checkpoints a CPU-only machine
can read. Skipped where no CUDA device is present; the CPU half (the plan, the refusals) is
tests/unit/test_devices.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

# The CPU e2e run's spec (tests/e2e is no package: imported by name from its folder, as the other GPU test does)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from ray_run_spec import SPEC  # noqa: E402

from tlt.checkpoint.store import load_latest  # noqa: E402
from tlt.spec.run import TLTTrainingRun  # noqa: E402
from tlt.tasks.warmstart import reduced_config  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() False)"),
]

ON_GPU = {"policy": {"resources": {"gpus": 1}}, "rollout": {"replicas": 2, "resources": {"gpus": 1}}}


def _run(name: str, **spec) -> TLTTrainingRun:
    """The e2e run's spec on the GPU, two steps."""
    base = {**SPEC, "algorithm": {**SPEC["algorithm"], "steps": 2}, **ON_GPU}
    return TLTTrainingRun.model_validate({"metadata": {"name": name}, "spec": {**base, **spec}})


def test_single_process_loop_trains_on_the_gpu_and_resumes_from_its_checkpoint(tmp_path):
    from tlt.runtime.local_executor import local_trainer

    run = _run("local-gpu", speculative={"mode": "off"})
    trainer = local_trainer(run, tmp_path, warmstart=reduced_config())
    assert trainer.policy.device.type == "cuda"
    history = trainer.train()
    assert [m["step"] for m in history] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in history)
    ckpt = load_latest(tmp_path / "checkpoints")
    state = ckpt.objects["optimizer"]["state"]
    assert all(t.device.type == "cpu" for s in state.values() for t in s.values() if isinstance(t, torch.Tensor))
    longer = _run("local-gpu", speculative={"mode": "off"})
    longer.spec.algorithm.steps = 3
    resumed = local_trainer(longer, tmp_path, warmstart=reduced_config())
    assert resumed.step == 2 and resumed.policy.device.type == "cuda"
    assert [m["step"] for m in resumed.train()] == [1, 2, 3]


def test_ray_runtime_rolls_out_and_trains_the_drafter_on_a_shared_gpu(tmp_path):
    ray = pytest.importorskip("ray")
    from tlt.runtime.ray_executor import ray_trainer

    run = _run("ray-gpu")  # speculative.mode tlt, the drafter trained on every idle worker
    try:
        trainer = ray_trainer(run, tmp_path, warmstart=reduced_config(), num_cpus=4)
        assert trainer.executor.placement.gpus.rollout_gpus == 0.5  # two workers share the one GPU
        assert trainer.policy.device.type == "cuda"
        actors = trainer.executor.start_actors()
        statuses = ray.get([w.status.remote() for w in actors.rollout])
        assert [s["device"] for s in statuses] == ["cuda:0", "cuda:0"]
        history = trainer.train()
    finally:
        ray.shutdown()
    assert [m["step"] for m in history] == [1, 2]
    assert sum(m["drafter_updates"] for m in history) > 0, "no GPU trainer pushed a parameter change to the hub"
    assert (tmp_path / "checkpoints" / "LATEST").read_text() == "step-00000002"
    assert (tmp_path / "policy" / "config.json").is_file()
