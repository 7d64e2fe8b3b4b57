"""Export a drafter checkpoint as a Hugging Face EAGLE folder that this engine and vLLM both load.

The folder holds `config.json` (a one-layer `LlamaForCausalLM` config with the target's widths,
heads, RoPE and norm epsilon) and `model.safetensors` with exactly the tensors vLLM's EAGLE loader
(`EagleLlamaForCausalLM`) maps onto its draft model:

    fc.weight                                   [H, 2H]   fusion of cat(embed(x[t+1]), f[t]), no bias
    layers.0.self_attn.{q,k,v,o}_proj.weight    Llama-shaped attention, no biases
    layers.0.post_attention_layernorm.weight    [H]
    layers.0.mlp.{gate,up,down}_proj.weight     SwiGLU MLP

The layout is the same for every target family: for a Qwen3 target too the layer is Llama-shaped,
with no `q_norm` / `k_norm` (vLLM has no Qwen3 EAGLE-1 drafter class and runs such drafters as
`EagleLlamaForCausalLM`), and `head_dim` in config.json carries Qwen3's head width.

No `layers.0.input_layernorm` (the first EAGLE layer's input norm is the identity), no final
norm, no embedding and no LM head: the drafter reads the target's own. vLLM skips checkpoint
tensors it does not know and leaves unknown parameters at their initial values, so a misnamed
tensor would load "successfully" and draft garbage: the key set is checked strictly both when
writing and when loading back.

`config.json` also carries `rope_theta` (read by transformers 4 and vLLM builds on it) next to
transformers 5's `rope_parameters`, the weight dtype as `torch_dtype`, and a `tlt` block naming
the target shape it was exported for.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from tlt.drafter.async_ckpt import LATEST
from tlt.drafter.drafter_set import BLOCK_SNAPSHOTS, member_params
from tlt.models.block_drafter import BlockDrafter, block_config_from_target
from tlt.models.drafter import (
    CONFIG_FILE,
    SHAPE_FIELDS,
    WEIGHTS_FILE,
    BoundDrafter,
    EagleDrafter,
    drafter_config_from_target,
    load_drafter,
    save_drafter,
)
from tlt.models.eagle_layout import EAGLE_ARCHITECTURE, check_eagle_keys

log = logging.getLogger(__name__)

ExportDtype = Literal["auto", "float32", "bfloat16", "float16"]
EXPORT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SERVED_DIR = "drafter-served"  # under a run's output folder: the drafter its next step would draft with
SERVED_INFO = "served.json"  # in SERVED_DIR: {"version", "publish", "step"}
DRAFTER_SNAPSHOTS_DIR = "drafter"  # under a run's output folder: the hub's asynchronous snapshots
EAGLE_FORMAT = "eagle"


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the folder, the checkpoint it came from, tensor count, parameters, dtype."""

    path: Path
    source: Path
    tensors: int
    parameters: int
    dtype: str


def target_config(target: str | Path | PretrainedConfig | PreTrainedModel) -> PretrainedConfig:
    """The target's config from a model, a config, or a local policy folder (never the hub)."""
    if isinstance(target, PreTrainedModel):
        return target.config
    if isinstance(target, PretrainedConfig):
        return target
    folder = Path(target)
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"target policy folder {str(folder)!r} has no {CONFIG_FILE}")
    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


def resolve_checkpoint(path: str | Path) -> Path:
    """The drafter checkpoint folder `path` names, one of:

    - a `save_drafter` folder (`model.safetensors` + `config.json`): that folder;
    - a run's output folder (it holds `drafter-served/`, written when the run finished): the
      *served* drafter, the one the run's next step would draft with (under `drafter.publish:
      validated` the last one validated on fresh rollouts, under `latest` the hub's newest);
    - a snapshot root written by the asynchronous checkpointer (a run's `drafter/` folder): the
      snapshot its LATEST file names, i.e. the hub's *newest* parameters, which under `validated` may be
      a candidate that lost validation.

    FileNotFoundError names the folder and what was expected in it.
    """
    folder = Path(path)
    if (folder / WEIGHTS_FILE).is_file() and (folder / CONFIG_FILE).is_file():
        return folder
    pointer = folder / LATEST
    if pointer.is_file():
        snapshot = folder / pointer.read_text().strip()
        if (snapshot / WEIGHTS_FILE).is_file():
            served = folder.parent / SERVED_DIR
            if served.is_dir():
                log.info(
                    "%s: the hub's newest snapshot %s; the run's served drafter is %s (pass the run folder "
                    "%s to export that one)",
                    folder,
                    snapshot.name,
                    served,
                    folder.parent,
                )
            return snapshot
        raise FileNotFoundError(f"{pointer} names {snapshot.name!r}, which has no {WEIGHTS_FILE}")
    served = folder / SERVED_DIR
    if served.is_dir():
        if (served / WEIGHTS_FILE).is_file() and (served / CONFIG_FILE).is_file():
            return served
        raise FileNotFoundError(f"the served drafter folder {str(served)!r} lacks {WEIGHTS_FILE} or {CONFIG_FILE}")
    if (folder / DRAFTER_SNAPSHOTS_DIR / LATEST).is_file():
        raise FileNotFoundError(
            f"run folder {str(folder)!r} has no {SERVED_DIR}/ (written when a run finishes): the run did not finish "
            f"or predates it; pass {str(folder / DRAFTER_SNAPSHOTS_DIR)!r} to export the hub's newest snapshot"
        )
    raise FileNotFoundError(
        f"no drafter checkpoint in {str(folder)!r}: expected {WEIGHTS_FILE} + {CONFIG_FILE} "
        f"(save_drafter), a {SERVED_DIR}/ folder (a finished run's output folder: the served drafter) or a "
        f"{LATEST} file naming a snapshot (a run's {DRAFTER_SNAPSHOTS_DIR}/ folder: the hub's newest)"
    )


def write_served_drafter(
    out_dir: str | Path,
    drafter: tuple[int, dict[str, torch.Tensor]],
    target: PretrainedConfig,
    *,
    publish: str,
    step: int,
    feature_layers: tuple[int, ...] = (),
) -> Path:
    """Write `drafter` = (version, parameters) as the `save_drafter` folder `<out_dir>/drafter-served/`
    with `served.json` (version, publish mode, step); built in a temporary folder and renamed into
    place, replacing an older one, so the folder is never half written. Returns the folder. A run with
    block arms serves a `DrafterSet`: its EAGLE member (if any) is the folder's drafter, its block drafter
    the `save_drafter` folder `drafter-served/block/` (`load_block_drafter` reads it), reading the target's
    `feature_layers` (the run's `LearnedDrafters.feature_layers`)."""
    version, params = drafter
    members = member_params(params)
    models: dict[str, BoundDrafter] = {}
    if "eagle" in members:
        models["eagle"] = EagleDrafter(drafter_config_from_target(target))
    if "block" in members:
        size = members["block"]["mask"].shape[0]
        models["block"] = BlockDrafter(block_config_from_target(target, size, feature_layers=feature_layers))
    for name, model in models.items():
        model.to(next(iter(params.values())).dtype).load_state_dict(members[name], strict=True)
    out_dir = Path(out_dir)
    final = out_dir / SERVED_DIR
    staging = Path(tempfile.mkdtemp(prefix=f".{SERVED_DIR}-", dir=out_dir))
    try:
        for name, model in models.items():
            save_drafter(model, staging / BLOCK_SNAPSHOTS if name == "block" else staging)
        info = {"version": int(version), "publish": publish, "step": int(step)}
        (staging / SERVED_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if final.exists():  # a directory cannot be replaced by a rename: move the old one aside first
            aside = Path(tempfile.mkdtemp(prefix=f".{SERVED_DIR}-old-", dir=out_dir))
            os.replace(final, aside / SERVED_DIR)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("served drafter version %d (publish %s, step %d) written to %s", version, publish, step, final)
    return final


def eagle_config(drafter: EagleDrafter, target: PretrainedConfig, dtype: torch.dtype) -> dict:
    """config.json of the exported folder (see the module docstring)."""
    config = drafter.config.to_dict()
    config.update(
        architectures=[EAGLE_ARCHITECTURE],
        model_type="llama",
        num_hidden_layers=1,
        rope_theta=float(drafter.config.rope_parameters["rope_theta"]),
        torch_dtype=str(dtype).removeprefix("torch."),
        tlt={
            "format": EAGLE_FORMAT,
            "target_model_type": target.model_type,
            "target": {field: getattr(drafter.config, field) for field in (*SHAPE_FIELDS, "vocab_size")},
        },
    )
    config.pop("dtype", None)
    return config


def export_eagle(
    checkpoint: str | Path,
    target: str | Path | PretrainedConfig | PreTrainedModel,
    out: str | Path,
    *,
    dtype: ExportDtype = "auto",
) -> ExportResult:
    """Write the drafter checkpoint at `checkpoint` as an EAGLE folder at `out` (replaced if present).

    The checkpoint must fit `target` (every shape field) and hold exactly the drafter's keys;
    `dtype` converts the weights (`auto` keeps the checkpoint's). The folder is written under a
    temporary name next to `out` and renamed into place, so `out` is never half written.
    """
    if dtype not in ("auto", *EXPORT_DTYPES):
        raise ValueError(f"dtype must be one of auto, {', '.join(EXPORT_DTYPES)}; got {dtype!r}")
    source = resolve_checkpoint(checkpoint)
    config = target_config(target)
    drafter = load_drafter(source, config)
    if dtype != "auto":
        drafter.to(EXPORT_DTYPES[dtype])
    state = {name: tensor.detach().contiguous() for name, tensor in drafter.state_dict().items()}
    check_eagle_keys(set(state), f"drafter checkpoint {source}")
    weight_dtype = next(iter(state.values())).dtype

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_file(state, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        body = eagle_config(drafter, config, weight_dtype)
        (staging / CONFIG_FILE).write_text(json.dumps(body, indent=2, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result = ExportResult(
        path=out,
        source=source,
        tensors=len(state),
        parameters=sum(t.numel() for t in state.values()),
        dtype=str(weight_dtype).removeprefix("torch."),
    )
    log.info("exported drafter %s -> %s (%d tensors, %s)", source, out, result.tensors, result.dtype)
    return result


def _check_eagle_config(config: dict, config_file: Path) -> None:
    problems = []
    if config.get("architectures") != [EAGLE_ARCHITECTURE]:
        problems.append(f"architectures is {config.get('architectures')!r}, expected [{EAGLE_ARCHITECTURE!r}]")
    if config.get("model_type") != "llama":
        problems.append(f"model_type is {config.get('model_type')!r}, expected 'llama'")
    if config.get("num_hidden_layers") != 1:
        problems.append(f"num_hidden_layers is {config.get('num_hidden_layers')!r}, expected 1")
    if problems:
        raise ValueError(f"{config_file}: not an EAGLE drafter config: {'; '.join(problems)}")


def load_eagle(path: str | Path, target: PretrainedConfig | PreTrainedModel) -> EagleDrafter:
    """Load an exported EAGLE folder for `target` (bound to it when a model is given).

    Strict: the config must describe a one-layer Llama drafter, the folder must hold exactly one
    safetensors file, and its keys must be exactly the EAGLE set; a missing or an extra key is a
    ValueError naming it. Shapes are checked against the target as for any drafter checkpoint.
    """
    folder = Path(path)
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"EAGLE folder {str(folder)!r} has no {CONFIG_FILE}")
    _check_eagle_config(json.loads(config_file.read_text()), config_file)
    weight_files = sorted(p.name for p in folder.glob("*.safetensors"))
    if weight_files != [WEIGHTS_FILE]:
        raise ValueError(f"EAGLE folder {str(folder)!r} must hold exactly one {WEIGHTS_FILE}; found {weight_files}")
    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as handle:
        check_eagle_keys(set(handle.keys()), str(folder / WEIGHTS_FILE))
    return load_drafter(folder, target)
