"""A compiled decode / verify / prefill step with a bounded set of shapes (gpt-fast's approach).

`CompiledStep` wraps a step function `fn(module, token_ids, positions, write_slots, attn_mask, ks, vs)`
(`tlt.rollout.runner.decoder_forward`, or the drafter's layer) in `torch.compile` with inductor.
The KV caches are per-layer tensors written in place (`tlt/rollout/kv_cache.py`, static: allocated
at max_context), so one graph serves every step of a shape class.

Shapes. Two modes:
- dynamic (CPU, the default there): batch B, query width Q and attended span S are symbolic. Dynamo
  specialises a size of 1, so four graphs cover everything: (B = 1 | B > 1) x (Q = 1 | Q > 1), with
  decode (Q = 1), every verify width and prefill all served. Dynamo traces one decoder layer and
  stamps it out for the rest (`tlt.rollout.runner.decoder_layer_region`). Measured here (24 layers x
  128, 1 thread, the bench's shape set): 175 s to compile cold, 17 s warm from inductor's on-disk cache
  (its default, /tmp/torchinductor_<user>, or TORCHINDUCTOR_CACHE_DIR), so the cold cost is paid once per
  machine (per pod on a cluster, where /tmp is the pod's emptyDir).
- padded (CUDA, with `mode="reduce-overhead"` CUDA graphs, which replay fixed shapes): B is padded up
  to the next power of two (as vLLM pads to its capture sizes) and S to the cache's full capacity;
  padded rows write scratch rows of the cache past the running ones and their output is dropped.

`compiles` counts graph compilations made through this step and `compile_seconds` the wall time of
the calls that compiled; after warm-up, a steady state adds none (the bench reports both).

Host cost per call. Dynamo checks a graph's guards on every call: with the module's parameters as graph
inputs, that is ~10 checks per parameter (0.4 ms of a 3.7 ms step at 24 layers x 128, batch 1), and each
cache entry whose guards fail on the way to the right one costs most of a check again (a step that
alternates classes, decode / verify / drafter, pays that). A step skips the full check once it is warm:
the first call of each input class (`shape_class`: the module, grad mode, every input's dtype,
contiguity and sizes, sizes reduced to 1 / equal-to-which-other-size) runs with every guard; later calls
of a class already served run under dynamo's `skip_guard_eval_unsafe` stance, which still checks every
tensor input's dtype, sizes and strides and every guard that has ever failed (the ones that tell this
function's graphs apart), and skips the rest (module identity, parameter marks). Inductor's size and
stride asserts stay on: they also check fallback kernels' output layouts, which nothing else checks.
"""

from __future__ import annotations

import logging
import shutil
import time
import weakref
from collections.abc import Callable

import torch
from torch._dynamo.eval_frame import DynamoStance, _set_stance

log = logging.getLogger(__name__)

StepFn = Callable[..., torch.Tensor]
AUTO_MIN_LAYERS = 16
# Whether decoder layers compile as nested regions (`tlt.rollout.runner.decoder_layer_region`): only where
# dynamo can inline them back into one flat graph (`inline_invoke_subgraph`: in torch 2.13, not in 2.11).
# Elsewhere every layer is traced: the same graphs and shapes, a longer compile (regions there would
# compile a graph per batch and width).
LAYER_REGIONS = hasattr(torch._dynamo.config, "inline_invoke_subgraph")
# Every runner in a process shares the step function's compiled graphs: a process holding several
# models (tests, the bench) needs more cache entries than dynamo's default 8.
_CACHE_SIZE_LIMIT = 256


def compile_available(device: torch.device) -> str | None:
    """None when inductor can compile for `device` here, else the reason it cannot."""
    if device.type == "cpu" and not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        return "inductor's CPU backend needs a C++ compiler (c++, g++ or clang++) on PATH"
    if device.type not in ("cpu", "cuda"):
        return f"compiled steps support cpu and cuda devices, not {device.type!r}"
    return None


def resolve_compile(setting: str, model: torch.nn.Module) -> bool:
    """`rollout.compile` for this model: "on" (an error where inductor cannot run), "off", or "auto":
    on for decoders of >= AUTO_MIN_LAYERS layers where inductor is available.

    Why a depth: compiled steps are faster at every depth, but the compile (tens of seconds warm, minutes
    cold) pays back only over thousands of steps of a deep policy's multi-millisecond forward; a shallow
    policy saves about a millisecond a step (docs/results.md, `tlt bench engine --part compiled`).
    """
    return resolve_compile_for(setting, len(model.model.layers), next(model.parameters()).device)


def resolve_compile_for(setting: str, layers: int, device: torch.device) -> bool:
    """`resolve_compile` for a decoder of `layers` layers on `device`, without the model."""
    reason = compile_available(device)
    if setting == "off":
        return False
    if setting == "on":
        if reason:
            raise ValueError(f"rollout.compile is 'on' but {reason}; set rollout.compile to 'auto' or 'off'")
        return True
    if setting != "auto":
        raise ValueError(f"rollout.compile must be 'auto', 'on' or 'off', got {setting!r}")
    if reason:
        log.warning("rollout.compile auto: running eager, %s", reason)
    return reason is None and layers >= AUTO_MIN_LAYERS


def _pad_rows(t: torch.Tensor, rows: int, fill: bool | int = 0) -> torch.Tensor:
    """t [B, ...] -> [rows, ...], new rows filled with `fill`."""
    pad = t.new_full((rows - t.shape[0], *t.shape[1:]), fill)
    return torch.cat([t, pad], dim=0)


def bucket_size(b: int, max_rows: int) -> int:
    """The padded batch size for b rows: the next power of two, capped at max_rows (>= b)."""
    if not 1 <= b <= max_rows:
        raise ValueError(f"batch of {b} rows outside [1, {max_rows}]")
    return min(max_rows, 1 << (b - 1).bit_length())


_COMPILES = [0]  # graphs compiled in this process, by any step (a step counts those its calls caused)
_COMPILED: dict[tuple[StepFn, str | None], Callable] = {}


def _compiled(fn: StepFn, mode: str | None) -> Callable:
    """One compiled callable per (step function, mode) in the process. Dynamo keys its graph cache on the
    function's code and on the backend object: every runner and drafter cache of the process shares these
    graphs (a new backend per instance would compile them all again)."""
    key = (fn, mode)
    if key not in _COMPILED:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, _CACHE_SIZE_LIMIT)
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, _CACHE_SIZE_LIMIT
        )
        # Decoder layers are nested compile regions (`tlt.rollout.runner.decoder_layer_region`): traced once,
        # then inlined back into one flat graph for AOTAutograd and inductor (see there why). A torch
        # without the option traces every layer instead (`LAYER_REGIONS`).
        if LAYER_REGIONS:
            torch._dynamo.config.inline_invoke_subgraph = True
        # Round where eager rounds: HF norms and RoPE compute in float32 and cast back; without this,
        # inductor fuses the casts away and the compiled step is (slightly) more precise than eager.
        patches: dict = {"emulate_precision_casts": True}
        if mode == "reduce-overhead":
            patches["triton.cudagraphs"] = True

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            from torch._inductor.compile_fx import compile_fx

            _COMPILES[0] += 1
            return compile_fx(gm, example_inputs, config_patches=patches)

        _COMPILED[key] = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
    return _COMPILED[key]


class CompiledStep:
    """`fn` compiled once per shape class; call it exactly like `fn`."""

    def __init__(
        self, fn: StepFn, *, name: str, padded: bool = False, mode: str | None = None, skip_guards: bool = True
    ) -> None:
        self.name = name
        self.padded = padded
        self.compiles = 0
        self.compile_seconds = 0.0
        self.guarded_calls = 0
        self.skip_guards = skip_guards
        self._fn = _compiled(fn, mode)
        self._served: set[tuple] = set()

    def __call__(
        self,
        module: torch.nn.Module,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        attn_mask: torch.Tensor,
        ks: list[torch.Tensor],
        vs: list[torch.Tensor],
        *extra: torch.Tensor,
    ) -> torch.Tensor:
        """token_ids, positions, write_slots [B, Q]; attn_mask [B, Q, S]; ks, vs per-layer caches
        [Bmax, Hkv, capacity, D]; extra: more per-token inputs [B, Q, ...] of fn (e.g. the drafter's
        features). Returns fn's output [B, Q, H]."""
        b = token_ids.shape[0]
        # Strides are part of a graph's guards: an expanded (stride-0) positions tensor would compile anew.
        token_ids, positions, write_slots, attn_mask = (
            t.contiguous() for t in (token_ids, positions, write_slots, attn_mask)
        )
        if write_slots is positions:  # aliasing is guarded too: keep the two inputs distinct always
            write_slots = write_slots.clone()
        if self.padded:
            token_ids, positions, write_slots, attn_mask = self._pad(
                token_ids, positions, write_slots, attn_mask, ks[0]
            )
            extra = tuple(_pad_rows(t, token_ids.shape[0]) for t in extra)
        args = (token_ids, positions, write_slots, attn_mask, ks[0], vs[0], *extra)
        key = shape_class(module, len(ks), args) if self.skip_guards else None
        warm = key is not None and key in self._served
        if not warm:
            # dynamic marks matter only where a graph may be compiled: a served class reuses its graph
            if not self.padded:
                _mark_dynamic(token_ids, positions, write_slots, attn_mask, *extra)
                _mark_cache_dynamic(ks, vs)
            self.guarded_calls += 1
        before, t0 = _COMPILES[0], time.perf_counter()
        out = None
        if warm:
            prior = _set_stance(_SKIP_GUARDS)
            try:
                out = self._fn(module, token_ids, positions, write_slots, attn_mask, ks, vs, *extra)
            except RuntimeError as err:
                # dynamo found no graph for the call and refuses to compile under the stance (before running
                # anything): the class was not what `shape_class` said. Run it again with every guard.
                if "skip_guard_eval_unsafe" not in str(err):
                    raise
                log.warning("%s step: a served input class needs another graph; calling with full guards", self.name)
            finally:
                _set_stance(prior)
        if out is None:
            if warm:  # the fallback: marks and count as the first call of a class gets them
                if not self.padded:
                    _mark_dynamic(token_ids, positions, write_slots, attn_mask, *extra)
                    _mark_cache_dynamic(ks, vs)
                self.guarded_calls += 1
            out = self._fn(module, token_ids, positions, write_slots, attn_mask, ks, vs, *extra)
            if key is not None:
                self._served.add(key)
        if _COMPILES[0] != before:
            self.compiles += _COMPILES[0] - before
            seconds = time.perf_counter() - t0
            self.compile_seconds += seconds
            log.info(
                "%s step: compiled graph %d for B=%d Q=%d in %.1f s",
                self.name,
                self.compiles,
                b,
                token_ids.shape[1],
                seconds,
            )
        return out[:b]

    @staticmethod
    def _pad(
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        attn_mask: torch.Tensor,
        cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows up to the batch bucket (their k/v go to scratch rows past the running ones, slot 0,
        which they alone see), span up to the cache's capacity (masked off)."""
        rows = bucket_size(token_ids.shape[0], cache.shape[0])
        span = cache.shape[2]
        mask = torch.nn.functional.pad(attn_mask, (0, span - attn_mask.shape[-1]), value=False)
        mask = _pad_rows(mask, rows, False)
        mask[token_ids.shape[0] :, :, 0] = True
        return _pad_rows(token_ids, rows), _pad_rows(positions, rows), _pad_rows(write_slots, rows), mask


# Dynamo's stance, set directly: `torch.compiler.set_stance(...)` as a context costs ~40 us a call (its
# object's set-up), `_set_stance` ~1 us. Same effect: the stance the next compiled call is evaluated under.
_SKIP_GUARDS = DynamoStance("default", skip_guard_eval_unsafe=True)


def shape_class(module: torch.nn.Module, layers: int, tensors: tuple[torch.Tensor, ...]) -> tuple:
    """What tells a step's calls apart beyond their tensors' own guards: the module (by identity, and its
    `graph_key` where it has one: what it reads besides its parameters, e.g. a drafter's vocabulary), grad and
    inference mode, the number of cache layers, and per tensor its dtype, device, contiguity and sizes, each
    size as 1, 0, or the index of the first distinct size > 1 equal to it (so a span equal to the cache's
    capacity, or a batch equal to the cache's rows, is a class of its own: dynamo guards such relations)."""
    labels: dict[int, int] = {}
    sizes = tuple([-s if s < 2 else labels.setdefault(s, len(labels) + 1) for t in tensors for s in t.shape])
    graph_key = module.graph_key if hasattr(type(module), "graph_key") else None  # no nn.Module __getattr__ miss
    return (
        id(module),
        graph_key,
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        layers,
        sizes,
        tuple([(t.dtype, t.device, t.dim(), t.is_contiguous()) for t in tensors]),
    )


def _mark_dynamic(
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    write_slots: torch.Tensor,
    mask: torch.Tensor,
    *extra: torch.Tensor,
) -> None:
    """Batch, width and span symbolic (sizes of 1 stay specialised). `maybe_`: where a graph does pin a
    size (a span equal to the whole cache, at the context limit) dynamo compiles one more graph instead
    of failing."""
    b, q = token_ids.shape
    for t in (token_ids, positions, write_slots, mask, *extra):
        if b > 1:
            torch._dynamo.maybe_mark_dynamic(t, 0)
        if q > 1:
            torch._dynamo.maybe_mark_dynamic(t, 1)
    if mask.shape[-1] > 1:
        torch._dynamo.maybe_mark_dynamic(mask, 2)


# Cache tensors already marked, by id (a mark is an attribute of the tensor and outlives the call): the
# caches live across steps, and marking their 2 x layers tensors on every call cost ~0.3 ms a step.
_MARKED: dict[int, weakref.ref] = {}


def _mark_cache_dynamic(ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
    """Cache rows and capacity symbolic: caches sized for other batch sizes or draft scratch (a warm-up's,
    another arm set's) share the graphs. Each cache tensor is marked once."""
    for t in (*ks, *vs):
        ref = _MARKED.get(id(t))
        if ref is not None and ref() is t:
            continue
        for dim in (0, 2):
            if t.shape[dim] > 1:
                torch._dynamo.maybe_mark_dynamic(t, dim)
        key = id(t)
        _MARKED[key] = weakref.ref(t, lambda _, key=key: _MARKED.pop(key, None))
