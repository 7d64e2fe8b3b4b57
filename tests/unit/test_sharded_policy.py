"""The policy group's placement and spec: which node each rank runs on, how many ranks a spec makes, what a
one-rank checkpoint's optimizer state becomes for the group, and the refusals."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tlt.models.tiny import tiny_model
from tlt.spec.run import RunSpec, TLTTrainingRun
from tlt.workers.policy_shards import named_optimizer_state
from tlt.workers.sharded_policy import policy_nodes, rank_nodes


def _node(node_id: str, address: str, *, policy: bool = True, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "NodeManagerAddress": address,
        "Alive": alive,
        "Resources": {"CPU": 4.0, **({"tlt_policy": 1.0} if policy else {})},
    }


def test_rank_zero_runs_on_the_coordinators_node_then_the_policy_pods_in_address_order():
    nodes = [
        _node("c", "10.0.0.9"),
        _node("b", "10.0.0.3"),
        _node("head", "10.0.0.1", policy=False),
        _node("rollout", "10.0.0.2", policy=False),
        _node("dead", "10.0.0.4", alive=False),
    ]
    assert policy_nodes(nodes, "head") == ["head", "b", "c"]


def test_ranks_fill_their_node_before_the_next():
    assert rank_nodes(4, 2, ["head", "b"]) == ["head", "head", "b", "b"]
    assert rank_nodes(2, 2, ["head"]) == ["head", "head"]
    assert rank_nodes(3, 1, ["head", "b", "c"]) == ["head", "b", "c"]


def test_too_few_policy_nodes_are_refused_naming_what_joined():
    with pytest.raises(ValueError, match="3 ranks at 1 a node need 3 policy nodes, 2 joined"):
        rank_nodes(3, 1, ["head", "b"])


def test_world_size_is_one_rank_a_gpu_or_a_pod():
    assert RunSpec().policy.world == 1 and RunSpec().policy.group_sharding == "none"
    pods = RunSpec.model_validate({"policy": {"replicas": 2}})
    assert pods.policy.world == 2 and pods.policy.group_sharding == "fsdp"
    gpus = RunSpec.model_validate({"policy": {"replicas": 2, "resources": {"gpus": 4}}})
    assert gpus.policy.world == 8
    assert RunSpec.model_validate({"policy": {"replicas": 2, "sharding": "ddp"}}).policy.group_sharding == "ddp"
    alone = RunSpec.model_validate({"policy": {"replicas": 4, "sharding": "none"}})
    assert alone.policy.world == 1 and alone.policy.group_sharding == "none"
    # fsdp asked for at one rank: one rank updates unsharded
    assert RunSpec.model_validate({"policy": {"sharding": "fsdp"}}).policy.group_sharding == "none"


def test_a_world_the_batch_cannot_feed_is_refused_in_one_line():
    with pytest.raises(ValidationError, match=r"policy: 9 policy ranks .* a step has 8 sequences"):
        RunSpec.model_validate({"policy": {"replicas": 9}, "algorithm": {"promptsPerStep": 2, "groupSize": 4}})
    RunSpec.model_validate({"policy": {"replicas": 8}, "algorithm": {"promptsPerStep": 2, "groupSize": 4}})


def test_an_unknown_sharding_is_refused_naming_the_choices():
    with pytest.raises(ValidationError, match="'none', 'ddp' or 'fsdp'"):
        RunSpec.model_validate({"policy": {"replicas": 2, "sharding": "zero3"}})


def test_the_one_process_loop_refuses_a_policy_group_in_one_line(tmp_path):
    from tlt.runtime.local_executor import local_trainer

    run = TLTTrainingRun.model_validate({"spec": {"policy": {"replicas": 2}}})
    with pytest.raises(ValueError, match="2 policy ranks .* run without --local, or set policy.sharding: none"):
        local_trainer(run, tmp_path)
    assert not any(tmp_path.iterdir()), "nothing written"


def test_a_one_rank_optimizer_state_is_keyed_by_parameter_name():
    model = tiny_model("qwen2", seed=1, num_layers=1, tie_word_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    named = named_optimizer_state(model, optimizer.state_dict())
    names = [n for n, _ in model.named_parameters()]
    assert list(named["state"]) == names
    assert named["param_groups"][0]["params"] == names
    first = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(named["state"][names[0]]["exp_avg"], first)


def test_a_rank_that_cannot_join_names_itself_and_the_address():
    from tlt.workers.policy_group import init_group
    from tlt.workers.policy_rank import free_port

    port = free_port("127.0.0.1")  # nobody listens there: rank 0 never came
    with pytest.raises(
        RuntimeError, match=rf"policy rank 1 of 2 could not join the group at 127.0.0.1:{port} within 2 s"
    ):
        init_group(1, 2, "127.0.0.1", port, timeout_s=2)


def test_tlt_train_local_refuses_a_policy_group_before_anything_loads(tmp_path, capsys):
    import yaml

    from tlt.cli import main

    run = tmp_path / "run.yaml"
    run.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tlt.dev/v1alpha1",
                "kind": "TLTTrainingRun",
                "metadata": {"name": "group"},
                "spec": {"policy": {"replicas": 2}},
            }
        )
    )
    assert main(["train", str(run), "--local", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "2 policy ranks" in err and "run without --local" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_recomputed_activations_give_the_same_update_and_keep_the_parameter_names():
    import copy

    from tlt.rl.update import RolloutBatch, policy_update
    from tlt.spec.run import AlgorithmSpec
    from tlt.workers.policy_group import checkpoint_activations

    algo = AlgorithmSpec(micro_batch_size=2, ppo_epochs=2)
    plain = tiny_model("qwen2", seed=4, dtype=torch.float64, num_layers=2)
    recomputed = checkpoint_activations(copy.deepcopy(plain))
    assert [n for n, _ in recomputed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    results, calls = [], []
    for model in (plain, recomputed):
        count = [0]
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *_, c=count: c.__setitem__(0, c[0] + 1))
        calls.append(count)
        g = torch.Generator().manual_seed(5)
        batch = RolloutBatch(
            [torch.randint(1, 64, (4,), generator=g).tolist() for _ in range(3)],
            [torch.randint(1, 64, (n,), generator=g).tolist() for n in (3, 7, 5)],
            torch.zeros(3, 7, dtype=torch.float64),
            torch.randn(3, generator=g),
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        results.append((policy_update(model, optimizer, batch, algo, old_from_first_pass=True), model.state_dict()))
    (m1, w1), (m2, w2) = results
    assert calls[1][0] == 2 * calls[0][0], "each layer's forward runs again in the backward"
    assert m1 == pytest.approx(m2, rel=1e-12, abs=1e-12)
    assert all(torch.allclose(w1[k], w2[k], rtol=0, atol=1e-12) for k in w1)
    assert any(
        not torch.equal(w1[k], tiny_model("qwen2", seed=4, dtype=torch.float64, num_layers=2).state_dict()[k])
        for k in w1
    )
