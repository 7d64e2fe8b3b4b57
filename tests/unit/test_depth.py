"""Layer-skip report: a layer that computes something raises the loss when skipped; an identity one does not."""

from __future__ import annotations

import torch

from tlt.models.tiny import tiny_model
from tlt.tasks.depth import heldout_loss, layer_skip_losses


def _batches():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (4, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    return [(ids, torch.ones_like(ids), labels)]


def test_skipping_a_zeroed_layer_changes_nothing_and_the_model_is_restored():
    model = tiny_model("qwen2", num_layers=3, dtype=torch.float64)
    with torch.no_grad():  # layer 1 becomes an identity: its residual branches write zeros
        model.model.layers[1].self_attn.o_proj.weight.zero_()
        model.model.layers[1].mlp.down_proj.weight.zero_()
    before = [id(layer) for layer in model.model.layers]
    report = layer_skip_losses(model, _batches())
    assert abs(report["skipped"][1] - report["full"]) < 1e-9
    assert abs(report["skipped"][0] - report["full"]) > 1e-4 and abs(report["skipped"][2] - report["full"]) > 1e-4
    assert [id(layer) for layer in model.model.layers] == before
    assert abs(heldout_loss(model, _batches()) - report["full"]) < 1e-12
