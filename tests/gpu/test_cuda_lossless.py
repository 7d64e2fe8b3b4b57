"""Speculative decoding stays lossless on a CUDA device, eager, compiled (inductor's Triton kernels) and
through CUDA graphs' padded step. Skipped where no CUDA device is present.

The CPU tiers prove each claim on the CPU; these run the same drafters and the same checks with the
model on the GPU, where kernels, reductions and the host/device split differ:
- greedy, float64: every engine drafter's output equals plain decoding token for token (log-probs and
  hidden states too), eager and compiled, and up to the context limit;
- sampled, coupled rule: every drafter reproduces plain sampling token for token (same seeds);
- sampled, distribution: the joint of the first three tokens through every drafter matches the exact
  joint (G-test, alpha 1e-3), eager and compiled;
- the padded step under CUDA graphs (`mode="reduce-overhead"`) computes what the eager forward does.

The drafter tables and the exact joint come from the CPU tests (`tests/lossless`), so the two tiers test
the same things. The test-only oracle and random-tree drafters build CPU tensors and stay on the CPU tier.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# The CPU tier's drafter tables and exact joints: tests/lossless is no package (pytest imports its modules by
# name, from their folder), so this module imports them the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lossless"))

import _engine_cases as cases  # noqa: E402
import _sd_helpers as H  # noqa: E402
import test_sd_engine as greedy_tier  # noqa: E402
import test_sd_engine_sampling as sampling_tier  # noqa: E402

from tlt.adaptive.adaptive_stepper import build_adaptive_stepper  # noqa: E402
from tlt.models.tiny import tiny_model  # noqa: E402
from tlt.rollout.compiled import CompiledStep  # noqa: E402
from tlt.rollout.drafting import EagleChainDrafter  # noqa: E402
from tlt.rollout.eagle_tree import EagleTreeDrafter  # noqa: E402
from tlt.rollout.engine import Engine  # noqa: E402
from tlt.rollout.mixed import MixedDrafter  # noqa: E402
from tlt.rollout.runner import causal_mask, decoder_forward  # noqa: E402
from tlt.rollout.speculative import SpeculativeStepper  # noqa: E402
from tlt.rollout.types import Completion, Request, SamplingParams  # noqa: E402
from tlt.spec.run import ArmSpec, SpeculativeSpec  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() False)"),
]

CUDA = torch.device("cuda")
MAX_CONTEXT = cases.MAX_CONTEXT
ENGINE_DRAFTERS = [name for name in greedy_tier.DRAFTERS if not name.startswith(("oracle", "random"))]
COMPILED = pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])


@pytest.fixture(scope="module", autouse=True)
def _exact_matmuls():
    """float32 paths must not round through TF32 (the CPU tiers never do)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def model64():
    return tiny_model("qwen2", dtype=torch.float64, vocab_size=32, seed=11).to(CUDA)


def _drafter(name: str, model, compiled: bool):
    """The CPU table's drafter `name`; its EAGLE steps compiled when `compiled` (same shapes and seeds)."""
    if not compiled or not name.startswith(("eagle", "mixed")):
        return greedy_tier.DRAFTERS[name](model, {})
    embed = model.get_input_embeddings()
    # the CPU table's reduced draft vocabulary (the even ids), else the whole one
    eagle = H.reduced_eagle(model, list(range(0, 32, 2))) if name.endswith("draft-vocab") else H.random_eagle(model)
    if name.startswith("eagle-tree"):
        return EagleTreeDrafter(
            eagle, embed, topk=2, depth=3, budget=5, max_batch_size=4, max_context=MAX_CONTEXT, compile=True
        )
    k = 4 if name == "eagle-chain-4" else 3
    guess = "argmax" if name == "eagle-chain-argmax" else "coupled"
    chain = EagleChainDrafter(eagle, embed, k=k, max_batch_size=4, max_context=MAX_CONTEXT, compile=True, guess=guess)
    return MixedDrafter(H.history_store(), chain, k=k) if name == "mixed" else chain


def _generate(model, requests: list[Request], name: str | None, compiled: bool):
    drafter = None if name is None else _drafter(name, model, compiled)
    layers = cases.feature_layers(drafter)  # a block drafter reading target layers: the engine keeps them
    engine = Engine(model, max_batch_size=4, max_context=MAX_CONTEXT, compile=compiled, feature_layers=layers)
    if drafter is not None:
        engine.stepper = SpeculativeStepper(engine.runner, drafter)
    return engine.generate(requests), engine.stepper


def _assert_equal(got: list[Completion], want: list[Completion], name, atol: float) -> None:
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids, f"{name}: {g.request_id} diverged from plain decoding on CUDA"
        torch.testing.assert_close(g.logprobs, w.logprobs, rtol=0, atol=max(atol, 1e-9))
        if w.hidden is not None:
            torch.testing.assert_close(g.hidden[:, : w.hidden.shape[1]], w.hidden, rtol=0, atol=atol)


@pytest.fixture(scope="module")
def plain64(model64) -> list[Completion]:
    return _generate(model64, cases.requests(), None, compiled=False)[0]


@COMPILED
@pytest.mark.parametrize("name", [None, *ENGINE_DRAFTERS], ids=str)
def test_greedy_speculative_equals_plain_on_cuda(name, compiled, model64, plain64):
    """Compiled kernels order float32 reductions (HF's norms and RoPE) differently: 1e-7, not 1e-9."""
    out, _ = _generate(model64, cases.requests(), name, compiled)
    _assert_equal(out, plain64, name, 1e-6 if compiled else 1e-9)


@COMPILED
@pytest.mark.parametrize("name", ["eagle-chain", "eagle-tree", "history-tree", "mixed"])
def test_greedy_speculative_equals_plain_up_to_the_context_limit_on_cuda(name, compiled, model64):
    requests = cases.requests(max_new=(200, 200, 200))
    plain, _ = _generate(model64, requests, None, compiled=False)
    assert all(p.finish_reason == "length" and len(p.token_ids) < 200 for p in plain), "rows must reach the limit"
    out, _ = _generate(model64, requests, name, compiled)
    _assert_equal(out, plain, name, 1e-6 if compiled else 1e-9)


@COMPILED
def test_adaptive_stepper_equals_plain_on_cuda(compiled, model64, plain64):
    """The bandit's stepper (n-gram, EAGLE chain and tree, plain arms; exploring) as the rollout runs it."""
    arms = [
        ArmSpec(kind="ngram", depth=3),
        ArmSpec(kind="chain", depth=2),
        ArmSpec(kind="tree", depth=3, topk=2, verify_tokens=5),
        ArmSpec(kind="plain"),
    ]
    spec = SpeculativeSpec(
        mode="tlt", threshold=2, buckets=[1, 2], arms=arms, epsilon=0.5, window=4, ngram_min=1, ngram_max=3
    )
    engine = Engine(model64, max_batch_size=4, max_context=MAX_CONTEXT, compile=compiled)
    engine.stepper = build_adaptive_stepper(
        spec, engine.runner, H.random_eagle(model64), rows=4, context=MAX_CONTEXT, seed=0
    )
    _assert_equal(engine.generate(cases.requests()), plain64, "adaptive", 1e-6 if compiled else 1e-9)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
@pytest.mark.parametrize("name", ENGINE_DRAFTERS)
def test_sampled_speculative_equals_plain_sampling_on_cuda(name, temperature, top_p, model64):
    requests = [
        Request(f"s{i}", p, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=n, seed=i))
        for i, (p, n) in enumerate(zip(cases.PROMPTS, (20, 9, 14)))
    ]
    plain, _ = _generate(model64, requests, None, compiled=False)
    out, _ = _generate(model64, requests, name, compiled=False)
    for p, s in zip(plain, out):
        assert s.token_ids == p.token_ids, f"{name}: {s.request_id} differs from plain sampling on CUDA"
        torch.testing.assert_close(s.logprobs, p.logprobs, rtol=0, atol=1e-9)


@COMPILED
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
@pytest.mark.parametrize("name", list(sampling_tier.ENGINE_SAMPLERS))
def test_sampling_matches_exact_joint_on_cuda(name, temperature, top_p, compiled):
    cpu_model = sampling_tier._peaked_model()
    exact = sampling_tier._exact_joint(cpu_model, temperature, top_p)
    model = sampling_tier._peaked_model().to(CUDA)
    drafter = sampling_tier.ENGINE_SAMPLERS[name](model, compiled)
    engine = Engine(
        model, max_batch_size=500, max_context=16, compile=compiled, feature_layers=cases.feature_layers(drafter)
    )
    engine.stepper = SpeculativeStepper(engine.runner, drafter)
    params = [
        SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=3, seed=s)
        for s in range(sampling_tier.ENGINE_SAMPLES)
    ]
    out = engine.generate([Request(f"r{i}", sampling_tier.ENGINE_PROMPT, p) for i, p in enumerate(params)])
    samples = torch.tensor([c.token_ids for c in out])
    assert engine.stepper.stats.drafted > 0, f"{name}: nothing was drafted: not tested"
    p = H.g_test_pvalue(samples, exact)
    assert p > 1e-3, f"{name}: engine samples on CUDA differ from the model (p={p:.3g})"


def test_padded_cuda_graph_step_equals_eager_forward():
    """The padded step (batch to a power of two, span to the full cache) under CUDA graphs, replayed:
    the same output as the eager forward, every replay."""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=4, num_layers=2).to(CUDA)
    step = CompiledStep(decoder_forward, name="cuda-graphs", padded=True, mode="reduce-overhead")
    engine = Engine(model, max_batch_size=8, max_context=cases.MAX_CONTEXT, compile=True)
    cache = engine.runner.cache
    lengths = torch.tensor([3, 7, 5], device=CUDA)
    for width in (1, 2, 1, 2):
        tokens = torch.randint(3, 32, (3, width), device=CUDA)
        slots = lengths[:, None] + torch.arange(width, device=CUDA)[None, :]
        mask = causal_mask(lengths, width, int(lengths.max()) + width)
        with torch.no_grad():
            want = decoder_forward(model.model, tokens, slots, slots, mask, cache.k, cache.v).clone()
            got = step(model.model, tokens, slots, slots, mask, cache.k, cache.v).clone()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
