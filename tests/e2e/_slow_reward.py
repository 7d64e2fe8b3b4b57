"""A reward plug-in that takes 0.1 s a sample (`verifier.reward: _slow_reward:reward`), so that a tiny run's
step lasts long enough (~1.6 s for 16 samples) for a test to signal the process in the middle of one."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


def reward(prompt: str, response: str, record: Mapping[str, Any]) -> float:
    time.sleep(0.1)
    return 0.0
