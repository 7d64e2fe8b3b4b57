"""The vLLM engine's sleep path with a fake `LLM` (vLLM's CPU build has no sleep mode; the GPU tier runs the real
one): level 1 between rollouts, woken before any call that needs the engine, level 2 refused while a drafter is
served, nothing where the platform cannot sleep."""

from __future__ import annotations

import pytest
import torch

from tlt.rollout.vllm.vllm_engine import VllmEngine


class FakeLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self) -> None:
        self.calls.append(("wake_up",))

    def collective_rpc(self, name: str, args: tuple) -> None:
        self.calls.append(("rpc", name))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def fake_engine(*, eagle: object | None, sleeps: bool = True) -> VllmEngine:
    engine = object.__new__(VllmEngine)  # no vLLM here: the driver side only
    engine.llm, engine.eagle, engine.releases_memory, engine.asleep = FakeLLM(), eagle, sleeps, False
    return engine


def test_level_one_between_rollouts_and_woken_before_new_weights():
    engine = fake_engine(eagle=object())
    engine.release()
    engine.release()  # asleep already: one call
    assert engine.asleep and engine.llm.calls == [("sleep", 1)]
    engine.load_weights({"w": torch.zeros(2)})
    assert engine.llm.calls[1:] == [("wake_up",), ("rpc", "tlt_update_policy"), ("reset_prefix_cache",)]
    assert not engine.asleep


def test_level_two_is_refused_while_a_drafter_is_served():
    engine = fake_engine(eagle=object())
    with pytest.raises(ValueError, match="level 2.*refused while an EAGLE drafter"):
        engine.release(level=2)
    assert engine.llm.calls == []
    plain = fake_engine(eagle=None)
    plain.release(level=2)
    assert plain.llm.calls == [("sleep", 2)]
    with pytest.raises(ValueError, match="must be 1 or 2"):
        plain.release(level=3)


def test_nothing_happens_where_the_platform_cannot_sleep():
    engine = fake_engine(eagle=object(), sleeps=False)
    engine.release()
    engine.wake()
    assert engine.llm.calls == [] and not engine.asleep
