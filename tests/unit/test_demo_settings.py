"""`make demo` runs the bench workload countdown-deep-v3's settings and warm start (vanilla and TLT), so
what it shows is what `tlt bench run --workload bench/workload-deep-v3.yaml` measures, one repeat."""

from __future__ import annotations

from pathlib import Path

import yaml

from tlt.bench.workload import WARMSTARTS, load_workload
from tlt.commands.demo import EXAMPLE
from tlt.spec.manifest_io import load_run

V3 = Path(__file__).resolve().parents[2] / "bench" / "workload-deep-v3.yaml"


def test_demo_warm_start_is_the_v3_workloads():
    assert WARMSTARTS["deep-v3"]().cache_key() == load_workload(V3).warmstart.cache_key()


def test_demo_run_file_has_the_v3_workloads_settings():
    demo = yaml.safe_load(EXAMPLE.read_text())["spec"]
    bench = yaml.safe_load(V3.read_text())["spec"]
    for key in ("model", "dataset", "rollout", "drafter"):
        assert demo[key] == bench[key], key
    heldout = {"evalEvery", "evalSamples"}  # the demo also shows held-out accuracy; the bench times steps only
    assert {k: v for k, v in demo["algorithm"].items() if k not in heldout} == bench["algorithm"]
    demo_sd = {k: v for k, v in demo["speculative"].items() if k != "mode"}
    assert demo_sd == bench["speculative"] and demo["speculative"]["mode"] == "tlt"
    load_run(EXAMPLE)  # and it is a valid run file
