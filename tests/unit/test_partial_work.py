"""A partial rollout's work on a worker: the engine's halt, where a shard's rollout is cut (a function of the
tokens alone), the shards' quotas, and a kept response continued under new weights with its earlier tokens'
behaviour log-probs and versions."""

from __future__ import annotations

import copy

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rl.update import response_logprobs
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion, Request, SamplingParams
from tlt.runtime.partial_rollouts import PartialRollouts
from tlt.runtime.partial_work import (
    GroupWork,
    MemberWork,
    chosen_groups,
    cut_completion,
    group_ends,
    settled_cut,
    shard_quotas,
    whole_completion,
)
from tlt.spec.run import RunSpec
from tlt.tasks.datasets import load_problems
from tlt.tasks.tokenizer import build_task_tokenizer
from tlt.workers.local_rollout import LocalWorker, local_quotas


def _member(request_id: str, finished: bool = False, tokens: tuple[int, ...] = ()) -> MemberWork:
    return MemberWork(request_id, tokens, torch.zeros(len(tokens)), finished, seed=0)


def _groups(*sizes: int) -> list[GroupWork]:
    return [GroupWork(k, k, tuple(_member(f"q{k}-g{g}") for g in range(n))) for k, n in enumerate(sizes)]


def test_shard_quotas_are_proportional_and_sum_to_the_target():
    assert shard_quotas([5, 5], 8) == [4, 4]
    assert shard_quotas([3, 2], 4) == [2, 2], "the larger remainder first"
    assert shard_quotas([2, 2, 1], 3) == [1, 1, 1]
    assert shard_quotas([4, 0], 4) == [4, 0]
    assert sum(shard_quotas([7, 6, 6], 16)) == 16
    with pytest.raises(ValueError, match="within"):
        shard_quotas([2, 2], 5)


def test_a_group_ends_at_its_longest_member_and_not_while_one_runs():
    groups = _groups(2, 2)
    lengths = {"q0-g0": 3, "q0-g1": 7, "q1-g0": 2, "q1-g1": 4}
    assert group_ends(groups, lengths, {"q0-g0", "q0-g1", "q1-g0"}) == [7, None]
    before = [GroupWork(0, 0, (_member("a", finished=True), _member("b", finished=True)))]
    assert group_ends(before, {}, set()) == [0], "a group finished before the step ends at 0"


def test_the_cut_waits_until_no_running_member_can_end_a_group_before_it():
    groups = _groups(1, 1, 1)
    # group 0 ended at 4; the others still run with 3 tokens: one of them could still end at 4
    assert settled_cut(groups, {"q0-g0": 4, "q1-g0": 3, "q2-g0": 3}, {"q0-g0"}, quota=1) is None
    assert settled_cut(groups, {"q0-g0": 4, "q1-g0": 4, "q2-g0": 6}, {"q0-g0"}, quota=1) == 4
    assert settled_cut(groups, {"q0-g0": 4, "q1-g0": 9, "q2-g0": 9}, {"q0-g0"}, quota=2) is None, "one group ended"
    assert settled_cut(groups, {}, set(), quota=0) == 0


def test_the_groups_ending_first_are_chosen_ties_to_the_earlier_group():
    assert chosen_groups([5, None, 3, 5, 2], cut=5, quota=3) == [0, 2, 4]
    assert chosen_groups([5, None, 3, 5, 2], cut=3, quota=3) == [2, 4], "none past the cut"


def test_a_member_past_the_cut_keeps_its_first_cut_tokens_unfinished():
    done = Completion("r", [1, 2], [5, 6, 7, 8], torch.tensor([-1.0, -2.0, -3.0, -4.0]), None, "stop")
    assert cut_completion(done, 4) is done, "finished at the cut: kept whole"
    cut = cut_completion(done, 2)
    assert cut.token_ids == [5, 6] and cut.finish_reason == "abort" and torch.equal(cut.logprobs, done.logprobs[:2])


def test_whole_completion_puts_the_kept_tokens_and_their_log_probs_first():
    member = MemberWork("r", (5, 6), torch.tensor([-0.5, -0.25]), False, seed=0)
    new = Completion("r", [1, 2, 5, 6], [7], torch.tensor([-1.0]), None, "stop")
    whole = whole_completion(new, prompt_len=2, member=member)
    assert whole.prompt_ids == [1, 2] and whole.token_ids == [5, 6, 7]
    assert whole.logprobs.tolist() == [-0.5, -0.25, -1.0]


def test_the_engine_halts_the_requests_it_is_told_to_with_their_tokens():
    model = tiny_model("qwen2", vocab_size=32, seed=1)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=4)
    requests = [Request(f"r{i}", [1, 2, 3], SamplingParams(**{**params.__dict__, "seed": i})) for i in range(3)]
    plain = Engine(model, max_batch_size=3, max_context=64).generate(requests)

    def halt(lengths: dict[str, int], done: set[str]) -> set[str]:
        return {"r1"} if lengths["r1"] >= 5 else set()

    halted = Engine(model, max_batch_size=3, max_context=64).generate(requests, halt=halt)
    assert halted[1].finish_reason == "abort" and halted[1].token_ids == plain[1].token_ids[:5]
    assert torch.equal(halted[1].logprobs, plain[1].logprobs[:5])
    for a, b in ((halted[0], plain[0]), (halted[2], plain[2])):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason, "the others run on as before"
    waves = Engine(model, max_batch_size=1, max_context=64).generate(requests, halt=lambda lengths, done: {"r2"})
    assert waves[2].token_ids == [] and waves[2].finish_reason == "abort", "a wave left with nothing does not start"


SPEC = {
    "model": {"dtype": "float32"},
    "dataset": {"builtin": {"numTrain": 16}},
    "algorithm": {
        "promptsPerStep": 2,
        "groupSize": 2,
        "maxNewTokens": 24,
        "seed": 1,
        "temperature": 1.0,
        "rollout": {"mode": "partial", "overProvision": 1.0, "maxStaleness": 2},
    },
    "speculative": {"mode": "off"},
}


def test_a_kept_response_continues_under_the_new_weights_keeping_its_earlier_tokens():
    spec = RunSpec.model_validate(SPEC)
    tokenizer = build_task_tokenizer()
    policy = tiny_model("qwen2", vocab_size=len(tokenizer), seed=11)
    problems = load_problems(spec.dataset, "train")
    worker = LocalWorker(spec, policy, tokenizer, None)
    partial = PartialRollouts(spec.algorithm, len(problems))

    def step(n: int):
        work = partial.plan(n)
        ids = [g.problem for g in work]
        completions, scored, result = worker.rollout(n, ids, [problems[i] for i in ids], work)
        return work, completions, partial.absorb(n, completions, scored, [result])

    step(1)
    kept = {
        g.request_id(i): (list(m.tokens), m.logprobs.clone(), list(m.versions))
        for g in partial.inflight
        for i, m in enumerate(g.members)
        if not m.finished and m.tokens
    }
    assert kept, "the premise: step 1 left unfinished responses with tokens"
    kept_groups = [g.key for g in partial.inflight]
    newer = copy.deepcopy(policy)
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    worker.load_weights(newer)
    work, completions, trained = step(2)
    continued = [c for c in completions if c.request_id in kept]
    assert continued and [g.key for g in work[: len(kept_groups)]] == kept_groups, "the kept groups run first"
    for c in continued:
        tokens, logprobs, versions = kept[c.request_id]
        assert c.token_ids[: len(tokens)] == tokens, "the kept tokens come first"
        assert torch.equal(c.logprobs[: len(tokens)], logprobs), "their behaviour log-probs as sampled"
        new = c.token_ids[len(tokens) :]
        if not new:
            continue
        under_new, _ = response_logprobs(newer, [c.prompt_ids + tokens], [new], temperature=1.0)
        under_old, _ = response_logprobs(policy, [c.prompt_ids + tokens], [new], temperature=1.0)
        torch.testing.assert_close(c.logprobs[len(tokens) :], under_new[0].float(), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(c.logprobs[len(tokens) :], under_old[0].float(), atol=1e-3), "not the old policy"
        assert versions == [1] * len(tokens)
    for c in trained.completions:
        if c.request_id in kept:
            n = len(kept[c.request_id][0])
            assert c.staleness.tolist() == [1] * n + [0] * (len(c.token_ids) - n), "one step older, then on-policy"
    for g in partial.inflight:
        for m in g.members:
            assert all(v in (1, 2) for v in m.versions) and m.versions == sorted(m.versions)


def test_one_process_splits_the_groups_as_the_ray_workers_would():
    spec = RunSpec.model_validate({**SPEC, "rollout": {"replicas": 2}})
    assert local_quotas(spec, 4) == [1, 1]
    assert local_quotas(spec, 5) == [1, 1], "3 + 2 groups, 2 trained"
    one = RunSpec.model_validate(SPEC)
    assert local_quotas(one, 4) == [2]
