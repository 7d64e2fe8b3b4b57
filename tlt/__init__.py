"""TLT: Taming the Long Tail — lossless speculative rollouts with an online drafter for RL."""

__version__ = "0.1.0"
