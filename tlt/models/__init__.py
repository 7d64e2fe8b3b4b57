"""Policy loading (Qwen2 / Qwen2.5 / Llama families), tiny models for tests, the EAGLE-style drafter."""
