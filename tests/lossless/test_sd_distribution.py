"""Speculative decoding samples exactly the target's distribution (and the test can tell when it does not).

A fixed synthetic autoregressive model (vocabulary 5, next token given the last two) gives the exact
joint distribution of the first three generated tokens; each speculative procedure is run on a large
batch of independent rows and compared with a G-test at alpha = 1e-3. The same test must reject each
deliberately wrong verifier (mutant), which shows it has the power to catch these mistakes.
"""

from __future__ import annotations

import _sd_helpers as H
import pytest

ALPHA = 1e-3
ROWS = 20_000
VOCAB = 5
SETTINGS = [pytest.param(1.0, 1.0, id="T1"), pytest.param(0.7, 0.9, id="T0.7-top_p0.9")]

# name -> (strategy, most tokens one round can emit)
CORRECT = {
    "chain-sampled": (H.chain_sampled(k=2), 3),
    "tree-deterministic": (H.topk_tree(topk=2, depth=2, budget=4), 5),
    "ngram-deterministic": (H.ngram_chain(k=3), 4),
}
MUTANTS = {
    "greedy-verify-while-sampling": (H.chain_sampled(2, H.mutant_greedy_while_sampling), 3),
    "p-q-swapped": (H.chain_sampled(2, H.mutant_swapped_pq), 3),
    "resample-from-p-not-residual": (H.chain_sampled(2, H.mutant_resample_from_p), 3),
    "no-bonus-token": (H.chain_sampled(2, H.mutant_no_bonus), 3),
    "ngram-greedy-verify-while-sampling": (H.ngram_chain(3, H.mutant_ngram_greedy), 4),
    "ngram-rejected-token-not-removed": (H.ngram_chain(3, H.mutant_ngram_resample_from_p), 4),
    "tree-greedy-verify-while-sampling": (H.topk_tree(2, 2, 4, H.mutant_tree_greedy), 5),
    "tree-drafter-probs-as-q-for-topk-children": (H.topk_tree(2, 2, 4, H.mutant_tree_drafter_q), 5),
}


def _pvalue(name: str, cases: dict, temperature: float, top_p: float) -> float:
    lm = H.make_table_lm(VOCAB, temperature, top_p)
    strategy, max_round_tokens = cases[name]
    samples = H.run_speculative(lm, strategy, ROWS, seed=2024, max_round_tokens=max_round_tokens)
    return H.g_test_pvalue(samples, H.exact_joint(lm))


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
@pytest.mark.parametrize("name", list(CORRECT))
def test_speculative_sampling_matches_target_distribution(name: str, temperature: float, top_p: float):
    p = _pvalue(name, CORRECT, temperature, top_p)
    assert p > ALPHA, f"{name}: joint of the first 3 tokens differs from the target's (G-test p={p:.3g})"


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_distribution_test_rejects_lossy_mutant(name: str, temperature: float, top_p: float):
    p = _pvalue(name, MUTANTS, temperature, top_p)
    assert p < ALPHA, f"mutant {name} passed the distribution test (G-test p={p:.3g}): the test lacks power"


def test_exact_joint_is_a_distribution():
    for temperature, top_p in [(1.0, 1.0), (0.7, 0.9)]:
        joint = H.exact_joint(H.make_table_lm(VOCAB, temperature, top_p))
        assert abs(float(joint.sum()) - 1.0) < 1e-12
        assert bool((joint >= 0).all())
