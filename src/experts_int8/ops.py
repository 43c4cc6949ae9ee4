"""Public MoE entry points: validate -> dispatch to the Triton kernels or the torch reference.

The Triton path is registered as the custom op ``experts_int8::fused_experts`` with a fake
(meta) implementation, so it captures in CUDA graphs and traces under ``torch.compile`` without a
graph break; under ``torch.compile``, and where a gradient is wanted, the torch path is the op
``experts_int8::fused_experts_reference`` (its loop over the experts hit depends on the ids' values; its backward
recomputes one expert at a time). Validation reads shapes, dtypes and strides
only; on CUDA no device value is read back to the host, so out-of-range expert ids are refused on CPU
tensors only. On the GPU they must lie in
range: the align step routes them to the absent group (they contribute zero), but the decode modes
(PAIRS, DEDUP_PAIRS: no align step) read the weights of the expert id given.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from typing import Callable, Optional

import torch

from . import reference
from .kernels.configs import get_config, overridden, split_config, tail_config, with_down, without

try:
    from .kernels.align import align_block_size, align_with_tail
    from .kernels.fused_moe import (DEDUP_MAX_PAIRS, invoke_dequantize, invoke_down, invoke_gate_up, invoke_sum,
                                     sum_last_counts, tma_layout_fits)
    TRITON_MISSING = None
except ImportError as e:  # no Triton (it ships for Linux only): the torch path still runs everywhere
    if e.name != "triton":  # (a part of an installed Triton missing: too old or broken, said as it is)
        raise
    TRITON_MISSING = f"Triton is not installed ({e}); it ships for Linux only. Use backend='torch' (the reference)"

try:
    from .kernels import gluon_moe, gluon_wsrr
except (ImportError, AttributeError):  # a Triton without (this) Gluon: GLUON/WSRR entries run the Triton kernels
    gluon_moe = gluon_wsrr = None
from .reference import ACTIVATIONS, GATED_ONLY, clamp_of, is_gated, unknown_activation
from .routing import OTHER_ARGS, refuse_unknown_args, select_experts, shape_str

BACKENDS = ("auto", "triton", "torch")
MIN_CAPABILITY = (8, 0)  # bf16 tensor-core dots (Ampere and newer)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WEIGHT_DTYPES = (torch.int8, torch.bfloat16, torch.float16, torch.float32)


def _require_tensor(name: str, t, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {shape_str(t)}")


def _global_experts(num_experts: int, expert_map, global_num_experts) -> int:
    """How many experts the router chooses among: the map's length, else global_num_experts, else the E given."""
    return expert_map.numel() if expert_map is not None else (global_num_experts or num_experts)


def _validate(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
              expert_map, global_num_experts, backend, w13_bias=None, w2_bias=None,
              apply_router_weight_on_input=False) -> None:
    for name, t, ndim in (("x", x, 2), ("w13", w13, 3), ("w2", w2, 3), ("topk_weights", topk_weights, 2),
                          ("topk_ids", topk_ids, 2)):
        _require_tensor(name, t, ndim)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(unknown_activation(activation))
    _validate_experts(x, w13, w2, w13_scale, w2_scale, w13_bias, w2_bias, activation, apply_router_weight_on_input)
    total = _validate_routing(x, topk_weights, topk_ids, expert_map, global_num_experts, w13.shape[0])
    tensors = {"x": x, "w13": w13, "w2": w2, "topk_weights": topk_weights, "topk_ids": topk_ids,
               "w13_scale": w13_scale, "w2_scale": w2_scale, "expert_map": expert_map,
               "w13_bias": w13_bias, "w2_bias": w2_bias}
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    for name in ("x", "w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias"):
        t = tensors[name]
        if t is not None and t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride 1), got strides {t.stride()}")
    # Value checks: on CPU only (no device sync; meta tensors hold no values) and not while torch.compile traces.
    if x.device.type not in ("cuda", "meta") and topk_ids.numel() and not torch.compiler.is_compiling():
        _check_id_values(topk_ids, expert_map, total, w13.shape[0])


def _validate_experts(x, w13, w2, w13_scale, w2_scale, w13_bias, w2_bias, activation,
                      apply_router_weight_on_input) -> None:
    """The weights' dtypes and shapes against each other and x's, with their scales and biases."""
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype not in WEIGHT_DTYPES:
            raise TypeError(f"{name} must be int8 (with scales) or bf16/fp16/fp32, got {w.dtype}")
    if (w13.dtype == torch.int8) != (w2.dtype == torch.int8):
        raise TypeError(f"w13 and w2 must both be int8 or both be float, got {w13.dtype} and {w2.dtype}")
    if w13.dtype != torch.int8 and (w13.dtype != x.dtype or w2.dtype != x.dtype):
        # (the kernel reads float weight tiles in x's dtype, the torch path in fp32: they would disagree)
        raise TypeError(f"float weights must have x's dtype ({x.dtype}), got w13 {w13.dtype} and w2 {w2.dtype}; "
                        f"cast them (Int8Experts does)")

    num_experts, rows13, hidden = w13.shape
    inter = w2.shape[2]
    if rows13 not in (inter, 2 * inter) or w2.shape[0] != num_experts or w2.shape[1] != hidden:
        raise ValueError(
            f"expected w13 [E, 2I, H] (gate then up rows; [E, I, H] for experts without a gate) and w2 [E, H, I] "
            f"with the same E, H and I; got w13 {shape_str(w13)}, w2 {shape_str(w2)}"
        )
    if not is_gated(w13, w2) and activation in GATED_ONLY:
        raise ValueError(f"activation {activation!r} needs gate and up rows (w13 [E, 2I, H]); w13 {shape_str(w13)} "
                         f"holds up rows only")
    if x.shape[1] != hidden:
        raise ValueError(f"x has hidden size {x.shape[1]} but the experts have H={hidden} (w13 {shape_str(w13)})")

    quantized = w13.dtype == torch.int8
    for name, scale, rows in (("w13_scale", w13_scale, rows13), ("w2_scale", w2_scale, hidden)):
        if quantized and scale is None:
            raise ValueError(f"int8 weights need {name} (fp32 [E, {rows}]); got None")
        if not quantized and scale is not None:
            raise ValueError(f"{name} was given but the weights are {w13.dtype}, not int8; drop the scales")
        if scale is not None:
            _require_tensor(name, scale, 2)
            if tuple(scale.shape) != (num_experts, rows):
                raise ValueError(f"{name} must have shape ({num_experts}, {rows}), got {shape_str(scale)}")
            if scale.dtype != torch.float32:
                raise TypeError(f"{name} must be float32, got {scale.dtype}")

    for name, bias, rows in (("w13_bias", w13_bias, rows13), ("w2_bias", w2_bias, hidden)):
        if bias is None:
            continue
        _require_tensor(name, bias, 2)
        if tuple(bias.shape) != (num_experts, rows):
            raise ValueError(f"{name} must have shape ({num_experts}, {rows}), got {shape_str(bias)}")
        if not bias.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got {bias.dtype}")
    if apply_router_weight_on_input and (w13_bias is not None or w2_bias is not None):
        raise ValueError("expert biases need the routing weight applied to the output "
                         "(apply_router_weight_on_input=False): w * (x W + b) != (w x) W + b")


def _validate_routing(x, topk_weights, topk_ids, expert_map, global_num_experts, num_experts: int) -> int:
    """The top-k tensors' shapes and dtypes and the expert map's; returns how many experts the router chooses
    among."""
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_weights and topk_ids must both be [M={x.shape[0]}, k]; got {shape_str(topk_weights)} and "
            f"{shape_str(topk_ids)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights must be floating point, got {topk_weights.dtype}")

    if global_num_experts is not None and (not isinstance(global_num_experts, int) or global_num_experts < 1
                                           or isinstance(global_num_experts, bool)):
        raise ValueError(f"global_num_experts must be a positive int (or None), got {global_num_experts!r}")
    if expert_map is not None:
        _require_tensor("expert_map", expert_map, 1)
        if expert_map.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"expert_map must be int32 or int64, got {expert_map.dtype}")
        if global_num_experts is not None and expert_map.numel() != global_num_experts:
            raise ValueError(
                f"expert_map has {expert_map.numel()} entries but global_num_experts={global_num_experts}"
            )
    total = _global_experts(num_experts, expert_map, global_num_experts)
    if expert_map is None and total != num_experts:
        raise ValueError(
            f"global_num_experts={total} differs from the {num_experts} experts given; pass expert_map to say "
            f"which global experts are local"
        )
    if topk_ids.shape[1] > total:
        raise ValueError(f"top_k={topk_ids.shape[1]} exceeds the number of experts ({total})")
    return total


def _check_id_values(topk_ids, expert_map, total: int, num_experts: int) -> None:
    """The ids' and the map's values in range (reads them: host tensors only)."""
    lo, hi = int(topk_ids.min()), int(topk_ids.max())
    if lo < 0 or hi >= total:
        raise ValueError(f"topk_ids must lie in [0, {total}), got values in [{lo}, {hi}]")
    if expert_map is not None:
        emin, emax = int(expert_map.min()), int(expert_map.max())
        if emin < -1 or emax >= num_experts:
            raise ValueError(f"expert_map entries must be -1 or a local index < {num_experts}, got [{emin}, {emax}]")


def _check_triton_runs(x: torch.Tensor) -> None:
    if TRITON_MISSING is not None:
        raise RuntimeError(TRITON_MISSING)
    if x.device.type == "cpu" and x.dtype == torch.bfloat16:
        # Triton's interpreter computes bf16 dots wrongly (errors of 1e9 and more), with no error of its own
        raise TypeError("the Triton backend on CPU tensors (Triton's interpreter) gives wrong results in bfloat16: "
                        "use float16 or float32 there, or backend='torch'")


@torch.compiler.assume_constant_result  # torch.compile evaluates it once while tracing: no graph break
def kernel_supported(device: torch.device) -> bool:
    """Whether the Triton kernel runs on this CUDA device; warns once per device when it does not."""
    return _capability_ok(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _capability_ok(device: int) -> bool:
    if TRITON_MISSING is not None:
        _warn_caller(f"experts_int8: {TRITON_MISSING}; MoE layers run the slower torch path")
        return False
    capability = torch.cuda.get_device_capability(device)
    if capability >= MIN_CAPABILITY:
        return True
    _warn_caller(
        f"experts_int8: {torch.cuda.get_device_name(device)} (compute capability {capability[0]}.{capability[1]}) is "
        f"older than the fused kernel needs ({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, Ampere); MoE layers fall back "
        f"to the slower torch path"
    )
    return False


def _warn_caller(message: str) -> None:
    """warnings.warn, attributed to the first frame outside this package, torch and transformers: the caller's
    line, however many calls lie between (fused_moe, fused_experts, a layer's forward through nn.Module's call,
    a transformers model's forward)."""
    libraries = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                      for m in (sys.modules[__package__], torch, sys.modules.get("transformers")) if m is not None)
    frame, level = sys._getframe(1), 2  # (level 2: the frame that called this function)
    while frame is not None and frame.f_code.co_filename.startswith(libraries):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def on_device(device: torch.device):
    """``device`` as the current CUDA device inside the block: Triton launches a kernel on the current device and
    its stream, so a model spread over GPUs (``device_map``) would run a layer on another GPU than its tensors',
    unordered with their stream. Nothing to do on the current device or off CUDA."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _transient_fits(nbytes: int, device: torch.device) -> bool:
    """Whether a temporary buffer of ``nbytes`` fits in the device's free memory plus what torch's
    allocator holds unused (always, off CUDA and while a graph is captured: no query there)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return nbytes <= free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _pair_experts(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> torch.Tensor:
    """Each (token, slot) pair's local expert (-1: on another rank): the decode paths' block experts."""
    flat = topk_ids.reshape(-1)
    return flat if expert_map is None else expert_map[flat]


def _aligned(topk_ids, block_m, num_experts, expert_map, config, tail_cfg):
    """The align step's ``(main, tail)`` blocks; ``tail`` None without a tail pass (no TAIL_ROWS, or a
    WSRR entry's TAIL_ROWS that its fallback's blocks of BLOCK_SIZE_M rows do not exceed)."""
    if tail_cfg is None or config["TAIL_ROWS"] >= block_m:
        return align_block_size(topk_ids, block_m, num_experts, expert_map), None
    return align_with_tail(topk_ids, block_m, num_experts, expert_map, config["TAIL_ROWS"], tail_cfg["BLOCK_SIZE_M"])


def _tma_where_it_fits(config: dict, w13: torch.Tensor, w2: torch.Tensor) -> dict:
    """A table's entry asks for TMA weight tiles, but a GEMM's weights are no (E*N, K) view with 16-byte
    aligned rows (a slice, another layout): that GEMM runs the entry's blocks with per-thread loads
    instead of failing. An entry forced by ``override_config`` keeps TMA and gets weight_descriptor's error."""
    if not (config.get("TMA") or config.get("down", {}).get("TMA")) or overridden():
        return config
    gate_up, down = split_config(config)
    asked = (bool(gate_up.get("TMA")), bool(down.get("TMA")))
    fits = (asked[0] and tma_layout_fits(w13, gate_up), asked[1] and tma_layout_fits(w2, down))
    return config if fits == asked else with_down(dict(config, TMA=int(fits[0])), TMA=int(fits[1]))


def _gate_up_and_down(x, w13, w13_scale, w2, w2_scale, h, y, weights, aligned, top_k, activation, on_input, config,
                      w13_bias, w2_bias, clamp):
    """Both GEMMs over the ``aligned`` blocks with ``config`` (no decode modes): its rows of ``h [M*k, I]``
    and ``y [M*k, H]``, on the Gluon kernels for a GLUON entry where they apply, else Triton's."""
    gate_up_config, down_config = split_config(config)
    if config.get("GLUON") and gluon_moe is not None and gluon_moe.supported(config, x, w13, w13_scale, w2):
        gluon_moe.invoke_gate_up(x, w13, w13_scale, h, weights, *aligned, top_k, activation, on_input, gate_up_config,
                                 w13_bias, clamp)
        gluon_moe.invoke_down(h, w2, w2_scale, y, weights, *aligned, not on_input, down_config, w2_bias)
    else:
        invoke_gate_up(x, w13, w13_scale, h, weights, *aligned, top_k, activation, on_input, gate_up_config, w13_bias,
                       None, clamp)
        invoke_down(h, w2, w2_scale, y, weights, *aligned, not on_input, down_config, w2_bias)


@torch.library.custom_op("experts_int8::fused_experts", mutates_args=())
def _fused_experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: Optional[torch.Tensor],
    w2_scale: Optional[torch.Tensor],
    activation: str,
    apply_router_weight_on_input: bool,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[float] = None,
    swiglu_alpha: Optional[float] = None,
    limit_after_act: bool = False,
) -> torch.Tensor:
    clamp = clamp_of(activation, swiglu_limit, swiglu_alpha, limit_after_act)
    with on_device(x.device):  # Triton launches on the current device, not the tensors'
        m, top_k = topk_ids.shape
        num_experts, hidden, inter = w2.shape
        if m == 0 or hidden == 0:
            return x.new_empty((m, hidden))
        if num_experts == 0:  # no local experts (every pair is another rank's): as the torch path, zeros
            return x.new_zeros((m, hidden))
        # the align kernels and pair paths read ids and the map by pointer: a strided view (reshape keeps one
        # whose strides are uniform) would be read as the wrong ids
        topk_ids = topk_ids.contiguous()
        expert_map = expert_map.contiguous() if expert_map is not None else None
        gated = is_gated(w13, w2)
        config = _tma_where_it_fits(get_config(m, num_experts, inter, top_k, w13.dtype, x.device, gated), w13, w2)
        if config.get("DEDUP_PAIRS") and m * top_k > DEDUP_MAX_PAIRS:  # a decode entry serving a large M
            config = without(config, "PAIRS", "DEDUP_PAIRS", "SUM_LAST")  # the align path and its sum launch
        weights = topk_weights.reshape(-1).contiguous()  # read in its own dtype: no cast launch per layer
        # TAIL_ROWS entries: an expert's last rows past its last whole block go to a second pass on a smaller
        # entry (they write their pairs' rows of h and y) instead of a large block of their own
        tail_cfg = (_tma_where_it_fits(tail_config(config, num_experts, inter, top_k, w13.dtype, x.device, gated),
                                       w13, w2) if config.get("TAIL_ROWS") else None)

        def run_tail(tail, h, y):
            if tail is not None:
                _gate_up_and_down(x, w13, w13_scale, w2, w2_scale, h, y, weights, tail, top_k, activation,
                                  apply_router_weight_on_input, tail_cfg, w13_bias, w2_bias, clamp)

        # WSRR entries: both GEMMs in the warp-specialized register form where it applies (else the entry's rest)
        rows = config.get("WSRR_ROWS", 256)
        stages = config.get("WSRR_STAGES")  # (None: the tile's own ring)
        if (config.get("WSRR") and gluon_wsrr is not None
                and gluon_wsrr.supported(x, w13, w13_scale, w2, apply_router_weight_on_input, rows, stages)):
            main, tail = _aligned(topk_ids, rows, num_experts, expert_map, config, tail_cfg)
            h, y = x.new_empty((m * top_k, gluon_wsrr.h_columns(inter))), x.new_empty((m * top_k, hidden))
            gluon_wsrr.expert_outputs(x, w13, w13_scale, w2, w2_scale, weights, main, h, y, rows, stages, activation,
                                      w13_bias, w2_bias, clamp)
            run_tail(tail, h[:, :inter], y)
            return y if top_k == 1 else invoke_sum(y.unsqueeze(0), x.new_empty((m, hidden)), top_k)
        # Large batches: the GEMMs run on float weights (their block sizes are this entry's, sized for
        # 16-bit weights: fp32 activations keep the int8 path), paying one read of the int8 experts and one
        # write of them in x's dtype instead of converting every tile (benchmarks/NOTES.md items 34, 37).
        # One float copy at a time (w2's reuses w13's memory), and only where it fits with the layer's
        # intermediate and output rows: else the int8 path.
        dequant = (config.get("DEQUANT_ONCE") and w13_scale is not None and x.element_size() == 2
                   and _transient_fits((w13.numel() + m * top_k * (inter + hidden)) * x.element_size(), x.device))
        if dequant:
            w13, w13_scale = invoke_dequantize(w13, w13_scale, x.dtype), None
        gate_up_config, down_config = split_config(config)
        if gate_up_config.get("PAIRS"):  # decode: blocks from the pairs themselves, no align step
            sorted_token_ids = block_expert_ids = num_post_padded = _pair_experts(topk_ids, expert_map)  # 2 unread
            tail = None
        else:
            (sorted_token_ids, block_expert_ids, num_post_padded), tail = _aligned(
                topk_ids, gate_up_config["BLOCK_SIZE_M"], num_experts, expert_map, config, tail_cfg)
        h = x.new_empty((m * top_k, inter))
        sum_last = bool(down_config.get("SUM_LAST"))  # (the Triton kernels only: configs excludes GLUON and WSRR)
        # SUM_LAST's arrival counters, zeroed by the gate_up launch
        counts = x.new_empty(sum_last_counts(m, hidden, down_config), dtype=torch.int32) if sum_last else None
        # GLUON entries: hand-pipelined wgmma kernels where they apply (sm_90, int8 with scales, 16-bit x,
        # wgmma-sized blocks), else the Triton kernels with the same blocks
        gluon = config.get("GLUON") and gluon_moe is not None and gluon_moe.supported(config, x, w13, w13_scale, w2)
        if gluon:
            gluon_moe.invoke_gate_up(x, w13, w13_scale, h, weights, sorted_token_ids, block_expert_ids, num_post_padded,
                                     top_k, activation, apply_router_weight_on_input, gate_up_config, w13_bias, clamp)
        else:
            invoke_gate_up(x, w13, w13_scale, h, weights, sorted_token_ids, block_expert_ids, num_post_padded,
                           top_k, activation, apply_router_weight_on_input, gate_up_config, w13_bias, counts, clamp)
        if dequant:
            del w13  # its float copy is free for w2's
            w2, w2_scale = invoke_dequantize(w2, w2_scale, x.dtype), None
        split_k = down_config.get("SPLIT_K", 1)
        sum_topk = bool(down_config.get("SUM_TOPK"))
        if split_k > 1 or sum_last:  # fp32 partials over slices of I, summed with the k experts of each token
            y = x.new_empty((split_k, m * top_k, hidden), dtype=torch.float32)
        elif sum_topk:  # decode: each token's k experts summed inside the down GEMM
            y = x.new_empty((m, hidden))
        else:
            y = x.new_empty((m * top_k, hidden))
        if gluon:
            gluon_moe.invoke_down(h, w2, w2_scale, y, weights, sorted_token_ids, block_expert_ids, num_post_padded,
                                  not apply_router_weight_on_input, down_config, w2_bias)
        elif sum_last:  # decode: the last program to finish a token's column tile adds it up, no sum launch
            return invoke_down(h, w2, w2_scale, y, weights, sorted_token_ids, block_expert_ids, num_post_padded,
                               not apply_router_weight_on_input, down_config, w2_bias, top_k=top_k,
                               sums=x.new_empty((m, hidden)), counts=counts)
        else:
            invoke_down(h, w2, w2_scale, y, weights, sorted_token_ids, block_expert_ids, num_post_padded,
                        not apply_router_weight_on_input, down_config, w2_bias, top_k=top_k if sum_topk else 1)
        run_tail(tail, h, y)  # (TAIL_ROWS excludes SPLIT_K and the decode modes: y is [M * k, H] here)
        if sum_topk or (top_k == 1 and split_k == 1):
            return y
        # partials and experts added and cast in one launch: torch would need two for split-K partials,
        # and its strided reduction over k took 4.3-4.7 µs per decode layer on the H200 (NOTES item 58)
        return invoke_sum(y if split_k > 1 else y.unsqueeze(0), x.new_empty((m, hidden)), top_k)


@_fused_experts_triton.register_fake
def _output_like(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation, apply_router_weight_on_input,
                 expert_map, w13_bias=None, w2_bias=None, swiglu_limit=None, swiglu_alpha=None, limit_after_act=False):
    return x.new_empty((x.shape[0], w2.shape[1]))


# The op's float tensor inputs that can carry a gradient (by position): x, w13, w2, topk_weights, w13_scale,
# w2_scale, w13_bias, w2_bias. int8 weights and the ids never do.
_DIFFERENTIABLE = (0, 1, 2, 3, 5, 6, 10, 11)
_NAMES = dict(zip(_DIFFERENTIABLE, reference.DIFFERENTIABLE))


# The ops that run the reference path read the ids' values on the host (its loop over the experts hit): inside a
# CUDA graph capture that read fails, so torch.compile's CUDA graphs (mode="reduce-overhead") must leave them out
_HOST_SYNC = (torch.Tag.cudagraph_unsafe,)


@torch.library.custom_op("experts_int8::fused_experts_backward", mutates_args=(), tags=_HOST_SYNC)
def _fused_experts_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: Optional[torch.Tensor],
    w2_scale: Optional[torch.Tensor],
    activation: str,
    apply_router_weight_on_input: bool,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    swiglu_limit: Optional[float],
    swiglu_alpha: Optional[float],
    limit_after_act: bool,
    wanted: list[int],
) -> list[torch.Tensor]:
    """The gradients of fused_experts' inputs at positions ``wanted`` (of _DIFFERENTIABLE): the reference path's,
    recomputed one expert at a time (one expert's weights in fp32 at once). Correct, not fast. An op of its own, so
    that torch.compile sees one call (the reference path's per-expert loop depends on the routing's values)."""
    return _reference_backward(grad, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
                               apply_router_weight_on_input, expert_map, w13_bias, w2_bias, swiglu_limit, swiglu_alpha,
                               limit_after_act, wanted, functional=True)


def _reference_backward(grad, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation, on_input,
                        expert_map, w13_bias, w2_bias, swiglu_limit, swiglu_alpha, limit_after_act, wanted, functional):
    """:func:`reference.fused_experts_backward` for the op's positional arguments and ``wanted`` positions."""
    return reference.fused_experts_backward(grad, [_NAMES[i] for i in wanted], x, w13, w2, topk_weights, topk_ids,
                                            w13_scale=w13_scale, w2_scale=w2_scale, activation=activation,
                                            apply_router_weight_on_input=on_input, expert_map=expert_map,
                                            w13_bias=w13_bias, w2_bias=w2_bias, swiglu_limit=swiglu_limit,
                                            swiglu_alpha=swiglu_alpha, limit_after_act=limit_after_act,
                                            functional=functional)


@_fused_experts_backward.register_fake
def _(grad, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation, apply_router_weight_on_input,
      expert_map, w13_bias, w2_bias, swiglu_limit, swiglu_alpha, limit_after_act, wanted):
    inputs = [x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, None, None, expert_map, w13_bias, w2_bias]
    return [torch.empty_like(inputs[i]) for i in wanted]


def _save_for_backward(ctx, inputs, output):
    ctx.save_for_backward(*(t if isinstance(t, torch.Tensor) else None for t in inputs[:12]))
    ctx.options = inputs[7:9]  # activation, apply_router_weight_on_input
    ctx.clamp = inputs[12:15]  # swiglu_limit, swiglu_alpha, limit_after_act (the op's defaults filled in)
    # (by position here: ctx.needs_input_grad leaves out the inputs given as None)
    ctx.wanted = [i for i in _DIFFERENTIABLE if isinstance(inputs[i], torch.Tensor) and inputs[i].requires_grad]


def _backward(ctx, grad):
    """Gradients through the experts, for adapters trained around frozen int8 experts (and the router's
    weights); the forward stays the kernel's."""
    x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, _, _, expert_map, w13_bias, w2_bias = ctx.saved_tensors
    if torch.compiler.is_compiling():  # one op in the traced graph (its loop over the experts reads the ids)
        grads = _fused_experts_backward(grad.contiguous(), x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale,
                                        *ctx.options, expert_map, w13_bias, w2_bias, *ctx.clamp, ctx.wanted)
    else:  # autograd, which (unlike torch.func) runs under saved-tensor hooks such as save_on_cpu
        grads = _reference_backward(grad, x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, *ctx.options,
                                    expert_map, w13_bias, w2_bias, *ctx.clamp, ctx.wanted, functional=False)
    by_position = dict(zip(ctx.wanted, grads))
    return tuple(by_position.get(i) for i in range(15))


_fused_experts_triton.register_autograd(_backward, setup_context=_save_for_backward)


@torch.library.custom_op("experts_int8::fused_experts_reference", mutates_args=(), tags=_HOST_SYNC)
def _fused_experts_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: Optional[torch.Tensor],
    w2_scale: Optional[torch.Tensor],
    activation: str,
    apply_router_weight_on_input: bool,
    expert_map: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[float] = None,
    swiglu_alpha: Optional[float] = None,
    limit_after_act: bool = False,
) -> torch.Tensor:
    """The torch path as one op, for torch.compile (its loop over the experts the routing hits depends on the ids'
    values, which a traced graph cannot) and for eager calls that want a gradient (its backward holds one expert's
    float weights at a time, where autograd through the loop saves every one's); other eager calls run it directly."""
    return reference.fused_experts(x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale,
                                   activation=activation, apply_router_weight_on_input=apply_router_weight_on_input,
                                   expert_map=expert_map, w13_bias=w13_bias, w2_bias=w2_bias,
                                   swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha,
                                   limit_after_act=limit_after_act)


_fused_experts_reference.register_fake(_output_like)
_fused_experts_reference.register_autograd(_backward, setup_context=_save_for_backward)


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Optional[torch.Tensor] = None,
    global_num_experts: Optional[int] = None,
    backend: str = "auto",
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[float] = None,
    swiglu_alpha: Optional[float] = None,
    limit_after_act: bool = False,
    **kwargs,
) -> torch.Tensor:
    """MoE over already-selected experts: ``sum_j w_j * expert_{id_j}(x)``. Returns ``[M, H]`` in x's dtype.

    ``w13 [E, 2I, H]`` (gate rows, then up rows: ``act(gate) * up``) and ``w2 [E, H, I]`` are int8 with
    fp32 per-row scales ``w13_scale [E, 2I]``, ``w2_scale [E, H]``, or float (bf16/fp16/fp32) without scales.
    Experts without a gate (NemotronH: ``act(up)``) pass their up rows alone, ``w13 [E, I, H]`` (and
    ``w13_scale [E, I]``).
    ``expert_map [global E]`` maps global expert ids to local indices or -1 (expert parallelism).
    ``w13_bias [E, 2I]`` (``[E, I]`` without a gate) / ``w2_bias [E, H]``: optional expert biases, added after the
    scaled products (GPT-OSS style; with ``activation="swiglu_oai"``, its clamped SwiGLU, which needs a gate;
    ``"relu2"`` is NemotronH's squared ReLU).
    ``swiglu_limit``: a clamped SwiGLU (gated experts): the gate clamped above at it before the activation
    (DeepSeek-V4, GLM-5-Next, HY-V4), or ``act(gate)`` after it with ``limit_after_act`` (Step-3.7, Ling), and up to
    ``[-limit, limit]``; for ``"swiglu_oai"`` its limit (default 7.0) and ``swiglu_alpha`` its sigmoid slope
    (default 1.702; MiniMax-M3's are its config's).
    ``backend``: "triton" (on CPU tensors, Triton's interpreter), "torch" (reference), "auto"
    (Triton on CUDA GPUs of compute capability 8.0 or newer, torch elsewhere, with a warning on an
    older GPU).
    """
    refuse_unknown_args("fused_experts", kwargs)
    _validate(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
              expert_map, global_num_experts, backend, w13_bias, w2_bias, apply_router_weight_on_input)
    # (raises for options that do not apply; a Clamp is (limit, alpha, after_act), the ops' last three arguments)
    clamp = clamp_of(activation, swiglu_limit, swiglu_alpha, limit_after_act, is_gated(w13, w2))
    use_triton = backend == "triton" or x.device.type == "meta" or (  # (meta: shapes only, from the op's fake)
        backend == "auto" and x.device.type == "cuda" and kernel_supported(x.device)
    )
    if use_triton and x.device.type != "meta":
        _check_triton_runs(x)
    if not use_triton:
        # Compiled, or where a gradient is wanted, the torch path is an op: its backward recomputes the experts
        # one at a time (autograd through the reference itself would keep an fp32 copy of every expert the routing
        # hits, in every layer, until the backward: four times the int8 experts)
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (x, w13, w2, topk_weights, w13_scale, w2_scale, w13_bias,
                                                             w2_bias))):
            return _fused_experts_reference(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
                                            apply_router_weight_on_input, expert_map, w13_bias, w2_bias, *clamp)
        return reference.fused_experts(
            x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale,
            activation=activation, apply_router_weight_on_input=apply_router_weight_on_input,
            expert_map=expert_map, w13_bias=w13_bias, w2_bias=w2_bias, swiglu_limit=clamp.limit,
            swiglu_alpha=clamp.alpha, limit_after_act=clamp.after_act,
        )
    return _fused_experts_triton(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
                                 apply_router_weight_on_input, expert_map, w13_bias, w2_bias, *clamp)


def fused_moe(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    correction_bias: Optional[torch.Tensor] = None,
    routed_scaling_factor: float = 1.0,
    custom_routing_function: Optional[Callable] = None,
    **kwargs,
) -> torch.Tensor:
    """:func:`select_experts` then :func:`fused_experts` (``kwargs`` are fused_experts' options)."""
    refuse_unknown_args("fused_moe", {name: value for name, value in kwargs.items() if name in OTHER_ARGS})
    if isinstance(router_logits, torch.Tensor) and router_logits.dim() == 3 and isinstance(w2, torch.Tensor) \
            and w2.dim() == 2:
        raise ValueError("fused_moe takes (x, router_logits, w13, w2, top_k): router_logits [M, E] comes second, "
                         f"got a {router_logits.dim()}-D tensor there and a 2-D one as w2 (vLLM's fused_moe takes the "
                         "weights first)")
    _require_tensor("x", x, 2)  # (before the rows are compared: x [B, S, H] has B "tokens")
    if isinstance(router_logits, torch.Tensor) and router_logits.dim() == 2 \
            and router_logits.shape[0] != x.shape[0]:
        raise ValueError(f"router_logits has {router_logits.shape[0]} rows but x has {x.shape[0]} tokens")
    expert_map = kwargs.get("expert_map")
    if isinstance(router_logits, torch.Tensor) and router_logits.dim() == 2 and isinstance(w13, torch.Tensor) \
            and w13.dim() == 3 and (expert_map is None or isinstance(expert_map, torch.Tensor)):
        experts = _global_experts(w13.shape[0], expert_map, kwargs.get("global_num_experts"))
        if router_logits.shape[1] != experts:
            raise ValueError(f"router_logits has {router_logits.shape[1]} columns but there are {experts} experts "
                             f"(one logit per expert; global_num_experts or expert_map for experts held elsewhere)")
    topk_weights, topk_ids = select_experts(
        router_logits, top_k, renormalize=renormalize, scoring=scoring, num_expert_group=num_expert_group,
        topk_group=topk_group, correction_bias=correction_bias, routed_scaling_factor=routed_scaling_factor,
        custom_routing_function=custom_routing_function,
    )
    return fused_experts(x, w13, w2, topk_weights, topk_ids, **kwargs)
