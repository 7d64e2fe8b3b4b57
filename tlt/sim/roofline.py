"""Analytic roofline costs: a forward takes the longer of streaming its bytes (weights + KV cache)
through HBM and doing its FLOPs, each at an achieved fraction of the published peak, plus a fixed
launch overhead; tensor parallelism splits both over `tp` GPUs and adds two all-reduces per layer.

Decode is memory-bound: at batch B and verify width W the weights are read once while the FLOPs grow
with B * W, so verifying W tokens costs about as much as 1 until B * W passes the GPU's ridge point
(peak FLOPs / bandwidth: ~300 tokens on an H100, ~37 on an H20). That is the whole reason SD pays
only at small batches, and why the H20 leaves it so little room.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Published figures of one GPU and the efficiencies assumed against them."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    memory_efficiency: float
    compute_efficiency: float
    update_mfu: float
    step_overhead_s: float
    interconnect_bytes_per_s: float
    allreduce_latency_s: float


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's size: parameters, layers, hidden width, attention and KV heads,
    vocabulary and bytes per weight."""

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    dtype_bytes: int

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token over all layers."""
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * self.dtype_bytes

    @property
    def drafter_params(self) -> float:
        """An EAGLE drafter: fc (2H -> H), one decoder layer, the (shared) LM head it reads through."""
        per_layer = (self.params - 2 * self.vocab * self.hidden) / self.layers
        return 2 * self.hidden * self.hidden + per_layer + self.vocab * self.hidden


@dataclass(frozen=True)
class RooflineCost:
    """`CostModel` of `model` on replicas of `tp` `gpu`s (weights sharded tp ways)."""

    gpu: GpuSpec
    model: ModelShape
    tp: int = 1

    @property
    def name(self) -> str:
        return f"{self.gpu.name} x{self.tp} / {self.model.name} (roofline)"

    def _forward(self, params: float, layers: int, batch: int, width: int, context: int) -> float:
        m, g = self.model, self.gpu
        tokens = batch * width
        head_dim = m.hidden // m.heads
        kv_per_layer = 2 * m.kv_heads * head_dim * m.dtype_bytes
        nbytes = params * m.dtype_bytes + batch * (context + width) * kv_per_layer * layers
        flops = 2 * params * tokens + 4 * layers * m.heads * head_dim * tokens * (context + width)
        seconds = max(
            nbytes / (self.tp * g.hbm_bytes_per_s * g.memory_efficiency),
            flops / (self.tp * g.bf16_flops_per_s * g.compute_efficiency),
        )
        if self.tp > 1:
            message = tokens * m.hidden * m.dtype_bytes * 2 * (self.tp - 1) / self.tp
            seconds += 2 * layers * (g.allreduce_latency_s + message / g.interconnect_bytes_per_s)
        return seconds + g.step_overhead_s

    def target_seconds(self, batch: int, width: int, context: int) -> float:
        return self._forward(self.model.params, self.model.layers, batch, width, context)

    def drafter_seconds(self, batch: int, context: int) -> float:
        return self._forward(self.model.drafter_params, 1, batch, 1, context)

    def update_seconds(self, tokens: int, gpus: int) -> float:
        """8 * params FLOPs per token (2 for the old log-probs' forward, 6 for forward + backward)."""
        return 8 * self.model.params * tokens / (gpus * self.gpu.bf16_flops_per_s * self.gpu.update_mfu)

    def sync_seconds(self) -> float:
        return self.model.params * self.model.dtype_bytes / self.gpu.interconnect_bytes_per_s
