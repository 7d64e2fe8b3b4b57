"""Where `tlt train`'s roles compute (`tlt.runtime.devices`): the GPU plan from the roles' `resources.gpus`,
the refusals that name the field, and the CPU hand-over of tensors that cross processes. The CUDA half of
each (a run on a GPU) is in tests/gpu/test_cuda_runtime.py."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from tlt.drafter.buffer import Sample, pack
from tlt.rollout.types import Completion
from tlt.runtime.devices import CPU, GpuPlan, actor_device, completion_to_cpu, gpu_plan, to_cpu, tree_to_cpu
from tlt.runtime.ray_cluster import _role_options, local_graph_sets, placement
from tlt.spec.run import RunSpec, TLTTrainingRun

CUDA = torch.device("cuda")


def plan(policy=0, rollout=0, replicas=2, resources=None, *, role_pods=False, cuda=False):
    return gpu_plan(policy, rollout, replicas, resources or {}, role_pods=role_pods, cuda_available=cuda)


def test_no_gpus_asked_keeps_every_role_on_the_cpu_even_where_gpus_exist():
    assert plan() == GpuPlan(CPU, 0.0)
    assert plan(resources={"CPU": 16, "GPU": 8}, cuda=True) == GpuPlan(CPU, 0.0)


@pytest.mark.parametrize(
    ("gpus", "replicas", "share"), [(1, 2, 0.5), (1, 3, 0.3333), (2, 2, 1.0), (8, 2, 1.0), (1, 1, 1.0)]
)
def test_local_rollout_workers_share_the_machines_gpus_at_most_one_each(gpus, replicas, share):
    assert plan(rollout=1, replicas=replicas, resources={"GPU": gpus}).rollout_gpus == share


def test_role_pods_ask_for_their_own_pods_gpus():
    assert plan(rollout=2, resources={"GPU": 16, "tlt_rollout": 2}, role_pods=True).rollout_gpus == 2.0


def test_the_policy_computes_on_cuda_when_it_asks_and_one_is_visible():
    assert plan(policy=1, cuda=True).policy_device == CUDA


def test_a_policy_gpu_that_is_not_there_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"policy\.resources\.gpus is 1 .*set policy\.resources\.gpus to 0"):
        plan(policy=1, resources={"GPU": 1}, cuda=False)


def test_a_rollout_gpu_the_cluster_lacks_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"rollout\.resources\.gpus is 1 .*no GPU.*set rollout\.resources\.gpus to 0"):
        plan(rollout=1, resources={"CPU": 2})


def test_placement_carries_the_gpu_plan_into_the_rollout_actors_options():
    spec = RunSpec.model_validate(
        {"rollout": {"replicas": 2, "resources": {"gpus": 1}}, "policy": {"resources": {"gpus": 1}}}
    )
    p = placement(spec, {"CPU": 8.0, "GPU": 1.0}, cuda_available=True)
    assert p.gpus == GpuPlan(CUDA, 0.5)
    assert _role_options("rollout", {"CPU": 8.0}, p.rollout_cpus, p.gpus.rollout_gpus)["num_gpus"] == 0.5
    assert "num_gpus" not in _role_options("verifier", {"CPU": 8.0}, p.verifier_cpus)
    # precompiling compiles CPU graphs: nothing to do for workers that roll out on a GPU
    rollout_only = RunSpec.model_validate({"rollout": {"replicas": 2, "resources": {"gpus": 1}}})
    assert local_graph_sets(rollout_only, "/nonexistent-policy", {"CPU": 8.0, "GPU": 1.0}) == []


def test_placement_on_a_machine_without_gpus_refuses_a_run_that_asks_for_one():
    spec = RunSpec.model_validate({"rollout": {"resources": {"gpus": 1}}})
    with pytest.raises(ValueError, match=r"rollout\.resources\.gpus"):
        placement(spec, {"CPU": 2.0}, cuda_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_single_process_loop_refuses_a_policy_gpu_before_loading_anything(tmp_path):
    from tlt.runtime.local_executor import local_trainer

    run = TLTTrainingRun.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {"model": {"path": str(tmp_path / "no-such-policy")}, "policy": {"resources": {"gpus": 1}}},
        }
    )
    with pytest.raises(ValueError, match=r"policy\.resources\.gpus is 1"):
        local_trainer(run, tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_actor_device_is_the_first_gpu_ray_assigned_else_the_cpu():
    assert actor_device([]) == CPU
    assert actor_device(["3"]) == torch.device("cuda", 0)  # Ray's CUDA_VISIBLE_DEVICES makes it cuda:0


def test_to_cpu_copies_nothing_that_is_already_on_the_cpu_and_casts_when_asked():
    state = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    same = to_cpu(state)
    assert all(same[k].data_ptr() == state[k].data_ptr() for k in state)  # detached views, no copy
    half = to_cpu(state, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 and t.device == CPU for t in half.values())


def test_tree_to_cpu_keeps_an_optimizer_state_loadable():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = tree_to_cpu(opt.state_dict())
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert fresh.state_dict()["param_groups"][0]["betas"] == (0.9, 0.999)
    Pair = namedtuple("Pair", "a b")
    assert tree_to_cpu({"x": [Pair(torch.ones(1), 2)]})["x"][0].b == 2


def test_a_completion_already_on_the_cpu_is_handed_over_as_it_is():
    c = Completion(
        request_id="r",
        prompt_ids=[1, 2],
        token_ids=[3],
        logprobs=torch.zeros(1),
        hidden=torch.zeros(2, 4),
        finish_reason="length",
    )
    assert completion_to_cpu(c) is c


def test_a_packed_row_moves_to_the_drafters_device_and_stays_put_where_it_is():
    sample = Sample(torch.arange(10), torch.randn(10, 8), prompt_len=3, step=1)
    row = pack([sample], row_tokens=16)[0]
    assert row.to(CPU) is row
    moved = row.to(torch.device("meta"))
    assert moved.segments == row.segments
    assert all(t.device.type == "meta" for t in moved.batch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_gpu_bench_workload_is_refused_up_front_on_a_machine_without_one():
    from pathlib import Path

    from tlt.bench.run import check_devices
    from tlt.bench.workload import load_workload

    bench = Path(__file__).resolve().parents[2] / "bench"
    with pytest.raises(ValueError, match=r"workload-gpu-v1\.yaml \(spec\): policy\.resources\.gpus is 1"):
        check_devices(load_workload(bench / "workload-gpu-v1.yaml", quick=True))
    check_devices(load_workload(bench / "workload-deep-v4.yaml"))  # a CPU workload passes
