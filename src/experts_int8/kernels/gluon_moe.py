"""Hopper (sm_90) prefill GEMMs of a W8A16 MoE layer, in Gluon (Triton's explicit-layout dialect).

Same work and numerics as :mod:`.fused_moe`'s two kernels for int8 weights and 16-bit activations
(rows from the align step, one expert per row block, fp32 accumulation, row scales after the K loop,
routing weight and activation in fp32, one cast at the store), scheduled by hand where Triton's own
pipeliner cannot: each int8 weight tile goes from a cp.async ring to registers, is converted, and is
stored into one of two bf16/fp16 slots, and its wgmma is issued asynchronously with the previous
tile's left in flight, so converting tile j+1 overlaps tile j's tensor-core work (Triton keeps the
int8 wgmma synchronous: benchmarks/NOTES.md items 13, 41).

An expert's last row block whose lower half is all padding runs the same loop compiled for half the
rows (``TRIM_TAIL``, on unless a config sets it to 0; :func:`trim_tail` says where it applies).

A config selects it with ``GLUON: 1`` (:mod:`.configs`); :func:`supported` says when it applies
(sm_90, int8 weights with scales, 16-bit activations, block sizes wgmma can tile), and
elsewhere the same config runs the Triton kernels. Gluon kernels do not run under Triton's
interpreter; on CPU the tests compile them for sm_90 and check the launch logic.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ..reference import is_gated
from .configs import compute_capability, max_shared_memory
from .fused_moe import ACTIVATION_CODES, INT8_TO_FP16_PTX, clamp_meta, fp16_dot_input

# cp.async into shared memory: ``async_load`` from Triton 3.7 on, ``async_copy_global_to_shared`` before
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# a CTA-wide barrier: ``barrier`` from Triton 3.7 on, ``thread_barrier`` before
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def supported(config: dict, x: torch.Tensor, w13: torch.Tensor, w13_scale, w2: torch.Tensor) -> bool:
    """Whether the Gluon kernels can run this call with ``config``'s blocks (else: the Triton ones): a
    layer they read (:func:`hopper_smem_limit`) and blocks that fit."""
    smem_limit = hopper_smem_limit(x, w13, w13_scale, w2)
    return smem_limit is not None and blocks_ok(config, smem_limit, is_gated(w13, w2))


def hopper_smem_limit(x: torch.Tensor, w13: torch.Tensor, w13_scale, w2: torch.Tensor) -> Optional[int]:
    """The device's shared memory per block where the Hopper Gluon kernels (here and in :mod:`.gluon_wsrr`)
    can read this layer, else None: sm_90, int8 weights with scales, 16-bit activations, and rows that
    16-byte copies can read (H and I multiples of 16, 16-byte aligned rows). Experts with or without a gate
    (w13 [E, 2I, H] or [E, I, H]); expert biases are added in these kernels' epilogues."""
    if x.device.type != "cuda" or torch.version.hip is not None:
        return None
    major, smem_limit = _device_facts(torch.cuda.current_device() if x.device.index is None else x.device.index)
    if major != 9 or w13_scale is None or x.dtype not in _GL_DTYPES or w13.dtype != torch.int8:
        return None
    hidden, inter = w2.shape[1], w2.shape[2]
    # Triton proves 16-byte copies aligned from pointers and strides that are multiples of 16 elements
    strides = (x.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1))
    if hidden % 16 or inter % 16 or any(stride % 16 for stride in strides) or not all(
            t.stride(-1) == 1 and t.data_ptr() % 16 == 0 for t in (x, w13, w2)):
        return None
    return smem_limit


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[int, int]:
    """(compute capability major, opt-in shared memory per block) of a CUDA device, asked once."""
    return compute_capability(index)[0], max_shared_memory(index)


def _acc_regs(config: dict) -> int:
    return config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"] // (32 * config["num_warps"])


def smem_bytes(config: dict, num_b: int, act_bytes: int = 2) -> int:
    """Shared memory of one program: the ring of activation and int8 weight tiles, and two converted
    weight slots (``num_b`` weight tiles of BLOCK_N rows each: 2 for gate_up, 1 for down and for gate_up
    without a gate)."""
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    return config["num_stages"] * (bm * bk * act_bytes + num_b * bn * bk) + 2 * num_b * bn * bk * act_bytes


def blocks_ok(config: dict, smem_limit: int = 227 * 1024, gated: bool = True) -> bool:
    """wgmma tiling: 16 rows per warp along M, N a multiple of 8 up to 256 (gate and up: 2 x BLOCK_N
    columns of weights, two accumulators, or one wgmma with FUSE_GATE_UP: at most 256 wide, which the
    register bound below implies; without a gate (``gated`` False) one tile and accumulator), K tiles of
    32-256, both kernels' buffers within ``smem_limit`` bytes of shared memory; no decode-only or split
    options."""
    down = {**config, **config.get("down", {})}
    tiles = 2 if gated else 1
    if max(smem_bytes(config, tiles), smem_bytes(down, 1)) > smem_limit:
        return False
    # accumulators past ~128 registers a thread spill, and ptxas then serializes the wgmmas
    if max(tiles * _acc_regs(config), _acc_regs(down)) > 128:
        return False
    if any(config.get(key) for key in ("PAIRS", "SWAP_AB", "DEDUP_PAIRS")):
        return False
    if down.get("SPLIT_K", 1) > 1 or down.get("SUM_TOPK") or down.get("SWAP_AB"):
        return False
    for cfg in (config, down):
        bm, bn, bk, warps = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"], cfg["num_warps"]
        if warps not in (4, 8) or bm < 16 * warps or bn % 8 or not 16 <= bn <= 256 or bk not in (32, 64, 128, 256):
            return False
        if cfg["num_stages"] < 2:
            return False
    return True


@gluon.jit
def _row_block(num_sorted, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """This program's row block and first output column (grouped ordering, as fused_moe's)."""
    num_pid_n = gl.cdiv(N, BLOCK_N)
    pid = gl.program_id(0)
    first_m = (pid // (GROUP_M * num_pid_n)) * GROUP_M
    group_m = gl.minimum(gl.cdiv(num_sorted, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    return pid_m, pid_n * BLOCK_N


@gluon.jit
def _convert(w, dtype: gl.constexpr):
    """An int8 weight tile in the activation dtype: to fp16 by fused_moe's PTX (1.25 instructions a
    weight, where Triton's cast takes a quarter-rate I2F), to bf16 by Triton's cast (2)."""
    if dtype == gl.float16:
        return gl.inline_asm_elementwise(INT8_TO_FP16_PTX, "=r,=r,r", [w], dtype=gl.float16, is_pure=True, pack=4)
    return w.to(dtype)


@gluon.jit
def _issue_tile(a_ptrs, a_row_mask, offs_ak, w_ptrs, offs_wk, a_slot, w_slot, k0, K):
    """cp.async of one K tile of the activation rows and the weight rows into their ring slots (rows
    past the batch and columns past K read as zeros)."""
    a_mask = a_row_mask[:, None] & (offs_ak[None, :] + k0 < K)
    _async_load(a_slot, a_ptrs + k0, mask=a_mask)
    _async_load(w_slot, w_ptrs + k0, mask=offs_wk[None, :] + k0 < K)


@gluon.jit
def _mainloop(a_ptr, w_ptr, a_rows, a_row_mask, w_rows, K, stride_am, stride_wn,
              A_SMEM: gl.constexpr, W_SMEM: gl.constexpr, B_SMEM: gl.constexpr, acc_layout: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
              NUM_B: gl.constexpr, num_warps: gl.constexpr):
    """``a[a_rows] @ w[w_rows]^T`` over K, as NUM_B accumulators of BLOCK_N columns each (w_rows holds
    NUM_B * BLOCK_N weight rows: gate's then up's for GEMM1)."""
    a_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [num_warps, 1], [1, 0])
    w_load: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [num_warps, 1], [1, 0])
    offs_ak = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, a_load))
    offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_load))
    a_ptrs = a_ptr + gl.convert_layout(a_rows, gl.SliceLayout(1, a_load))[:, None] * stride_am + offs_ak[None, :]
    a_mask = gl.convert_layout(a_row_mask, gl.SliceLayout(1, a_load))
    w_ptrs = w_ptr + gl.convert_layout(w_rows, gl.SliceLayout(1, w_load))[:, None] * stride_wn + offs_wk[None, :]
    act_dtype: gl.constexpr = a_ptr.dtype.element_ty

    a_ring = gl.allocate_shared_memory(act_dtype, [STAGES, BLOCK_M, BLOCK_K], A_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int8, [STAGES, NUM_B * BLOCK_N, BLOCK_K], W_SMEM)
    b_slots = gl.allocate_shared_memory(act_dtype, [2, NUM_B * BLOCK_N, BLOCK_K], B_SMEM)

    num_k = gl.cdiv(K, BLOCK_K)
    # prologue: the first STAGES-1 tiles in flight (past K the masks make them empty copies; a branch
    # here would make ptxas serialize the wgmmas, C7515)
    for s in gl.static_range(STAGES - 1):
        _issue_tile(a_ptrs, a_mask, offs_ak, w_ptrs, offs_wk, a_ring.index(s), w_ring.index(s), s * BLOCK_K, K)
        async_copy.commit_group()

    acc0 = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    acc1 = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for j in range(num_k):
        slot = j % STAGES
        async_copy.wait_group(STAGES - 2)  # tile j has landed (this thread's copies) ...
        _cta_barrier()  # ... and every thread's
        # int8 -> registers -> activation dtype -> one of two slots; the wgmmas that last read this
        # slot (tile j-2) have completed: at most one tile's are left in flight below
        w = w_ring.index(slot).load(w_load)
        b_slot = b_slots.index(j % 2)
        b_slot.store(_convert(w, act_dtype))
        fence_async_shared()
        _cta_barrier()
        a_tile = a_ring.index(slot)
        acc0 = warpgroup_mma(a_tile, b_slot.slice(0, BLOCK_N).permute((1, 0)), acc0, is_async=True)
        if NUM_B == 2:
            acc1 = warpgroup_mma(a_tile, b_slot.slice(BLOCK_N, BLOCK_N).permute((1, 0)), acc1, is_async=True)
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))
        else:
            acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc0, ))
        # tile j-1's wgmmas are done, in this warpgroup; the barrier extends that to all of them
        # before its ring slot takes tile j+STAGES-1
        _cta_barrier()
        nxt = j + STAGES - 1
        if nxt < num_k:
            _issue_tile(a_ptrs, a_mask, offs_ak, w_ptrs, offs_wk, a_ring.index(nxt % STAGES),
                        w_ring.index(nxt % STAGES), nxt * BLOCK_K, K)
        async_copy.commit_group()  # (empty near the end: keeps the group count uniform)
    if NUM_B == 2:
        acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
    else:
        acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, ))
    async_copy.wait_group(0)  # the last (empty) copy groups, so none is pending at exit
    return acc0, acc1


@triton.constexpr_function
def _acc_layout(block_m, n, num_warps):
    """wgmma's accumulator layout for block_m x n: warpgroups stacked along M while each gets 64 rows,
    side by side along N past that (a 64-row tile on 8 warps: two warpgroups of n/2 columns)."""
    warps_m = min(num_warps, block_m // 16)
    warps_n = num_warps // warps_m
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps_m, warps_n],
                                     instr_shape=[16, n // warps_n, 16])


def trim_tail(config: dict, n_cols: int) -> bool:
    """Whether a row block whose lower half is all padding (an expert's last block) may run as a block
    of BLOCK_SIZE_M / 2 rows: half the tensor-core work and activation reads for the same weight tiles.
    Needs the half block to be whole warpgroups (>= 64 rows) and, on 8 warps with 64 rows, ``n_cols``
    (the accumulator's columns) to split into two wgmma widths (multiples of 8). TRIM_TAIL: 0 turns it
    off."""
    bm, warps = config["BLOCK_SIZE_M"], config["num_warps"]
    if not config.get("TRIM_TAIL", 1) or bm // 2 < 64:
        return False
    warps_n = warps // min(warps, bm // 2 // 16)
    return n_cols % (8 * warps_n) == 0


@gluon.jit
def _block(first_row, block, n0, N, sorted_token_ids_ptr, block_expert_ids_ptr, num_valid, out_ptr, stride_om,
           acc_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The rows from sorted row ``first_row`` (flat pair ids, padding ``>= num_valid``) and mask, the
    output columns from ``n0``, output pointers and mask, and row block ``block``'s expert (-1: not on
    this rank)."""
    rows = gl.load(sorted_token_ids_ptr + first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout)))
    rows = rows.to(gl.int64)
    row_mask = rows < num_valid
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    out_mask = row_mask[:, None] & (offs_n[None, :] < N)
    return rows, row_mask, offs_n, out_ptrs, out_mask, gl.load(block_expert_ids_ptr + block).to(gl.int64)


@gluon.jit
def _sigmoid(v):
    return 1.0 / (1.0 + gl.exp(-v))


@gluon.jit
def glu(acc_g, acc_u, ACTIVATION: gl.constexpr, GATED: gl.constexpr, SWIGLU_ALPHA: gl.constexpr,
        SWIGLU_LIMIT: gl.constexpr, LIMIT_AFTER_ACT: gl.constexpr):
    """act(gate) * up in fp32 (fused_moe's ACTIVATION_CODES), clamped as fused_moe's ``_activate`` clamps it, or
    act(gate) alone without GATED (``acc_u`` unread, no clamp): the epilogue of both Gluon gate/up kernels (here
    and :mod:`.gluon_wsrr`)."""
    if SWIGLU_LIMIT is not None:
        if not LIMIT_AFTER_ACT:
            acc_g = gl.minimum(acc_g, SWIGLU_LIMIT)
        acc_u = gl.minimum(gl.maximum(acc_u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
    if ACTIVATION == 0:  # silu
        gate = acc_g / (1.0 + gl.exp(-acc_g))
    elif ACTIVATION == 1:  # gelu (erf)
        gate = 0.5 * acc_g * (1.0 + gl.erf(acc_g * 0.7071067811865476))
    elif ACTIVATION == 2:  # gelu, tanh approximation: g * sigmoid(2z)
        gate = acc_g * _sigmoid(1.5957691216057308 * (acc_g + 0.044715 * acc_g * acc_g * acc_g))
    elif ACTIVATION == 4:  # relu2: relu(g)^2
        g = gl.maximum(acc_g, 0.0)
        gate = g * g
    else:  # swiglu_oai (gated only; clamped above): gate * sigmoid(alpha * gate) * (up + 1)
        gate = acc_g * _sigmoid(SWIGLU_ALPHA * acc_g)
        acc_u = acc_u + 1.0
    if LIMIT_AFTER_ACT:
        gate = gl.minimum(gate, SWIGLU_LIMIT)
    if GATED:
        gate = gate * acc_u
    return gate


@gluon.jit
def _gate_up_tile(
    first_row, block, n0, x_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
    block_expert_ids_ptr, num_valid, I, H, stride_xm, stride_we, stride_wn, stride_se, stride_om, x_inv_scale_ptr,
    bias_ptr, stride_be, TOP_K: gl.constexpr, ACTIVATION: gl.constexpr, MUL_ROUTED_WEIGHT: gl.constexpr,
    ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, FUSE_GATE_UP: gl.constexpr, GATED: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    SWIGLU_ALPHA: gl.constexpr, SWIGLU_LIMIT: gl.constexpr, LIMIT_AFTER_ACT: gl.constexpr,
    A_SMEM: gl.constexpr, W_SMEM: gl.constexpr, B_SMEM: gl.constexpr, num_warps: gl.constexpr,
):
    """GEMM1's BLOCK_M rows from sorted row ``first_row`` (of row block ``block``), columns from ``n0``.
    Without GATED, w13 holds the I up rows alone: one weight tile a K step, and ``act(up)``."""
    acc_layout: gl.constexpr = _acc_layout(BLOCK_M, BLOCK_N, num_warps)
    rows, row_mask, offs_n, out_ptrs, out_mask, expert = _block(first_row, block, n0, I, sorted_token_ids_ptr,
                                                                block_expert_ids_ptr, num_valid, out_ptr, stride_om,
                                                                acc_layout, BLOCK_M, BLOCK_N)
    if expert < 0:  # not on this rank: zeros, as the Triton kernel writes
        gl.store(out_ptrs, gl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty, layout=acc_layout),
                 mask=out_mask)
    else:
        if not GATED:
            w_rows = (n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))) % I  # (wrapped)
            acc_g, _ = _mainloop(x_ptr, w_ptr + expert * stride_we, rows // TOP_K, row_mask, w_rows, H, stride_xm,
                                 stride_wn, A_SMEM, W_SMEM, B_SMEM, acc_layout, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, 1,
                                 num_warps)
            acc_u = acc_g  # (unread: the epilogue below takes act(up) alone)
        elif FUSE_GATE_UP:
            # gate and up as one wgmma of 2*BLOCK_N columns: the activation tile is read from shared
            # memory once per K step, not once per half. Weight rows in groups of 8, gate's and up's in
            # turn, so that each thread's accumulator pairs split into gate and up without moving data
            acc2_layout: gl.constexpr = _acc_layout(BLOCK_M, 2 * BLOCK_N, num_warps)
            r = gl.arange(0, 2 * BLOCK_N, layout=gl.SliceLayout(1, acc2_layout))
            w_rows = (n0 + (r // 16) * 8 + r % 8) % I + ((r // 8) % 2) * I  # (wrapped: no N mask)
            acc, _ = _mainloop(x_ptr, w_ptr + expert * stride_we, rows // TOP_K, row_mask, w_rows, H, stride_xm,
                               stride_wn, A_SMEM, W_SMEM, B_SMEM, acc2_layout, BLOCK_M, 2 * BLOCK_N, BLOCK_K, STAGES,
                               1, num_warps)
            acc = gl.permute(gl.reshape(acc, [BLOCK_M, BLOCK_N // 8, 2, 8]), (0, 1, 3, 2))
            acc_g, acc_u = gl.split(gl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
            acc_g = gl.convert_layout(acc_g, acc_layout, assert_trivial=True)
            acc_u = gl.convert_layout(acc_u, acc_layout, assert_trivial=True)
        else:
            r = gl.arange(0, 2 * BLOCK_N, layout=gl.SliceLayout(1, acc_layout))  # gate rows, then up rows (wrapped)
            w_rows = gl.where(r < BLOCK_N, (n0 + r) % I, I + (n0 + r - BLOCK_N) % I)
            acc_g, acc_u = _mainloop(x_ptr, w_ptr + expert * stride_we, rows // TOP_K, row_mask, w_rows, H,
                                     stride_xm, stride_wn, A_SMEM, W_SMEM, B_SMEM, acc_layout, BLOCK_M, BLOCK_N,
                                     BLOCK_K, STAGES, 2, num_warps)

        offs_wn = offs_n % I
        s_ptrs = scale_ptr + expert * stride_se + offs_wn
        acc_g = acc_g * gl.load(s_ptrs)[None, :]
        if GATED:
            acc_u = acc_u * gl.load(s_ptrs + I)[None, :]
        if ROW_SCALE:
            inv = gl.load(x_inv_scale_ptr + rows // TOP_K, mask=row_mask, other=0.0)[:, None]
            acc_g = acc_g * inv
            if GATED:
                acc_u = acc_u * inv
        if HAS_BIAS:  # (never with MUL_ROUTED_WEIGHT: the caller checks)
            b_ptrs = bias_ptr + expert * stride_be + offs_wn
            acc_g = acc_g + gl.load(b_ptrs).to(gl.float32)[None, :]
            if GATED:
                acc_u = acc_u + gl.load(b_ptrs + I).to(gl.float32)[None, :]
        if MUL_ROUTED_WEIGHT:
            rw = gl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(gl.float32)
            acc_g = acc_g * rw[:, None]
            if GATED:
                acc_u = acc_u * rw[:, None]
        h = glu(acc_g, acc_u, ACTIVATION, GATED, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT)
        gl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=out_mask)


@gluon.jit
def moe_gate_up_wgmma_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid, num_sorted, I, H, stride_xm, stride_we, stride_wn, stride_se, stride_om,
    x_inv_scale_ptr,  # (M,) fp32, read only when ROW_SCALE (FP16_DOT: x's rows were scaled by 1 / this)
    bias_ptr, stride_be,  # [E, 2I] ([E, I] without a gate), read only when HAS_BIAS
    TOP_K: gl.constexpr, ACTIVATION: gl.constexpr, MUL_ROUTED_WEIGHT: gl.constexpr, ROW_SCALE: gl.constexpr,
    HAS_BIAS: gl.constexpr, FUSE_GATE_UP: gl.constexpr, GATED: gl.constexpr, TRIM_TAIL: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SWIGLU_ALPHA: gl.constexpr,
    SWIGLU_LIMIT: gl.constexpr, LIMIT_AFTER_ACT: gl.constexpr, A_SMEM: gl.constexpr, W_SMEM: gl.constexpr,
    B_SMEM: gl.constexpr,
    HALF_A_SMEM: gl.constexpr, num_warps: gl.constexpr,
):
    """GEMM1 (+ activation): out[M*k, I] = act(x[rows // k] @ w13[e, :I]^T) * (x[rows // k] @ w13[e, I:]^T);
    without GATED (w13 [E, I, H], up rows alone) act(x[rows // k] @ w13[e]^T)."""
    pid_m, n0 = _row_block(num_sorted, I, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    first_row = pid_m * BLOCK_M
    # TRIM_TAIL: an expert's last block whose lower half is all padding (padding ends each expert's
    # rows) runs as a block of BLOCK_M / 2 rows
    if TRIM_TAIL and gl.load(sorted_token_ids_ptr + first_row + BLOCK_M // 2) >= num_valid:
        _gate_up_tile(first_row, pid_m, n0, x_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                      block_expert_ids_ptr, num_valid, I, H, stride_xm, stride_we, stride_wn, stride_se, stride_om,
                      x_inv_scale_ptr, bias_ptr, stride_be, TOP_K, ACTIVATION, MUL_ROUTED_WEIGHT, ROW_SCALE, HAS_BIAS,
                      FUSE_GATE_UP, GATED, BLOCK_M // 2,
                      BLOCK_N, BLOCK_K, STAGES, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT, HALF_A_SMEM, W_SMEM,
                      B_SMEM, num_warps)
    else:
        _gate_up_tile(first_row, pid_m, n0, x_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                      block_expert_ids_ptr, num_valid, I, H, stride_xm, stride_we, stride_wn, stride_se, stride_om,
                      x_inv_scale_ptr, bias_ptr, stride_be, TOP_K, ACTIVATION, MUL_ROUTED_WEIGHT, ROW_SCALE, HAS_BIAS,
                      FUSE_GATE_UP, GATED, BLOCK_M,
                      BLOCK_N, BLOCK_K, STAGES, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT, A_SMEM, W_SMEM, B_SMEM,
                      num_warps)


@gluon.jit
def _down_tile(first_row, block, n0, a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
               block_expert_ids_ptr, num_valid, H, I, stride_am, stride_we, stride_wn, stride_se, stride_om,
               bias_ptr, stride_be, MUL_ROUTED_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr,
               BLOCK_K: gl.constexpr, STAGES: gl.constexpr, A_SMEM: gl.constexpr, W_SMEM: gl.constexpr,
               B_SMEM: gl.constexpr, num_warps: gl.constexpr):
    """GEMM2's BLOCK_M rows from sorted row ``first_row`` (of row block ``block``), columns from ``n0``."""
    acc_layout: gl.constexpr = _acc_layout(BLOCK_M, BLOCK_N, num_warps)
    rows, row_mask, offs_n, out_ptrs, out_mask, expert = _block(first_row, block, n0, H, sorted_token_ids_ptr,
                                                                block_expert_ids_ptr, num_valid, out_ptr, stride_om,
                                                                acc_layout, BLOCK_M, BLOCK_N)
    if expert < 0:
        gl.store(out_ptrs, gl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty, layout=acc_layout),
                 mask=out_mask)
    else:
        w_rows = (n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))) % H
        acc, _ = _mainloop(a_ptr, w_ptr + expert * stride_we, rows, row_mask, w_rows, I, stride_am, stride_wn,
                           A_SMEM, W_SMEM, B_SMEM, acc_layout, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, 1, num_warps)
        acc = acc * gl.load(scale_ptr + expert * stride_se + offs_n % H)[None, :]
        if HAS_BIAS:
            acc = acc + gl.load(bias_ptr + expert * stride_be + offs_n % H).to(gl.float32)[None, :]
        if MUL_ROUTED_WEIGHT:
            acc = acc * gl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(gl.float32)[:, None]
        gl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@gluon.jit
def moe_down_wgmma_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid, num_sorted, H, I, stride_am, stride_we, stride_wn, stride_se, stride_om,
    bias_ptr, stride_be,  # [E, H], read only when HAS_BIAS
    MUL_ROUTED_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, TRIM_TAIL: gl.constexpr, BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, A_SMEM: gl.constexpr,
    W_SMEM: gl.constexpr, B_SMEM: gl.constexpr, HALF_A_SMEM: gl.constexpr, num_warps: gl.constexpr,
):
    """GEMM2 (* routing weight): out[M*k, H] = a[rows] @ w2[e]^T (+ bias)."""
    pid_m, n0 = _row_block(num_sorted, H, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    first_row = pid_m * BLOCK_M
    if TRIM_TAIL and gl.load(sorted_token_ids_ptr + first_row + BLOCK_M // 2) >= num_valid:  # as in GEMM1
        _down_tile(first_row, pid_m, n0, a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                   block_expert_ids_ptr, num_valid, H, I, stride_am, stride_we, stride_wn, stride_se, stride_om,
                   bias_ptr, stride_be, MUL_ROUTED_WEIGHT, HAS_BIAS, BLOCK_M // 2, BLOCK_N, BLOCK_K, STAGES,
                   HALF_A_SMEM, W_SMEM, B_SMEM, num_warps)
    else:
        _down_tile(first_row, pid_m, n0, a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                   block_expert_ids_ptr, num_valid, H, I, stride_am, stride_we, stride_wn, stride_se, stride_om,
                   bias_ptr, stride_be, MUL_ROUTED_WEIGHT, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, A_SMEM, W_SMEM,
                   B_SMEM, num_warps)


def _smem_layouts(config: dict, act_dtype: torch.dtype, num_b: int) -> dict:
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    gl_dtype = _GL_DTYPES[act_dtype]
    return dict(A_SMEM=gl.NVMMASharedLayout.get_default_for([bm, bk], gl_dtype),
                HALF_A_SMEM=gl.NVMMASharedLayout.get_default_for([max(bm // 2, 8), bk], gl_dtype),
                W_SMEM=gl.NVMMASharedLayout.get_default_for([num_b * bn, bk], gl.int8),
                B_SMEM=gl.NVMMASharedLayout.get_default_for([num_b * bn, bk], gl_dtype))


def _meta(config: dict, trim_cols: int) -> dict:
    return dict(BLOCK_M=config["BLOCK_SIZE_M"], BLOCK_N=config["BLOCK_SIZE_N"], BLOCK_K=config["BLOCK_SIZE_K"],
                GROUP_M=config["GROUP_SIZE_M"], STAGES=config["num_stages"], num_warps=config["num_warps"],
                TRIM_TAIL=trim_tail(config, trim_cols))


def bias_args(w: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple:
    """A Gluon kernel's (bias_ptr, stride_be) and HAS_BIAS: the weights stand in for an absent bias (never read)."""
    return (w, 0) if bias is None else (bias, bias.stride(0)), dict(HAS_BIAS=bias is not None)


def invoke_gate_up(x, w13, w13_scale, out, topk_weights, sorted_token_ids, block_expert_ids,
                   num_tokens_post_padded, top_k, activation, mul_routed_weight, config, w13_bias=None, clamp=None):
    """GEMM1 (+ activation) as :func:`.fused_moe.invoke_gate_up`, on the Gluon kernel (w13 [E, 2I, H] with a
    gate, [E, I, H] without)."""
    inter = out.shape[1]
    gated = w13.shape[1] == 2 * inter
    num_sorted = sorted_token_ids.numel()
    grid = (triton.cdiv(num_sorted, config["BLOCK_SIZE_M"]) * triton.cdiv(inter, config["BLOCK_SIZE_N"]),)
    x, x_inv_scale = fp16_dot_input(x, w13, config)
    bias, has_bias = bias_args(w13, w13_bias)
    moe_gate_up_wgmma_kernel[grid](
        x, w13, w13_scale, out, topk_weights, sorted_token_ids, block_expert_ids, num_tokens_post_padded,
        topk_weights.numel(), num_sorted, inter, x.shape[1], x.stride(0), w13.stride(0), w13.stride(1),
        w13_scale.stride(0), out.stride(0), x_inv_scale, *bias, ROW_SCALE=x_inv_scale is not None, **has_bias,
        TOP_K=top_k, ACTIVATION=ACTIVATION_CODES[activation], MUL_ROUTED_WEIGHT=mul_routed_weight,
        FUSE_GATE_UP=gated and bool(config.get("FUSE_GATE_UP")), GATED=gated,
        **clamp_meta(activation, clamp, gated), **_meta(config, config["BLOCK_SIZE_N"]),
        **_smem_layouts(config, x.dtype, 2 if gated else 1), enable_fp_fusion=True,
    )


def invoke_down(a, w2, w2_scale, out, topk_weights, sorted_token_ids, block_expert_ids,
                num_tokens_post_padded, mul_routed_weight, config, w2_bias=None):
    """GEMM2 (* routing weight) as :func:`.fused_moe.invoke_down` without split-K, on the Gluon kernel."""
    hidden, inter = w2.shape[1], w2.shape[2]
    num_sorted = sorted_token_ids.numel()
    grid = (triton.cdiv(num_sorted, config["BLOCK_SIZE_M"]) * triton.cdiv(hidden, config["BLOCK_SIZE_N"]),)
    bias, has_bias = bias_args(w2, w2_bias)
    moe_down_wgmma_kernel[grid](
        a, w2, w2_scale, out, topk_weights, sorted_token_ids, block_expert_ids, num_tokens_post_padded,
        topk_weights.numel(), num_sorted, hidden, inter, a.stride(0), w2.stride(0), w2.stride(1),
        w2_scale.stride(0), out.stride(0), *bias, MUL_ROUTED_WEIGHT=mul_routed_weight, **has_bias,
        **_meta(config, config["BLOCK_SIZE_N"]), **_smem_layouts(config, a.dtype, 1), enable_fp_fusion=True,
    )


def sm90_ptx(which: str, config: dict, act_dtype: torch.dtype = torch.bfloat16, activation: str = "silu",
             gated: bool = True, biased: bool = False) -> str:
    """PTX of the ``"gate_up"`` or ``"down"`` kernel for ``config`` (gate_up with ``activation``, for experts
    without a gate unless ``gated``; with expert biases if ``biased``), compiled for sm_90 without a GPU
    (Triton ships the compiler and ptxas):
    to inspect the pipeline offline. Run it in a process without ``TRITON_INTERPRET``, whose patches of
    Triton's language break compilation."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    if which == "gate_up":
        kernel, num_b = moe_gate_up_wgmma_kernel, 2 if gated else 1
        constexprs = dict(TOP_K=2, ACTIVATION=ACTIVATION_CODES[activation], MUL_ROUTED_WEIGHT=False,
                          **clamp_meta(activation, None, gated),
                          ROW_SCALE=act_dtype == torch.float16, GATED=gated, HAS_BIAS=biased,
                          FUSE_GATE_UP=gated and bool(config.get("FUSE_GATE_UP")))
    else:
        kernel, num_b = moe_down_wgmma_kernel, 1
        constexprs = dict(MUL_ROUTED_WEIGHT=True, HAS_BIAS=biased)
    constexprs.update(_meta(config, config["BLOCK_SIZE_N"]), **_smem_layouts(config, act_dtype, num_b))
    act = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[act_dtype]
    ptr_types = {"w_ptr": "*i8", "scale_ptr": "*fp32", "topk_weights_ptr": "*fp32", "x_inv_scale_ptr": "*fp32",
                 "sorted_token_ids_ptr": "*i32",
                 "block_expert_ids_ptr": "*i32", "num_tokens_post_padded_ptr": "*i32"}
    signature = {name: "constexpr" if name in constexprs else ptr_types.get(name, act) if name.endswith("_ptr")
                 else "i32" for name in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if signature[name] != "constexpr"}
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, aligned), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config["num_warps"], enable_fp_fusion=True))
    return compiled.asm["ptx"]
