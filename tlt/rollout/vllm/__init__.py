"""The optional vLLM rollout backend (`rollout.engine: vllm`): `engine.VllmEngine` in the driver,
`extension.WeightSync` inside vLLM's worker. Only `availability` imports without vLLM installed."""
