"""`tlt bench drafter`: does online training make the warm drafter better or worse on unseen prompts?

The question behind TLT's adaptive drafter on a policy that barely moves: the online trainer sees
only the current step's rollouts. With GRPO-shaped steps (a few prompts x a group of samples) it may
fit those prompts and lose accuracy on the next step's; with as many samples spread over distinct
prompts it should not. This bench holds the policy fixed (isolating the drafter's own fitting from
policy drift) and trains from the same warm drafter, through the runtime's own pieces
(`OnlineBuffer`, `packed_gradients`, `DrafterHub`'s AdamW), on each step shape and learning rate,
`updates_per_step` updates per step, and records the drafter's top-1 agreement with the policy on
held-out responses (other prompts, sampled at T=1) after chosen steps.

No timing is measured: agreement is deterministic for given seeds. Rollouts are generated once per
step shape and reused by every learning rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from tlt.bench.engine_sd import WARMSTARTS
from tlt.bench.workload import DRAFTER_WARMSTART, drafter_warm_start
from tlt.drafter.buffer import OnlineBuffer, pack
from tlt.drafter.evaluate import make_requests
from tlt.drafter.hub import DrafterHub
from tlt.drafter.trainer import packed_agreement, packed_gradients
from tlt.models.drafter import EagleDrafter, drafter_config_from_target, load_drafter
from tlt.rollout.engine import Engine
from tlt.rollout.types import Completion
from tlt.tasks.countdown import CountdownTask, generate
from tlt.tasks.warmstart import load_metadata, load_policy, warm_start


@dataclass(frozen=True)
class OnlineDrafterBenchConfig:
    """shapes: name -> (prompts per step, samples per prompt), equal totals keep the data size fixed."""

    warmstart: str = "deep"
    drafter_warmstart: dict[str, Any] = field(default_factory=lambda: dict(DRAFTER_WARMSTART))
    shapes: dict[str, tuple[int, int]] = field(default_factory=lambda: {"grpo-4x8": (4, 8), "distinct-32x1": (32, 1)})
    learning_rates: tuple[float, ...] = (1e-3, 3e-4)
    steps: int = 16
    updates_per_step: int = 25
    report_after: tuple[int, ...] = (1, 2, 4, 8, 16)  # steps after which agreement is measured
    batch_tokens: int = 512
    buffer_steps: int = 2
    heldout_prompts: int = 64
    max_new_tokens: int = 256
    threads: int = 1
    seed: int = 0

    @classmethod
    def quick(cls) -> OnlineDrafterBenchConfig:
        return cls(
            warmstart="reduced",
            drafter_warmstart={**DRAFTER_WARMSTART, "prompts": 16, "steps": 10, "maxNewTokens": 32},
            shapes={"grpo-2x2": (2, 2), "distinct-4x1": (4, 1)},
            learning_rates=(1e-3,),
            steps=2,
            updates_per_step=2,
            report_after=(1, 2),
            batch_tokens=64,
            heldout_prompts=4,
            max_new_tokens=32,
        )


def _rollouts(
    policy: Any, tokenizer: Any, task: CountdownTask, prompts: int, samples: int, seed: int, max_new_tokens: int
) -> list[Completion]:
    """`prompts` problems x `samples` T=1 responses each, with the policy's hidden states."""
    problems = generate(prompts, seed, task)
    requests = []
    for member in range(samples):
        for index, request in enumerate(
            make_requests(
                tokenizer, problems, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed * 1000 + member
            )
        ):
            requests.append(replace(request, request_id=f"{seed}-{member}-{index}"))
    longest = max(len(r.prompt_ids) for r in requests) + max_new_tokens + 1
    engine = Engine(
        policy,
        max_batch_size=len(requests),
        max_context=min(longest, policy.config.max_position_embeddings),
        return_hidden=True,
    )
    return engine.generate(requests)


def _agreement(drafter: EagleDrafter, hub: DrafterHub, packs: list) -> float:
    drafter.load_state_dict(hub.params())
    agree, total = packed_agreement(drafter, packs)
    return agree / max(total, 1)


def train_curve(
    policy: Any,
    warm: dict[str, torch.Tensor],
    steps_data: list[list[Completion]],
    heldout: list,
    lr: float,
    cfg: OnlineDrafterBenchConfig,
) -> list[dict[str, Any]]:
    """Held-out agreement of a hub started from `warm` after each step in `cfg.report_after`, training
    `cfg.updates_per_step` updates per step on a buffer fed with that step's completions."""
    hub = DrafterHub(drafter_config_from_target(policy.config), lr, seed=cfg.seed)
    hub.load_params(warm)
    drafter = EagleDrafter(drafter_config_from_target(policy.config)).float()
    drafter.bind_policy(policy)
    buffer = OnlineBuffer(cfg.buffer_steps, cfg.batch_tokens, seed=cfg.seed)
    curve = [{"step": 0, "updates": 0, "agreement": _agreement(drafter, hub, heldout)}]
    updates = 0
    version, params = hub.pull()
    for step, completions in enumerate(steps_data, start=1):
        buffer.add(completions, step)
        done, epoch = 0, 0
        while done < cfg.updates_per_step:
            for packed in buffer.batches(epoch):
                drafter.load_state_dict(params)
                drafter.train()
                grads, loss = packed_gradients(drafter, packed)
                drafter.eval()
                version, params = hub.push("bench", grads, version, packed.num_trained, loss)
                done += 1
                if done == cfg.updates_per_step:
                    break
            epoch += 1
        updates += done
        if step in cfg.report_after:
            curve.append({"step": step, "updates": updates, "agreement": _agreement(drafter, hub, heldout)})
    return curve


def run_online_drafter_bench(
    cfg: OnlineDrafterBenchConfig, on_row: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Every (step shape, learning rate) curve from one warm drafter; see the module docstring."""
    torch.set_num_threads(cfg.threads)
    warm_cfg = WARMSTARTS[cfg.warmstart]()
    folder = warm_start(warm_cfg)
    policy, tokenizer = load_policy(folder)
    policy = policy.float().eval()
    drafter_folder, drafter_info = drafter_warm_start(warm_cfg, cfg.drafter_warmstart)
    warm = {k: v.float().clone() for k, v in load_drafter(drafter_folder, policy).state_dict().items()}
    task = CountdownTask(**load_metadata(folder)["config"]["task"])
    on_row("held-out responses")
    held = OnlineBuffer(1, cfg.batch_tokens)
    held.add(_rollouts(policy, tokenizer, task, cfg.heldout_prompts, 1, cfg.seed + 900_001, cfg.max_new_tokens), 1)
    heldout = pack(held.samples, cfg.batch_tokens)
    rows = []
    for shape, (prompts, samples) in cfg.shapes.items():
        on_row(f"rollouts: {shape}")
        steps_data = [
            _rollouts(policy, tokenizer, task, prompts, samples, cfg.seed + 1000 * (step + 1) + 17, cfg.max_new_tokens)
            for step in range(cfg.steps)
        ]
        for lr in cfg.learning_rates:
            on_row(f"training: {shape}, lr {lr:g}")
            curve = train_curve(policy, warm, steps_data, heldout, lr, cfg)
            rows.append(
                {
                    "shape": shape,
                    "prompts_per_step": prompts,
                    "samples_per_prompt": samples,
                    "learning_rate": lr,
                    "curve": curve,
                    "final_over_warm": curve[-1]["agreement"] / max(curve[0]["agreement"], 1e-9),
                    "min_over_warm": min(c["agreement"] for c in curve) / max(curve[0]["agreement"], 1e-9),
                }
            )
    return {
        "online_drafter": {
            "config": asdict(cfg),
            "policy": str(folder),
            "drafter": str(drafter_folder),
            "drafter_info": drafter_info,
            "heldout_positions": sum(p.num_trained for p in heldout),
            "rows": rows,
        }
    }
