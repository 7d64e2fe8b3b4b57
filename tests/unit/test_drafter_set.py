"""A run with block arms learns the drafters its arms use, as one set the hub, trainers and snapshots move."""

from __future__ import annotations

import pytest
import torch
from test_drafter_hub import filled_buffer, policy, wait_for

from tlt.drafter.block_objective import block_agreement_counts, block_batch, every_kth_anchor
from tlt.drafter.buffer import pack
from tlt.drafter.drafter_set import (
    BLOCK_SNAPSHOTS,
    DrafterSet,
    member_params,
    new_drafter_set,
    packed_block_agreement,
    packed_block_batch,
)
from tlt.drafter.export import write_served_drafter
from tlt.drafter.hub import DrafterHub
from tlt.drafter.trainer import SpotTrainer, packed_agreement
from tlt.models.block_drafter import load_block_drafter
from tlt.models.drafter import drafter_config_from_target, load_drafter
from tlt.models.tiny import tiny_model
from tlt.spec.plan import LearnedDrafters, learned_drafters
from tlt.spec.run import SpeculativeSpec

BLOCK4 = {"kind": "block", "depth": 4}


@pytest.mark.parametrize(
    ("spec", "eagle", "block_size"),
    [
        ({"arms": [{"kind": "chain", "depth": 2}, BLOCK4, {"kind": "block", "depth": 2}]}, True, 4),
        ({"arms": [BLOCK4, {"kind": "ngram"}, {"kind": "plain"}]}, False, 4),
        ({"arms": [{"kind": "tree", "depth": 2, "topk": 2}]}, True, 0),
        ({"arms": [{"kind": "mixed", "depth": 2}, BLOCK4], "history": {"enabled": False}}, False, 4),
        ({"mode": "ngram", "arms": [BLOCK4, {"kind": "ngram"}]}, False, 0),
        ({"mode": "off", "arms": [BLOCK4]}, False, 0),
    ],
)
def test_a_run_learns_one_drafter_per_kind_its_usable_arms_draft_with(spec, eagle, block_size):
    learned = learned_drafters(SpeculativeSpec.model_validate(spec), 16)
    layers = (1, 7, 13) if block_size else ()  # the block drafter reads layers spread over the target's 16
    assert learned == LearnedDrafters(eagle=eagle, block_size=block_size, feature_layers=layers)


def test_a_set_parameter_dict_splits_by_member_and_an_eagle_dict_stays_whole():
    model = policy()
    params = new_drafter_set(model, LearnedDrafters(eagle=True, block_size=3)).state_dict()
    members = member_params(params)
    assert set(members) == {"eagle", "block"}
    assert members["block"]["mask"].shape[0] == 3 and "mask" not in members["eagle"]
    assert len(members["eagle"]) + len(members["block"]) == len(params)
    assert member_params(members["eagle"]) == {"eagle": members["eagle"]}


def test_packed_blocks_never_reach_into_the_next_packed_sequence():
    model = policy()
    buffer = filled_buffer(model, seed=3)
    (packed,) = pack(buffer.samples[:2], row_tokens=64)
    assert len(packed.segments) == 2
    blocks = packed_block_batch(packed, 4)
    first = packed.segments[0]
    alone = block_batch(
        type(packed.batch)(*(t[:, :first] for t in packed.batch)), 4
    )  # the first sequence on its own row
    n = alone.weight.shape[0]
    assert torch.equal(blocks.weight[:n], alone.weight), "a block of the first sequence counted the second's"
    assert torch.equal(blocks.target[:n][alone.weight], alone.target[alone.weight])


def test_a_sets_agreement_sums_its_eagle_positions_and_its_block_outputs():
    model = policy()
    drafters = new_drafter_set(model, LearnedDrafters(eagle=True, block_size=3))
    packs = filled_buffer(model, seed=5).batches(0)
    eagle = packed_agreement(drafters.eagle, packs)
    block = packed_block_agreement(drafters.block, packs)
    assert 0 < block[1] <= eagle[1], "non-overlapping blocks predict each position at most once"
    assert packed_agreement(drafters, packs) == (eagle[0] + block[0], eagle[1] + block[1])
    counts = [block_agreement_counts(drafters.block, every_kth_anchor(packed_block_batch(p, 3), 3)) for p in packs]
    assert block == (sum(int(a.sum()) for a, _ in counts), sum(int(t.sum()) for _, t in counts))


def test_every_kth_anchor_predicts_each_position_of_a_sequence_once():
    model = policy()
    (packed,) = pack(filled_buffer(model, seed=3).samples[:2], row_tokens=64)
    for k in (1, 2, 3, 5):
        blocks = packed_block_batch(packed, k)
        kept = every_kth_anchor(blocks, k)
        assert torch.equal(kept.input_ids, blocks.input_ids[::k]) and torch.equal(kept.weight, blocks.weight[::k])
        anchors = packed.batch.mask[0].nonzero().squeeze(1)[::k]  # [n] positions of the kept anchors
        predicted = (anchors[:, None] + torch.arange(k)[None, :])[kept.weight]
        assert predicted.unique().numel() == predicted.numel(), f"k={k}: a position predicted twice"


def test_the_hub_takes_the_runs_set_once_and_refuses_a_change_after_training(tmp_path):
    model = policy()
    hub = DrafterHub(drafter_config_from_target(model.config), 1e-3, snapshot_dir=tmp_path)
    learned = LearnedDrafters(eagle=False, block_size=4)
    hub.use_drafters(learned)
    first = hub.params()
    hub.use_drafters(learned)  # every worker says the same: nothing changes
    assert isinstance(hub.drafter, DrafterSet) and hub.drafter.eagle is None
    assert hub.params().keys() == first.keys() and all(torch.equal(hub.params()[k], v) for k, v in first.items())
    hub.push_delta("w0", {k: torch.full_like(v, 1e-3) for k, v in first.items()}, 0, 1, 10, 1.0)
    with pytest.raises(ValueError, match="cannot switch"):
        hub.use_drafters(LearnedDrafters(eagle=True, block_size=4))
    hub.snapshot(step=1)
    assert hub.wait_snapshots(30.0)
    assert (tmp_path / BLOCK_SNAPSHOTS / "LATEST").is_file() and not (tmp_path / "LATEST").exists(), (
        "a block-only run snapshots its block drafter alone"
    )


def test_a_spot_trainer_trains_the_set_and_syncs_it_with_the_hub(tmp_path):
    model = policy()
    config = drafter_config_from_target(model.config)
    hub = DrafterHub(config, 3e-3, snapshot_dir=tmp_path / "drafter")
    learned = LearnedDrafters(eagle=True, block_size=4)
    hub.use_drafters(learned)
    drafters = new_drafter_set(model, learned)
    trainer = SpotTrainer(
        "w0", drafters, filled_buffer(model, seed=2), hub.push_delta, learning_rate=3e-3, sync_every=2
    )
    trainer.load(*hub.pull())
    before = hub.params()
    trainer.start(step=1)
    wait_for(lambda: hub.version >= 4)
    ack = trainer.stop()
    assert ack["error"] is None and ack["version_last"] == hub.version
    after = member_params(hub.params())
    changed = {
        m for m, params in after.items() if any(not torch.equal(v, before[f"{m}.{k}"]) for k, v in params.items())
    }
    assert changed == {"eagle", "block"}, "both members trained and reached the hub"
    hub.snapshot(step=1)
    assert hub.wait_snapshots(30.0)
    block_root = tmp_path / "drafter" / BLOCK_SNAPSHOTS
    block = load_block_drafter(block_root / (block_root / "LATEST").read_text().strip(), model)
    assert block.block_size == 4 and torch.equal(block.mask, after["block"]["mask"])
    eagle_root = tmp_path / "drafter"
    eagle = load_drafter(eagle_root / (eagle_root / "LATEST").read_text().strip(), model)
    assert torch.equal(eagle.fc.weight, after["eagle"]["fc.weight"])


def test_every_member_of_a_set_drafts_from_one_reduced_vocabulary():
    model = policy()
    drafters = new_drafter_set(model, LearnedDrafters(eagle=True, block_size=2))
    vocab = drafters.set_draft_vocab(8)
    assert vocab is not None and drafters.eagle.draft_vocab is vocab and drafters.block.draft_vocab is vocab


@pytest.mark.parametrize("layers", [(), (0,)], ids=["final-norm", "wide"])
@pytest.mark.parametrize("eagle", [True, False])
def test_the_served_set_is_written_as_its_members_folders(tmp_path, eagle, layers):
    model = tiny_model(vocab_size=32, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32)
    drafters = new_drafter_set(model, LearnedDrafters(eagle=eagle, block_size=3, feature_layers=layers))
    params = drafters.state_dict()
    folder = write_served_drafter(
        tmp_path, (7, params), model.config, publish="validated", step=2, feature_layers=layers
    )
    block = load_block_drafter(folder / BLOCK_SNAPSHOTS, model)
    assert torch.equal(block.mask, drafters.block.mask) and block.feature_layers == layers
    assert (folder / "config.json").exists() == eagle
    if eagle:
        assert torch.equal(load_drafter(folder, model).fc.weight, drafters.eagle.fc.weight)


def test_a_warm_start_of_eagle_parameters_fills_the_sets_eagle_member_only():
    model = policy()
    config = drafter_config_from_target(model.config)
    eagle = DrafterHub(config, 1e-3, seed=5).params()  # an EAGLE drafter's parameters, as drafterPath holds
    hub = DrafterHub(config, 1e-3)
    hub.use_drafters(LearnedDrafters(eagle=True, block_size=2))
    block = member_params(hub.params())["block"]
    hub.load_params(eagle)
    members = member_params(hub.params())
    assert all(torch.equal(members["eagle"][k], v) for k, v in eagle.items())
    assert all(torch.equal(members["block"][k], v) for k, v in block.items())
    only_block = DrafterHub(config, 1e-3)
    only_block.use_drafters(LearnedDrafters(eagle=False, block_size=2))
    with pytest.raises(ValueError, match="drafterPath"):
        only_block.load_params(eagle)
