"""The adaptive stepper (SD on/off by running batch, bandit-chosen arms) is lossless and re-prefills nothing.

- Greedy decoding in float64 with the adaptive stepper equals plain decoding token for token while
  the batch shrinks across the SD threshold and the bandit switches between n-gram chains, EAGLE
  chains, EAGLE trees, block drafts and an always-right oracle chain.
- The target forwards exactly the prompt tokens plus what each step verified: switching SD on or
  changing arms costs zero re-prefill tokens (counted at the target's embedding layer); a block arm's
  step runs its drafter once.
- The bandit inside the engine records rewards per bucket, tries every arm, and keeps exploring
  with epsilon > 0 (with epsilon 0 it settles on the best arm).
"""

from __future__ import annotations

import itertools
import random

import _sd_helpers as H
import pytest
import torch
from transformers import PreTrainedModel

from tlt.adaptive.adaptive_stepper import AdaptiveStepper, build_adaptive_stepper
from tlt.adaptive.arms import Arm, build_arms, verify_width
from tlt.adaptive.bandit import BucketedBandit
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.batch import RunningBatch
from tlt.rollout.drafting import Draft
from tlt.rollout.engine import Engine
from tlt.rollout.tree import chain_tree
from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.spec.run import ArmSpec, SpeculativeSpec

MAX_CONTEXT = 96
PROMPTS = [
    [5, 6, 7, 5, 6, 7, 5, 6],
    [9, 10, 9, 10, 9, 10, 9, 10],
    [11, 12, 13, 14, 11, 12, 13, 14],
    [3, 4, 3, 4, 5, 3, 4, 5],
]
MAX_NEW = (56, 8, 36, 12)  # rows finish at different steps: the batch shrinks 4 -> 3 -> 2 -> 1
LONG_MAX_NEW = (88, 8, 56, 12)  # longer SD phases for the bandit test
ARMS = [
    ArmSpec(kind="ngram", depth=3),
    ArmSpec(kind="chain", depth=2),
    ArmSpec(kind="tree", depth=3, topk=2, verify_tokens=5),
    ArmSpec(kind="chain", depth=4),
]
# block drafts and plain steps chosen by the bandit, between the other speculative arms
WITH_PLAIN = [*ARMS, ArmSpec(kind="block", depth=3), ArmSpec(kind="plain")]


def _requests(max_new: tuple[int, ...] = MAX_NEW) -> list[Request]:
    return [
        Request(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=n))
        for i, (p, n) in enumerate(zip(PROMPTS, max_new))
    ]


def _spec(**overrides) -> SpeculativeSpec:
    base = dict(mode="tlt", threshold=2, buckets=[1, 2], arms=ARMS, epsilon=0.5, window=4, ngram_min=1, ngram_max=3)
    return SpeculativeSpec(**{**base, **overrides})


def _eagle(model: PreTrainedModel) -> EagleDrafter:
    torch.manual_seed(3)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).to(model.dtype)
    drafter.bind_policy(model)
    return drafter


class OracleChain:
    """Drafts the plain engine's next k greedy tokens: every draft is accepted."""

    def __init__(self, answers: dict[str, list[int]], k: int) -> None:
        self.answers, self.k = answers, k

    def propose(self, batch: RunningBatch) -> Draft:
        futures = [self.answers[s.request.request_id][len(s.tokens) : len(s.tokens) + self.k] for s in batch.sequences]
        n = torch.tensor([len(f) for f in futures])
        padded = torch.tensor([f + [0] * (self.k - len(f)) for f in futures])
        return Draft(chain_tree(batch.last_token, padded, n), chain=True)


@pytest.fixture(scope="module")
def model64() -> PreTrainedModel:
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11)


@pytest.fixture(scope="module")
def plain64(model64: PreTrainedModel) -> list[Completion]:
    return Engine(model64, max_batch_size=4, max_context=MAX_CONTEXT).generate(_requests())


class ForwardCounter:
    """Counts a module's forward calls."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.count += 1


class TargetTokenCounter:
    """Counts every token the target model embeds (any forward of the target, prefill included)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.count = 0
        self.handle = model.model.embed_tokens.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.count += inputs[0].numel()


def _adaptive_engine(model, spec, answers=None, *, seed=0, clock=None) -> tuple[Engine, AdaptiveStepper]:
    engine = Engine(model, max_batch_size=4, max_context=MAX_CONTEXT, return_hidden=True)
    stepper = build_adaptive_stepper(
        spec, engine.runner, _eagle(model), rows=4, context=MAX_CONTEXT, seed=seed, block=H.random_block(model)
    )
    if answers is not None:  # one more arm: the oracle, whose drafts are all accepted
        arms = stepper.arms + [
            Arm(len(stepper.arms), "oracle-d6", ArmSpec(kind="chain", depth=6), OracleChain(answers, 6))
        ]
        bandit = BucketedBandit(
            len(arms), len(spec.buckets), spec.epsilon, spec.window, random.Random(seed), spec.exploration
        )
        stepper = AdaptiveStepper(
            engine.runner,
            arms,
            bandit,
            threshold=spec.threshold,
            buckets=spec.buckets,
            **({"clock": clock} if clock else {}),
        )
    engine.stepper = stepper
    return engine, stepper


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_adaptive_equals_plain_float64_through_switches_and_arm_changes(seed, model64, plain64):
    answers = {c.request_id: c.token_ids for c in plain64}
    engine, stepper = _adaptive_engine(model64, _spec(arms=WITH_PLAIN), answers, seed=seed)
    out = engine.generate(_requests())
    assert [c.token_ids for c in out] == [c.token_ids for c in plain64]
    for got, want in zip(out, plain64):
        torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-6)
    modes = [r.arm is not None for r in stepper.log]
    assert modes[0] is False and True in modes, "the batch must start plain (4 > threshold 2) and switch SD on"
    assert len({r.arm for r in stepper.log if r.arm}) >= 3, "the bandit must switch between several arms"
    assert stepper.stats.accepted > 0, "some drafts must be accepted (the oracle arm at least)"
    for record in stepper.log:
        assert (record.arm is not None) == (record.running <= 2)


def test_switching_sd_on_and_changing_arms_costs_zero_reprefill_tokens(model64, plain64):
    answers = {c.request_id: c.token_ids for c in plain64}
    engine, stepper = _adaptive_engine(model64, _spec(arms=WITH_PLAIN), answers)
    counter = TargetTokenCounter(model64)
    block = next(a.drafter.drafter for a in stepper.arms if a.label == "block-d3")
    calls = ForwardCounter(block)
    try:
        engine.generate(_requests())
    finally:
        counter.handle.remove()
        calls.handle.remove()
    prompt_tokens = sum(len(p) for p in PROMPTS)  # equal lengths: prefill has no padding
    assert len({len(p) for p in PROMPTS}) == 1
    widths = {a.label: verify_width(a.spec) for a in stepper.arms}
    verified = 0
    for r in stepper.log:
        expected = r.running if r.arm is None else r.running * widths[r.arm]  # plain arm: width 1
        assert r.target_tokens == expected, f"step {r} fed other than the verified tokens"
        verified += expected
    assert counter.count == prompt_tokens + verified
    assert engine.tokens_processed == prompt_tokens + verified
    assert 0 < calls.count == sum(1 for r in stepper.log if r.arm == "block-d3"), "one block forward a block step"
    switches = sum(1 for a, b in itertools.pairwise(stepper.log) if a.arm != b.arm)
    assert switches >= 3
    assert "plain" in {r.arm for r in stepper.log}, "the plain arm must be chosen between speculative arms"


def _fixed_clock():
    ticks = itertools.count()
    return lambda: float(next(ticks))  # every step lasts exactly 1 s: reward = tokens gained


def test_bandit_in_engine_records_rewards_per_bucket_and_explores(model64):
    plain = Engine(model64, max_batch_size=4, max_context=MAX_CONTEXT).generate(_requests(LONG_MAX_NEW))
    answers = {c.request_id: c.token_ids for c in plain}
    greedy_engine, greedy = _adaptive_engine(model64, _spec(epsilon=0.0), answers, clock=_fixed_clock())
    greedy_engine.generate(_requests(LONG_MAX_NEW))
    explore_engine, explore = _adaptive_engine(
        model64, _spec(epsilon=0.6, exploration="uniform"), answers, clock=_fixed_clock()
    )
    explore_engine.generate(_requests(LONG_MAX_NEW))
    weighted_engine, weighted = _adaptive_engine(model64, _spec(epsilon=0.6), answers, clock=_fixed_clock())
    weighted_engine.generate(_requests(LONG_MAX_NEW))
    oracle = len(explore.arms) - 1
    for stepper in (greedy, explore, weighted):
        for bucket in (0, 1):
            steps_in_bucket = sum(1 for r in stepper.log if r.bucket == bucket)
            stats = stepper.bandit.stats(bucket)
            assert sum(s.pulls for s in stats) == steps_in_bucket
            assert all(s.pulls >= 1 and s.estimate is not None for s in stats), "every arm tried in every bucket"
    for bucket in (0, 1):
        # epsilon 0: after one try each, the oracle (most tokens per second) is always chosen
        assert [s.pulls for i, s in enumerate(greedy.bandit.stats(bucket)) if i != oracle] == [1] * oracle
        assert greedy.bandit.best(bucket) == oracle
    # epsilon 0.6, uniform exploration: the other arms keep getting pulled
    others = sum(s.pulls for b in (0, 1) for i, s in enumerate(explore.bandit.stats(b)) if i != oracle)
    assert others >= 2 * oracle + 4
    # weighted exploration: rounds go to the oracle rather than to arms far behind it
    pulls = {
        name: [s.pulls for b in (0, 1) for s in stepper.bandit.stats(b)]
        for name, stepper in (("uniform", explore), ("weighted", weighted))
    }
    share = {name: sum(p[oracle :: len(explore.arms)]) / sum(p) for name, p in pulls.items()}
    assert share["weighted"] > share["uniform"], (pulls, share)


def test_mode_off_is_plain_decoding_and_ngram_mode_uses_only_ngram_arms(model64, plain64):
    engine = Engine(model64, max_batch_size=4, max_context=MAX_CONTEXT, return_hidden=False)
    off = build_adaptive_stepper(_spec(mode="off"), engine.runner, None, rows=4, context=MAX_CONTEXT)
    engine.stepper = off
    assert [c.token_ids for c in engine.generate(_requests())] == [c.token_ids for c in plain64]
    assert all(r.arm is None for r in off.log)
    ngram = build_adaptive_stepper(_spec(mode="ngram"), engine.runner, None, rows=4, context=MAX_CONTEXT)
    engine.stepper = ngram
    assert [c.token_ids for c in engine.generate(_requests())] == [c.token_ids for c in plain64]
    assert {r.arm for r in ngram.log if r.arm} == {"ngram-d3"}


def test_build_arms_refuses_learned_arms_without_a_drafter(model64):
    with pytest.raises(ValueError, match="needs the learned drafter"):
        build_arms(
            _spec(mode="static"),
            embed=model64.get_input_embeddings(),
            drafter=None,
            max_batch_size=4,
            max_context=MAX_CONTEXT,
        )


def test_build_arms_refuses_block_arms_without_a_block_drafter(model64):
    with pytest.raises(ValueError, match="arms of kind block needs the block drafter"):
        build_arms(
            _spec(arms=WITH_PLAIN),
            embed=model64.get_input_embeddings(),
            drafter=_eagle(model64),
            max_batch_size=4,
            max_context=MAX_CONTEXT,
        )


def test_bandit_reward_is_per_running_row(model64, plain64):
    """A plain arm gains exactly one token per row and step: with every step lasting 1 s its reward
    is 1.0 whatever the batch size in the bucket (4 -> 3 -> 2 -> 1 rows here)."""
    engine = Engine(model64, max_batch_size=4, max_context=MAX_CONTEXT, return_hidden=False)
    spec = _spec(
        mode="ngram",
        arms=[ArmSpec(kind="plain"), ArmSpec(kind="ngram", depth=2)],
        threshold=4,
        buckets=[4],
        epsilon=0.0,
    )
    stepper = build_adaptive_stepper(spec, engine.runner, None, rows=4, context=MAX_CONTEXT)
    stepper.clock = _fixed_clock()
    engine.stepper = stepper
    assert [c.token_ids for c in engine.generate(_requests())] == [c.token_ids for c in plain64]
    plain_steps = [r for r in stepper.log if r.arm == "plain"]
    assert plain_steps and plain_steps[0].running == 4, "plain is tried first, at 4 rows (4 tokens a step)"
    assert stepper.bandit.estimate(0, 0) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_arm_runs_up_to_the_context_limit_without_overflow(seed, model64):
    """Default and deep arms, switched at random (epsilon 1) up to the context limit: EAGLE chains
    of depth 4, trees, and an EAGLE catch-up after n-gram steps (rows with different catch-up lengths)
    all stay inside the caches, and the output equals plain decoding."""
    context = 24
    requests = _requests(max_new=(200, 200, 200, 200))
    plain = Engine(model64, max_batch_size=4, max_context=context).generate(requests)
    arms = [
        *ARMS,
        ArmSpec(kind="ngram", depth=4),
        ArmSpec(kind="tree", depth=4, topk=3, verify_tokens=6),
        ArmSpec(kind="history", depth=4),
        ArmSpec(kind="history", depth=3, topk=2),
        ArmSpec(kind="mixed", depth=3),
        ArmSpec(kind="block", depth=3),
        ArmSpec(kind="block", depth=8),
    ]
    spec = _spec(arms=arms, threshold=4, buckets=[4], epsilon=1.0, history={"min_match": 1, "max_match": 4})
    engine = Engine(model64, max_batch_size=4, max_context=context, return_hidden=True)
    engine.stepper = build_adaptive_stepper(
        spec, engine.runner, _eagle(model64), rows=4, context=context, seed=seed, block=H.random_block(model64)
    )
    out = engine.generate(requests)
    assert [c.token_ids for c in out] == [c.token_ids for c in plain]
    assert all(c.finish_reason == "length" for c in out)
    assert {"block-d3", "block-d8"} <= {r.arm for r in engine.stepper.log}, "block arms are chosen like any other"
