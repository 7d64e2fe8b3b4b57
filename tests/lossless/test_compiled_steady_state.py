"""A compiled worker's rollouts compile nothing after `warm_up`, whichever arm the bandit picks.

The rollout worker warms its engine up once (`warm_up` with the drafter graphs its arms and sampling can
reach, `drafter_graphs`, and the block drafter's, `block_graphs`) and then runs the adaptive stepper over
every arm kind: plain, EAGLE chains of two depths, an EAGLE tree, n-gram, rollout-history, mixed and block
drafts of two depths. A graph compiled after the warm-up
would land in a timed rollout (seconds each; one was found this way: a stride guard at one row). Dynamo's
global counter of unique graphs covers the target's step and every drafter graph at once.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch._dynamo.utils import counters

from tlt.adaptive.adaptive_stepper import build_adaptive_stepper
from tlt.adaptive.arms import block_graphs, drafter_graphs, new_history_store
from tlt.models.block_drafter import new_block_drafter
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout import warmup
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams
from tlt.rollout.warmup import warm_up, warm_up_blocks
from tlt.spec.plan import spread_layers
from tlt.spec.run import ArmSpec, SpeculativeSpec

CONTEXT = 64
ROWS = 3
PROMPTS = [[5, 6, 7, 5, 6, 7], [9, 10, 9, 10, 9], [11, 12, 13, 11, 12, 13, 11]]
ARMS = [
    ArmSpec(kind="plain"),
    ArmSpec(kind="chain", depth=2),
    ArmSpec(kind="chain", depth=3),
    ArmSpec(kind="tree", depth=2, topk=2, verify_tokens=4),
    ArmSpec(kind="ngram", depth=3),
    ArmSpec(kind="history", depth=4),
    ArmSpec(kind="mixed", depth=3),
    ArmSpec(kind="block", depth=2),
    ArmSpec(kind="block", depth=3),
]


def _requests(temperature: float, rows: int, max_new: int, tag: str) -> list[Request]:
    return [
        Request(
            f"{tag}{i}", PROMPTS[i], SamplingParams(temperature=temperature, max_new_tokens=max_new + 5 * i, seed=i)
        )
        for i in range(rows)
    ]


def test_rollouts_after_warm_up_compile_nothing_whatever_the_arm_block_arms_too(fresh_graphs):
    """Sampling rollouts after a warm-up planned for sampling, then greedy ones after the greedy plan's
    warm-up: neither compiles a graph, so each plan holds every graph its rollouts reach. (Dynamo starts
    empty, `fresh_graphs`; the greedy plan's warm-up adds only what the sampling plan's lacked.
    `test_warm_up_runs_only_the_planned_drafter_classes` checks what a plan runs.)"""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=7)
    torch.manual_seed(3)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).eval()
    drafter.bind_policy(model)
    # as a run's: reading the target's spread layers beside its final-norm state (the engine keeps them)
    block = new_block_drafter(model, block_size=3, feature_layers=spread_layers(model.config.num_hidden_layers)).eval()
    spec = SpeculativeSpec(
        mode="tlt", threshold=ROWS, buckets=[1, 2, ROWS], arms=ARMS, epsilon=1.0, window=4, ngram_min=1, ngram_max=3
    )
    engine = Engine(model, max_batch_size=ROWS, max_context=CONTEXT, compile=True, feature_layers=block.feature_layers)
    history = new_history_store(spec)
    engine.wave_observers.append(history.observe)  # later rollouts draft from earlier ones
    arms_run: set[str] = set()
    round_ = 0
    for temperature in (1.0, 0.0):
        assert warm_up(engine, drafter, **drafter_graphs(spec, sampled=temperature > 0)) > 0
        assert warm_up_blocks(engine, block, **block_graphs(spec, sampled=temperature > 0)) > 0
        graphs = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            for rows in (ROWS, 1, 2):
                stepper = build_adaptive_stepper(
                    spec, engine.runner, drafter, rows=ROWS, context=CONTEXT, seed=round_, history=history, block=block
                )
                engine.stepper = stepper
                engine.generate(_requests(temperature, rows, 14, f"t{round_}-"))
                arms_run |= {r.arm for r in stepper.log if r.arm is not None}
                round_ += 1
        assert counters["stats"]["unique_graphs"] == graphs, f"a graph compiled after the warm-up (T={temperature})"
    assert arms_run == {
        "plain",
        "chain-d2",
        "chain-d3",
        "tree-d2k2v4",
        "ngram-d3",
        "history-d4",
        "mixed-d3",
        "block-d2",
        "block-d3",
    }, arms_run


class _RecordingCache:
    """Stands in for `EagleCache` in `warm_up`: records each drafter call's class instead of compiling."""

    calls: list[tuple] = []

    def __init__(self, *args, **kwargs) -> None:
        self.step = None
        self.cache = SimpleNamespace(ensure_capacity=lambda n: None, k=[], v=[])

    def forward(self, tokens, features, positions, slots, mask):
        self.calls.append(("step", tokens.shape[0], min(tokens.shape[1], 2)))

    def _chain_step(self, k):
        return lambda step, tokens, *rest: self.calls.append(
            ("chain", k, tokens.shape[0], "coupled" if len(rest) > 6 else "argmax")
        )


def test_warm_up_runs_only_the_planned_drafter_classes(monkeypatch):
    monkeypatch.setattr(warmup, "EagleCache", _RecordingCache)
    target_calls = []
    runner = SimpleNamespace(
        device=torch.device("cpu"),
        forward=lambda tokens, *a: target_calls.append(tokens.shape),
        model=SimpleNamespace(get_input_embeddings=lambda: None),
    )
    engine = SimpleNamespace(compiled=True, max_batch_size=ROWS, max_context=CONTEXT, runner=runner)
    drafter = SimpleNamespace(config=SimpleNamespace(hidden_size=8), fc=SimpleNamespace(weight=torch.zeros(1)))
    _RecordingCache.calls = []
    warm_up(engine, drafter, chain_depths=[2, 3], step_widths=[2], guesses=["coupled"])
    assert len(target_calls) == 4  # the target: (one row, several) x (width 1, wider)
    assert _RecordingCache.calls == [("step", 1, 2), ("step", 2, 2)] + [
        ("chain", k, b, "coupled") for k in (2, 3) for b in (1, 2)
    ]
    _RecordingCache.calls = []
    warm_up(engine, drafter, chain_depths=[3], step_widths=[], guesses=["argmax"], target=False, batches=[1])
    assert _RecordingCache.calls == [("chain", 3, 1, "argmax")]
    _RecordingCache.calls = []
    warm_up(engine, drafter, chain_depths=[2], target=False, batches=[2])  # the defaults: every class
    assert _RecordingCache.calls == [
        ("step", 2, 1),
        ("step", 2, 2),
        ("chain", 2, 2, "coupled"),
        ("chain", 2, 2, "argmax"),
    ]
