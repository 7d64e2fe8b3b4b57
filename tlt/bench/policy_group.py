"""`tlt bench policy-group`: one GRPO update of a real policy shape on one rank (all the cores' threads) vs a
policy group of two FSDP2 ranks (one thread each) on the same cores, with FSDP2's reshard_after_forward on
(`2-ranks`, the default) and off (`2-ranks-gathered`), interleaved rounds, fresh processes.

Each round starts every variant from the same random weights and batch (`tlt.bench.policy_group_rank`), in
alternating order. Reported per variant and round: tokens per second (the batch's prompt + response tokens
over the slowest rank's update seconds), each rank's parameter + gradient + optimizer bytes and its peak
resident memory; and the group's ratios to one rank (throughput, state per rank) with their range. The
question it answers: does sharding the policy cost speed where one device would do, and how much memory does
each rank save? `--device cuda` runs the one-rank update on one GPU (tokens per second, peak GPU memory)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# name -> (ranks, threads per rank, FSDP2's reshard_after_forward)
VARIANTS = {"1-rank": (1, 2, True), "2-ranks": (2, 1, True), "2-ranks-gathered": (2, 1, False)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(
    shape: str,
    ranks: int,
    threads: int,
    seqs: int,
    prompt: int,
    response: int,
    reshard: bool = True,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """One update of `ranks` processes of `threads` threads each (`reshard`: FSDP2's reshard_after_forward) on
    `device`; every rank's JSON result."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="tlt-policy-group-") as tmp:
        outs = [Path(tmp) / f"rank-{r}.json" for r in range(ranks)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tlt.bench.policy_group_rank"]
                + [
                    str(a)
                    for a in (shape, ranks, rank, port, threads, seqs, prompt, response, int(reshard), out, device)
                ],
                env={**os.environ, "OMP_NUM_THREADS": str(threads)},
            )
            for rank, out in enumerate(outs)
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"policy-group bench: {shape} at {ranks} rank(s) exited {codes}")
        return [json.loads(out.read_text()) for out in outs]


def _ratios(one: list[dict[str, Any]], two: list[dict[str, Any]]) -> dict[str, Any]:
    """A group's ratios to one rank, round by round: throughput, state and peak memory per rank."""
    return {
        "throughput_ratio": _range([b["tokens_per_second"] / a["tokens_per_second"] for a, b in zip(one, two)]),
        "state_ratio_per_rank": _range([max(b["state_bytes"]) / a["state_bytes"][0] for a, b in zip(one, two)]),
        "peak_rss_ratio_per_rank": _range(
            [max(b["peak_rss_bytes"]) / a["peak_rss_bytes"][0] for a, b in zip(one, two)]
        ),
    }


def _range(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_policy_group_bench(
    shape: str = "qwen2.5-0.5b",
    *,
    rounds: int = 5,
    seqs: int = 2,
    prompt: int = 64,
    response: int = 512,
    on_result: Callable[[str], None] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """`rounds` interleaved rounds of every variant (see the module docstring) on `device` (`cuda`: the one-rank
    update on one GPU, the group needing a GPU a rank); the results as a dict."""
    if rounds < 1 or seqs < 2:
        raise ValueError(f"rounds must be >= 1 and seqs >= 2 (one a rank), got {rounds} and {seqs}")
    variants = VARIANTS if device == "cpu" else {"1-rank": (1, 1, True)}
    before = list(os.getloadavg())
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for index in range(rounds):
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        for name in order:
            ranks, threads, reshard = variants[name]
            results = run_variant(shape, ranks, threads, seqs, prompt, response, reshard, device)
            slowest = max(r["seconds"] for r in results)
            row = {
                "round": index + 1,
                "tokens_per_second": results[0]["tokens"] / slowest,
                "seconds": slowest,
                "state_bytes": [r["state_bytes"] for r in results],
                "peak_rss_bytes": [r["peak_rss_bytes"] for r in results],
                "parameters": results[0]["parameters"],
                **({"peak_gpu_bytes": [r["peak_gpu_bytes"] for r in results]} if device == "cuda" else {}),
            }
            per[name].append(row)
            if on_result is not None:
                on_result(
                    f"round {index + 1}/{rounds} {name}: {row['tokens_per_second']:.1f} tok/s, "
                    f"state {max(row['state_bytes']) / 2**30:.2f} GiB a rank"
                )
    one = per["1-rank"]
    group = (
        {} if device != "cpu" else {**_ratios(one, per["2-ranks"]), "gathered": _ratios(one, per["2-ranks-gathered"])}
    )
    return {
        "shape": shape,
        "device": device,
        "parameters": one[0]["parameters"],
        "batch": {"sequences": seqs, "prompt_tokens": prompt, "response_tokens": response},
        "variants": {
            name: {"ranks": r, "threads": t, "reshard_after_forward": f} for name, (r, t, f) in variants.items()
        },
        "rounds": per,
        **group,
        "load_average": {"before": before, "after": list(os.getloadavg())},
    }
