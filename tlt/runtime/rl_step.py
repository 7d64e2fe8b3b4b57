"""The building blocks of one RL step, as functions: pick prompts, roll out, score, build the
batch, update the policy, push its weights to the engine, summarise the step.

The trainer (`tlt.runtime.trainer`) and the rollout workers of both executors call them. Everything
random is a pure function of (algorithm.seed, step, problem index, group member), so a resumed run needs no
data-loader or sampler state, and a problem's samples do not depend on which worker or batch carries it.

Conventions: `step` is 1-based (step s makes the s-th policy update); P prompts per step,
G responses per prompt (the group), B = P * G sequences ordered prompt-major
(sequence p * G + g is member g of prompt p's group), T the longest response.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tlt.rl.grpo import behaviour_weights, group_advantages
from tlt.rl.packing import micro_batches
from tlt.rl.reward_plugin import RewardError, RewardFn, call_reward
from tlt.rl.rewards import score
from tlt.rl.update import RolloutBatch, policy_update, response_logprobs
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion, Request, SamplingParams, StepMetrics
from tlt.spec.run import AlgorithmSpec
from tlt.tasks.evaluate import length_stats
from tlt.tasks.problem import Problem
from tlt.tasks.prompt_format import encode_prompt


def derive_seed(*parts: str | int) -> int:
    """A 62-bit seed that is a stable function of `parts` (same on every machine and Python run)."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def select_prompts(num_problems: int, prompts_per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the `prompts_per_step` problems of step `step` (1-based), from (seed, step) alone.

    The training set is walked in epochs; each epoch is a fresh permutation seeded by
    (seed, epoch), and step s takes the positions [(s-1)*P, s*P) of that endless walk, so every
    problem is seen once per epoch and a resumed run picks exactly what an uninterrupted one would.
    """
    if step < 1:
        raise ValueError(f"step is 1-based, got {step}")
    return walk_prompts(num_problems, seed, (step - 1) * prompts_per_step, prompts_per_step)


def walk_prompts(num_problems: int, seed: int, start: int, count: int) -> list[int]:
    """Positions [start, start + count) of the endless walk over the training set (`select_prompts`)."""
    if num_problems < 1:
        raise ValueError(f"num_problems must be >= 1, got {num_problems}")
    orders: dict[int, list[int]] = {}
    picked = []
    for position in range(start, start + count):
        epoch, offset = divmod(position, num_problems)
        if epoch not in orders:
            order = list(range(num_problems))
            random.Random(derive_seed("prompts", seed, epoch)).shuffle(order)
            orders[epoch] = order
        picked.append(orders[epoch][offset])
    return picked


def make_requests(
    problems: Sequence[Problem],
    problem_ids: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    algo: AlgorithmSpec,
    step: int,
) -> list[Request]:
    """B = P * G requests, prompt-major; member g of problem `problem_ids[p]` at step s is seeded by
    (algo.seed, s, problem_ids[p], g), so its tokens do not depend on the batch it runs in."""
    if len(problems) != len(problem_ids):
        raise ValueError(f"{len(problems)} problems but {len(problem_ids)} problem ids")
    stop = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    requests = []
    for problem, index in zip(problems, problem_ids):
        prompt_ids = encode_prompt(tokenizer, problem)
        for member in range(algo.group_size):
            params = SamplingParams(
                temperature=algo.temperature,
                top_p=algo.top_p,
                max_new_tokens=algo.max_new_tokens,
                stop_token_ids=stop,
                seed=derive_seed("sample", algo.seed, step, index, member),
            )
            requests.append(Request(f"s{step}-p{index}-g{member}", prompt_ids, params))
    return requests


@dataclass
class RolloutTrace:
    """The engine's per-step records of one rollout; pass it as `Engine.generate(on_step=...)`.

    Tail time is the wall time of decode steps that ran with fewer rows than their wave started
    with: sequences had finished, their batch slots sat empty, and the batch was waiting for
    the longest responses (the long tail that speculative decoding turns into speed).
    """

    steps: list[StepMetrics] = field(default_factory=list)

    def __call__(self, metrics: StepMetrics) -> None:
        self.steps.append(metrics)

    def tail_seconds(self) -> float:
        seconds, full = 0.0, 0
        for m in self.steps:
            if m.step == 0:  # prefill: a new wave starts with its full batch
                full = m.running
            elif m.running < full:
                seconds += m.seconds
        return seconds

    def engine_seconds(self) -> float:
        return sum(m.seconds for m in self.steps)

    def decode_seconds_by_running(self) -> dict[int, float]:
        """Wall seconds of decode steps (prefills excluded) by the number of rows running in them."""
        return self._decode_by_running(lambda m: m.seconds)

    def decode_tokens_by_running(self) -> dict[int, int]:
        """Tokens the sequences kept in decode steps (prefills excluded) by the number of rows running."""
        return self._decode_by_running(lambda m: m.new_tokens)

    def decode_steps_by_running(self) -> dict[int, int]:
        """Decode steps (prefills excluded) by the number of rows running in them."""
        return self._decode_by_running(lambda m: 1)

    def _decode_by_running(self, value: Callable[[StepMetrics], float]) -> dict:
        out: dict = {}
        for m in self.steps:
            if m.step > 0:
                out[m.running] = out.get(m.running, 0) + value(m)
        return dict(sorted(out.items()))


def rollout(
    engine: Engine,
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    algo: AlgorithmSpec,
    *,
    step: int,
    problem_ids: Sequence[int],
    trace: RolloutTrace | None = None,
) -> list[Completion]:
    """`algo.group_size` samples of each of the P problems: B completions, prompt-major.

    `problem_ids[p]` is problem p's index in the training set (it seeds its samples).
    """
    requests = make_requests(problems, problem_ids, tokenizer, algo, step)
    return engine.generate(requests, on_step=trace)


def score_completions(
    completions: Sequence[Completion],
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    answer_format: str,
    reward: RewardFn | None = None,
    errors: list[RewardError] | None = None,
) -> torch.Tensor:
    """Rewards [P, G] float32: each response's final answer against its problem's reference (in {0, 1}),
    or with `reward` the plug-in's value (`tlt.rl.reward_plugin`); a sample whose plug-in fails scores
    0.0 and its `RewardError` (sample named by its request id) is appended to `errors`."""
    if len(completions) % len(problems):
        raise ValueError(f"{len(completions)} completions do not split into groups of {len(problems)} problems")
    group = len(completions) // len(problems)
    rewards = torch.zeros(len(problems), group)
    for b, completion in enumerate(completions):
        p, g = divmod(b, group)
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        if reward is None:
            rewards[p, g] = score(text, problems[p].answer, answer_format)
            continue
        rewards[p, g], error = call_reward(reward, problems[p].prompt, text, problems[p].record, completion.request_id)
        if error is not None and errors is not None:
            errors.append(error)
    return rewards


def pad_logprobs(completions: Sequence[Completion]) -> torch.Tensor:
    """The engine's log-probs of the sampled tokens, [B, T] float32, right-padded with 0."""
    width = max((len(c.token_ids) for c in completions), default=0)
    out = torch.zeros(len(completions), width)
    for row, completion in enumerate(completions):
        out[row, : len(completion.token_ids)] = completion.logprobs.float()
    return out


def build_batch(
    completions: Sequence[Completion],
    rewards: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    *,
    importance_cap: float = 2.0,
) -> RolloutBatch:
    """The update's batch: B (prompt, response) pairs, one GRPO advantage each.

    rewards [P, G] -> advantages [B] (group-normalised, prompt-major). old_logprobs [B, T]
    defaults to the engine's (`pad_logprobs`); pass the policy's recomputed ones (`policy_logprobs`)
    to take the ratio against the trainer's own numerics. Completions with tokens of an older policy
    (`Completion.staleness` > 0: partial rollouts) give the batch its `stale` mask and behaviour log-probs
    (the engine's, each token's sampling policy's), weighted in the update up to `importance_cap`.
    """
    if rewards.numel() != len(completions):
        raise ValueError(f"rewards {tuple(rewards.shape)} do not match {len(completions)} completions")
    engine = pad_logprobs(completions)
    stale = stale_mask(completions)
    return RolloutBatch(
        prompt_ids=[list(c.prompt_ids) for c in completions],
        response_ids=[list(c.token_ids) for c in completions],
        old_logprobs=engine if old_logprobs is None else old_logprobs,
        advantages=group_advantages(rewards.double()).float().reshape(-1),
        behaviour_logprobs=None if stale is None else engine.clone(),
        stale=stale,
        importance_cap=importance_cap,
    )


def stale_mask(completions: Sequence[Completion]) -> torch.Tensor | None:
    """[B, T] bool, True on the tokens an older policy sampled (`Completion.staleness` > 0), right-padded with
    False; None when every token is on-policy."""
    if not any(c.staleness is not None and bool((c.staleness > 0).any()) for c in completions):
        return None
    width = max((len(c.token_ids) for c in completions), default=0)
    out = torch.zeros(len(completions), width, dtype=torch.bool)
    for row, c in enumerate(completions):
        if c.staleness is not None:
            out[row, : len(c.token_ids)] = c.staleness > 0
    return out


def behaviour_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The behaviour weights the update gave the batch's off-policy tokens (after it filled the proximal
    log-probs into `old_logprobs`): their mean, the share truncated at the cap, the off-policy token count;
    {} for an on-policy batch."""
    if batch.stale is None or batch.behaviour_logprobs is None:
        return {}
    stale = batch.stale & batch.response_mask().bool()
    if not bool(stale.any()):
        return {}
    old, behav = batch.old_logprobs.double(), batch.behaviour_logprobs.double()
    weights = behaviour_weights(old, behav, stale, cap=batch.importance_cap)[stale]
    raw = torch.exp(old - behav)[stale]
    return {
        "importance_weight_mean": float(weights.mean()),
        "importance_capped_fraction": float((raw > batch.importance_cap).double().mean()),
        "off_policy_tokens": int(stale.sum()),
    }


def _compute_context(policy: PreTrainedModel, compute_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to `compute_dtype` when it is lower than the policy's (master) weights' dtype."""
    if compute_dtype is None or compute_dtype == policy.dtype:
        return contextlib.nullcontext()
    return torch.autocast(policy.device.type, dtype=compute_dtype)


@torch.no_grad()
def policy_logprobs(
    policy: PreTrainedModel,
    batch: RolloutBatch,
    algo: AlgorithmSpec,
    *,
    pad_id: int,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The policy's log-probs of the batch's response tokens, [B, T] (0 on padding), micro-batched in
    the update's layout (`algorithm.updateLayout`).

    Same temperature rule as the update (temperature 0 counts as 1).
    """
    temperature = algo.temperature if algo.temperature > 0 else 1.0
    was_training = policy.training
    policy.eval()
    width = batch.old_logprobs.shape[1]
    out = torch.zeros(len(batch), width, dtype=torch.float64 if policy.dtype == torch.float64 else torch.float32)
    with _compute_context(policy, compute_dtype):
        for rows in micro_batches(batch.lengths(), algo.micro_batch_size, algo.update_layout):
            logp, _ = response_logprobs(
                policy,
                [batch.prompt_ids[b] for b in rows],
                [batch.response_ids[b] for b in rows],
                pad_id=pad_id,
                temperature=temperature,
                packed=algo.update_layout == "packed",
            )
            out[rows, : logp.shape[1]] = logp.to(out)
    policy.train(was_training)
    return out


def update_policy(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: AlgorithmSpec,
    *,
    pad_id: int,
    compute_dtype: torch.dtype | None = None,
    old_from_first_pass: bool = False,
) -> dict[str, float]:
    """GRPO update of `policy` on `batch` (see `tlt.rl.update.policy_update`, also for
    `old_from_first_pass`); returns its metrics.

    `compute_dtype` lower than the policy's weights (bfloat16 over float32 master weights)
    runs the forward and backward under autocast; the optimizer keeps the master weights.
    """
    with _compute_context(policy, compute_dtype):
        return policy_update(policy, optimizer, batch, algo, pad_id=pad_id, old_from_first_pass=old_from_first_pass)


def learn(
    policy: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    completions: list[Completion],
    rewards: torch.Tensor,
    algo: AlgorithmSpec,
    *,
    pad_id: int,
    compute_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """One step's learning from its rollouts: build the GRPO batch (rewards [P, G]) and update, the old
    log-probs taken from the update's own first forward (on the weights that sampled the batch; the
    engine's may differ by rounding), not from a separate recompute pass. Returns the update's metrics
    plus `logprob_gap`, the largest engine-vs-policy log-prob difference."""
    batch = build_batch(completions, rewards, importance_cap=algo.rollout.importance_cap)
    engine_logprobs = batch.old_logprobs
    update = update_policy(
        policy, optimizer, batch, algo, pad_id=pad_id, compute_dtype=compute_dtype, old_from_first_pass=True
    )
    gap = logprob_gap(engine_logprobs, batch.old_logprobs, batch)
    return {**update, "logprob_gap": gap, **behaviour_metrics(batch)}


def sync_weights(policy: PreTrainedModel, engine: Engine) -> None:
    """Copy the policy's weights into the engine's model in place (cast to the engine's dtype).

    Tied embeddings arrive under both names and stay tied in the engine.
    """
    engine.load_weights(policy.state_dict())


def rollout_metrics(
    completions: Sequence[Completion], rewards: torch.Tensor, trace: RolloutTrace, rollout_seconds: float
) -> dict[str, float]:
    """What the rollout did: reward, response lengths, truncation, speed and tail time.

    tokens_per_second counts generated response tokens over the rollout's wall time;
    truncation_rate is the fraction of responses cut at max_new_tokens (or the context);
    tail_seconds is `RolloutTrace.tail_seconds`, tail_fraction its share of the rollout.
    """
    lengths = [len(c.token_ids) for c in completions]
    stats = length_stats(lengths)
    generated = sum(lengths)
    return {
        "reward_mean": float(rewards.mean()),
        "reward_group_solved": float((rewards.max(dim=1).values > 0).float().mean()),
        "response_length_mean": stats["mean"],
        "response_length_p50": stats["p50"],
        "response_length_p90": stats["p90"],
        "response_length_max": stats["max"],
        "truncation_rate": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "generated_tokens": generated,
        "rollout_seconds": rollout_seconds,
        "tail_seconds": trace.tail_seconds(),
        "tail_fraction": trace.tail_seconds() / rollout_seconds if rollout_seconds > 0 else 0.0,
        "tokens_per_second": generated / rollout_seconds if rollout_seconds > 0 else 0.0,
    }


def logprob_gap(engine_logprobs: torch.Tensor, policy_logprobs_: torch.Tensor, batch: RolloutBatch) -> float:
    """Largest |engine - policy| log-prob over the batch's real on-policy response tokens (0 for none): the
    tokens of an older policy (`batch.stale`) differ by the updates since, not by the engine's numerics."""
    mask = batch.response_mask().bool()
    if batch.stale is not None:
        mask = mask & ~batch.stale
    if not bool(mask.any()):
        return 0.0
    return float((engine_logprobs.double() - policy_logprobs_.double()).abs()[mask].max())


def shards(ids: list[int], workers: int) -> list[list[int]]:
    """Split prompt ids into `workers` contiguous, near-equal shards (prompt-major order kept)."""
    size = math.ceil(len(ids) / workers)
    return [ids[i * size : (i + 1) * size] for i in range(workers)]
