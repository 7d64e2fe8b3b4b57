"""`speculative.drafterPath` warm-starts the parts of the drafter set a run learns, the block part included."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_drafter_hub import policy

from tlt.bench.bench_block_drafter import with_block_part
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS, member_params, new_drafter_set
from tlt.drafter.export import write_served_drafter
from tlt.drafter.hub import DrafterHub
from tlt.drafter.warmstart import warm_start_params, warm_start_problem
from tlt.models.block_drafter import BlockDrafter, block_config_from_target
from tlt.models.drafter import drafter_config_from_target, save_drafter
from tlt.models.loading import save_policy
from tlt.models.tiny import tiny_model
from tlt.runtime import actor_states
from tlt.runtime.actor_states import ActorStates
from tlt.runtime.input_checks import input_problems
from tlt.runtime.ray_cluster import Actors
from tlt.spec.plan import LearnedDrafters
from tlt.spec.run import RunSpec
from tlt.tasks.tokenizer import build_task_tokenizer
from tlt.workers.local_rollout import LocalWorker


def served(tmp_path, eagle: bool, block_size: int, seed: int = 3):
    """A run's `drafter-served/` folder of a freshly initialised set, and the set's parameters."""
    model = policy()
    torch.manual_seed(seed)
    drafters = new_drafter_set(model, LearnedDrafters(eagle=eagle, block_size=block_size))
    params = drafters.state_dict()
    return write_served_drafter(tmp_path, (5, params), model.config, publish="latest", step=1), params, model


def hub_for(model, learned: LearnedDrafters) -> DrafterHub:
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3, seed=11)
    if learned.block_size:
        hub.use_drafters(learned)
    return hub


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value.float()), key


@pytest.mark.parametrize("eagle", [True, False])
def test_a_served_set_warm_starts_both_members_exactly(tmp_path, eagle):
    folder, params, model = served(tmp_path, eagle, block_size=4)
    learned = LearnedDrafters(eagle=eagle, block_size=4)
    hub = hub_for(model, learned)
    assert not torch.equal(hub.params()["block.mask"], params["block.mask"]), "the hub starts elsewhere"
    hub.load_params(warm_start_params(folder, model.config, learned))
    assert_equal(hub.params(), params)


def test_a_block_only_run_takes_the_block_part_and_ignores_the_eagle_part(tmp_path):
    folder, params, model = served(tmp_path, eagle=True, block_size=2)
    learned = LearnedDrafters(eagle=False, block_size=2)
    hub = hub_for(model, learned)
    hub.load_params(warm_start_params(folder, model.config, learned))
    assert_equal(hub.params(), {k: v for k, v in params.items() if k.startswith("block.")})


def test_a_run_without_block_arms_takes_the_eagle_part_as_a_plain_drafter(tmp_path):
    folder, params, model = served(tmp_path, eagle=True, block_size=2)
    learned = LearnedDrafters(eagle=True, block_size=0)
    hub = hub_for(model, learned)
    hub.load_params(warm_start_params(folder, model.config, learned))
    assert_equal(hub.params(), member_params(params)["eagle"])


def test_a_missing_block_part_starts_fresh_beside_the_eagle_part(tmp_path):
    folder, params, model = served(tmp_path, eagle=True, block_size=2)
    eagle_only = tmp_path / "eagle-only"
    eagle_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (eagle_only / name).write_bytes((folder / name).read_bytes())
    learned = LearnedDrafters(eagle=True, block_size=2)
    hub = hub_for(model, learned)
    fresh = hub.params()
    hub.load_params(warm_start_params(eagle_only, model.config, learned))
    got = hub.params()
    assert_equal(
        {k: v for k, v in got.items() if k.startswith("eagle.")},
        {k: v for k, v in params.items() if k.startswith("eagle.")},
    )
    assert torch.equal(got["block.mask"], fresh["block.mask"])
    problem = warm_start_problem(eagle_only, LearnedDrafters(eagle=False, block_size=2))
    assert problem is not None and "holds no block drafter" in problem and "speculative.drafterPath" in problem


@pytest.mark.parametrize(("block_size", "layers", "field"), [(4, 1, "block_size 4"), (2, 2, "num_hidden_layers 2")])
def test_a_block_part_that_does_not_fit_is_refused_naming_the_field_and_file(tmp_path, block_size, layers, field):
    model = policy()
    folder = tmp_path / "drafter"
    save_drafter(BlockDrafter(block_config_from_target(model.config, block_size, layers)), folder / BLOCK_SNAPSHOTS)
    learned = LearnedDrafters(eagle=False, block_size=2)
    with pytest.raises(ValueError, match="speculative.drafterPath") as err:
        warm_start_params(folder, model.config, learned)
    assert field in str(err.value) and str(folder / BLOCK_SNAPSHOTS / "config.json") in str(err.value)


def test_a_block_part_reading_other_target_layers_is_refused_naming_them(tmp_path):
    model = policy()
    folder = tmp_path / "drafter"
    save_drafter(BlockDrafter(block_config_from_target(model.config, 2)), folder / BLOCK_SNAPSHOTS)  # final-norm only
    wide = LearnedDrafters(eagle=False, block_size=2, feature_layers=(0,))
    problem = warm_start_problem(folder, wide)
    assert problem is not None and problem.startswith("speculative.drafterPath: ")
    assert "feature_layers [], this run's block drafter reads the target's layers [0]" in problem
    assert warm_start_problem(folder, wide, check_layers=False) is None
    assert warm_start_problem(folder, LearnedDrafters(eagle=False, block_size=2)) is None


def test_tlt_validate_refuses_a_block_part_of_other_layers_when_the_policy_is_known(tmp_path):
    """With `model.path` set, the block part's feature layers are checked against those a run's block drafter
    reads on that policy (4 layers: layer 1); without it (the built-in policy) they are checked at start."""
    tokenizer = build_task_tokenizer()
    model = tiny_model("qwen2", vocab_size=len(tokenizer), num_layers=4, seed=2)
    save_policy(model, tokenizer, tmp_path / "policy")
    folder = tmp_path / "drafter"
    save_drafter(BlockDrafter(block_config_from_target(model.config, 2)), folder / BLOCK_SNAPSHOTS)  # final-norm only

    def problems(**model_section) -> list[str]:
        spec = {
            "model": model_section,
            "speculative": {"mode": "tlt", "arms": [{"kind": "block", "depth": 2}], "drafterPath": str(folder)},
        }
        return input_problems(RunSpec.model_validate(spec))

    (line,) = problems(path=str(tmp_path / "policy"))
    assert line.startswith("spec.speculative.drafterPath: ") and str(folder / BLOCK_SNAPSHOTS / "config.json") in line
    assert "feature_layers [], this run's block drafter reads the target's layers [1]" in line
    assert problems() == []


def test_the_bench_folder_holds_the_eagle_drafter_and_its_block_part(tmp_path):
    (tmp_path / "run").mkdir()
    eagle_folder, params, model = served(tmp_path / "run", eagle=True, block_size=2)
    eagle = tmp_path / "bench-drafter-aaaa"
    block = tmp_path / "bench-block-drafter-bbbb"
    eagle.mkdir()
    for name in ("config.json", "model.safetensors"):
        (eagle / name).write_bytes((eagle_folder / name).read_bytes())
    (eagle / "bench.json").write_text("{}")
    (eagle_folder / BLOCK_SNAPSHOTS).rename(block)
    folder = with_block_part(eagle, block)
    assert folder == tmp_path / "bench-drafter-set-aaaa-bbbb"
    assert with_block_part(eagle, block) == folder, "built once"
    learned = LearnedDrafters(eagle=True, block_size=2)
    assert_equal(warm_start_params(folder, model.config, learned), {k: v.float() for k, v in params.items()})


def test_the_local_loop_starts_its_block_drafter_from_the_block_part(tmp_path):
    folder, params, _ = served(tmp_path, eagle=True, block_size=3)
    spec = RunSpec.model_validate(
        {"speculative": {"mode": "tlt", "arms": [{"kind": "block", "depth": 3}], "drafterPath": str(folder)}}
    )
    worker = LocalWorker(spec, policy(), None, None)
    assert_equal(worker.hub.params(), {k: v for k, v in params.items() if k.startswith("block.")})


def test_tlt_validate_refuses_a_drafter_path_that_does_not_fit_the_arms(tmp_path):
    folder, _, _ = served(tmp_path, eagle=True, block_size=4)

    def problems(*depths: int) -> list[str]:
        arms = [{"kind": "chain", "depth": 2}, *({"kind": "block", "depth": d} for d in depths)]
        spec = {"speculative": {"mode": "tlt", "arms": arms, "drafterPath": str(folder)}}
        return input_problems(RunSpec.model_validate(spec))

    assert problems(2, 4) == [] and problems() == []
    (line,) = problems(8)
    assert line.startswith("spec.speculative.drafterPath: ") and "block_size 4" in line and "block_size 8" in line


def test_a_run_that_never_trains_is_refused_block_arms_without_a_block_part(tmp_path):
    """Mode static starting from drafterPath (frozen from it) or drafter.training false: block arms with no block
    part to start from would draft with an untrained drafter for the whole run."""
    with_block, _, _ = served(tmp_path, eagle=True, block_size=2)
    eagle_only = tmp_path / "eagle-only"
    eagle_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (eagle_only / name).write_bytes((with_block / name).read_bytes())

    def problems(folder, mode: str = "static", training: bool = True, block: bool = True) -> list[str]:
        arms = [{"kind": "chain", "depth": 2}, *([{"kind": "block", "depth": 2}] if block else [])]
        spec = {
            "speculative": {"mode": mode, "arms": arms, "drafterPath": str(folder)},
            "drafter": {"training": training},
        }
        return input_problems(RunSpec.model_validate(spec))

    (line,) = problems(eagle_only)
    assert line.startswith("spec.speculative.drafterPath: ") and "mode static" in line and "untrained" in line
    (line,) = problems(eagle_only, mode="tlt", training=False)
    assert "drafter.training false" in line
    assert problems(eagle_only, mode="tlt") == []  # it trains the block drafter online
    assert problems(eagle_only, block=False) == [] and problems(with_block) == []


class _Remote:
    """An in-process hub behind the `actor.method.remote(...)` calls `hand_out` makes (ray.get: identity)."""

    def __init__(self, hub: DrafterHub) -> None:
        self.hub = hub

    def __getattr__(self, name: str):
        return SimpleNamespace(remote=getattr(self.hub, name))


def test_a_ray_runs_hub_is_handed_the_parts_it_holds(tmp_path, monkeypatch):
    folder, params, model = served(tmp_path, eagle=True, block_size=3)
    hub = hub_for(model, LearnedDrafters(eagle=False, block_size=3))  # as the workers told it when they started
    monkeypatch.setattr(actor_states.ray, "get", lambda refs: refs)
    actors = Actors(rollout=[], verifiers=[], hub=_Remote(hub))
    ActorStates().hand_out(actors, str(folder), model.config)
    assert_equal(hub.params(), {k: v for k, v in params.items() if k.startswith("block.")})
