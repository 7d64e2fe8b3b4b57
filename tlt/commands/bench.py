"""`tlt bench <name>`: side-by-side benchmarks. Each sub-bench is one entry in BENCHES."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tlt.bench.run_cli import add_run_arguments, run_run
from tlt.commands import bench_trainer
from tlt.commands.bench_args import batches as _batches
from tlt.commands.bench_args import depths as _depths
from tlt.commands.bench_args import draft_vocabs as _draft_vocabs
from tlt.commands.bench_args import workload_file as _workload_file
from tlt.commands.bench_args import write_json as _write_json


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed rounds per variant, median reported (default 3; 1 with --quick)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model and short runs (seconds): checks the bench, measures little"
    )
    parser.add_argument(
        "--part",
        choices=("all", "hf", "sd", "compiled", "vllm"),
        default="all",
        help="hf: this engine vs transformers generate; sd: speculative decoding rows and costs; compiled: eager vs "
        "compiled steps vs generate vs the weight-read bound; vllm: this engine (plain, TLT's adaptive SD) vs vLLM "
        "(plain, EAGLE), greedy (needs vLLM: run it with .venv-vllm's python); all: every part but vllm",
    )
    parser.add_argument(
        "--warmstart",
        choices=("full", "reduced", "deep"),
        default=None,
        help="policy of the sd part: full (default), reduced, or deep (16 layers, shaped like a reasoning LLM)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the sd part (default 2; a `tlt bench run` rollout worker decodes on 1)",
    )
    parser.add_argument(
        "--batches",
        type=_batches,
        default=None,
        help="running batch sizes of the sd part, e.g. 1,4,16 (default 1,4,32), or of the vllm part "
        "(default 1,4,16,32; 1,4 with --quick)",
    )
    parser.add_argument(
        "--workload",
        type=Path,
        default=None,
        help="sd part on a `tlt bench run` workload's policy and warm drafter, at its temperature, response budget, "
        "group size and rollout.compile (instead of --warmstart); the vllm part's workload (default "
        "bench/workload-vllm-v1.yaml; with --quick, its quick overrides)",
    )


def _engine_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from tlt.bench.engine import EngineBenchConfig, run_engine_bench
    from tlt.bench.engine_compiled import CompiledBenchConfig, run_compiled_bench
    from tlt.bench.engine_sd import SdBenchConfig, run_sd_bench

    console = Console()
    if args.repeats is not None and args.repeats < 1:
        console.print("[red]error:[/red] --repeats must be >= 1")
        return 2
    if args.threads is not None and args.threads < 1:
        console.print(f"[red]error:[/red] --threads must be >= 1, got {args.threads}")
        return 2
    if args.workload is not None and args.warmstart is not None:
        console.print("[red]error:[/red] --workload and --warmstart both choose the sd part's policy: give one")
        return 2
    if args.workload is not None and not args.workload.is_file():
        console.print(f"[red]error:[/red] --workload: no such file {str(args.workload)!r}")
        return 2
    refusal = _vllm_refusal(args) if args.part == "vllm" else None
    if refusal is not None:
        console.print(f"[red]error:[/red] {escape(refusal)}")  # escaped: the install hint's 'tlt[vllm]'
        return 2
    result: dict = {}
    with console.status("benchmarking") as status:
        if args.part == "vllm":
            from tlt.bench.engine_vllm import VllmBenchConfig, run_vllm_bench

            v_cfg = (
                VllmBenchConfig.quick(repeats=args.repeats or 1)
                if args.quick
                else VllmBenchConfig(repeats=args.repeats or 3)
            )
            v_over = {"batches": args.batches, "workload": str(args.workload) if args.workload else None}
            v_cfg = replace(v_cfg, **{k: v for k, v in v_over.items() if v is not None})
            result.update(run_vllm_bench(v_cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "hf"):
            cfg = (
                EngineBenchConfig.quick(repeats=args.repeats or 1)
                if args.quick
                else EngineBenchConfig(repeats=args.repeats or 3)
            )
            result.update(run_engine_bench(cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "sd"):
            sd_cfg = (
                SdBenchConfig.quick(repeats=args.repeats or 1)
                if args.quick
                else SdBenchConfig(repeats=args.repeats or 3)
            )
            overrides = {
                "warmstart": args.warmstart,
                "batches": args.batches,
                "threads": args.threads,
                "workload": str(args.workload) if args.workload is not None else None,
            }
            sd_cfg = replace(sd_cfg, **{k: v for k, v in overrides.items() if v is not None})
            result.update(run_sd_bench(sd_cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "compiled"):
            c_cfg = (
                CompiledBenchConfig.quick(repeats=args.repeats or 1)
                if args.quick
                else CompiledBenchConfig(repeats=args.repeats or 5)
            )
            result.update(run_compiled_bench(c_cfg, on_row=lambda text: status.update(text)))
    for table in _engine_tables(result):
        console.print(table)
    return _write_json(console, args.json, result)


def _vllm_refusal(args: argparse.Namespace) -> str | None:
    """Why `--part vllm` cannot run (vLLM not installed: said at once, before any model loads), or None."""
    from tlt.rollout.vllm.availability import INSTALL_HINT, VllmUnavailable, require_vllm

    try:
        require_vllm()
    except VllmUnavailable:
        return f"--part vllm needs vLLM, which is not installed here: {INSTALL_HINT}"
    if args.warmstart is not None:
        return "--part vllm takes its policy from --workload, not --warmstart"
    return None


def _vllm_tables(result: dict) -> list:
    from rich.table import Table

    info = result["vllm"]
    policy, config = info["policy"], info["config"]
    table = Table(
        title=f"this engine vs vLLM {info['versions']['vllm']} ({policy['params'] / 1e6:.2f}M-param policy, "
        f"{policy['dtype']}, greedy, up to {policy['max_new_tokens']} new tokens, "
        f"{info['threads']['torch_threads']} threads, median of {config['repeats']})"
    )
    table.add_column("variant", no_wrap=True)
    for column in ("batch", "tok/s", "range", "accept", "differ", "start s"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in info["rows"]:
        low, high = row["tokens_per_s_range"]
        accept = f"{row['accept_length']:.2f}" if row["accept_length"] is not None else "-"
        table.add_row(
            row["variant"],
            str(row["batch"]),
            f"{row['tokens_per_s']:.0f}",
            f"{low:.0f}-{high:.0f}",
            accept,
            str(row["mismatched_requests"]),
            f"{info['start_seconds'][row['variant']]:.1f}",
        )
    ratios = Table(
        title=f"tokens/s over ref, the faster vllm-plain, paired per round (goal: {info['goal']}; "
        f"compiled vLLM: {info['vllm_compiled_error'] or 'ran'})"
    )
    for column in ("batch", "ref", "tlt-adaptive", "range", "vllm-eagle", "range", "goal"):
        ratios.add_column(column, justify="right", no_wrap=True)
    for b, ratio in result["tlt_vs_vllm_plain"].items():
        eagle = result["vllm_eagle_vs_plain"][b]
        ratios.add_row(
            b,
            result["vllm_plain_reference"][b].removeprefix("vllm-plain-"),
            f"{ratio:.2f}x",
            "{:.2f}-{:.2f}".format(*result["tlt_vs_vllm_plain_range"][b]),
            f"{eagle:.2f}x",
            "{:.2f}-{:.2f}".format(*result["vllm_eagle_vs_plain_range"][b]),
            "yes" if result["goal_met"][b] else "no",
        )
    return [table, ratios]


def _engine_tables(result: dict) -> list:
    from rich.table import Table

    tables = []
    if "rows" in result:
        cfg = result["config"]
        table = Table(
            title=f"engine tokens/s ({cfg['params'] / 1e6:.1f}M params, prompt {cfg['prompt_len']}, "
            f"{cfg['new_tokens']} new tokens, median of {cfg['repeats']})"
        )
        for column in ("dtype", "batch", "hf-generate tok/s", "tlt tok/s", "tlt / hf", "range", "by CPU time"):
            table.add_column(column, justify="right")
        rows = {(r["engine"], r["dtype"], r["batch"]): r["tokens_per_s"] for r in result["rows"]}
        for ratio in result["ratios"]:
            key = (ratio["dtype"], ratio["batch"])
            table.add_row(
                ratio["dtype"],
                str(ratio["batch"]),
                f"{rows[('hf-generate', *key)]:.1f}",
                f"{rows[('tlt', *key)]:.1f}",
                f"{ratio['tlt_over_hf']:.2f}x",
                "{:.2f}-{:.2f}".format(*ratio["tlt_over_hf_range"]),
                f"{ratio['tlt_over_hf_cpu']:.2f}x",
            )
        tables.append(table)
    if "sd" in result:
        sd = result["sd"]
        table = Table(
            title=f"speculative decoding ({sd['policy']['params'] / 1e6:.2f}M-param warm-started policy, "
            f"{sd['config']['dtype']}, drafter top-1 {sd['drafter']['train_top1_agreement']:.2f}, "
            f"median of {sd['config']['repeats']})"
        )
        for column in ("variant", "batch", "T", "accept len", "tok/s", "vs plain", "range"):
            table.add_column(column, justify="right")
        for row, ratio in zip(sd["rows"], sd["ratios"]):
            low, high = ratio["over_plain_range"]
            table.add_row(
                row["variant"],
                str(row["batch"]),
                f"{row['temperature']:g}",
                f"{row['accept_length']:.2f}",
                f"{row['tokens_per_s']:.0f}",
                f"{ratio['over_plain']:.2f}x",
                f"{low:.2f}-{high:.2f}",
            )
        tables.append(table)
        if "history_vs_ngram_accept" in result:
            table = Table(
                title=f"history drafts at T={max(sd['config']['temperatures']):g} (GRPO groups of "
                f"{sd['config']['group_size']})"
            )
            for column in ("batch", "history / ngram accept", "mixed / best single tok/s"):
                table.add_column(column, justify="right")
            for b, ratio in result["history_vs_ngram_accept"].items():
                table.add_row(b, f"{ratio:.2f}x", f"{result['mixed_vs_best_single'][b]:.2f}x")
            tables.append(table)
        if result.get("block_vs_best_chain"):
            table = Table(title=f"block drafts (one drafter forward) at T={max(sd['config']['temperatures']):g}")
            for column in ("batch", "best block / best chain tok/s"):
                table.add_column(column, justify="right")
            for b, ratio in result["block_vs_best_chain"].items():
                table.add_row(b, f"{ratio:.2f}x")
            tables.append(table)
        costs = result["costs"]
        table = Table(title=f"costs after {costs['context']} cached tokens (ms, {costs['estimate']})")
        for column in ("batch", "width (tokens/row)", "target forward ms", "vs 1 token"):
            table.add_column(column, justify="right")
        for point in costs["verify"]:
            table.add_row(
                str(point["batch"]), str(point["width"]), f"{point['seconds'] * 1e3:.2f}", f"{point['ratio']:.2f}x"
            )
        for point in costs["drafter_step"]:
            table.add_row(str(point["batch"]), "drafter step", f"{point['seconds'] * 1e3:.2f}", "")
        for point in costs.get("block_step", []):
            table.add_row(str(point["batch"]), f"block of {point['block']}", f"{point['seconds'] * 1e3:.2f}", "")
        tables.append(table)
    if "vllm" in result:
        tables.extend(_vllm_tables(result))
    return tables


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

    from tlt.bench.run import DEFAULT_WORKLOAD
    from tlt.bench.update_pass import run_update_bench

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
    "engine": ("tokens/s of the rollout engine vs transformers generate", _engine_arguments, _engine_run),
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
