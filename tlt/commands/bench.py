"""`tlt bench <name>`: side-by-side benchmarks. Each sub-bench is one entry in BENCHES."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tlt.bench.run_cli import add_run_arguments, run_run
from tlt.commands import bench_engine, bench_trainer
from tlt.commands.bench_args import batches as _batches
from tlt.commands.bench_args import depths as _depths
from tlt.commands.bench_args import draft_vocabs as _draft_vocabs
from tlt.commands.bench_args import workload_file as _workload_file
from tlt.commands.bench_args import write_json as _write_json


def _drafter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the reduced policy and two tiny steps (seconds): checks the bench, measures little",
    )
    parser.add_argument(
        "--warmstart",
        choices=("full", "reduced", "deep"),
        default=None,
        help="policy (default deep: 16 layers, the bench workloads' policy)",
    )


def _drafter_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tlt.bench.online_drafter import OnlineDrafterBenchConfig, run_online_drafter_bench

    cfg = OnlineDrafterBenchConfig.quick() if args.quick else OnlineDrafterBenchConfig()
    if args.warmstart is not None:
        cfg = replace(cfg, warmstart=args.warmstart)
    console = Console()
    with console.status("benchmarking") as status:
        result = run_online_drafter_bench(cfg, on_row=lambda text: status.update(text))
    rows = result["online_drafter"]["rows"]
    table = Table(
        title=f"online drafter training from the warm drafter, policy fixed (shape: prompts x samples "
        f"per step): held-out top-1 agreement after each step "
        f"({result['online_drafter']['heldout_positions']} positions, {cfg.updates_per_step} "
        f"updates per step)"
    )
    table.add_column("step shape", no_wrap=True)
    table.add_column("lr", justify="right")
    for point in rows[0]["curve"]:
        table.add_column(f"step {point['step']}", justify="right")
    table.add_column("final / warm", justify="right")
    for row in rows:
        table.add_row(
            row["shape"],
            f"{row['learning_rate']:g}",
            *(f"{p['agreement']:.3f}" for p in row["curve"]),
            f"{row['final_over_warm']:.3f}",
        )
    console.print(table)
    return _write_json(console, args.json, result)


def _update_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved (recompute, first-pass) pairs (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2, the coordinator's here)")


def _update_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tlt.bench.update_pass import run_update_bench
    from tlt.bench.workload import DEFAULT_WORKLOAD

    console = Console()
    try:
        with console.status("benchmarking the update"):
            result = run_update_bench(args.workload or DEFAULT_WORKLOAD, pairs=args.pairs, threads=args.threads)
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    ratio, sec = result["recompute_over_first_pass"], result["seconds"]
    console.print(
        f"{result['workload']}: {result['responses']} responses, {result['response_tokens']} tokens, "
        f"{result['threads']} threads; update seconds recompute {statistics.median(sec['recompute']):.2f}, "
        f"first-pass {statistics.median(sec['first-pass']):.2f} (medians); recompute / first-pass "
        f"{ratio['median']:.3f} [{ratio['min']:.3f}, {ratio['max']:.3f}]; "
        f"load before {result['load_average']['before']}"
    )
    return _write_json(console, args.json, result)


def _policy_group_arguments(parser: argparse.ArgumentParser) -> None:
    from tlt.bench.policy_group_rank import SHAPES

    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b", help="policy shape (random weights)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--seqs", type=int, default=2, help="sequences in the step's batch (default 2)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens a sequence (default 64)")
    parser.add_argument("--response", type=int, default=512, help="response tokens a sequence (default 512)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu: 1 rank vs 2; cuda: 1 rank on one GPU"
    )


def _policy_group_run(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console

    from tlt.bench.policy_group import run_policy_group_bench

    console = Console()
    try:
        result = run_policy_group_bench(
            args.shape,
            rounds=args.rounds,
            seqs=args.seqs,
            prompt=args.prompt,
            response=args.response,
            on_result=lambda line: print(line, file=sys.stderr, flush=True),
            device=args.device,
        )
    except (ValueError, RuntimeError) as exc:
        console.print(f"error: {exc}")
        return 2
    if args.device == "cuda":
        rows = result["rounds"]["1-rank"]
        console.print(
            f"{result['shape']} ({result['parameters'] / 1e6:.0f}M parameters) on one GPU, {args.seqs} x "
            f"({args.prompt} + {args.response}) tokens: "
            + ", ".join(f"{r['tokens_per_second']:.0f}" for r in rows)
            + f" tokens/s; peak GPU memory {max(max(r['peak_gpu_bytes']) for r in rows) / 2**30:.1f} GiB, "
            f"state {rows[0]['state_bytes'][0] / 2**30:.1f} GiB",
            highlight=False,
        )
        return _write_json(console, args.json, result)
    t, m, g = result["throughput_ratio"], result["state_ratio_per_rank"], result["gathered"]
    gt, gp = g["throughput_ratio"], g["peak_rss_ratio_per_rank"]
    console.print(
        f"{result['shape']} ({result['parameters'] / 1e6:.0f}M parameters), {args.seqs} x "
        f"({args.prompt} + {args.response}) tokens, {args.rounds} rounds: 2 ranks / 1 rank throughput "
        f"{t['median']:.3f} [{t['min']:.3f}, {t['max']:.3f}], state per rank {m['median']:.3f} "
        f"[{m['min']:.3f}, {m['max']:.3f}]; without resharding after the forward: throughput "
        f"{gt['median']:.3f} [{gt['min']:.3f}, {gt['max']:.3f}], peak memory per rank {gp['median']:.3f}; "
        f"load before {result['load_average']['before']}",
        highlight=False,
    )
    return _write_json(console, args.json, result)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=None, help="workload file (default bench/workload.yaml)")
    parser.add_argument("--shards", type=int, default=8, help="shards (the run's first steps' prompts), default 8")
    parser.add_argument("--repeats", type=int, default=3, help="repeats, each with fresh workers (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, a Ray rollout worker's here)")
    parser.add_argument("--quick", action="store_true", help="the workload's small version (checks the bench)")
    parser.add_argument(
        "--split",
        action="store_true",
        help="also split each decode step's time by part (target forward, drafter, host work)",
    )


def _worker_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tlt.bench.worker_alone import WorkerBenchConfig, run_worker_bench

    console = Console()
    try:
        cfg = WorkerBenchConfig(
            workload=_workload_file(args.workload),
            shards=args.shards,
            threads=args.threads,
            quick=args.quick,
            split=args.split,
            repeats=args.repeats,
        )
        with console.status("one rollout worker alone: vanilla vs tlt"):  # the JSON rewritten after every repeat
            result = run_worker_bench(cfg, on_repeat=lambda partial: _write_json(console, args.json, partial))
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    for name, v in result["variants"].items():
        ranges = ", ".join(f"{k}: {s:.2f}" for k, s in v["decode_seconds_by_running"].items())
        console.print(
            f"{name}: {v['seconds_total']:.2f} s, {v['steps_total']} decode steps; decode s by running batch {ranges}"
        )
    for name, ranges in result.get("step_split", {}).items():
        for rng, cell in ranges.items():
            parts = ", ".join(f"{p} {cell[p]:.2f}" for p in ("target_forward", "draft_graph", "host") if p in cell)
            console.print(f"  {name} at {rng} rows: {cell['steps']} steps, {cell['total']:.2f} ms a step ({parts})")
    per_token = result.get("speedup_per_token_by_running") or {}
    if per_token:
        console.print(
            "tlt speed-up per generated token by running batch (decode steps): "
            + ", ".join(f"{k}: {x:.2f}x" for k, x in per_token.items())
        )
    low, high = result["rollout_speedup_range"]
    console.print(
        f"tlt over vanilla (median of {len(result['repeats'])} repeats): rollout speed-up "
        f"{result['rollout_speedup']:.3f}x (range {low:.3f}-{high:.3f}), steps "
        f"{result['steps_ratio']:.3f}, seconds per step {result['step_cost_ratio']:.3f}; "
        f"{result['mismatched_responses']} responses differ; load {result['load_average']}"
    )
    return _write_json(console, args.json, result)


def _costs_arguments(parser: argparse.ArgumentParser) -> None:
    from tlt.bench.cost_terms import SHAPES

    parser.add_argument(
        "--shape",
        default=None,
        help=f"a published shape, random weights: {', '.join(SHAPES)} (default qwen2.5-0.5b unless --config)",
    )
    parser.add_argument("--config", type=Path, default=None, help="a model's config.json (or its folder) instead")
    parser.add_argument("--device", default="cpu", help="torch device to decode on: cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float32 or float64")
    parser.add_argument(
        "--batches", type=_batches, default=(1, 4, 16, 64), help="running batch sizes (default 1,4,16,64)"
    )
    parser.add_argument("--depths", type=_depths, default=(1, 2, 3, 4, 6, 8), help="chain depths (default 1,2,3,4,6,8)")
    parser.add_argument("--context", type=int, default=512, help="cached tokens per row (default 512)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, fastest kept (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU (default 1)")
    parser.add_argument("--compile", action="store_true", help="time the compiled steps (as rollout.compile on)")
    parser.add_argument(
        "--draft-vocab",
        type=_draft_vocabs,
        default=(0,),
        help="drafter head sizes, side by side: 0 the whole vocabulary, N a reduced draft vocabulary "
        "of N tokens (speculative.draftVocab), e.g. 0,32768 (default 0)",
    )


def _costs_run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from tlt.bench.cost_terms import CostsConfig, costs_table, run_costs

    console = Console()
    torch.set_num_threads(max(1, args.threads))
    shape = args.shape if args.shape or args.config else "qwen2.5-0.5b"
    try:
        cfg = CostsConfig(
            shape=shape,
            config=args.config,
            device=args.device,
            dtype=args.dtype,
            batches=args.batches,
            depths=args.depths,
            context=args.context,
            repeats=args.repeats,
            compile=args.compile,
            draft_vocabs=args.draft_vocab,
        )
        with console.status("timing target, verify and drafter steps"):
            result = run_costs(cfg)
    except ValueError as exc:
        console.print(f"error: {exc}")
        return 2
    console.print(costs_table(result))
    return _write_json(console, args.json, result)


# name -> (help, add_arguments, run)
BENCHES: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "engine": ("tokens/s of the rollout engine vs transformers generate", bench_engine.add_arguments, bench_engine.run),
    "run": ("the pinned RL workload under each SD variant, side by side", add_run_arguments, run_run),
    "drafter": (
        "online drafter training on GRPO-shaped vs distinct-prompt steps: held-out agreement",
        _drafter_arguments,
        _drafter_run,
    ),
    "update": (
        "the policy update with vs without a separate old-log-prob pass, interleaved pairs",
        _update_arguments,
        _update_run,
    ),
    "policy-group": (
        "one GRPO update of a real policy shape on one rank vs two FSDP2 ranks on the same cores, interleaved",
        _policy_group_arguments,
        _policy_group_run,
    ),
    "worker": (
        "one rollout worker alone (no Ray): vanilla vs tlt on the same shards, interleaved",
        _worker_arguments,
        _worker_run,
    ),
    "trainer": (
        "a decode loop with a spot trainer on another core switched off and on, interleaved: what idle-time "
        "training costs a worker still decoding",
        bench_trainer.add_arguments,
        bench_trainer.run,
    ),
    "costs": (
        "verify and drafter cost of a model shape on this hardware: break-even accept length by depth",
        _costs_arguments,
        _costs_run,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (help_text, add, _) in BENCHES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
        add(p)


def run(args: argparse.Namespace) -> int:
    return BENCHES[args.bench][2](args)
