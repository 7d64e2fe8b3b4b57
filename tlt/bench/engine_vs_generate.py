"""`tlt bench engine`: this engine vs `transformers` generate (the SD rows: `tlt/bench/engine_sd.py`).

Engine vs generate: same random Qwen2-shaped model, prompts, sampling settings and token counts for
both; no early stop (every row generates exactly new_tokens), batches 1, 4 and 32, bf16 and fp32.
SD: the built-in task's warm-started policy, an EAGLE drafter trained on its own samples (cached
next to it), plain vs chain / tree / n-gram drafting at running batch 1, 4 and 32, greedy and T=1;
plus the costs the adaptive engine calibrates from (a target forward of 1 vs k tokens per row, one
drafter step). Repeats are interleaved (every variant once per round, so load hits all alike);
medians and ranges are reported, and the engine rows also give CPU-time ratios.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from transformers import GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from tlt.rollout.engine import Engine
from tlt.rollout.types import Request, SamplingParams

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class EngineBenchConfig:
    """What to run. The default model is ~110M parameters (DESIGN.md section 3); quick is tiny."""

    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int = 2
    intermediate_size: int = 2560
    vocab_size: int = 32000
    batches: tuple[int, ...] = (1, 4, 32)
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    prompt_len: int = 64
    new_tokens: int = 64
    repeats: int = 3
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    threads: int = 2

    @classmethod
    def quick(cls, repeats: int = 1) -> EngineBenchConfig:
        return cls(
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=128,
            vocab_size=512,
            prompt_len=16,
            new_tokens=16,
            repeats=repeats,
        )


@dataclass
class Row:
    """One variant's timed rounds: wall seconds, and this process's CPU seconds (less load-sensitive)."""

    engine: str  # "hf-generate" or "tlt"
    dtype: str
    batch: int
    tokens: int
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / statistics.median(self.seconds)

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_range": [self.tokens / max(self.seconds), self.tokens / min(self.seconds)],
            "tokens_per_cpu_s": self.tokens / min(self.cpu_seconds),
        }


def build_model(cfg: EngineBenchConfig) -> PreTrainedModel:
    config = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        tie_word_embeddings=True,
        max_position_embeddings=max(512, cfg.prompt_len + cfg.new_tokens),
        pad_token_id=0,
        eos_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    return Qwen2ForCausalLM(config).eval()


def hf_runner(model: PreTrainedModel, cfg: EngineBenchConfig, prompts: torch.Tensor) -> Callable[[], None]:
    gen = GenerationConfig(
        do_sample=cfg.temperature > 0,
        temperature=cfg.temperature or None,
        top_p=cfg.top_p,
        top_k=0,
        max_new_tokens=cfg.new_tokens,
        min_new_tokens=cfg.new_tokens,
        eos_token_id=None,
        pad_token_id=0,
    )
    mask = torch.ones_like(prompts)

    def go() -> None:
        torch.manual_seed(cfg.seed)
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=mask, generation_config=gen)
        if out.shape[1] != prompts.shape[1] + cfg.new_tokens:
            raise RuntimeError(f"hf generate made {out.shape[1] - prompts.shape[1]} tokens, expected {cfg.new_tokens}")

    return go


def tlt_runner(engine: Engine, cfg: EngineBenchConfig, prompts: torch.Tensor) -> Callable[[], None]:
    requests = [
        Request(str(i), p.tolist(), SamplingParams(cfg.temperature, cfg.top_p, cfg.new_tokens, (), cfg.seed + i))
        for i, p in enumerate(prompts)
    ]

    def go() -> None:
        out = engine.generate(requests)
        if any(len(c.token_ids) != cfg.new_tokens for c in out):
            raise RuntimeError(f"engine made a completion of other than {cfg.new_tokens} tokens")

    return go


def run_engine_bench(cfg: EngineBenchConfig, on_row: Callable[[str], None] | None = None) -> dict:
    """Measure every (engine, dtype, batch) variant; returns {"config", "rows", "ratios"} as plain data."""
    torch.set_num_threads(cfg.threads)
    base = build_model(cfg)
    params = sum(p.numel() for p in base.parameters())
    g = torch.Generator().manual_seed(cfg.seed)
    variants: list[tuple[Row, Callable[[], None]]] = []
    for dtype in cfg.dtypes:
        model = copy.deepcopy(base).to(DTYPES[dtype])
        engine = Engine(model, max_batch_size=max(cfg.batches), max_context=cfg.prompt_len + cfg.new_tokens)
        for batch in cfg.batches:
            prompts = torch.randint(1, cfg.vocab_size, (batch, cfg.prompt_len), generator=g)
            tokens = batch * cfg.new_tokens
            variants.append((Row("hf-generate", dtype, batch, tokens), hf_runner(model, cfg, prompts)))
            variants.append((Row("tlt", dtype, batch, tokens), tlt_runner(engine, cfg, prompts)))
    for _, go in variants:  # warm-up round, not timed
        go()
    for round_ in range(cfg.repeats):
        for row, go in variants:
            t0, c0 = time.perf_counter(), time.process_time()
            go()
            row.seconds.append(time.perf_counter() - t0)
            row.cpu_seconds.append(time.process_time() - c0)
            if on_row is not None:
                on_row(f"round {round_ + 1}/{cfg.repeats}: {row.engine} {row.dtype} batch {row.batch}")
    rows = [row for row, _ in variants]
    by_key = {(r.engine, r.dtype, r.batch): r for r in rows}
    ratios = []
    for dtype in cfg.dtypes:
        for batch in cfg.batches:
            ours, hf = by_key["tlt", dtype, batch], by_key["hf-generate", dtype, batch]
            per_round = [h / t for t, h in zip(ours.seconds, hf.seconds)]  # interleaved: same load
            ratios.append(
                {
                    "dtype": dtype,
                    "batch": batch,
                    "tlt_over_hf": ours.tokens_per_s / hf.tokens_per_s,
                    "tlt_over_hf_range": [min(per_round), max(per_round)],
                    "tlt_over_hf_cpu": min(hf.cpu_seconds) / min(ours.cpu_seconds),
                }
            )
    return {
        "config": {**asdict(cfg), "params": params, "torch": torch.__version__, "threads": torch.get_num_threads()},
        "rows": [r.as_dict() for r in rows],
        "ratios": ratios,
    }


# --- speculative decoding rows: the built-in task's warm-started policy and a drafter trained on its outputs ---
