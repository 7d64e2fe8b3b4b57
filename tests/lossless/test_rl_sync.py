"""After every policy update and weight sync, the rollout engine samples from exactly the policy:
the engine's log-probs of its own samples equal the policy's recomputed ones (float32, 1e-5),
with tied and with untied embeddings, and for a Qwen3 policy (q/k norms)."""

from __future__ import annotations

import copy

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.runtime import rl_step
from tlt.spec.run import AlgorithmSpec, DatasetSpec
from tlt.tasks.datasets import load_problems
from tlt.tasks.tokenizer import build_task_tokenizer

TOLERANCE = 1e-5
UPDATES = 3


def _problems(count: int, seed: int):
    """`count` problems of the built-in task."""
    return load_problems(DatasetSpec.model_validate({"builtin": {"numTrain": max(16, count), "seed": seed}}))[:count]


def _synthetic_rewards(completions, group_size: int) -> torch.Tensor:
    """A reward that varies within a group (share of even token ids): any signal moves the policy."""
    shares = [sum(t % 2 == 0 for t in c.token_ids) / len(c.token_ids) for c in completions]
    return torch.tensor(shares).view(-1, group_size)


@pytest.mark.parametrize(
    ("family", "tied"), [("qwen2", False), ("qwen2", True), ("qwen3", False)], ids=["untied", "tied", "qwen3"]
)
def test_engine_logprobs_equal_policy_after_every_update(family: str, tied: bool):
    """Qwen3 also checks that its q/k norm weights, which the update moves, reach the engine."""
    tokenizer = build_task_tokenizer()
    policy = tiny_model(family, vocab_size=len(tokenizer), tie_word_embeddings=tied, seed=3)
    if tied:
        assert policy.lm_head.weight is policy.model.embed_tokens.weight
    engine = Engine(copy.deepcopy(policy), max_batch_size=16, max_context=64, return_hidden=False)
    algo = AlgorithmSpec(prompts_per_step=4, group_size=4, max_new_tokens=12, learning_rate=1e-2, micro_batch_size=8)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=algo.learning_rate)
    problems = _problems(32, seed=5)

    for step in range(1, UPDATES + 2):
        ids = rl_step.select_prompts(len(problems), algo.prompts_per_step, algo.seed, step)
        batch_problems = [problems[i] for i in ids]
        completions = rl_step.rollout(engine, batch_problems, tokenizer, algo, step=step, problem_ids=ids)
        batch = rl_step.build_batch(completions, _synthetic_rewards(completions, algo.group_size))
        recomputed = rl_step.policy_logprobs(policy, batch, algo, pad_id=tokenizer.pad_token_id)
        gap = rl_step.logprob_gap(batch.old_logprobs, recomputed, batch)
        assert gap <= TOLERANCE, f"step {step}: engine log-probs differ from the policy's by {gap:.2e}"
        if step > UPDATES:
            break
        batch.old_logprobs = recomputed
        rl_step.update_policy(policy, optimizer, batch, algo, pad_id=tokenizer.pad_token_id)
        moved = rl_step.logprob_gap(
            batch.old_logprobs, rl_step.policy_logprobs(policy, batch, algo, pad_id=tokenizer.pad_token_id), batch
        )
        assert moved > 100 * TOLERANCE, "the update must move the policy, or the check above proves nothing"
        rl_step.sync_weights(policy, engine)
        if tied:
            assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight


def test_stale_engine_is_detected():
    """Without the sync, the engine's log-probs drift from the updated policy's (the check can fail)."""
    tokenizer = build_task_tokenizer()
    policy = tiny_model("qwen2", vocab_size=len(tokenizer), tie_word_embeddings=True, seed=4)
    engine = Engine(copy.deepcopy(policy), max_batch_size=16, max_context=64, return_hidden=False)
    algo = AlgorithmSpec(prompts_per_step=4, group_size=4, max_new_tokens=12, learning_rate=1e-2)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=algo.learning_rate)
    problems = _problems(8, seed=6)
    ids = [0, 1, 2, 3]
    completions = rl_step.rollout(engine, [problems[i] for i in ids], tokenizer, algo, step=1, problem_ids=ids)
    batch = rl_step.build_batch(completions, _synthetic_rewards(completions, algo.group_size))
    rl_step.update_policy(policy, optimizer, batch, algo, pad_id=tokenizer.pad_token_id)
    completions = rl_step.rollout(engine, [problems[i] for i in ids], tokenizer, algo, step=2, problem_ids=ids)
    batch = rl_step.build_batch(completions, _synthetic_rewards(completions, algo.group_size))
    recomputed = rl_step.policy_logprobs(policy, batch, algo, pad_id=tokenizer.pad_token_id)
    assert rl_step.logprob_gap(batch.old_logprobs, recomputed, batch) > 100 * TOLERANCE


def _greedy_float64_run(root, mode: str):
    """Three greedy float64 steps of the local loop; returns (completions per step, final weights, SD stepper)."""
    from tlt.models.loading import save_policy
    from tlt.runtime.local_executor import local_trainer
    from tlt.spec.manifest_io import parse_run

    tokenizer = build_task_tokenizer()
    init = root / "init"
    if not init.exists():
        save_policy(tiny_model("qwen2", vocab_size=len(tokenizer), seed=8, dtype=torch.float64), tokenizer, init)
    run = parse_run(
        {
            "model": {"path": str(init), "dtype": "float64"},
            "dataset": {"builtin": {"numTrain": 32}},
            "algorithm": {
                "steps": 3,
                "promptsPerStep": 4,
                "groupSize": 2,
                "maxNewTokens": 24,
                "temperature": 0.0,
                "learningRate": 1e-2,
            },
            "speculative": {"mode": mode, "threshold": 4096},
        }
    )
    trainer = local_trainer(run, root / mode)
    rollouts = []
    generate = trainer.executor.engine.generate

    def recording(requests, on_step=None):
        rollouts.append(generate(requests, on_step))
        return rollouts[-1]

    trainer.executor.engine.generate = recording
    accepted = 0
    for _ in range(3):
        m = trainer.train_step()
        accepted += round((m["accept_length"] - 1) * m["sd_row_steps"]) if m["accept_length"] else 0
    return rollouts, trainer.policy.state_dict(), accepted


def test_greedy_float64_loop_is_identical_with_and_without_speculative_decoding(tmp_path):
    """Greedy SD (n-gram drafts, on at every batch size) is lossless across policy updates and weight
    swaps: the same rollouts token for token, the same log-probs, and the same weights after 3 steps."""
    plain, plain_weights, _ = _greedy_float64_run(tmp_path, "off")
    spec, spec_weights, accepted = _greedy_float64_run(tmp_path, "ngram")
    assert accepted > 0, "the drafts must be accepted sometimes, or SD never produced a token"
    for step, (a, b) in enumerate(zip(plain, spec), start=1):
        assert [c.token_ids for c in a] == [c.token_ids for c in b], f"step {step}: rollouts differ"
        for x, y in zip(a, b):
            torch.testing.assert_close(x.logprobs, y.logprobs, rtol=0, atol=1e-6)
    for name, weight in plain_weights.items():
        assert torch.equal(weight, spec_weights[name]), f"{name} differs after 3 steps"
