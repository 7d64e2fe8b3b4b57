"""The e2e Ray run's spec (`test_ray_runtime.py`), apart from that test so that the GPU tier can take it on a
machine without Ray (`tests/gpu/test_cuda_runtime.py`: its single-process test needs no Ray)."""

SPEC = {
    "model": {"dtype": "float32", "maxContext": 256},
    "dataset": {"builtin": {"numTrain": 64, "numEval": 16}},
    "algorithm": {"steps": 3, "promptsPerStep": 4, "groupSize": 4, "maxNewTokens": 96, "microBatchSize": 16},
    "rollout": {"replicas": 2},
    "verifier": {"replicas": 1},
    "speculative": {"mode": "tlt"},
    "drafter": {"enabledSlots": "all", "batchTokens": 256, "learningRate": 1e-3},
    "checkpoint": {"intervalSteps": 1},
}
