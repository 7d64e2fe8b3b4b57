"""`tlt bench engine`: the engine's parts side by side (HF vs this engine, speculative decoding and its drafts,
compiled vs eager, vLLM), with its tables."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from tlt.commands.bench_args import batches as _batches
from tlt.commands.bench_args import write_json as _write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def _config(cls: Any, args: argparse.Namespace, repeats: int) -> Any:
    """A part's config: its `quick()` one with --quick (1 repeat by default), else the full one (`repeats`)."""
    return cls.quick(repeats=args.repeats or 1) if args.quick else cls(repeats=args.repeats or repeats)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from tlt.bench.engine_compiled import CompiledBenchConfig, run_compiled_bench
    from tlt.bench.engine_sd import SdBenchConfig, run_sd_bench
    from tlt.bench.engine_vs_generate import EngineBenchConfig, run_engine_bench

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

            v_cfg = _config(VllmBenchConfig, args, 3)
            v_over = {"batches": args.batches, "workload": str(args.workload) if args.workload else None}
            v_cfg = replace(v_cfg, **{k: v for k, v in v_over.items() if v is not None})
            result.update(run_vllm_bench(v_cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "hf"):
            cfg = _config(EngineBenchConfig, args, 3)
            result.update(run_engine_bench(cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "sd"):
            sd_cfg = _config(SdBenchConfig, args, 3)
            overrides = {
                "warmstart": args.warmstart,
                "batches": args.batches,
                "threads": args.threads,
                "workload": str(args.workload) if args.workload is not None else None,
            }
            sd_cfg = replace(sd_cfg, **{k: v for k, v in overrides.items() if v is not None})
            result.update(run_sd_bench(sd_cfg, on_row=lambda text: status.update(text)))
        if args.part in ("all", "compiled"):
            c_cfg = _config(CompiledBenchConfig, args, 5)
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
            f"{info['start_seconds'].get(row['variant'], info['start_seconds'].get('vllm-table', 0.0)):.1f}",
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
    tables = [table, ratios]
    if "vllm_dynamic_vs_best" in result:
        dynamic = Table(title=f"vllm-dynamic over the better of vLLM's best fixed K and ref ({info['dynamic_goal']})")
        for column in ("batch", "best fixed", "over", "vllm-dynamic", "range", "goal"):
            dynamic.add_column(column, justify="right", no_wrap=True)
        for b, cell in result["vllm_dynamic_vs_best"].items():
            dynamic.add_row(
                b,
                str(result["vllm_best_fixed"][b]),
                cell["over"],
                f"{cell['ratio']:.2f}x",
                "{:.2f}-{:.2f}".format(*result["vllm_dynamic_vs_best_range"][b]),
                "yes" if result["dynamic_goal_met"][b] else "no",
            )
        tables.append(dynamic)
    if "feature_forward" in info:
        cost = info["feature_forward"]
        extra = Table(title="the drafter features' policy forward a vLLM worker adds (vLLM keeps its hidden states)")
        for column in ("batch", "seconds", "over generate", "range"):
            extra.add_column(column, justify="right", no_wrap=True)
        low, high = cost["over_generate_range"]
        extra.add_row(
            str(cost["batch"]),
            f"{statistics.median(cost['seconds']):.2f}",
            f"{cost['over_generate']:.2f}x",
            f"{low:.2f}-{high:.2f}",
        )
        tables.append(extra)
    return tables


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
            wide = result.get("wide_vs_final_norm_block") or {}
            for column in ("batch", "best block / best chain tok/s", "reading layers too / final-norm only"):
                table.add_column(column, justify="right")
            for b, ratio in result["block_vs_best_chain"].items():
                table.add_row(b, f"{ratio:.2f}x", f"{wide[b]:.2f}x" if b in wide else "")
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
        for part, label in (("block_step", "block of {}"), ("block_step_wide", "block of {}, with layers")):
            for point in costs.get(part, []):
                table.add_row(str(point["batch"]), label.format(point["block"]), f"{point['seconds'] * 1e3:.2f}", "")
        tables.append(table)
    if "vllm" in result:
        tables.extend(_vllm_tables(result))
    return tables
