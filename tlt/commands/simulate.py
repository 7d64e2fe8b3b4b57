"""`tlt simulate`: predict vanilla, static-drafter and TLT step times on a GPU cluster from a
response-length trace and a hardware profile (docs/simulate.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        help="a `tlt train` output folder or metrics.jsonl, a JSONL of lengths per step, "
        "or lognormal:median=M,sigma=S,n=N[,max=C] / pareto:min=M,alpha=A,n=N[,max=C]",
    )
    parser.add_argument(
        "--hardware",
        default="h100",
        help="h100, h200, h20, a100, a profile YAML or a `tlt bench engine --json` file (default h100)",
    )
    parser.add_argument(
        "--model",
        default="qwen2.5-7b",
        help="model shape of a roofline profile: qwen2.5-7b, "
        "qwen2.5-32b, llama-3.3-70b or a YAML file (default qwen2.5-7b)",
    )
    parser.add_argument("--run", type=Path, default=None, help="run.yaml: roles, speculative and drafter settings")
    parser.add_argument(
        "--bench-variant",
        default=None,
        help="instead of --run: this variant of the bench workload (`tlt bench run`'s runs, e.g. vanilla or tlt)",
    )
    parser.add_argument(
        "--workload", type=Path, default=None, help="workload of --bench-variant (default bench/workload.yaml)"
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="colocated cluster of this many GPUs: GPUs / tp "
        "rollout engines, the update on all (default: the run's roles)",
    )
    parser.add_argument(
        "--tp", type=int, default=None, help="GPUs per rollout engine (default: the run's rollout GPUs, at least 1)"
    )
    parser.add_argument("--steps", type=int, default=10, help="RL steps simulated (default 10)")
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=128,
        help="prompt tokens per request (default 128; the "
        "built-in countdown task's prompts are 6-7 tokens: give --prompt-len 6 for its runs)",
    )
    parser.add_argument(
        "--reward-seconds",
        type=float,
        default=0.0,
        help="reward verification per response, on the run's verifier pods (default 0)",
    )
    parser.add_argument(
        "--decision-tokens", type=int, default=64, help="tokens per row between two engine decisions (default 64)"
    )
    parser.add_argument("--variants", default="vanilla,static,tlt", help="comma-separated (default all three)")
    parser.add_argument(
        "--accept",
        default="",
        help="accept curve, e.g. alpha0=0.5,alpha_max=0.8,tau=600,ngram=0.3 (tau in drafter-training GPU-seconds)",
    )
    parser.add_argument(
        "--calibrate-run",
        type=Path,
        default=None,
        help="a `tlt train` output: its update seconds "
        "(fixed + per padded token) set the update cost of a bench-JSON profile",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of parametric traces and bandits")
    parser.add_argument("--timeline-step", type=int, default=None, help="step drawn in the PNG (default the last)")
    parser.add_argument("--png", type=Path, default=Path("simulate.png"), help="timeline PNG (default simulate.png)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="run the validations instead (docs/simulate.md); "
        "with --hardware BENCH.json and --calibrate-run DIR --run RUN.yaml for the local one",
    )


def _curve(text: str) -> Any:
    from tlt.sim.accept import AcceptCurve

    fields = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in AcceptCurve.__dataclass_fields__:
            raise ValueError(f"--accept keys are {sorted(AcceptCurve.__dataclass_fields__)}, got {key!r}")
        fields[key] = float(value)
    return AcceptCurve(**fields)


def _cluster(args: argparse.Namespace, spec: Any) -> Any:
    from tlt.sim.step import ClusterConfig

    base = ClusterConfig.from_run(
        spec, prompt_len=args.prompt_len, reward_seconds=args.reward_seconds, decision_tokens=args.decision_tokens
    )
    tp = args.tp or base.gpus_per_replica
    if args.gpus is None:
        return ClusterConfig(**{**base.__dict__, "gpus_per_replica": tp})
    if args.gpus < tp or args.gpus % tp:
        raise ValueError(f"--gpus must be a positive multiple of the tp width {tp}, got {args.gpus}")
    return ClusterConfig(
        **{**base.__dict__, "replicas": args.gpus // tp, "gpus_per_replica": tp, "update_gpus": args.gpus}
    )


def _spec(args: argparse.Namespace) -> Any:
    from tlt.spec.manifest_io import load_run
    from tlt.spec.run import RunSpec

    if args.bench_variant is not None:
        if args.run is not None:
            raise ValueError("give --run or --bench-variant, not both")
        from tlt.bench.run import variant_run
        from tlt.bench.workload import DEFAULT_WORKLOAD, load_workload

        workload = load_workload(args.workload or DEFAULT_WORKLOAD)
        if args.bench_variant not in workload.variants:
            raise ValueError(f"--bench-variant must be one of {sorted(workload.variants)}, got {args.bench_variant!r}")
        return variant_run(workload, args.bench_variant, 0).spec
    return load_run(args.run).spec if args.run is not None else RunSpec()


def _history(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl" if folder.is_dir() else folder
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _validate(args: argparse.Namespace, spec: Any) -> dict[str, Any]:
    from tlt.sim.accuracy_checks import h20_check, paper_sweep
    from tlt.sim.calibrate import compare_run

    out: dict[str, Any] = {"local_error": None}
    if args.calibrate_run is not None and args.hardware.endswith(".json"):
        local = compare_run(
            _history(args.calibrate_run),
            json.loads(Path(args.hardware).read_text()),
            spec,
            _cluster(args, spec),
            _curve(args.accept),
        )
        out.update(local_error=local["error"], local=local)
    out["h20"] = h20_check("h20")
    out["h100_contrast"] = h20_check("h100")
    out["h20_sd_off"] = out["h20"]["sd_off"]
    out["paper"] = paper_sweep()
    return out


def _simulate(args: argparse.Namespace, spec: Any, console: Any) -> dict[str, Any]:
    from rich.progress import Progress

    from tlt.sim.calibrate import fit_update
    from tlt.sim.profiles import load_cost_model
    from tlt.sim.simulator import build_variants, simulate
    from tlt.sim.step import update_tokens
    from tlt.sim.timeline import plot_timelines
    from tlt.sim.trace import load_trace

    if not args.trace:
        raise ValueError("--trace is required (or --validate)")
    cluster = _cluster(args, spec)
    trace = load_trace(args.trace, args.steps, args.seed)
    measured_update = None
    if args.calibrate_run is not None:
        history = [m for m in _history(args.calibrate_run) if "response_lengths" in m]
        if not history:
            raise ValueError(f"{args.calibrate_run} has no steps with response_lengths (the Ray runtime records them)")
        layout = (cluster.prompt_len, cluster.micro_batch_size, cluster.update_layout)
        fixed, per_token = fit_update(
            [update_tokens(m["response_lengths"], *layout) for m in history],
            [float(m["update_seconds"]) for m in history],
        )
        # the run's seconds per token (on its one CPU device; the cost model divides by the update GPUs),
        # the fixed part as the per-step sync
        measured_update = (per_token, fixed)
    cost = load_cost_model(args.hardware, model=args.model, tp=cluster.gpus_per_replica, update_cost=measured_update)
    variants = build_variants(spec.speculative, tuple(args.variants.split(",")), spec.drafter.training)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=len(trace) * len(variants))
        result = simulate(
            trace,
            variants,
            cost,
            cluster,
            spec.speculative,
            _curve(args.accept),
            seed=args.seed,
            on_step=lambda name, step: progress.update(task, advance=1, description=f"{name} step {step}"),
        )
    shown = (args.timeline_step or len(trace)) - 1
    if not 0 <= shown < len(trace):
        raise ValueError(f"--timeline-step must be in [1, {len(trace)}], got {args.timeline_step}")
    plot_timelines(
        {name: steps[shown].timelines for name, steps in result.steps.items()},
        args.png,
        f"step {shown + 1}: {cost.name}, {cluster.replicas} engines x {cluster.gpus_per_replica} GPUs",
    )
    return {
        "hardware": cost.name,
        "cluster": cluster.__dict__,
        "trace": args.trace,
        "summary": result.summary(),
        "steps": {name: [s.as_dict() for s in steps] for name, steps in result.steps.items()},
        "timeline_png": str(args.png),
    }


def _table(summary: dict[str, dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="simulated RL step (mean over steps)")
    for column in ("variant", "step s", "rollout share", "idle GPU-s", "harvested GPU-s", "accept rate", "speedup"):
        table.add_column(column, justify="right")
    for name, row in summary.items():
        table.add_row(
            name,
            f"{row['step_seconds']:.2f}",
            f"{row['rollout_share']:.0%}",
            f"{row['idle_gpu_seconds_per_step']:.1f}",
            f"{row['harvested_gpu_seconds_per_step']:.1f}",
            f"{row['final_alpha']:.2f}",
            f"{row['speedup']:.2f}x" if "speedup" in row else "-",
        )
    return table


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        spec = _spec(args)
        out = _validate(args, spec) if args.validate else _simulate(args, spec, console)
    except ValueError as err:  # SpecError included
        console.print(f"[red]error:[/red] {err}")
        return 2
    if args.validate:
        console.print_json(data=out)
    else:
        console.print(_table(out["summary"]))
        console.print(f"wrote {out['timeline_png']}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0
