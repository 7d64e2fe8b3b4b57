"""The block drafter: its layout, save/load, the block objective's alignment, training from the online
buffer's packed rows, exact resume, and a warm start on the policy's own greedy outputs whose block
drafts the engine then accepts."""

from __future__ import annotations

import pytest
import torch

from tlt.drafter.block_objective import (
    BlockTraining,
    block_agreement,
    block_batch,
    block_loss,
)
from tlt.drafter.buffer import OnlineBuffer
from tlt.drafter.objective import DrafterBatch, drafter_inputs
from tlt.models.block_drafter import (
    MAX_BLOCK,
    BlockDrafter,
    load_block_drafter,
    new_block_drafter,
)
from tlt.models.drafter import (
    EagleDrafter,
    drafter_config_from_target,
    save_drafter,
    target_features,
)
from tlt.models.tiny import tiny_model
from tlt.rollout.block import BlockChainDrafter
from tlt.rollout.engine import Engine
from tlt.rollout.speculative import SpeculativeStepper
from tlt.rollout.types import Request, SamplingParams


@pytest.fixture(scope="module")
def policy():
    return tiny_model("qwen2", vocab_size=32, seed=2)


def _numbered(rows: int, width: int, mask: torch.Tensor | None = None) -> DrafterBatch:
    """A DrafterBatch whose feature at (row, j) is 100 * row + j (so target[j] = f[j+1] reads j + 1)."""
    f = (100 * torch.arange(rows)[:, None] + torch.arange(width + 1)[None, :]).float()[..., None]  # [S, T+1, 1]
    ids = torch.arange(width + 1).expand(rows, width + 1)
    return drafter_inputs(ids, f, mask)


def test_block_outputs_regress_the_features_after_the_anchor():
    batch = _numbered(1, 6)  # positions j = 0..5: x[j+1], f[j]; target[j] = f[j+1]
    blocks = block_batch(batch, k=3)
    assert blocks.input_ids.tolist() == [1, 2, 3, 4, 5, 6] and blocks.features[:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert blocks.target[0, :, 0].tolist() == [1, 2, 3]  # anchor f[0]: outputs f[1], f[2], f[3]
    assert blocks.weight.tolist()[-2:] == [[True, True, False], [True, False, False]]  # the row ends at f[6]


def test_blocks_stop_at_untrained_positions_and_packed_sequence_boundaries():
    mask = torch.tensor([[False, False, True, True, True, True, True]])  # x[2..] are response tokens
    blocks = block_batch(_numbered(1, 6, mask), k=2)
    assert blocks.features[:, 0].tolist() == [1, 2, 3, 4, 5]  # anchors where x[j+1] is a response token
    packed = block_batch(_numbered(1, 6), k=3, segments=[4, 2])
    assert packed.weight.tolist()[:4] == [
        [True, True, True],
        [True, True, True],
        [True, True, False],
        [True, False, False],
    ]
    with pytest.raises(ValueError, match="segments"):
        block_batch(_numbered(2, 6), k=2, segments=[6])


def test_block_drafter_saves_only_its_own_weights_and_loads_back(policy, tmp_path):
    drafter = new_block_drafter(policy, block_size=4, num_layers=2)
    names = set(drafter.state_dict())
    assert "mask" in names and "fc.weight" in names and any(n.startswith("layers.1.") for n in names)
    assert not any("embed" in n or "lm_head" in n for n in names)
    save_drafter(drafter, tmp_path / "block")
    loaded = load_block_drafter(tmp_path / "block", policy)
    assert loaded.block_size == 4 and len(loaded.layers) == 2
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), loaded.state_dict().values()))
    save_drafter(EagleDrafter(drafter_config_from_target(policy.config)), tmp_path / "eagle")
    with pytest.raises(ValueError, match="no block_size"):
        load_block_drafter(tmp_path / "eagle", policy)
    with pytest.raises(ValueError, match="block_size must be in"):
        new_block_drafter(policy, block_size=MAX_BLOCK + 1)


def _own_greedy_data(policy, prompts: int = 12, new: int = 24) -> tuple[DrafterBatch, list[Request]]:
    """The policy's own greedy continuations of short prompts, aligned for the drafter (response only)."""
    g = torch.Generator().manual_seed(0)
    requests = [
        Request(
            f"p{i}",
            torch.randint(1, 32, (4,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=new),
        )
        for i in range(prompts)
    ]
    out = Engine(policy, max_batch_size=prompts, max_context=64, return_hidden=False).generate(requests)
    tokens = torch.tensor([c.prompt_ids + c.token_ids for c in out])  # [P, 4 + new] (no stop token)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 3:] = True  # f[t] produced a response token from t = prompt_len - 1 on
    return drafter_inputs(tokens, target_features(policy, tokens), mask), requests


def test_blocks_train_from_the_online_buffers_packed_rows(policy):
    """The rollout's completions (tokens and the target's features) enter the drafter's online buffer as
    packed rows; a block anchors at each trained position and never reaches into the next sequence."""
    _, requests = _own_greedy_data(policy, prompts=6, new=10)
    buffer = OnlineBuffer(buffer_steps=1, row_tokens=40)
    buffer.add(Engine(policy, max_batch_size=6, max_context=64, return_hidden=True).generate(requests), step=0)
    rows = buffer.batches(0)
    assert any(len(p.segments) > 1 for p in rows), "the rows must pack several sequences"
    blocks = [block_batch(p.batch, 4, p.segments) for p in rows]
    assert sum(b.input_ids.shape[0] for b in blocks) == sum(p.num_trained for p in rows)
    for packed, b in zip(rows, blocks):
        starts = torch.tensor([0, *packed.segments]).cumsum(0)[1:]  # [segments] first position after each
        anchors = packed.batch.mask[0].nonzero()[:, 0]  # [N]
        end = starts[torch.searchsorted(starts, anchors, right=True)]  # [N] the anchor's segment end
        reach = anchors[:, None] + torch.arange(4)[None, :]  # [N, 4] target[j + i]
        assert not bool((b.weight & (reach >= end[:, None])).any()), "a block reached into the next sequence"
    torch.manual_seed(0)
    losses = BlockTraining(new_block_drafter(policy, block_size=4), blocks, lr=3e-3).train(4 * len(blocks))
    assert losses[-1] < losses[0]


def test_training_resumed_from_a_checkpoint_takes_the_steps_of_an_unbroken_run(policy, tmp_path):
    data, _ = _own_greedy_data(policy, prompts=4, new=8)
    batches = [block_batch(data, k=4)]
    torch.manual_seed(0)
    straight = BlockTraining(new_block_drafter(policy, block_size=4), batches, lr=3e-3)
    straight.train(4)
    torch.manual_seed(0)
    first = BlockTraining(new_block_drafter(policy, block_size=4), batches, lr=3e-3)
    first.train(2)
    first.save(tmp_path)
    resumed = BlockTraining(new_block_drafter(policy, block_size=4), batches, lr=3e-3)
    resumed.resume(tmp_path)
    resumed.train(2)
    assert resumed.step == straight.step == 4
    for name, tensor in straight.drafter.state_dict().items():
        assert torch.equal(tensor, resumed.drafter.state_dict()[name]), name
    with pytest.raises(FileNotFoundError, match="no block drafter training state"):
        resumed.resume(tmp_path / "elsewhere")


def test_a_block_drafter_warm_started_on_the_policys_outputs_gets_its_drafts_accepted(policy):
    """Trained on the policy's own greedy answers, the block drafter's drafts of those answers are
    accepted (an untrained one's almost never are), and the output is still plain decoding's."""
    data, requests = _own_greedy_data(policy)
    blocks = block_batch(data, k=4)
    torch.manual_seed(0)
    drafter = new_block_drafter(policy, block_size=4)
    untrained = block_loss(drafter, blocks).total.item()
    losses = BlockTraining(drafter, [blocks], lr=3e-3).train(150)
    assert losses[-1] < 0.6 * untrained
    assert min(block_agreement(drafter, blocks)) > 0.5, "every block offset learns, not only the first"
    plain = Engine(policy, max_batch_size=4, max_context=64).generate(requests)
    engine = Engine(policy, max_batch_size=4, max_context=64)
    engine.stepper = SpeculativeStepper(engine.runner, BlockChainDrafter(drafter, k=4))
    out = engine.generate(requests)
    assert [c.token_ids for c in out] == [c.token_ids for c in plain]
    assert engine.stepper.stats.accept_length > 2.0  # an untrained block drafter's: ~1.05


def test_block_drafter_config_is_refused_without_a_block_size(policy):
    with pytest.raises(ValueError, match="needs block_size"):
        BlockDrafter(drafter_config_from_target(policy.config))
