"""This engine's drafter health end to end in the one-process rollout worker: a drafter that drafts every token
right is zeroed by a sync; the step it is served in is flagged, the next step with the same version decodes
plainly (no row-step drafts) with the same greedy tokens, and a newer good drafter drafts again and recovers."""

from __future__ import annotations

import torch

from tlt.models.tiny import tiny_model
from tlt.spec.run import RunSpec
from tlt.tasks.datasets import load_problems
from tlt.tasks.tokenizer import build_task_tokenizer
from tlt.workers.local_rollout import LocalWorker

SPEC = {
    "model": {"dtype": "float32"},
    "dataset": {"builtin": {"numTrain": 16}},
    "algorithm": {"promptsPerStep": 2, "groupSize": 2, "maxNewTokens": 16, "seed": 3, "temperature": 0.0},
    "speculative": {"mode": "static", "arms": [{"kind": "chain", "depth": 3}], "threshold": 8},
    "drafter": {"health": {"minRowSteps": 4}},
}


def silent(policy) -> dict[str, torch.Tensor]:
    """The policy with layers that write nothing: it predicts from the last token's embedding alone."""
    return {
        k: torch.zeros_like(v) if k.endswith(("o_proj.weight", "down_proj.weight")) else v
        for k, v in policy.state_dict().items()
    }


def exact(drafter_state: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """A drafter that passes the next token's embedding through: it predicts what the silent policy does."""
    state = {k: v.clone() for k, v in drafter_state.items()}
    state["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    for name in ("layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"):
        state[name] = torch.zeros_like(state[name])
    return state


def test_a_zeroed_drafter_is_flagged_in_its_step_then_off_until_a_good_one_drafts():
    spec = RunSpec.model_validate(SPEC)
    tokenizer = build_task_tokenizer()
    policy = tiny_model("llama", vocab_size=len(tokenizer), seed=5, num_heads=2, num_kv_heads=1)
    policy.load_state_dict(silent(policy))
    problems = load_problems(spec.dataset, "train")
    worker = LocalWorker(spec, policy, tokenizer, None)
    base = worker.drafting.drafter.state_dict()
    good = exact(base, policy.config.hidden_size)
    zeroed = {k: torch.zeros_like(v) for k, v in base.items()}
    served = iter([(1, good), (2, zeroed), (2, zeroed), (3, good)])

    def load_drafters() -> None:  # the hub's sync, as the test wants it
        worker.served = next(served)
        worker.drafting.load(worker.served)

    worker.load_drafters = load_drafters
    results = []
    for step in range(1, 5):
        ids = [0, 1]
        _, _, result = worker.rollout(step, ids, [problems[i] for i in ids])
        results.append(result)
    health = [r["sd_health"] for r in results]
    assert health[0]["healthy"] and health[0]["accept_length"] == 4.0, "every draft accepted"
    assert health[1]["change"] == "flagged" and health[1]["flagged_version"] == 2 and health[1]["accept_length"] == 1.0
    assert results[2]["sd_row_steps"] == 0 and not health[2]["drafted"] and not health[2]["healthy"]
    assert health[3]["drafted"] and health[3]["change"] == "recovered" and health[3]["served_version"] == 3
    tokens = [[c.token_ids for c in r["completions"]] for r in results]
    assert tokens[0] == tokens[1] == tokens[2] == tokens[3], "lossless whatever the drafter"
    by_bucket = results[0]["sd_by_bucket"]
    assert by_bucket and all(p == 3 * n and a == p for n, p, a in by_bucket.values()), by_bucket
