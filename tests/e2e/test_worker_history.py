"""A rollout worker indexes its finished responses into the rollout-history store after the
rollout's results return (off the critical path), and always before its next rollout drafts."""

from __future__ import annotations

import threading

from tlt.models.loading import load_policy
from tlt.spec.run import TLTTrainingRun
from tlt.tasks.datasets import load_problems
from tlt.tasks.warmstart import reduced_config, warm_start
from tlt.workers.rollout import RolloutWorker

SPEC = {
    "model": {"dtype": "float32", "maxContext": 128},
    "dataset": {"builtin": {"numTrain": 16, "numEval": 8}},
    "algorithm": {"steps": 2, "promptsPerStep": 2, "groupSize": 2, "maxNewTokens": 16},
    "rollout": {"replicas": 1, "compile": "off"},
    "speculative": {"mode": "tlt", "threshold": 4, "arms": [{"kind": "plain"}, {"kind": "history", "depth": 4}]},
}


def _worker(**speculative) -> tuple[RolloutWorker, dict, list]:
    spec = {**SPEC, "speculative": {**SPEC["speculative"], **speculative}}
    run = TLTTrainingRun.model_validate({"metadata": {"name": "history"}, "spec": spec})
    folder = warm_start(reduced_config())
    worker = RolloutWorker(0, run.spec, str(folder), 4, [_Verifier()], None)
    weights = {k: v.detach() for k, v in load_policy(str(folder), "float32")[0].state_dict().items()}
    return worker, weights, load_problems(run.spec.dataset, "train")


class _Scores:
    def remote(self, *args, **kwargs) -> None:
        return None


class _Verifier:
    score = _Scores()


def test_responses_enter_the_history_store_after_the_rollout_and_before_the_next():
    worker, weights, problems = _worker()
    first = worker.rollout(1, [0, 1], problems[:2], weights, None)
    assert len(first["completions"]) == 4
    worker.wait_history_indexed()
    assert worker.generator.history.num_docs == 4, "every finished response is history once the rollout is settled"
    worker.rollout(2, [0, 1], problems[:2], weights, None)  # waits for step 1's indexing before drafting
    worker.wait_history_indexed()
    assert worker.generator.history.num_docs == 8
    assert worker.generator.waves == [] and worker.after.indexing is None


def test_a_rollout_returns_before_its_responses_are_indexed():
    """Threshold 0: the rollout never drafts, so only the deferred wave-end indexing fills the store."""
    worker, weights, problems = _worker(threshold=0)
    gate = threading.Event()
    worker.after.submit(gate.wait, 120)  # the background thread is busy until the gate opens
    try:
        result = worker.rollout(1, [0, 1], problems[:2], weights, None)
        assert len(result["completions"]) == 4
        assert worker.generator.history.num_docs == 0, "the rollout returned before its responses were indexed"
        assert worker.after.indexing is None, "indexing starts when the coordinator holds the results (`settle`)"
        worker.settle()
        assert worker.after.indexing is not None and not worker.after.indexing.done()
        assert worker.after.settling is not None and not worker.after.settling.done()
    finally:
        gate.set()
    worker.wait_history_indexed()
    assert worker.generator.history.num_docs == 4
