"""One process of `tlt bench policy-group`: builds the shape's policy (random weights, float32, seeded) and one
step's batch of random tokens, runs one GRPO update alone (world 1) or as its rank of a group (FSDP2 over
gloo on 127.0.0.1), and writes what it measured as JSON. On `cuda` (world 1) the update runs in bfloat16 over
float32 master weights, after one untimed update (CUDA's start), and its peak GPU memory is reported too:

    python -m tlt.bench.policy_group_rank SHAPE WORLD RANK PORT THREADS SEQS PROMPT RESPONSE RESHARD OUT [DEVICE]
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from tlt.rl.update import RolloutBatch, policy_update
from tlt.spec.run import AlgorithmSpec

# Qwen2.5-0.5B's architecture (its config.json); `tiny` checks the bench in seconds
SHAPES = {
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    ),
}


def build(shape: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen2Config(**SHAPES[shape]), dtype=torch.float32).eval()


def step_batch(vocab: int, seqs: int, prompt: int, response: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    return RolloutBatch(
        [torch.randint(1, vocab, (prompt,), generator=g).tolist() for _ in range(seqs)],
        [torch.randint(1, vocab, (response,), generator=g).tolist() for _ in range(seqs)],
        torch.zeros(seqs, response),
        torch.randn(seqs, generator=g),
    )


def main(
    shape: str,
    world: int,
    rank: int,
    port: int,
    threads: int,
    seqs: int,
    prompt: int,
    response: int,
    reshard: int,
    out: Path,
    device: str = "cpu",
):
    from tlt.workers.policy_group import init_group, rank_update, shard_policy, state_bytes

    torch.set_num_threads(threads)
    algo = AlgorithmSpec(micro_batch_size=1)
    cuda = device == "cuda"
    policy = build(shape).to(device)
    parameters = sum(p.numel() for p in policy.parameters())
    if world > 1:
        init_group(rank, world, "127.0.0.1", port)
        policy = shard_policy(policy, "fsdp", reshard_after_forward=bool(reshard))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)

    def update() -> float:
        batch = step_batch(SHAPES[shape]["vocab_size"], seqs, prompt, response)
        # on a GPU as a run trains there: float32 master weights, the forward and backward in bfloat16
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        started = time.perf_counter()
        with autocast:
            if world > 1:
                rank_update(policy, optimizer, batch, algo, pad_id=0)
            else:
                policy_update(policy, optimizer, batch, algo, old_from_first_pass=True)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    if cuda:  # CUDA's first update pays its kernels' and libraries' start
        update()
    seconds = update()
    result = {
        "rank": rank,
        "device": device,
        "seconds": seconds,
        "tokens": seqs * (prompt + response),
        "state_bytes": state_bytes(policy, optimizer),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "parameters": parameters,
    }
    if cuda:
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    if world > 1:
        torch.distributed.destroy_process_group()
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:9]), Path(a[9]), *a[10:11])
