"""Old log-probs from the update's own first forward (`old_from_first_pass`): the same update as
recomputing them in a separate pass, one forward per micro-batch fewer."""

from __future__ import annotations

import copy

import pytest
import torch

from tlt.models.tiny import tiny_model
from tlt.rl.update import RolloutBatch, policy_update, response_logprobs
from tlt.rollout.types import Completion
from tlt.runtime import rl_step
from tlt.spec.run import AlgorithmSpec

PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4, 8], [1, 3]]
RESPONSES = [[10, 11, 2], [12, 13, 14, 15, 16, 2], [17], [18, 19, 20, 2]]


def _batch(model: torch.nn.Module, noise: float = 0.0) -> RolloutBatch:
    """The batch with the policy's own log-probs as old ones, perturbed by `noise` (an engine's rounding)."""
    with torch.no_grad():
        old, _ = response_logprobs(model, PROMPTS, RESPONSES)
    old = old + noise * torch.randn(old.shape, generator=torch.Generator().manual_seed(0), dtype=old.dtype)
    return RolloutBatch(PROMPTS, RESPONSES, old, torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=old.dtype))


def _counting_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("epochs", [1, 3])
@pytest.mark.parametrize("layout", ["padded", "sorted", "packed"])
def test_first_pass_old_logprobs_give_the_recomputed_update(epochs, layout):
    base = tiny_model(seed=3, dtype=torch.float64)
    algo = AlgorithmSpec(micro_batch_size=2, ppo_epochs=epochs, update_layout=layout)
    models, batches, metrics = {}, {}, {}
    for mode in ("recomputed", "first-pass"):
        model = copy.deepcopy(base)
        batch = _batch(model, noise=0.0 if mode == "recomputed" else 1e-3)  # first pass ignores what the engine said
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        metrics[mode] = policy_update(model, opt, batch, algo, old_from_first_pass=mode == "first-pass")
        models[mode], batches[mode] = model, batch
    torch.testing.assert_close(
        batches["first-pass"].old_logprobs, batches["recomputed"].old_logprobs, atol=1e-12, rtol=0
    )
    for (name, a), b in zip(models["recomputed"].named_parameters(), models["first-pass"].parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=name)
    assert metrics["first-pass"] == pytest.approx(metrics["recomputed"], abs=1e-9)


def test_learn_runs_one_forward_per_micro_batch_and_epoch_and_reports_the_engine_gap():
    """No separate pass recomputes the old log-probs (the old learn ran 2 more forwards here)."""
    policy = tiny_model(seed=4, dtype=torch.float64)
    algo = AlgorithmSpec(micro_batch_size=2, ppo_epochs=2, group_size=2)
    batch = _batch(policy)
    completions = [
        Completion(f"r{i}", p, r, batch.old_logprobs[i, : len(r)].float() + 1e-4, None, "stop")
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES))
    ]
    calls = _counting_forwards(policy)
    out = rl_step.learn(
        policy,
        torch.optim.SGD(policy.parameters(), lr=0.1),
        completions,
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        algo,
        pad_id=0,
    )
    assert calls[0] == 2 * 2  # 2 micro-batches x 2 epochs
    assert out["logprob_gap"] == pytest.approx(1e-4, rel=1e-2)
