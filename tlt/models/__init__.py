"""Policy loading (Qwen2 / Qwen2.5 / Qwen3 dense / Llama families), tiny models for tests, the EAGLE-style drafter."""
