"""The online drafter buffer: alignment from engine completions, packing, the one-step offset."""

from __future__ import annotations

import pytest
import torch

from tlt.drafter.buffer import OnlineBuffer, pack, sample_from_completion
from tlt.drafter.objective import drafter_loss
from tlt.drafter.trainer import packed_loss
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion, Request, SamplingParams

H = 16


def fake_completion(prompt_len: int, response_len: int, rid: str = "r") -> Completion:
    return Completion(
        request_id=rid,
        prompt_ids=list(range(1, prompt_len + 1)),
        token_ids=[5] * response_len,
        logprobs=torch.zeros(response_len),
        hidden=torch.randn(prompt_len + response_len - 1, H),
        finish_reason="stop",
    )


def test_sample_from_engine_completion_pairs_token_t_plus_1_with_state_t():
    model = tiny_model(vocab_size=32, hidden_size=32, num_layers=1, intermediate_size=64)
    engine = Engine(model, max_batch_size=2, max_context=64, return_hidden=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    completion = engine.generate([Request("a", [1, 7, 9, 4], params)])[0]
    sample = sample_from_completion(completion, step=3)
    full = [1, 7, 9, 4] + completion.token_ids
    assert sample.tokens.tolist() == full[:-1]
    assert sample.prompt_len == 4 and sample.step == 3
    # f[t] produced x[t+1]: the LM head over the stored state at t picks the greedy token t+1
    logits = model.lm_head(sample.hidden[3:])
    assert logits.argmax(-1).tolist() == completion.token_ids[: len(sample.tokens) - 3]


def _drafter_and_samples(seed: int, shapes: list[tuple[int, int]]):
    """A float64 drafter bound to a tiny grouped-query policy, and one buffer sample per (prompt, response)."""
    torch.manual_seed(seed)
    model = tiny_model(
        vocab_size=32,
        hidden_size=H,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
        dtype=torch.float64,
    )
    drafter = EagleDrafter(drafter_config_from_target(model.config)).double()
    drafter.bind_policy(model)
    samples = [sample_from_completion(fake_completion(p, r, f"s{i}"), 1) for i, (p, r) in enumerate(shapes)]
    return drafter, [type(s)(s.tokens % 32, s.hidden.double(), s.prompt_len, s.step) for s in samples]


def test_packed_row_predicts_exactly_what_each_sequence_predicts_alone():
    drafter, samples = _drafter_and_samples(0, [(3, 5), (2, 9), (4, 2)])
    rows = pack(samples, row_tokens=64)
    assert len(rows) == 1
    b = rows[0].batch
    packed_pred = drafter(b.input_ids, b.features, b.position_ids, attention_mask=rows[0].attn_mask)
    alone = [pack([s], row_tokens=64)[0] for s in samples]
    alone_pred = torch.cat(
        [drafter(a.batch.input_ids, a.batch.features, a.batch.position_ids, attention_mask=a.attn_mask) for a in alone],
        dim=1,
    )
    torch.testing.assert_close(packed_pred, alone_pred, rtol=0, atol=1e-12)
    # L = P + T - 1 stored tokens align to L - 1 positions; positions restart per sequence
    assert b.position_ids[0].tolist() == [*range(6), *range(9), *range(4)]


def test_packing_keeps_rows_within_budget_and_trains_on_response_positions_only():
    samples = [
        sample_from_completion(fake_completion(p, r, f"s{i}"), 1)
        for i, (p, r) in enumerate([(3, 40), (2, 9), (5, 2), (4, 17)])
    ]
    assert sample_from_completion(fake_completion(5, 1), 1) is None  # one response token: nothing to train
    rows = pack(samples, row_tokens=16)
    assert all(r.num_positions <= 16 for r in rows)
    # every aligned position appears once; the loss sees exactly the response positions
    assert sum(r.num_positions for r in rows) == sum(s.length - 1 for s in samples)
    assert sum(r.num_trained for r in rows) == sum(s.response_len for s in samples)
    for r in rows:
        mask = r.attn_mask[0, 0]
        assert not mask.triu(1).any(), "a position attends to a later one"


def test_one_step_offset_keeps_the_previous_steps_long_sequences_only():
    buffer = OnlineBuffer(buffer_steps=2, row_tokens=64)
    buffer.add([fake_completion(2, n, f"a{n}") for n in (2, 3, 10, 30)], step=1)
    buffer.begin_step(2)
    assert sorted(s.response_len for s in buffer.samples) == [9, 29]  # T - 1 trainable positions each
    buffer.add([fake_completion(2, n, f"b{n}") for n in (4, 5, 6)], step=2)
    assert buffer.steps_held() == [1, 2]
    buffer.begin_step(3)
    assert buffer.steps_held() == [2]
    assert sorted(s.response_len for s in buffer.samples) == [4, 5]


def test_a_step_run_again_replaces_its_samples_and_a_second_shard_adds_to_them():
    """A step run again after a lost worker hands the same requests in again: each is held once (the later
    samples), while another shard of the same step (a lost worker's, retried here) adds its own."""
    buffer = OnlineBuffer(buffer_steps=2, row_tokens=64)
    buffer.add([fake_completion(2, n, f"s1-p{n}-g0") for n in (3, 4)], step=1)
    buffer.add([fake_completion(2, n, f"s2-p{n}-g0") for n in (5, 6)], step=2)
    again = [fake_completion(2, n, f"s2-p{n}-g0") for n in (5, 6)]
    assert buffer.add(again, step=2) == 2
    step_2 = [s for s in buffer.samples if s.step == 2]
    assert [s.request_id for s in step_2] == ["s2-p5-g0", "s2-p6-g0"]
    assert all(s.hidden is c.hidden for s, c in zip(step_2, again)), "the later samples are kept"
    buffer.add([fake_completion(2, 7, "s2-p7-g0")], step=2)  # another shard of the step
    assert len([s for s in buffer.samples if s.step == 2]) == 3 and buffer.steps_held() == [1, 2]
    restored = OnlineBuffer(buffer_steps=2, row_tokens=64)
    restored.load_state_dict(buffer.state_dict())
    assert [s.request_id for s in restored.samples] == [s.request_id for s in buffer.samples]
    old = {k: v for k, v in buffer.state_dict().items() if k != "request_id"}  # written before samples kept ids
    restored.load_state_dict(old)
    assert len(restored.samples) == len(buffer.samples) and {s.request_id for s in restored.samples} == {""}


def test_batches_cover_the_buffer_in_a_seeded_order():
    buffer = OnlineBuffer(buffer_steps=1, row_tokens=8, seed=7)
    buffer.add([fake_completion(2, n, f"c{n}") for n in (3, 4, 5, 6)], step=1)
    first, again = buffer.batches(0), buffer.batches(0)
    assert [r.batch.input_ids.tolist() for r in first] == [r.batch.input_ids.tolist() for r in again]
    assert sum(r.num_trained for r in first) == buffer.num_trainable


def _packed_setup():
    drafter, samples = _drafter_and_samples(1, [(3, 5), (1, 2), (2, 9), (4, 2)])
    rows = pack(samples, row_tokens=64)
    assert len(rows) == 1 and rows[0].segments == (6, 1, 9, 4)  # one sequence of a single position
    return drafter, rows[0]


def test_segment_attention_equals_the_block_diagonal_mask_in_value_and_gradient():
    """The trainer attends per packed sequence (`segments`), not through a [T, T] mask: same predictions,
    same loss, same gradients (float64), grouped-query heads and a one-position sequence included."""
    drafter, row = _packed_setup()
    b = row.batch
    with torch.no_grad():
        target_logits = drafter.logits(b.target)
    out = {}
    for how, kwargs in (("segments", {"segments": row.segments}), ("mask", {"attention_mask": row.attn_mask})):
        drafter.zero_grad(set_to_none=True)
        pred = drafter(b.input_ids, b.features, b.position_ids, **kwargs)
        loss = drafter_loss(pred, drafter.logits(pred), b.target, target_logits, b.mask).total
        loss.backward()
        out[how] = (pred.detach(), float(loss), {n: p.grad.clone() for n, p in drafter.named_parameters()})
    torch.testing.assert_close(out["segments"][0], out["mask"][0], rtol=0, atol=1e-12)
    assert out["segments"][1] == pytest.approx(out["mask"][1], rel=1e-12)
    for name, grad in out["mask"][2].items():
        torch.testing.assert_close(out["segments"][2][name], grad, rtol=1e-10, atol=1e-12)
    drafter.zero_grad(set_to_none=True)
    assert float(packed_loss(drafter, row)) == pytest.approx(out["mask"][1], rel=1e-12)  # the trainer's path


@pytest.mark.parametrize(
    ("segments", "mask", "match"),
    [
        ((6, 1, 9), False, "sum to the row.s 20"),
        ((6, 1, 9, 4), True, "not both"),
        ((6, 0, 1, 9, 4), False, "positive"),
    ],
)
def test_bad_segments_are_refused(segments, mask, match):
    drafter, row = _packed_setup()
    b = row.batch
    with pytest.raises(ValueError, match=match):
        drafter(
            b.input_ids, b.features, b.position_ids, segments=segments, attention_mask=row.attn_mask if mask else None
        )
