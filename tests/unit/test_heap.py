"""`tlt.runtime.heap`: a worker's start-up heap collected once, then frozen, only in a Ray actor's process."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

from tlt.runtime.heap import freeze_actor_heap, in_actor

# In a process of its own: freezing this test process's heap would keep whatever later turns into cyclic garbage.
SCRIPT = textwrap.dedent("""
    import gc, json
    from tlt.runtime.heap import freeze_heap

    class Node:
        def __init__(self):
            self.me = self  # a reference cycle: only the cyclic collector frees it

    gc.disable()  # nothing is collected before freeze_heap's own collection
    for _ in range(1000):
        Node()
    kept = [Node() for _ in range(10)]
    report = freeze_heap()
    gc.enable()
    counts = gc.get_count()
    for _ in range(500):
        Node()
    later = gc.collect()  # what is created after the freeze is still collected
    print(json.dumps({**report, "freeze_count": gc.get_freeze_count(), "later": later, "counts": counts}))
""")


def test_freeze_heap_collects_the_cycles_then_freezes_the_live_objects():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["collected"] >= 1000, "the cyclic garbage made before the freeze was collected first"
    assert report["frozen"] == report["freeze_count"] > 10, "the live objects are in the permanent generation"
    assert report["counts"][1:] == [0, 0], "the older generations are empty right after the freeze"
    assert report["later"] >= 500, "cycles made after the freeze are still collected"
    assert report["seconds"] >= 0


def test_freeze_actor_heap_does_nothing_outside_a_ray_actor():
    before = gc.get_freeze_count()
    assert not in_actor()
    assert freeze_actor_heap("tool") is None
    assert gc.get_freeze_count() == before
