"""Decode GEMMs over a persistent grid (config key ``PERSISTENT``, a PAIRS mode).

The PAIRS kernels of :mod:`.fused_moe` give every (pair, column tile) its own program, and each
program pays its start, its pipeline's ramp and its drain; at decode those programs are short (a
qwen3 layer at M=1 is 192 gate_up programs of 8 K steps). Here the grid is ``PERSISTENT`` programs
per SM (at most one per tile) and each walks tiles ``pid, pid + programs, ...`` in ONE loop over
(tile, K step): the loop is flat, so Triton's software pipeliner keeps the next tile's weight loads
in flight while the current tile finishes, and the epilogue of a tile runs on its last K step.
The pairs' experts are read once, before the loop, and picked from registers: an expert id loaded
inside the loop is an indirect load to the pipeliner, which then keeps a single buffer.

Same numerics, outputs and options as the PAIRS kernels (scales, biases, routing weights, experts
on another rank, SPLIT_K partials in the down GEMM); not with SWAP_AB, FUSE_GATE_UP, DEDUP_PAIRS,
SUM_TOPK or SUM_LAST (:func:`.configs.check_config`): SUM_LAST's CTA barrier inside the loop would
stop Triton from pipelining it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fused_moe import _activate, _pdl_prologue, _zero_counts


@triton.jit
def _next_step(step_k, tile, STEPS_PER_TILE, num_programs):
    """The flat loop's (K step, tile) after (step_k, tile): K steps first, then the program's next tile."""
    step_k = tl.where(step_k == STEPS_PER_TILE - 1, 0, step_k + 1)
    return step_k, tl.where(step_k == 0, tile + num_programs, tile)


@triton.jit
def moe_gate_up_persistent_kernel(
    x_ptr,  # (M, H) activation dtype, unit column stride
    w_ptr,  # (E, 2I, H) int8 or activation dtype, unit stride along H
    scale_ptr,  # (E, 2I) fp32; read only when HAS_SCALE
    bias_ptr,  # (E, 2I); read only when HAS_BIAS
    out_ptr,  # (M*k, I) activation dtype: act(gate) * up
    topk_weights_ptr,  # (M*k,); read only when MUL_ROUTED_WEIGHT
    pair_experts_ptr,  # (M*k,) int32 local expert of each pair, -1 for another rank's
    num_pairs,
    I,
    H,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    stride_om,
    counts_ptr,  # zeroed here for the down GEMM's SUM_LAST; used only with ZERO_COUNTS
    num_counts,
    TOP_K: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PAIRS_P2: tl.constexpr,  # power of two >= M*k
    SWIGLU_ALPHA: tl.constexpr,
    SWIGLU_LIMIT: tl.constexpr,
    ZERO_COUNTS: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_prologue(PDL)
    if ZERO_COUNTS:
        _zero_counts(counts_ptr, num_counts)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n_tiles = tl.cdiv(I, BLOCK_N)
    num_kb = tl.cdiv(H, BLOCK_K)
    steps = tl.cdiv(num_pairs * n_tiles - pid, num_programs) * num_kb
    lane0 = tl.arange(0, BLOCK_M) == 0  # the pair's row; the other rows pad the tile to tl.dot's 16
    offs_k = tl.arange(0, BLOCK_K)
    offs_p = tl.arange(0, PAIRS_P2)
    experts = tl.load(pair_experts_ptr + offs_p, mask=offs_p < num_pairs, other=-1)  # see the module docstring
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kb = num_kb - 1
    tile = pid - num_programs
    for _ in range(0, steps):
        kb, tile = _next_step(kb, tile, num_kb, num_programs)
        pair = tile // n_tiles
        offs_n = (tile % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_wn = offs_n % I  # wrapped, so weight loads need no mask along N
        expert = tl.max(tl.where(offs_p == pair, experts, -1), axis=0)
        k = kb * BLOCK_K + offs_k
        a = tl.load(x_ptr + tl.where(lane0, pair // TOP_K, 0).to(tl.int64)[:, None] * stride_xm + k[None, :],
                    mask=lane0[:, None] & (k[None, :] < H), other=0.0)
        g_ptrs = w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we + offs_wn[None, :] * stride_wn + k[:, None]
        w_mask = k[:, None] < tl.where(expert >= 0, H, 0)  # another rank's expert: nothing read, zeros out
        g = tl.load(g_ptrs, mask=w_mask, other=0)
        u = tl.load(g_ptrs + I * stride_wn, mask=w_mask, other=0)
        acc_g = tl.dot(a, g.to(a.dtype), acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, u.to(a.dtype), acc_u, input_precision=DOT_PRECISION)
        if kb == num_kb - 1:  # the tile's last K step: its epilogue, then a fresh accumulator
            if HAS_SCALE:
                s_ptrs = scale_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_se + offs_wn
                acc_g *= tl.load(s_ptrs)[None, :]
                acc_u *= tl.load(s_ptrs + I)[None, :]
            if HAS_BIAS:
                b_ptrs = bias_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_be + offs_wn
                acc_g += tl.load(b_ptrs).to(tl.float32)[None, :]
                acc_u += tl.load(b_ptrs + I).to(tl.float32)[None, :]
            if MUL_ROUTED_WEIGHT:
                rw = tl.load(topk_weights_ptr + pair).to(tl.float32)
                acc_g *= rw
                acc_u *= rw
            h = tl.where(expert >= 0, _activate(acc_g, acc_u, ACTIVATION, SWIGLU_ALPHA, SWIGLU_LIMIT), 0.0)
            rows = tl.where(lane0, pair, 0).to(tl.int64)
            tl.store(out_ptr + rows[:, None] * stride_om + offs_n[None, :], h.to(out_ptr.dtype.element_ty),
                     mask=lane0[:, None] & (offs_n[None, :] < I))
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def moe_down_persistent_kernel(
    a_ptr,  # (M*k, I) activation dtype (the gate_up output), unit column stride
    w_ptr,  # (E, H, I) int8 or activation dtype, unit stride along I
    scale_ptr,  # (E, H) fp32; read only when HAS_SCALE
    bias_ptr,  # (E, H); read only when HAS_BIAS
    out_ptr,  # (M*k, H) activation dtype, or (SPLIT_K, M*k, H) fp32 with SPLIT_K > 1
    topk_weights_ptr,  # (M*k,); read only when MUL_ROUTED_WEIGHT
    pair_experts_ptr,  # (M*k,) int32 local expert of each pair, -1 for another rank's
    num_pairs,
    H,
    I,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    stride_om,
    stride_os,  # between split-K partials
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PAIRS_P2: tl.constexpr,  # power of two >= M*k
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_prologue(PDL)
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    n_tiles = tl.cdiv(H, BLOCK_N)
    kb_per_split = tl.cdiv(tl.cdiv(I, BLOCK_K), SPLIT_K)  # a last split may run past I: masked, read nothing
    steps = tl.cdiv(num_pairs * SPLIT_K * n_tiles - pid, num_programs) * kb_per_split
    lane0 = tl.arange(0, BLOCK_M) == 0
    offs_k = tl.arange(0, BLOCK_K)
    offs_p = tl.arange(0, PAIRS_P2)
    experts = tl.load(pair_experts_ptr + offs_p, mask=offs_p < num_pairs, other=-1)  # see the module docstring
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    step_k = kb_per_split - 1
    tile = pid - num_programs  # tile = (pair * SPLIT_K + split) * n_tiles + column tile
    for _ in range(0, steps):
        step_k, tile = _next_step(step_k, tile, kb_per_split, num_programs)
        pair = tile // (SPLIT_K * n_tiles)
        split = tile // n_tiles % SPLIT_K
        offs_n = (tile % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_wn = offs_n % H
        expert = tl.max(tl.where(offs_p == pair, experts, -1), axis=0)
        k = (split * kb_per_split + step_k) * BLOCK_K + offs_k
        a = tl.load(a_ptr + tl.where(lane0, pair, 0).to(tl.int64)[:, None] * stride_am + k[None, :],
                    mask=lane0[:, None] & (k[None, :] < I), other=0.0)
        w = tl.load(w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we + offs_wn[None, :] * stride_wn
                    + k[:, None], mask=k[:, None] < tl.where(expert >= 0, I, 0), other=0)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
        if step_k == kb_per_split - 1:
            if HAS_SCALE:
                acc *= tl.load(scale_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_se + offs_wn)[None, :]
            if HAS_BIAS:  # in the first partial only
                bias = tl.load(bias_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_be + offs_wn).to(tl.float32)
                acc += tl.where(split == 0, bias, 0.0)[None, :]
            if MUL_ROUTED_WEIGHT:
                acc *= tl.load(topk_weights_ptr + pair).to(tl.float32)
            acc = tl.where(expert >= 0, acc, 0.0)
            rows = tl.where(lane0, pair, num_pairs).to(tl.int64)
            out_ptrs = out_ptr + split.to(tl.int64) * stride_os + rows[:, None] * stride_om + offs_n[None, :]
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=lane0[:, None] & (offs_n[None, :] < H))
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


# The pairs' expert ids live in every program's registers: up to this many pairs (decode sizes); ops.py
# drops PERSISTENT beyond.
MAX_PAIRS = 256


def grid_size(num_tiles: int, programs_per_sm: int, num_sms: int) -> tuple[int]:
    """``PERSISTENT`` programs per SM, never more than there are tiles."""
    return (max(1, min(num_tiles, programs_per_sm * num_sms)),)


def pairs_p2(num_pairs: int) -> int:
    if num_pairs > MAX_PAIRS:
        raise ValueError(f"PERSISTENT handles up to {MAX_PAIRS} (token, slot) pairs, got {num_pairs}")
    return max(16, triton.next_power_of_2(num_pairs))
