"""The policy's part of a whole-run checkpoint when its update runs on several ranks: model and AdamW state
through `torch.distributed.checkpoint` (DCP), one file a rank plus DCP's metadata, keyed by parameter
names, so a checkpoint written at one world size loads at another (DCP reshards on load; one process
reads it without a process group).

A checkpoint of a one-rank run holds the policy as a flat tensor dict and AdamW's own id-keyed state
(`PolicyRole.add_to`); `named_optimizer_state` turns that into the name-keyed form the group loads.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

POLICY_SHARDS = "policy_shards"  # the folder in a checkpoint


def save_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Write this rank's shards of the model and optimizer into `folder` (collective: every rank calls it)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))


def load_shards(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Load what `save_shards` wrote, at this process's world size (collective where a group exists)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)  # initialises AdamW's state to load into
    state = {"model": model_state, "optimizer": optimizer_state}
    with warnings.catch_warnings():  # one process without a group: DCP says it assumes so, as meant
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def named_optimizer_state(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer `state_dict()` of `model.parameters()` (parameters by position) keyed by parameter name
    instead, as `set_optimizer_state_dict` takes it."""
    names = [name for name, _ in model.named_parameters()]
    return {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
    }


def load_full(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor], named: dict[str, Any]
) -> None:
    """Load full (unsharded) weights and a name-keyed optimizer state into this rank's shards."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, named, options=options)
