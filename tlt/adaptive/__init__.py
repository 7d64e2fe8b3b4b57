"""Adaptive speculative decoding: on/off threshold and the bucketed epsilon-greedy bandit."""
