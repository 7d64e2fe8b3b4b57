"""A compiled worker's rollouts compile nothing after `warm_up`, whichever arm the bandit picks.

The rollout worker warms its engine up once (`warm_up` with the drafter graphs its arms and sampling can
reach, `drafter_graphs`) and then runs the adaptive stepper over every arm kind: plain, EAGLE chains of
two depths, an EAGLE tree, n-gram, rollout-history and mixed drafts. A graph compiled after the warm-up
would land in a timed rollout (seconds each; session 17 found one, a stride guard at one row). Dynamo's
global counter of unique graphs covers the target's step and every drafter graph at once.
"""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from tlt.adaptive.arms import drafter_graphs, new_history_store
from tlt.adaptive.stepper import build_adaptive_stepper
from tlt.config import ArmSpec, SpeculativeSpec
from tlt.models.drafter import EagleDrafter, drafter_config_from_target
from tlt.models.tiny import tiny_model
from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams
from tlt.rollout.warmup import warm_up

CONTEXT = 64
ROWS = 3
PROMPTS = [[5, 6, 7, 5, 6, 7], [9, 10, 9, 10, 9], [11, 12, 13, 11, 12, 13, 11]]
ARMS = [ArmSpec(kind="plain"), ArmSpec(kind="chain", depth=2), ArmSpec(kind="chain", depth=3),
        ArmSpec(kind="tree", depth=2, topk=2, verify_tokens=4), ArmSpec(kind="ngram", depth=3),
        ArmSpec(kind="history", depth=4), ArmSpec(kind="mixed", depth=3)]


def _requests(temperature: float, rows: int, max_new: int, tag: str) -> list[Request]:
    return [Request(f"{tag}{i}", PROMPTS[i], SamplingParams(temperature=temperature, max_new_tokens=max_new + 5 * i,
                                                            seed=i)) for i in range(rows)]


def test_rollouts_after_warm_up_compile_nothing_whatever_the_arm():
    """Sampling rollouts after a warm-up planned for sampling, then greedy ones after the greedy plan's
    warm-up: neither compiles a graph. The sampling plan compiles 10 graphs, not all 16: the target's 4,
    the tree's drafter step at width > 1 (catch-up, level of topk 2) at both batch classes, and the two
    chains' coupled graphs at both; the greedy plan then adds the chains' 4 argmax graphs only."""
    model = tiny_model("qwen2", dtype=torch.float32, vocab_size=32, seed=7, num_layers=1, hidden_size=48)
    torch.manual_seed(3)
    drafter = EagleDrafter(drafter_config_from_target(model.config)).eval()
    drafter.bind_policy(model)
    spec = SpeculativeSpec(mode="tlt", threshold=ROWS, buckets=[1, 2, ROWS], arms=ARMS, epsilon=1.0, window=4,
                           ngram_min=1, ngram_max=3)
    engine = Engine(model, max_batch_size=ROWS, max_context=CONTEXT, compile=True)
    history = new_history_store(spec)
    engine.wave_observers.append(history.observe)  # later rollouts draft from earlier ones
    arms_run: set[str] = set()
    round_ = 0
    for temperature, added in ((1.0, 10), (0.0, 4)):
        before = counters["stats"]["unique_graphs"]
        assert warm_up(engine, drafter, **drafter_graphs(spec, sampled=temperature > 0)) > 0
        graphs = counters["stats"]["unique_graphs"]
        assert graphs - before == added, (temperature, graphs - before)
        with torch.no_grad():
            for rows in (ROWS, 1, 2):
                stepper = build_adaptive_stepper(spec, engine.runner, drafter, rows=ROWS, context=CONTEXT,
                                                 seed=round_, history=history)
                engine.stepper = stepper
                engine.generate(_requests(temperature, rows, 14, f"t{round_}-"))
                arms_run |= {r.arm for r in stepper.log if r.arm is not None}
                round_ += 1
        assert counters["stats"]["unique_graphs"] == graphs, f"a graph compiled after the warm-up (T={temperature})"
    assert arms_run == {"plain", "chain-d2", "chain-d3", "tree-d2k2v4", "ngram-d3", "history-d4", "mixed-d3"}, arms_run
