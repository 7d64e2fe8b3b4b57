"""Drafter evaluation (the `evaluate_drafter` component): accept length and speedup on held-out prompts.

The exported EAGLE folder is loaded strictly for the policy (`tlt.drafter.export.load_eagle`): the
policy artifact's folder, or for a cluster run (`policy_metadata` location cluster) the final
checkpoint on the claim mounted at `mount` (`tlt_components.volume`);
the first `num_prompts` held-out problems of the prepared data run plainly and speculatively
(`tlt.drafter.evaluate.evaluate_drafter`), and the measurements come back as flat metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tlt.drafter.evaluate import evaluate_drafter
from tlt.drafter.export import load_eagle
from tlt.models.loading import load_policy
from tlt_components.common import at_least, choice
from tlt_components.prepare import read_problems
from tlt_components.volume import CHECKPOINT_MOUNT, final_checkpoint, read_location, trained_policy

DTYPES = ("float32", "bfloat16", "float64")
# first rows of the evaluation's report (`tlt_components.report.metrics_report`)
HEADLINE_KEYS = (
    "accept_length",
    "speedup",
    "outputs_equal",
    "speculative_tokens_per_second",
    "plain_tokens_per_second",
    "prompts",
    "draft_tokens",
)


def evaluate_export(
    eagle_dir: str | Path,
    policy_dir: str | Path,
    data_dir: str | Path,
    *,
    num_prompts: int,
    draft_tokens: int,
    max_new_tokens: int,
    batch_size: int,
    temperature: float,
    dtype: str,
    seed: int = 0,
    policy_metadata: dict[str, Any] | None = None,
    mount: str | Path = CHECKPOINT_MOUNT,
) -> dict[str, float]:
    """Metrics of the exported drafter against its policy (see tlt.drafter.evaluate)."""
    for name, value in (
        ("num_prompts", num_prompts),
        ("draft_tokens", draft_tokens),
        ("max_new_tokens", max_new_tokens),
        ("batch_size", batch_size),
    ):
        at_least(name, value, 1)
    at_least("temperature", temperature, 0.0)
    choice("dtype", dtype, DTYPES)
    problems = read_problems(data_dir, "eval")[:num_prompts]
    if not problems:
        raise ValueError(
            "the prepared dataset has no held-out problems (dataset.evalFraction 0 and no dataset.evalPath); "
            "set one of them to evaluate the drafter on records it was not trained on"
        )
    if (policy_metadata or {}).get("location") == "cluster":
        policy, tokenizer = trained_policy(final_checkpoint(read_location(policy_dir), mount), dtype)
    else:
        policy, tokenizer = load_policy(policy_dir, dtype)
    drafter = load_eagle(eagle_dir, policy)
    result = evaluate_drafter(
        policy,
        tokenizer,
        drafter,
        problems,
        draft_tokens=draft_tokens,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        temperature=temperature,
        seed=seed,
    )
    return result.as_metrics()
