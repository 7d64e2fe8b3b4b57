"""`tlt generate --model DIR --prompts FILE`: complete prompts with the rollout engine.

Prompts: a .jsonl file with a "prompt" field per line, or a .txt file with one prompt per line.
Results: one JSON object per prompt (to --out, else to stdout) in prompt order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="folder with a Qwen2 / Qwen3 / Llama causal LM and its tokenizer"
    )
    parser.add_argument(
        "--prompts", required=True, type=Path, help='.jsonl (a "prompt" field per line) or .txt (one per line)'
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept, in (0, 1] (default 1.0)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens per completion (default 256)")
    parser.add_argument("--batch-size", type=int, default=32, help="most rows decoded together (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed + i (default 0)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16, float16, float32 or float64 (default bfloat16)")
    parser.add_argument("--out", type=Path, default=None, help="write results here as .jsonl (default: stdout)")


def read_prompts(path: Path) -> list[str]:
    """Prompts from a .jsonl ("prompt" field) or .txt (one per non-empty line) file."""
    if not path.is_file():
        raise FileNotFoundError(f"--prompts: no such file {str(path)!r}")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".txt":
        return lines
    if path.suffix != ".jsonl":
        raise ValueError(f"--prompts: expected a .jsonl or .txt file, got {path.name!r}")
    prompts = []
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ValueError(f'--prompts: line {number} of {path.name} has no string "prompt" field')
        prompts.append(record["prompt"])
    return prompts


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tlt.models.loading import load_policy
    from tlt.rollout.engine import Engine
    from tlt.rollout.types import Request, SamplingParams, StepMetrics

    console = Console(stderr=True)
    try:
        prompts = read_prompts(args.prompts)
        model, tokenizer = load_policy(args.model, args.dtype)
        stop = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
        requests = [
            Request(
                str(i),
                tokenizer(text).input_ids,
                SamplingParams(args.temperature, args.top_p, args.max_new_tokens, stop, args.seed + i),
            )
            for i, text in enumerate(prompts)
        ]
        longest = max(len(r.prompt_ids) for r in requests)
        context = min(model.config.max_position_embeddings, longest + args.max_new_tokens)
        engine = Engine(model, max_batch_size=args.batch_size, max_context=max(context, 2), return_hidden=False)
        with Progress(
            TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("generate", total=len(requests))

            def on_step(metrics: StepMetrics) -> None:
                progress.advance(task, metrics.finished)

            completions = engine.generate(requests, on_step=on_step)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    out = args.out.open("w") if args.out else sys.stdout
    try:
        for text, completion in zip(prompts, completions):
            record = {
                "request_id": completion.request_id,
                "prompt": text,
                "completion": tokenizer.decode(completion.token_ids, skip_special_tokens=True),
                "token_ids": completion.token_ids,
                "finish_reason": completion.finish_reason,
                "logprob": float(completion.logprobs.sum()),
            }
            out.write(json.dumps(record) + "\n")
    finally:
        if args.out:
            out.close()
    console.print(f"{len(completions)} completions, {engine.tokens_processed} tokens processed by the target")
    return 0
