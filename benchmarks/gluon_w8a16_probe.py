"""Probe (Hopper, not used by the library): can a Gluon GEMM overlap the int8 -> bf16 conversion with
the tensor cores, which Triton's own pipeliner does not (benchmarks/NOTES.md items 13 and 41)?

Dense ``Y = X @ (Wq * scale)^T`` with X [M, K] bf16, Wq [N, K] int8, one fp32 scale per row of Wq.
One or two warpgroups per program (split along M). X and W tiles stream into a STAGES-deep
shared-memory ring by cp.async; each int8 tile is loaded to registers, converted, and stored into one
of two bf16 slots, and the wgmma on it is issued asynchronously with one left in flight, so
converting tile j+1 overlaps the wgmma of tile j ("db"). With bf16 weights the same kernel reads its B operand straight from the
ring: the reference for what the conversion costs. A second, warp-specialized form ("ws", below)
moves loading and conversion into their own warps; a third ("rr") keeps the converted weights out of
shared memory altogether (the weights as wgmma's register operand, from rows repacked once).

Prints a table of microseconds and TFLOP/s per shape and config for the chosen forms (db int8, db
bf16, ws int8, rr int8) and torch bf16 (cuBLAS), and checks every Gluon result against torch.

    PYTHONPATH=src python3 benchmarks/gluon_w8a16_probe.py --out benchmarks/results
"""
import argparse
import json
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from experts_int8.kernels.fused_moe import compile_for_sm90  # noqa: E402
from experts_int8.kernels.gluon_wsrr import _consumer, _fragment_layout, _ring  # noqa: E402

# Gluon names that Triton 3.7 changed (the probe ran on 3.6)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _issue_tile(x_ptr, w_ptr, x_slot, w_slot, offs_xm, offs_wn, offs_xk, offs_wk, k0, M, N, K,
                stride_xm, stride_wn):
    """cp.async of one K tile of X and W into their ring slots (rows and K masked)."""
    xk = k0 + offs_xk
    wk = k0 + offs_wk
    x_ptrs = x_ptr + offs_xm[:, None] * stride_xm + xk[None, :]
    w_ptrs = w_ptr + offs_wn[:, None] * stride_wn + wk[None, :]
    _async_load(x_slot, x_ptrs, mask=(offs_xm[:, None] < M) & (xk[None, :] < K))
    _async_load(w_slot, w_ptrs, mask=(offs_wn[:, None] < N) & (wk[None, :] < K))


@gluon.jit
def w8a16_gemm_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                      INT8: gl.constexpr, X_SMEM: gl.constexpr, W_SMEM: gl.constexpr, B_SMEM: gl.constexpr,
                      num_warps: gl.constexpr):
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    # 16-byte global reads per thread: 8 bf16 of X, 16 int8 (or 8 bf16) of W
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [num_warps, 1], [1, 0])
    W_VEC: gl.constexpr = 16 if INT8 else 8
    w_load: gl.constexpr = gl.BlockedLayout([1, W_VEC], [32 * W_VEC // BLOCK_K, BLOCK_K // W_VEC], [num_warps, 1],
                                            [1, 0])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])

    offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load))
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_load))
    offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_load))

    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)
    w_ring = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGES, BLOCK_N, BLOCK_K], W_SMEM)
    b_slots = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, BLOCK_K], B_SMEM)

    num_k = gl.cdiv(K, BLOCK_K)
    for s in gl.static_range(STAGES - 1):  # prologue: the first STAGES-1 tiles in flight
        _issue_tile(x_ptr, w_ptr, x_ring.index(s), w_ring.index(s), offs_xm, offs_wn, offs_xk, offs_wk,
                    s * BLOCK_K, M, N, K, stride_xm, stride_wn)
        async_copy.commit_group()

    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for j in range(num_k):
        slot = j % STAGES
        async_copy.wait_group(STAGES - 2)  # tile j has landed (this thread's copies) ...
        _cta_barrier()  # ... and every thread's
        if INT8:
            # registers -> bf16 -> one of two slots; the wgmma that last read this slot (tile j-2) has
            # completed: at most one wgmma is left in flight below
            w = w_ring.index(slot).load(w_load)
            b_slot = b_slots.index(j % 2)
            b_slot.store(w.to(gl.bfloat16))
            fence_async_shared()
            _cta_barrier()
            b = b_slot.permute((1, 0))
        else:
            fence_async_shared()
            b = w_ring.index(slot).permute((1, 0))
        acc = warpgroup_mma(x_ring.index(slot), b, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        # the wgmma of tile j-1 is done, in this warpgroup; the barrier extends that to all of them
        # before its ring slot takes tile j+STAGES-1
        _cta_barrier()
        nxt = j + STAGES - 1
        if nxt < num_k:
            _issue_tile(x_ptr, w_ptr, x_ring.index(nxt % STAGES), w_ring.index(nxt % STAGES), offs_xm, offs_wn,
                        offs_xk, offs_wk, nxt * BLOCK_K, M, N, K, stride_xm, stride_wn)
        async_copy.commit_group()  # (empty near the end: keeps the group count uniform)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    if INT8:
        scale = gl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0)
        acc = acc * scale[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    gl.store(y_ptrs, acc.to(gl.bfloat16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# Warp-specialized form: a loader warpgroup streams X and int8 W tiles into a ring (cp.async, each thread's
# copies counted on the slot's `loaded` barrier as they land), a converter warpgroup turns each int8
# tile into a bf16 tile in a second ring, and the default partition only waits and issues wgmma, so
# the conversion leaves the tensor cores' critical path. Per ring slot: `loaded` (X and int8 W
# landed), `converted` (bf16 W stored), `free` (arrived by the converter once it has read the int8
# tile and by the MMA partition once the wgmma reading the slot's X and bf16 W has completed).
# Phases: tile j uses slot j % STAGES in phase (j // STAGES) & 1; waits on `free` start at phase 1,
# which a fresh barrier counts as complete.
LOADER_WARPS = gl.constexpr(4)
CONVERTER_WARPS = gl.constexpr(4)


# (block sizes come from the rings' types, since constexpr arguments do not survive the trip into a
# worker partition; the loader also feeds the wsrr form below)
@gluon.jit
def _ws_loader(x_ptr, w_ptr, x_ring, w_ring, loaded, free, M, N, K, stride_xm, stride_wn):
    STAGES: gl.constexpr = x_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    BLOCK_K: gl.constexpr = x_ring.type.shape[2]
    BLOCK_N: gl.constexpr = w_ring.type.shape[1]
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [LOADER_WARPS, 1], [1, 0])
    w_load: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [LOADER_WARPS, 1], [1, 0])
    offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load))
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_load))
    offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_load))
    for j in range(gl.cdiv(K, BLOCK_K)):
        slot = j % STAGES
        mbarrier.wait(free.index(slot), ((j // STAGES) & 1) ^ 1)
        _issue_tile(x_ptr, w_ptr, x_ring.index(slot), w_ring.index(slot), offs_xm, offs_wn, offs_xk, offs_wk,
                    j * BLOCK_K, M, N, K, stride_xm, stride_wn)
        async_copy.mbarrier_arrive(loaded.index(slot), increment_count=False)  # per thread, when its copies land


@gluon.jit
def _ws_converter(x_ptr, w_ptr, x_ring, w_ring, b_ring, loaded, converted, free, consumed, M, N, K, stride_xm,
                  stride_wn):
    STAGES: gl.constexpr = w_ring.type.shape[0]
    BLOCK_K: gl.constexpr = w_ring.type.shape[2]
    w_reg: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [4, 1], [1, 0])
    for j in range(gl.cdiv(K, BLOCK_K)):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(loaded.index(slot), phase)
        mbarrier.wait(consumed.index(slot), phase ^ 1)  # the wgmma that last read this bf16 slot is done
        w = w_ring.index(slot).load(w_reg)
        _cta_barrier()  # every converter thread has read the int8 tile ...
        mbarrier.arrive(free.index(slot))  # ... so the loader may refill it (with the MMA side's arrival)
        b_ring.index(slot).store(w.to(gl.bfloat16))
        fence_async_shared()  # generic-proxy stores before the wgmma's async-proxy reads
        _cta_barrier()
        mbarrier.arrive(converted.index(slot))


@gluon.jit
def _ws_mma(x_ring, b_ring, loaded, converted, free, consumed, K, acc_layout: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
    for j in range(gl.cdiv(K, BLOCK_K)):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(loaded.index(slot), phase)
        mbarrier.wait(converted.index(slot), phase)
        fence_async_shared()  # X landed by cp.async (generic proxy), read by the wgmma
        acc = warpgroup_mma(x_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        # tile j-1's wgmma has completed: its X slot and bf16 slot may be reused
        prev = (j + STAGES - 1) % STAGES
        _cta_barrier()
        mbarrier.arrive(free.index(prev), pred=j > 0)
        mbarrier.arrive(consumed.index(prev), pred=j > 0)
    return (warpgroup_mma_wait(num_outstanding=0, deps=(acc, )), )  # warp_specialize returns a tuple


@gluon.jit
def w8a16_gemm_ws_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                         X_SMEM: gl.constexpr, W_SMEM: gl.constexpr, B_SMEM: gl.constexpr, num_warps: gl.constexpr):
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_K], W_SMEM)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K], B_SMEM)
    loaded = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    converted = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    consumed = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(loaded.index(s), count=32 * LOADER_WARPS)  # one async arrival per loader thread
        mbarrier.init(converted.index(s), count=1)
        mbarrier.init(free.index(s), count=2)  # converter (int8 tile read) + MMA (wgmma done)
        mbarrier.init(consumed.index(s), count=1)

    converter_args = (x_ptr, w_ptr, x_ring, w_ring, b_ring, loaded, converted, free, consumed, M, N, K, stride_xm,
                      stride_wn)
    acc, = gl.warp_specialize([
        (_ws_mma, (x_ring, b_ring, loaded, converted, free, consumed, K, acc_layout, BLOCK_M, BLOCK_N, BLOCK_K,
                   STAGES)),
        (_ws_loader, (x_ptr, w_ptr, x_ring, w_ring, loaded, free, M, N, K, stride_xm, stride_wn)),
        (_ws_converter, converter_args),
    ], [LOADER_WARPS, CONVERTER_WARPS], [80, 96])

    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    scale = gl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc * scale[None, :]).to(gl.bfloat16)
    gl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# Register form from repacked rows ("rr", benchmarks/NOTES.md item 54): the product computed transposed,
# Y^T = W X^T, so the weights are wgmma's register operand; each thread loads its own fragment of a
# weight tile straight from global memory (16 contiguous bytes a row, thanks to the repack below),
# converts it in registers and never writes it to shared memory. Only X goes through the ring.
# Repack (host, once): within every 64-wide K block, memory position p = 16c + 4s + 2e1 + e0 holds
# k = 16s + 8e1 + 2c + e0, so thread c of a quad finds its k values of the four k16 steps together.
def repack_rows(w: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` (K a multiple of 64) -> the same values in the register-fragment order above."""
    n, k = w.shape
    return w.reshape(n, k // 64, 4, 2, 4, 2).permute(0, 1, 4, 2, 3, 5).reshape(n, k).contiguous()


@gluon.jit
def _rr_mma(w_tile, x_slot, acc, a_layout: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
            STAGES: gl.constexpr):
    """A repacked int8 tile relabelled as the bf16 register operand (memory positions [c, s, e1, e0] as
    logical k [s, e1, c, e0]: register renaming only), then, once its X tile has landed, its wgmma
    issued. Returns the accumulator and the operand, which must stay untouched until that wgmma retires."""
    w6 = gl.reshape(w_tile.to(gl.bfloat16), [BLOCK_N, BLOCK_K // 64, 4, 4, 2, 2])
    a = gl.convert_layout(gl.reshape(gl.permute(w6, [0, 1, 3, 4, 2, 5]), [BLOCK_N, BLOCK_K]), a_layout)
    async_copy.wait_group(STAGES - 2)
    _cta_barrier()
    fence_async_shared()  # X landed by cp.async (generic proxy), read by the wgmma (async proxy)
    return warpgroup_mma(a, x_slot.permute((1, 0)), acc, is_async=True), a


@gluon.jit
def _rr_refill(x_ptr, x_ring, offs_xm, offs_xk, nxt, num_k, M, K, stride_xm, BLOCK_K: gl.constexpr,
               STAGES: gl.constexpr):
    """Tile ``nxt`` of X into its ring slot, once every warpgroup is past the wgmma that last read it."""
    _cta_barrier()
    if nxt < num_k:
        xk = nxt * BLOCK_K + offs_xk
        _async_load(x_ring.index(nxt % STAGES), x_ptr + offs_xm[:, None] * stride_xm + xk[None, :],
                    mask=(offs_xm[:, None] < M) & (xk[None, :] < K))
    async_copy.commit_group()  # (empty near the end: keeps the group count uniform)


@gluon.jit
def w8a16_gemm_rr_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                         OVERLAP: gl.constexpr, X_SMEM: gl.constexpr, num_warps: gl.constexpr):
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [num_warps, 1], [1, 0])
    # accumulator rows: weight rows (wgmma's M, 64 per warpgroup); columns: tokens (wgmma's N)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _fragment_layout(gl.to_linear_layout(a_layout, [BLOCK_N, BLOCK_K]))

    offs_xm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load))
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    offs_wn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_layout))
    offs_wp = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_layout))
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)
    w_ptrs = w_ptr + offs_wn[:, None] * stride_wn + offs_wp[None, :]
    w_mask = offs_wn[:, None] < N

    num_k = gl.cdiv(K, BLOCK_K)  # (K a multiple of 64: the repack's blocks; of 2 * BLOCK_K with OVERLAP)
    for s in gl.static_range(STAGES - 1):
        xk = s * BLOCK_K + offs_xk
        _async_load(x_ring.index(s), x_ptr + offs_xm[:, None] * stride_xm + xk[None, :],
                    mask=(offs_xm[:, None] < M) & (xk[None, :] < K))
        async_copy.commit_group()
    acc = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    w_next = gl.load(w_ptrs, mask=w_mask, other=0)
    if OVERLAP:
        # two register operands in turn: tile j's wgmma stays in flight while tile j+1 is converted
        # into the other one, and each operand is kept (a dependency of the wait) until its wgmma retires
        a_odd = gl.zeros((BLOCK_N, BLOCK_K), dtype=gl.bfloat16, layout=a_layout)
        for i in range(num_k // 2):
            j = 2 * i
            w_tile = w_next
            w_next = gl.load(w_ptrs + (j + 1) * BLOCK_K, mask=w_mask, other=0)
            acc, a_even = _rr_mma(w_tile, x_ring.index(j % STAGES), acc, a_layout, BLOCK_N, BLOCK_K, STAGES)
            acc, a_odd = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_odd))  # tile j-1 retired
            _rr_refill(x_ptr, x_ring, offs_xm, offs_xk, j + STAGES - 1, num_k, M, K, stride_xm, BLOCK_K, STAGES)
            w_tile = w_next
            if j + 2 < num_k:
                w_next = gl.load(w_ptrs + (j + 2) * BLOCK_K, mask=w_mask, other=0)
            acc, a_odd = _rr_mma(w_tile, x_ring.index((j + 1) % STAGES), acc, a_layout, BLOCK_N, BLOCK_K, STAGES)
            acc, a_even = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_even))  # tile j retired
            _rr_refill(x_ptr, x_ring, offs_xm, offs_xk, j + STAGES, num_k, M, K, stride_xm, BLOCK_K, STAGES)
        acc, a_odd = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_odd))
    else:
        for j in range(num_k):
            w_tile = w_next
            if j + 1 < num_k:  # the next weight tile in flight (in registers) while this one computes
                w_next = gl.load(w_ptrs + (j + 1) * BLOCK_K, mask=w_mask, other=0)
            acc, a = _rr_mma(w_tile, x_ring.index(j % STAGES), acc, a_layout, BLOCK_N, BLOCK_K, STAGES)
            # none left in flight: the next conversion may reuse this operand's registers
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
            _rr_refill(x_ptr, x_ring, offs_xm, offs_xk, j + STAGES - 1, num_k, M, K, stride_xm, BLOCK_K, STAGES)

    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout))
    scale = gl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc * scale[:, None]).to(gl.bfloat16)
    gl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], y,
             mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


# Register form, warp-specialized ("wsrr", benchmarks/NOTES.md item 94; the library's kernels/gluon_wsrr.py
# grew from it and now lends it its ring and consumer partition): rr2's register operands, but the
# repacked int8 weight tiles and the X tiles both arrive through a shared-memory ring filled by the ws
# form's loader partition (_ws_loader), so the consumer warpgroups hold no weight tile in flight (what
# limited rr and rr2, item 57): each reads its fragment (16 contiguous bytes a row) just before
# converting it, and they take the registers the loader gives up (setmaxnreg).
@gluon.jit
def w8a16_gemm_wsrr_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                           LOADER_REGS: gl.constexpr, X_SMEM: gl.constexpr, num_warps: gl.constexpr):
    # accumulator rows: weight rows (wgmma's M, 64 per warpgroup); columns: tokens (wgmma's N)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    x_ring, w_ring, loaded, free = _ring(STAGES, BLOCK_M, BLOCK_N, BLOCK_K, gl.bfloat16, X_SMEM)
    acc, = gl.warp_specialize([
        (_consumer, (x_ring, w_ring, loaded, free, K, acc_layout, gl.bfloat16, False)),
        (_ws_loader, (x_ptr, w_ptr, x_ring, w_ring, loaded, free, M, N, K, stride_xm, stride_wn)),
    ], [LOADER_WARPS], [LOADER_REGS])

    offs_n = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    offs_m = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout))
    scale = gl.load(scale_ptr + offs_n, mask=offs_n < N, other=0.0)
    y = (acc * scale[:, None]).to(gl.bfloat16)
    gl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], y,
             mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


def w8a16_gemm(x, w, scale=None, *, block_m=128, block_n=128, block_k=64, stages=4, num_warps=4):
    """``x @ (w * scale[:, None])^T`` for int8 ``w`` with fp32 ``scale``, or ``x @ w^T`` for bf16 ``w``."""
    m, k = x.shape
    n = w.shape[0]
    int8 = w.dtype == torch.int8
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_smem = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.int8 if int8 else gl.bfloat16)
    b_smem = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    w8a16_gemm_kernel[grid](x, w, scale if int8 else w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                            block_m, block_n, block_k, stages, int8, x_smem, w_smem, b_smem, num_warps=num_warps)
    return y


def w8a16_gemm_ws(x, w, scale, *, block_m=128, block_n=128, block_k=64, stages=4, num_warps=4):
    """The warp-specialized form (int8 ``w`` only); ``num_warps`` is the MMA partition's."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_smem = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.int8)
    b_smem = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    # registers: the kernel's warps (MMA, loader and converter groups, each rounded up to 4) share 64K
    total_warps = num_warps + 4 + 4
    w8a16_gemm_ws_kernel[grid](x, w, scale, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                               block_m, block_n, block_k, stages, x_smem, w_smem, b_smem, num_warps=num_warps,
                               maxnreg=min(255, 65536 // (32 * total_warps)) // 8 * 8)
    return y


def w8a16_gemm_rr(x, w_repacked, scale, *, block_m=128, block_n=128, block_k=64, stages=3, num_warps=8,
                  overlap=False):
    """The register form on ``repack_rows(w)``: ``block_m`` tokens are wgmma's N, ``block_n`` weight rows its M;
    ``overlap``: two register operands in turn, one wgmma in flight during the next tile's conversion."""
    m, k = x.shape
    n = w_repacked.shape[0]
    if k % 64 or block_k % 64 or (overlap and k % (2 * block_k)):
        raise ValueError("the repacked layout works in 64-wide K blocks (an even number of K tiles to overlap)")
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    w8a16_gemm_rr_kernel[grid](x, w_repacked, scale, y, m, n, k, x.stride(0), w_repacked.stride(0), y.stride(0),
                               block_m, block_n, block_k, stages, overlap, x_smem, num_warps=num_warps)
    return y


def w8a16_gemm_wsrr(x, w_repacked, scale, *, block_m=256, block_n=128, block_k=64, stages=4, num_warps=8,
                    loader_regs=72):
    """The warp-specialized register form on ``repack_rows(w)``: ``block_m`` tokens (wgmma's N), ``block_n``
    weight rows (wgmma's M, 64 a warpgroup of the ``num_warps`` consumer warps), the ws form's loader
    partition (LOADER_WARPS warps) with ``loader_regs`` registers a thread; the consumers get the rest."""
    m, k = x.shape
    n = w_repacked.shape[0]
    if k % (2 * block_k) or block_k % 64:  # (an odd tile count would drop the last tile)
        raise ValueError("the repacked layout works in 64-wide K blocks, and the loop in pairs of K tiles")
    if stages < 2:  # one slot: the loader would wait for a slot the consumers free only after the next tile
        raise ValueError("wsrr needs at least two ring stages")
    if block_n != 16 * num_warps or w_repacked.dtype != torch.int8 or x.stride(1) != 1 or w_repacked.stride(1) != 1:
        raise ValueError("wsrr: 64 weight rows a warpgroup (block_n = 16 x num_warps), int8 weights, unit-stride rows")
    y = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    w8a16_gemm_wsrr_kernel[grid](x, w_repacked, scale, y, m, n, k, x.stride(0), w_repacked.stride(0), y.stride(0),
                                 block_m, block_n, block_k, stages, loader_regs, x_smem, num_warps=num_warps)
    return y


def sm90_cubin(kernel, constexprs: dict, pointer_types: dict, num_warps: int) -> bytes:
    """``kernel`` (a Gluon kernel of this file) compiled for sm_90 without a GPU (fused_moe.compile_for_sm90),
    for benchmarks/wgmma_operand_check.py (its SASS by cuobjdump)."""
    return compile_for_sm90(kernel, constexprs, pointer_types, num_warps).asm["cubin"]


def bench_us(fn, reps=50):
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1024x28672x4096,4096x28672x4096,1024x4096x14336,4096x4096x14336",
                    help="MxNxK, comma-separated (defaults: mixtral-8x7b gate_up and down per expert)")
    ap.add_argument("--configs", default="128x128x64x3x4,256x64x64x3x4,128x128x64x3x8,256x128x64x3x8,128x256x64x3x8",
                    help="BMxBNxBKxSTAGESxWARPS, comma-separated (WARPS: the MMA partition's in the ws form)")
    ap.add_argument("--kernels", default="db,rr,rr2",
                    help="db (double-buffered), ws (warp-specialized), rr (register form, repacked), rr2 (rr with "
                         "the next tile's conversion overlapping the wgmma), wsrr (rr2 fed by a loader partition "
                         "through shared memory), comma-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    torch.manual_seed(0)
    rows = []
    names = [f"{kernel} {dtype}" for kernel, dtype in (("db", "int8"), ("db", "bf16"), ("ws", "int8"), ("rr", "int8"),
                                                       ("rr2", "int8"), ("wsrr", "int8")) if kernel in kernels]
    print(f"{'M':>5} {'N':>6} {'K':>6} {'config':>14} | " + " | ".join(f"{n:>16}" for n in names)
          + f" | {'torch bf16':>16} | ok")
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda") * 0.02
        scale = w.abs().amax(1) / 127
        wq = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        wf = (wq.float() * scale[:, None]).to(torch.bfloat16)
        wr = repack_rows(wq)
        ref = x @ wf.t()
        tol = 0.05 * ref.float().abs().max().item()
        t_torch = bench_us(lambda: x @ wf.t())
        tf = lambda t: 2 * m * n * k / t / 1e6 if t else 0  # noqa: E731  TFLOP/s from microseconds
        for cfg in args.configs.split(","):
            bm, bn, bk, st, nw = (int(v) for v in cfg.split("x"))
            kw = dict(block_m=bm, block_n=bn, block_k=bk, stages=st, num_warps=nw)
            row = dict(M=m, N=n, K=k, config=cfg, torch_bf16_us=t_torch)
            runs = {"db_int8": ("db", lambda: w8a16_gemm(x, wq, scale, **kw)),
                    "db_bf16": ("db", lambda: w8a16_gemm(x, wf, **kw)),
                    "ws_int8": ("ws", lambda: w8a16_gemm_ws(x, wq, scale, **kw)),
                    "rr_int8": ("rr", lambda: w8a16_gemm_rr(x, wr, scale, **kw)),  # rr, rr2: not yet on a GPU
                    "rr2_int8": ("rr2", lambda: w8a16_gemm_rr(x, wr, scale, overlap=True, **kw)),
                    "wsrr_int8": ("wsrr", lambda: w8a16_gemm_wsrr(x, wr, scale, **kw))}
            runs = {name: run for name, run in runs.items() if run[0] in kernels}
            for name, (kernel, fn) in runs.items():
                try:
                    err = (fn().float() - ref.float()).abs().max().item()
                    row[f"{name}_us"], row[f"{name}_err"] = bench_us(fn), err
                except Exception as exc:  # a config this kernel cannot compile: recorded, the rest still runs
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            ok = all(f"{nm}_err" in row and row[f"{nm}_err"] <= tol for nm in runs)  # (a run that raised: not ok)
            row["correct"] = ok
            cells = " | ".join(f"{row[f'{nm}_us']:8.1f} us {tf(row[f'{nm}_us']):4.0f} TF" if f"{nm}_us" in row
                               else f"{'-':>16}" for nm in runs)
            print(f"{m:5d} {n:6d} {k:6d} {cfg:>14} | {cells} | {t_torch:8.1f} us {tf(t_torch):4.0f} TF | "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
            if args.out:  # after every row: a hang or crash later keeps what was measured
                save(args.out, rows)


def save(out_dir, rows):
    from experts_int8.bench import library_commit
    with open(os.path.join(out_dir, "gluon_w8a16_probe.json"), "w") as f:
        json.dump(dict(benchmark="gluon_w8a16_probe", gpu=torch.cuda.get_device_name(), commit=library_commit()[0],
                       triton=triton.__version__, command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
