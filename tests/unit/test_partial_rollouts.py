"""Partial rollouts across steps, on made-up rollouts: the groups a step runs (kept first, then queued, then
fresh), the stale ones dropped and queued again, staleness per trained token, the update's behaviour weights,
and the state a checkpoint keeps."""

from __future__ import annotations

import io

import pytest
import torch

from tlt.rl.grpo import behaviour_weights, grpo_loss
from tlt.rl.reward_plugin import RewardError
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.runtime.partial_rollouts import PartialRollouts
from tlt.spec.run import AlgorithmSpec

ALGO = AlgorithmSpec.model_validate(
    {"promptsPerStep": 2, "groupSize": 2, "rollout": {"mode": "partial", "overProvision": 1.0, "maxStaleness": 1}}
)


def _rollout(partial: PartialRollouts, step: int, finish: dict[int, int], new: int = 3):
    """Run step `step` where the groups at positions `finish` (position -> tokens each member adds) end and
    are chosen; every other member adds `new` tokens and stays unfinished."""
    work = partial.plan(step)
    completions, scored = [], []
    for i, group in enumerate(work):
        for m in group.members:
            if m.finished:
                continue
            n = finish.get(i, new)
            done = i in finish
            tokens = [*m.tokens, *range(100 + step * 10, 100 + step * 10 + n)]
            logprobs = torch.cat([m.logprobs, torch.full((n,), -float(step))])
            completions.append(Completion(m.request_id, [1, 2], tokens, logprobs, None, "stop" if done else "abort"))
            scored.append((float(i), None) if done else None)
    result = {"chosen": sorted(finish), "groups": len(work)}
    return work, partial.absorb(step, completions, scored, [result])


def test_a_step_runs_kept_groups_first_then_fresh_prompts_from_the_walk():
    partial = PartialRollouts(ALGO, num_problems=10)
    work, trained = _rollout(partial, 1, {0: 2, 2: 4})
    walk = rl_step.walk_prompts(10, ALGO.seed, 0, 4)
    assert [g.problem for g in work] == walk and partial.started == 4
    assert trained.problems == [walk[0], walk[2]] and trained.rewards.tolist() == [[0.0, 0.0], [2.0, 2.0]]
    assert trained.metrics["off_policy_fraction"] == 0.0 and trained.metrics["groups_kept"] == 2
    work, trained = _rollout(partial, 2, {0: 1, 1: 1})
    assert [g.key for g in work] == [1, 3, 4, 5], "the kept groups, then the walk goes on"
    assert [g.problem for g in work[2:]] == rl_step.walk_prompts(10, ALGO.seed, 4, 2)
    assert trained.metrics["staleness_tokens"] == {"0": 4, "1": 12}, "3 tokens of step 1 and 1 of step 2 each"
    assert [c.staleness.tolist() for c in trained.completions] == [[1, 1, 1, 0]] * 4
    assert trained.metrics["off_policy_fraction"] == pytest.approx(12 / 16)
    assert [c.logprobs.tolist() for c in trained.completions][0] == [-1.0, -1.0, -1.0, -2.0], "behaviour log-probs"


def test_a_group_older_than_max_staleness_is_dropped_and_its_prompt_run_again():
    partial = PartialRollouts(ALGO, num_problems=10)
    _rollout(partial, 1, {0: 2, 1: 2})  # groups 2, 3 kept with tokens of step 1
    _rollout(partial, 2, {2: 2, 3: 2})  # fresh groups 4, 5 trained; 2, 3 still running
    work, trained = _rollout(partial, 3, {0: 1, 1: 1})
    assert trained.metrics["dropped_groups"] == [2, 3], "tokens of step 1 are 2 steps old at step 3"
    assert [g.key for g in work] == [2, 3, 6, 7], "none kept: the queue first, then fresh prompts"
    assert all(not m.tokens for g in work[:2] for m in g.members), "a dropped group starts again from nothing"
    assert work[0].members[0].request_id == "q2-a1-g0", "as a new attempt"
    assert trained.metrics["trained_groups"] == [2, 3] and [g.key for g in partial.inflight] == [6, 7]
    assert all(int(age) <= 1 for age in trained.metrics["staleness_tokens"])


def test_the_state_survives_a_checkpoint_round_trip():
    partial = PartialRollouts(ALGO, num_problems=10)
    _rollout(partial, 1, {0: 2, 3: 2})
    partial.inflight[0].members[0].scored = (0.5, RewardError("sample", "boom"))
    buffer = io.BytesIO()
    torch.save(partial.state_dict(), buffer)
    buffer.seek(0)
    restored = PartialRollouts(ALGO, num_problems=10)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.state_dict().keys() == partial.state_dict().keys()
    assert restored.cursor == partial.cursor and restored.queue == partial.queue
    assert restored.inflight[0].members[0].scored == (0.5, RewardError("sample", "boom"))
    a, b = restored.plan(2), partial.plan(2)
    assert [(g.key, [m.tokens for m in g.members], [m.seed for m in g.members]) for g in a] == [
        (g.key, [m.tokens for m in g.members], [m.seed for m in g.members]) for g in b
    ]


def test_a_rollout_reporting_other_than_prompts_per_step_groups_is_refused():
    partial = PartialRollouts(ALGO, num_problems=10)
    work = partial.plan(1)
    with pytest.raises(RuntimeError, match="1 groups chosen of 4"):
        partial.absorb(1, [], [], [{"chosen": [0], "groups": len(work)}])


def test_behaviour_weights_correct_only_stale_tokens_and_are_truncated():
    prox = torch.tensor([[-1.0, -1.0, -1.0]])
    behav = torch.tensor([[-2.0, -1.5, -0.5]])
    stale = torch.tensor([[True, True, False]])
    w = behaviour_weights(prox, behav, stale, cap=2.0)
    assert w.tolist()[0] == pytest.approx([2.0, float(torch.exp(torch.tensor(0.5))), 1.0])
    assert not w.requires_grad


def test_grpo_loss_weights_scale_each_tokens_surrogate():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach().clone()
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    kwargs = {"clip_low": 0.2, "clip_high": 0.2, "loss_agg": "token-mean"}
    plain = grpo_loss(logp, old, adv, mask, **kwargs)
    ones = grpo_loss(logp, old, adv, mask, weights=torch.ones(1, 2), **kwargs)
    assert torch.equal(plain.loss, ones.loss)
    weighted = grpo_loss(logp, old, adv, mask, weights=torch.tensor([[2.0, 0.0]]), **kwargs)
    (grad,) = torch.autograd.grad(weighted.loss, logp)
    assert grad[0].tolist() == pytest.approx([-1.0, 0.0]), "d/dlogp of -w * ratio * A / 2 tokens"


def test_the_batch_marks_stale_tokens_and_the_gap_skips_them():
    fresh = Completion("a", [1], [5, 6], torch.tensor([-1.0, -1.0]), None, "stop")
    old = Completion("b", [1], [5, 6, 7], torch.tensor([-1.0, -1.0, -1.0]), None, "stop", torch.tensor([1, 0, 0]))
    assert rl_step.build_batch([fresh, fresh], torch.zeros(1, 2)).stale is None, "on-policy: as before"
    batch = rl_step.build_batch([fresh, old], torch.tensor([[0.0, 1.0]]), importance_cap=3.0)
    assert batch.stale.tolist() == [[False, False, False], [True, False, False]] and batch.importance_cap == 3.0
    policy = batch.old_logprobs.clone()
    policy[1, 0] = -4.0  # the stale token moved with the updates since: not an engine mismatch
    assert rl_step.logprob_gap(batch.old_logprobs, policy, batch) == 0.0
    batch.old_logprobs = policy
    metrics = rl_step.behaviour_metrics(batch)
    assert metrics["off_policy_tokens"] == 1 and metrics["importance_weight_mean"] == pytest.approx(
        float(torch.exp(torch.tensor(-3.0)))
    )
    assert metrics["importance_capped_fraction"] == 0.0
