"""Probe (Hopper, not used by the library): the MoE gate/up GEMM in the register form of
benchmarks/NOTES.md items 54-55, against the library's own gate/up launch on the same aligned rows.

The expert rows are repacked once (``gluon_w8a16_probe.repack_rows``); each program takes BLOCK_M
aligned (token, slot) rows of one expert and BLOCK_N columns of I, gathers the token rows of x into a
cp.async ring, loads its gate and up weight fragments from global memory straight into registers,
and issues two wgmmas with the weights as the register operand (the product transposed: tokens are
wgmma's N), then applies the scales and SiLU(gate) * up and writes its tile of h. No converted weight
tile ever goes through shared memory.

A tile with the suffix w runs the warp-specialized form instead ("wsrr", NOTES item 95): a loader
partition brings the token rows and the repacked weight rows into a shared-memory ring, the consumer
warpgroups read each weight fragment from it just before converting it (no weight tile held in
registers in flight), two pairs of register operands in turn. ``--gemm down`` times the down GEMM in
that form (``moe_down_wsrr_kernel``; tiles with the suffix w: pair rows x columns of H) against the
library's down launch.

Prints, per shape and M: the library's int8 gate/up (the shipped config: Triton or Gluon), the
library's bf16 gate/up (the shipped bf16 config), the register form, and whether it matches the
library's int8 output.

    PYTHONPATH=src python3 benchmarks/gluon_moe_rr_probe.py --out benchmarks/results

At decode (benchmarks/NOTES.md item 79) the same kernel keeps weights out of shared memory where the
library's decode GEMMs stage every weight tile through it; tokens are wgmma's N (16):

    PYTHONPATH=src python3 benchmarks/gluon_moe_rr_probe.py --m 1,2,4,8 --tiles 16x64x3x4,16x64x3x4d2,\
        16x64x3x4h,16x64x3x4d2h,16x128x3x8d2h --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
import triton  # noqa: E402
from gluon_w8a16_probe import (LOADER_WARPS, _async_load, _cta_barrier, _repacked_layout, _wsrr_mma,  # noqa: E402
                               _wsrr_ring, bench_us, permute_k, repack_rows)
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier,  # noqa: E402
                                                              warpgroup_mma, warpgroup_mma_wait)

from experts_int8 import bench, quantize_weights, select_experts  # noqa: E402
from experts_int8.kernels import configs, fused_moe, gluon_moe  # noqa: E402
from experts_int8.kernels.align import align_block_size  # noqa: E402
from experts_int8.kernels.fused_moe import INT8_TO_FP16_PTX, invoke_fp16_rows  # noqa: E402
from experts_int8.kernels.gluon_moe import _row_block  # noqa: E402


@gluon.jit
def _relabel(w_tile, a_layout: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, FP16: gl.constexpr):
    """A repacked int8 tile as the bf16 (fp16: by the library's PTX) register operand in logical K
    order (register renaming only)."""
    if FP16:
        w = gl.inline_asm_elementwise(INT8_TO_FP16_PTX, "=r,=r,r", [w_tile], dtype=gl.float16, is_pure=True, pack=4)
    else:
        w = w_tile.to(gl.bfloat16)
    w6 = gl.reshape(w, [BLOCK_N, BLOCK_K // 64, 4, 4, 2, 2])
    return gl.convert_layout(gl.reshape(gl.permute(w6, [0, 1, 3, 4, 2, 5]), [BLOCK_N, BLOCK_K]), a_layout)


@gluon.jit
def moe_gate_up_rr_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
                          num_tokens_post_padded_ptr, num_valid, num_sorted, I, H, stride_xm, stride_we, stride_wn,
                          stride_se, stride_om, x_inv_scale_ptr, TOP_K: gl.constexpr, BLOCK_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                          X_SMEM: gl.constexpr, FP16: gl.constexpr, DEPTH: gl.constexpr, num_warps: gl.constexpr):
    """FP16: x holds fp16 rows scaled by 1 / x_inv_scale (fused_moe.invoke_fp16_rows) and the weights
    convert to fp16; DEPTH: weight tiles in flight in registers ahead of the one converting (1 or 2)."""
    pid_m, n0 = _row_block(num_sorted, I, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [num_warps, 1], [1, 0])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _repacked_layout(gl.to_linear_layout(a_layout, [BLOCK_N, BLOCK_K]))
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)

    rows = gl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load)))
    row_mask = rows < num_valid
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    x_ptrs = x_ptr + (rows // TOP_K).to(gl.int64)[:, None] * stride_xm + offs_xk[None, :]
    offs_wn = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_layout))
    offs_wp = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_layout))
    g_ptrs = w_ptr + expert * stride_we + offs_wn.to(gl.int64)[:, None] * stride_wn + offs_wp[None, :]
    u_ptrs = g_ptrs + I * stride_wn
    x_ring = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)

    num_k = gl.cdiv(H, BLOCK_K)  # (H a multiple of 64: the repack's blocks)
    for s in gl.static_range(STAGES - 1):
        _async_load(x_ring.index(s), x_ptrs + s * BLOCK_K,
                    mask=row_mask[:, None] & (offs_xk[None, :] + s * BLOCK_K < H))
        async_copy.commit_group()
    acc_g = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    acc_u = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    g_next = gl.load(g_ptrs)  # (I a multiple of BLOCK_N: no mask, which keeps the loads 16 bytes wide)
    u_next = gl.load(u_ptrs)
    g_after = g_next  # DEPTH 2: the tile after the next one (a copy until loaded)
    u_after = u_next
    if DEPTH == 2:
        if num_k > 1:
            g_after = gl.load(g_ptrs + BLOCK_K)
            u_after = gl.load(u_ptrs + BLOCK_K)
    for j in range(num_k):
        slot = j % STAGES
        g_tile, u_tile = g_next, u_next
        if DEPTH == 2:  # two tiles in flight (in registers) during this tile's conversion and wgmmas
            g_next, u_next = g_after, u_after
            if j + 2 < num_k:
                g_after = gl.load(g_ptrs + (j + 2) * BLOCK_K)
                u_after = gl.load(u_ptrs + (j + 2) * BLOCK_K)
        else:
            if j + 1 < num_k:  # the next weight tiles in flight (in registers) during this tile's wgmmas
                g_next = gl.load(g_ptrs + (j + 1) * BLOCK_K)
                u_next = gl.load(u_ptrs + (j + 1) * BLOCK_K)
        a_g = _relabel(g_tile, a_layout, BLOCK_N, BLOCK_K, FP16)
        a_u = _relabel(u_tile, a_layout, BLOCK_N, BLOCK_K, FP16)
        async_copy.wait_group(STAGES - 2)
        _cta_barrier()
        fence_async_shared()
        x_t = x_ring.index(slot).permute((1, 0))
        acc_g = warpgroup_mma(a_g, x_t, acc_g, is_async=True)
        acc_u = warpgroup_mma(a_u, x_t, acc_u, is_async=True)
        # none left in flight: the wgmmas read their weight operands from registers, which the next
        # tile's conversion would reuse (the next tile's loads are in flight all the same)
        acc_g, acc_u, a_g, a_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u, a_g, a_u))
        _cta_barrier()  # every warpgroup is past tile j's wgmmas before an X slot is refilled
        nxt = j + STAGES - 1
        if nxt < num_k:
            _async_load(x_ring.index(nxt % STAGES), x_ptrs + nxt * BLOCK_K,
                        mask=row_mask[:, None] & (offs_xk[None, :] + nxt * BLOCK_K < H))
        async_copy.commit_group()
    async_copy.wait_group(0)

    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    out_rows = gl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout)))
    n_mask = offs_n < I
    g = acc_g * gl.load(scale_ptr + expert * stride_se + offs_n, mask=n_mask, other=0.0)[:, None]
    u = acc_u * gl.load(scale_ptr + expert * stride_se + I + offs_n, mask=n_mask, other=0.0)[:, None]
    if FP16:  # undo the rows' power-of-two scales (columns of the transposed product are tokens)
        inv = gl.load(x_inv_scale_ptr + out_rows // TOP_K, mask=out_rows < num_valid, other=0.0)[None, :]
        g = g * inv
        u = u * inv
    h = g / (1.0 + gl.exp(-g)) * u
    gl.store(out_ptr + out_rows.to(gl.int64)[None, :] * stride_om + offs_n[:, None], h.to(gl.bfloat16),
             mask=(out_rows[None, :] < num_valid) & n_mask[:, None])


def gate_up_rr(x, w13r, w13_scale, sorted_ids, block_experts, num_post, top_k, out, *, block_m, block_n=128,
               block_k=64, group_m=8, stages=3, num_warps=8, x_inv_scale=None, depth=1):
    """``x`` bf16, or fp16 rows scaled by ``1 / x_inv_scale`` (then the weights convert to fp16)."""
    num_experts, two_i, hidden = w13r.shape
    inter = two_i // 2
    if hidden % 64 or block_k % 64 or inter % block_n:
        raise ValueError("the repacked layout works in 64-wide K blocks, on whole column tiles of I")
    fp16 = x.dtype == torch.float16
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float16 if fp16 else gl.bfloat16)
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(inter, block_n),)
    moe_gate_up_rr_kernel[grid](x, w13r, w13_scale, out, sorted_ids, block_experts, num_post, top_k * x.shape[0],
                                sorted_ids.numel(), inter, hidden, x.stride(0), w13r.stride(0), w13r.stride(1),
                                w13_scale.stride(0), out.stride(0), x_inv_scale if fp16 else w13_scale, top_k,
                                block_m, block_n, block_k, group_m, stages, x_smem, fp16, depth, num_warps=num_warps)
    return out


# The warp-specialized register form ("wsrr", benchmarks/NOTES.md item 95), gluon_w8a16_probe's wsrr in
# the MoE layout: a loader partition gathers the block's token rows of x and brings the expert's
# repacked gate and up weight rows (one ring slot: BLOCK_N gate rows, then BLOCK_N up rows) by cp.async;
# the consumer warpgroups read each fragment from shared memory just before converting it, and keep
# one K tile's two wgmmas in flight with two pairs of register operands in turn. Same barriers as the
# dense form: `loaded` (128 loader arrivals a slot), `free` (one arrival, once both warpgroups have
# retired the wgmmas that read the slot's x tile, after reading its weights).
@gluon.jit
def _moe_wsrr_loader(x_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, first_row, n0, expert,
                     num_valid, top_k, first_rows, second_offset, H, stride_xm, stride_we, stride_wn,
                     INTERLEAVED: gl.constexpr = False):
    """Token rows sorted_token_ids // top_k of x; weight rows n0 + r for the slot's first ``first_rows``
    rows, n0 + second_offset + r - first_rows after them (gate_up: BLOCK_N gate rows, then the up rows
    I further on; down: all rows of one block, first_rows = the slot's rows); K = H here.
    INTERLEAVED: gate and up rows 8 apart (slot row r: column n0 + 8 (r // 16) + r % 8, of up when
    r % 16 >= 8, second_offset further on), so a thread's accumulator rows r and r + 8 pair up."""
    STAGES: gl.constexpr = x_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    BLOCK_K: gl.constexpr = x_ring.type.shape[2]
    BLOCK_N2: gl.constexpr = w_ring.type.shape[1]
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [LOADER_WARPS, 1], [1, 0])
    w_load: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [LOADER_WARPS, 1], [1, 0])
    rows = gl.load(sorted_token_ids_ptr + first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load)))
    row_mask = rows < num_valid
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    x_ptrs = x_ptr + (rows // top_k).to(gl.int64)[:, None] * stride_xm + offs_xk[None, :]
    r = gl.arange(0, BLOCK_N2, layout=gl.SliceLayout(1, w_load))
    if INTERLEAVED:
        w_rows = n0 + (r // 16) * 8 + r % 8 + ((r // 8) % 2) * second_offset
    else:
        w_rows = gl.where(r < first_rows, n0 + r, n0 + second_offset + r - first_rows)
    offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_load))
    w_ptrs = w_ptr + expert * stride_we + w_rows.to(gl.int64)[:, None] * stride_wn + offs_wk[None, :]
    for j in range(gl.cdiv(H, BLOCK_K)):
        slot = j % STAGES
        mbarrier.wait(free.index(slot), ((j // STAGES) & 1) ^ 1)
        _async_load(x_ring.index(slot), x_ptrs + j * BLOCK_K,
                    mask=row_mask[:, None] & (offs_xk[None, :] + j * BLOCK_K < H))
        _async_load(w_ring.index(slot), w_ptrs + j * BLOCK_K)  # (whole tiles: H and I checked by the wrapper)
        async_copy.mbarrier_arrive(loaded.index(slot), increment_count=False)


@gluon.jit
def _moe_wsrr_operands(w_ring, loaded, j, w_layout: gl.constexpr, a_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                       BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """Tile j's gate and up fragments, once its slot has landed, as bf16 register operands."""
    slot = j % STAGES
    mbarrier.wait(loaded.index(slot), (j // STAGES) & 1)
    w_slot = w_ring.index(slot)
    g = _relabel(w_slot.slice(0, BLOCK_N).load(w_layout), a_layout, BLOCK_N, BLOCK_K, False)
    u = _relabel(w_slot.slice(BLOCK_N, BLOCK_N).load(w_layout), a_layout, BLOCK_N, BLOCK_K, False)
    return g, u


@gluon.jit
def _moe_wsrr_mma(x_ring, w_ring, loaded, free, H, acc_layout: gl.constexpr, a_layout: gl.constexpr,
                  w_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                  STAGES: gl.constexpr):
    acc_g = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    acc_u = gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    g_odd = gl.zeros((BLOCK_N, BLOCK_K), dtype=gl.bfloat16, layout=a_layout)
    u_odd = gl.zeros((BLOCK_N, BLOCK_K), dtype=gl.bfloat16, layout=a_layout)
    num_k = gl.cdiv(H, BLOCK_K)  # (even: the wrapper checks)
    for i in range(num_k // 2):
        j = 2 * i
        g_even, u_even = _moe_wsrr_operands(w_ring, loaded, j, w_layout, a_layout, BLOCK_N, BLOCK_K, STAGES)
        fence_async_shared()  # x landed by cp.async (generic proxy), read by the wgmmas (async proxy)
        x_t = x_ring.index(j % STAGES).permute((1, 0))
        acc_g = warpgroup_mma(g_even, x_t, acc_g, is_async=True)
        acc_u = warpgroup_mma(u_even, x_t, acc_u, is_async=True)
        acc_g, acc_u, g_odd, u_odd = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u, g_odd, u_odd))
        _cta_barrier()  # tile j-1's wgmmas retired in both warpgroups
        mbarrier.arrive(free.index((j + STAGES - 1) % STAGES), pred=j > 0)
        g_odd, u_odd = _moe_wsrr_operands(w_ring, loaded, j + 1, w_layout, a_layout, BLOCK_N, BLOCK_K, STAGES)
        fence_async_shared()
        x_t = x_ring.index((j + 1) % STAGES).permute((1, 0))
        acc_g = warpgroup_mma(g_odd, x_t, acc_g, is_async=True)
        acc_u = warpgroup_mma(u_odd, x_t, acc_u, is_async=True)
        acc_g, acc_u, g_even, u_even = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u, g_even, u_even))
        _cta_barrier()  # tile j's
        mbarrier.arrive(free.index(j % STAGES))
    acc_g, acc_u, g_odd, u_odd = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u, g_odd, u_odd))
    return acc_g, acc_u


@gluon.jit
def _moe_wsrr_out(out_ptr, sorted_token_ids_ptr, pid_m, n0, stride_om, acc_layout: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The block's pair rows and the addresses of its transposed output tile (columns of I x rows)."""
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    rows = gl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_layout)))
    return rows, out_ptr + rows.to(gl.int64)[None, :] * stride_om + offs_n[:, None]


@gluon.jit
def _moe_wsrr_zeros(out_ptr, sorted_token_ids_ptr, pid_m, n0, num_valid, stride_om, acc_layout: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Zeros into the block's output tile (an expert not on this rank)."""
    out_rows, out_ptrs = _moe_wsrr_out(out_ptr, sorted_token_ids_ptr, pid_m, n0, stride_om, acc_layout, BLOCK_M,
                                       BLOCK_N)
    gl.store(out_ptrs, gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.bfloat16, layout=acc_layout),
             mask=out_rows[None, :] < num_valid)


@gluon.jit
def moe_gate_up_wsrr_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
                            num_tokens_post_padded_ptr, num_valid, num_sorted, I, H, stride_xm, stride_we, stride_wn,
                            stride_se, stride_om, top_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                            LOADER_REGS: gl.constexpr, X_SMEM: gl.constexpr, W_SMEM: gl.constexpr,
                            num_warps: gl.constexpr):
    pid_m, n0 = _row_block(num_sorted, I, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _repacked_layout(gl.to_linear_layout(a_layout, [BLOCK_N, BLOCK_K]))
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)
    if expert < 0:  # not on this rank: zeros, as the library's kernels write
        _moe_wsrr_zeros(out_ptr, sorted_token_ids_ptr, pid_m, n0, num_valid, stride_om, acc_layout, BLOCK_M, BLOCK_N)
        return
    x_ring, w_ring, loaded, free = _wsrr_ring(STAGES, BLOCK_M, 2 * BLOCK_N, BLOCK_K, X_SMEM, W_SMEM)
    acc_g, acc_u = gl.warp_specialize([
        (_moe_wsrr_mma, (x_ring, w_ring, loaded, free, H, acc_layout, a_layout, w_layout, BLOCK_M, BLOCK_N, BLOCK_K,
                         STAGES)),
        (_moe_wsrr_loader, (x_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, pid_m * BLOCK_M, n0,
                            expert, num_valid, top_k, BLOCK_N, I, H, stride_xm, stride_we, stride_wn)),
    ], [LOADER_WARPS], [LOADER_REGS])

    # (the output's addresses only now: computed before the K loop they would hold registers through it)
    out_rows, out_ptrs = _moe_wsrr_out(out_ptr, sorted_token_ids_ptr, pid_m, n0, stride_om, acc_layout, BLOCK_M,
                                       BLOCK_N)
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    g = acc_g * gl.load(scale_ptr + expert * stride_se + offs_n)[:, None]
    u = acc_u * gl.load(scale_ptr + expert * stride_se + I + offs_n)[:, None]
    h = g / (1.0 + gl.exp(-g)) * u
    gl.store(out_ptrs, h.to(gl.bfloat16), mask=out_rows[None, :] < num_valid)


def gate_up_wsrr(x, w13r, w13_scale, sorted_ids, block_experts, num_post, top_k, out, *, block_m, block_n=128,
                 block_k=64, group_m=8, stages=4, num_warps=8, loader_regs=56):
    """bf16 ``x``; ``block_m`` tokens (wgmma's N), ``block_n`` columns of I (64 a consumer warpgroup)."""
    num_experts, two_i, hidden = w13r.shape
    inter = two_i // 2
    if hidden % (2 * block_k) or block_k % 64 or inter % block_n:
        raise ValueError("the repacked layout works in 64-wide K blocks (the loop in pairs), on whole tiles of I")
    if stages < 2 or block_n != 16 * num_warps or x.dtype != torch.bfloat16 or w13r.dtype != torch.int8:
        raise ValueError("wsrr: two or more stages, 64 columns of I a warpgroup, bf16 x, int8 weights")
    if any(t.stride(-1) != 1 for t in (x, w13r, w13_scale, out)):
        raise ValueError("wsrr: unit-stride rows")
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_smem = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # plain rows: a thread's 16 repacked bytes together
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(inter, block_n),)
    moe_gate_up_wsrr_kernel[grid](x, w13r, w13_scale, out, sorted_ids, block_experts, num_post, top_k * x.shape[0],
                                  sorted_ids.numel(), inter, hidden, x.stride(0), w13r.stride(0), w13r.stride(1),
                                  w13_scale.stride(0), out.stride(0), top_k, block_m, block_n, block_k, group_m,
                                  stages, loader_regs, x_smem, w_smem, num_warps=num_warps)
    return out


# One accumulator for gate and up ("wsrr1", NOTES item 96): the loader interleaves an expert's gate and up
# rows 8 apart, so one m64 wgmma a warpgroup covers 32 columns of I and every thread holds a column's gate
# (accumulator row r) and up (row r + 8) for the same tokens: the dense form's tile (256 tokens x 128
# weight rows, 128 accumulator registers) serves the MoE gate/up, where two accumulators of 256 tokens
# do not fit. Weights unrepacked: the activations come K-permuted instead (gluon_w8a16_probe.permute_k),
# and with PERMUTE_OUT the output h is written K-permuted for a down GEMM in the same form.
@gluon.jit
def _k_position(c):
    """Where column c of a row lands in permute_k's order (the logical k of memory position c)."""
    b = c & 63
    return (c & ~63) | (b & 1) | ((b >> 4) & 3) << 1 | ((b >> 1) & 1) << 3 | ((b >> 2) & 3) << 4


@gluon.jit
def moe_gate_up_wsrr1_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
                             num_tokens_post_padded_ptr, num_valid, num_sorted, I, H, stride_xm, stride_we, stride_wn,
                             stride_se, stride_om, top_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                             BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                             LOADER_REGS: gl.constexpr, X_SMEM: gl.constexpr, W_SMEM: gl.constexpr,
                             PERMUTE_OUT: gl.constexpr, num_warps: gl.constexpr):
    W_ROWS: gl.constexpr = 2 * BLOCK_N  # 16 a warp
    pid_m, n0 = _row_block(num_sorted, I, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _repacked_layout(gl.to_linear_layout(a_layout, [W_ROWS, BLOCK_K]))
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)
    if expert < 0:  # not on this rank: zeros, as the library's kernels write
        zeros_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        _store_h(gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.bfloat16, layout=zeros_layout), out_ptr, sorted_token_ids_ptr,
                 pid_m, n0, num_valid, stride_om, PERMUTE_OUT)
        return
    x_ring, w_ring, loaded, free = _wsrr_ring(STAGES, BLOCK_M, W_ROWS, BLOCK_K, X_SMEM, W_SMEM)
    acc, = gl.warp_specialize([
        (_wsrr_mma, (x_ring, w_ring, loaded, free, H, acc_layout, a_layout, w_layout, BLOCK_M, W_ROWS, BLOCK_K,
                     STAGES)),
        (_moe_wsrr_loader, (x_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, pid_m * BLOCK_M, n0,
                            expert, num_valid, top_k, W_ROWS, I, H, stride_xm, stride_we, stride_wn, True)),
    ], [LOADER_WARPS], [LOADER_REGS])

    r = gl.arange(0, W_ROWS, layout=gl.SliceLayout(1, acc_layout))
    acc = acc * gl.load(scale_ptr + expert * stride_se + n0 + (r // 16) * 8 + r % 8 + ((r // 8) % 2) * I)[:, None]
    g, u = gl.split(gl.permute(gl.reshape(acc, [W_ROWS // 16, 2, 8, BLOCK_M]), [0, 2, 3, 1]))
    h = gl.reshape(g / (1.0 + gl.exp(-g)) * u, [BLOCK_N, BLOCK_M]).to(gl.bfloat16)  # row j: column n0 + j
    _store_h(h, out_ptr, sorted_token_ids_ptr, pid_m, n0, num_valid, stride_om, PERMUTE_OUT)


@gluon.jit
def _store_h(h, out_ptr, sorted_token_ids_ptr, pid_m, n0, num_valid, stride_om, PERMUTE_OUT: gl.constexpr):
    """A transposed tile of h (columns n0.. of I x the block's pair rows) into its rows of ``out``."""
    BLOCK_N: gl.constexpr = h.type.shape[0]
    BLOCK_M: gl.constexpr = h.type.shape[1]
    h_layout: gl.constexpr = h.type.layout
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, h_layout))
    if PERMUTE_OUT:
        cols = _k_position(cols)
    rows = gl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, h_layout)))
    gl.store(out_ptr + rows.to(gl.int64)[None, :] * stride_om + cols[:, None], h, mask=rows[None, :] < num_valid)


def gate_up_wsrr1(xp, w13, w13_scale, sorted_ids, block_experts, num_post, top_k, out, *, block_m, block_n=64,
                  block_k=64, group_m=8, stages=4, num_warps=8, loader_regs=56, permute_out=False):
    """``xp = permute_k(x)`` (bf16), ``w13`` as quantized (not repacked); ``block_m`` tokens, ``block_n``
    columns of I (32 a consumer warpgroup); ``out`` h, K-permuted with ``permute_out``."""
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    if hidden % (2 * block_k) or block_k % 64 or inter % block_n or (permute_out and inter % 64):
        raise ValueError("wsrr1: 64-wide K blocks (the loop in pairs), whole tiles of I")
    if stages < 2 or block_n != 8 * num_warps or xp.dtype != torch.bfloat16 or w13.dtype != torch.int8:
        raise ValueError("wsrr1: two or more stages, 32 columns of I a warpgroup, bf16 x, int8 weights")
    if any(t.stride(-1) != 1 for t in (xp, w13, w13_scale, out)):
        raise ValueError("wsrr1: unit-stride rows")
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_smem = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(inter, block_n),)
    moe_gate_up_wsrr1_kernel[grid](xp, w13, w13_scale, out, sorted_ids, block_experts, num_post, top_k * xp.shape[0],
                                   sorted_ids.numel(), inter, hidden, xp.stride(0), w13.stride(0), w13.stride(1),
                                   w13_scale.stride(0), out.stride(0), top_k, block_m, block_n, block_k, group_m,
                                   stages, loader_regs, x_smem, w_smem, permute_out, num_warps=num_warps)
    return out


@gluon.jit
def moe_down_wsrr_kernel(a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                         block_expert_ids_ptr, num_tokens_post_padded_ptr, num_valid, num_sorted, H, I, stride_am,
                         stride_we, stride_wn, stride_se, stride_om, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                         LOADER_REGS: gl.constexpr, X_SMEM: gl.constexpr, W_SMEM: gl.constexpr,
                         num_warps: gl.constexpr):
    """The down GEMM in the same form: out[pair, H] = (h[pair] @ w2[e]^T) * routing weight; the K loop is
    gluon_w8a16_probe's dense wsrr consumer (one register operand pair in turn), the loader the one above
    (rows of h are pair rows: top_k 1)."""
    pid_m, n0 = _row_block(num_sorted, H, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _repacked_layout(gl.to_linear_layout(a_layout, [BLOCK_N, BLOCK_K]))
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)
    if expert < 0:  # not on this rank: zeros, as the library's kernels write
        _moe_wsrr_zeros(out_ptr, sorted_token_ids_ptr, pid_m, n0, num_valid, stride_om, acc_layout, BLOCK_M, BLOCK_N)
        return
    x_ring, w_ring, loaded, free = _wsrr_ring(STAGES, BLOCK_M, BLOCK_N, BLOCK_K, X_SMEM, W_SMEM)
    acc, = gl.warp_specialize([
        (_wsrr_mma, (x_ring, w_ring, loaded, free, I, acc_layout, a_layout, w_layout, BLOCK_M, BLOCK_N, BLOCK_K,
                     STAGES)),
        (_moe_wsrr_loader, (a_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, pid_m * BLOCK_M, n0,
                            expert, num_valid, 1, BLOCK_N, 0, I, stride_am, stride_we, stride_wn)),
    ], [LOADER_WARPS], [LOADER_REGS])

    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    y = acc * gl.load(scale_ptr + expert * stride_se + offs_n)[:, None]
    first = pid_m * BLOCK_M
    if BLOCK_M <= 128:
        _down_store(y, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first, n0, num_valid, stride_om)
    else:  # in quarters of the pair rows: a whole tile's 64-bit addresses would spill (NOTES item 95)
        y0, y1 = _column_halves(y)
        y00, y01 = _column_halves(y0)
        _down_store(y00, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first, n0, num_valid, stride_om)
        _down_store(y01, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first + BLOCK_M // 4, n0, num_valid,
                    stride_om)
        y10, y11 = _column_halves(y1)
        _down_store(y10, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first + BLOCK_M // 2, n0, num_valid,
                    stride_om)
        _down_store(y11, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first + 3 * BLOCK_M // 4, n0, num_valid,
                    stride_om)


@gluon.jit
def _column_halves(y):
    """The left and right halves of a tile's columns (register renaming: the top column bit is a register's)."""
    return gl.split(gl.permute(gl.reshape(y, [y.type.shape[0], 2, y.type.shape[1] // 2]), [0, 2, 1]))


@gluon.jit
def _down_store(y, out_ptr, topk_weights_ptr, sorted_token_ids_ptr, first, n0, num_valid, stride_om):
    """A transposed tile of the down GEMM (columns n0.. of H x pair rows from sorted position ``first``)
    times the routing weights, into its rows of ``out``."""
    layout: gl.constexpr = y.type.layout
    rows = gl.load(sorted_token_ids_ptr + first + gl.arange(0, y.type.shape[1], layout=gl.SliceLayout(0, layout)))
    row_mask = rows < num_valid
    rw = gl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(gl.float32)
    cols = n0 + gl.arange(0, y.type.shape[0], layout=gl.SliceLayout(1, layout))
    gl.store(out_ptr + rows.to(gl.int64)[None, :] * stride_om + cols[:, None], (y * rw[None, :]).to(gl.bfloat16),
             mask=row_mask[None, :])


def down_wsrr(a, w2r, w2_scale, topk_weights, sorted_ids, block_experts, num_post, out, *, block_m, block_n=128,
              block_k=64, group_m=8, stages=4, num_warps=8, loader_regs=56):
    """bf16 ``a`` (the gate/up output, pair rows); ``block_m`` pair rows (wgmma's N), ``block_n`` columns of
    H (64 a consumer warpgroup); ``out [pairs, H]`` times the flat routing weights."""
    num_experts, hidden, inter = w2r.shape
    if inter % (2 * block_k) or block_k % 64 or hidden % block_n:
        raise ValueError("the repacked layout works in 64-wide K blocks (the loop in pairs), on whole tiles of H")
    if stages < 2 or block_n != 16 * num_warps or a.dtype != torch.bfloat16 or w2r.dtype != torch.int8:
        raise ValueError("wsrr: two or more stages, 64 columns of H a warpgroup, bf16 a, int8 weights")
    if any(t.stride(-1) != 1 for t in (a, w2r, w2_scale, out)):
        raise ValueError("wsrr: unit-stride rows")
    x_smem = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_smem = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(hidden, block_n),)
    moe_down_wsrr_kernel[grid](a, w2r, w2_scale, out, topk_weights, sorted_ids, block_experts, num_post,
                               topk_weights.numel(), sorted_ids.numel(), hidden, inter, a.stride(0), w2r.stride(0),
                               w2r.stride(1), w2_scale.stride(0), out.stride(0), block_m, block_n, block_k, group_m,
                               stages, loader_regs, x_smem, w_smem, num_warps=num_warps)
    return out


def library_gate_up(x, w13, w13_scale, weights, ids, top_k, dtype):
    """The library's gate/up launch with the shipped config for this M (aligned outside the timing)."""
    m = x.shape[0]
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    cfg = configs.get_config(m, num_experts, inter, top_k, dtype)
    cfg = configs.without(cfg, "DEQUANT_ONCE", "PAIRS", "DEDUP_PAIRS", "SUM_TOPK", "SUM_LAST", "FUSED_DECODE")
    gate_up_cfg, _ = configs.split_config(cfg)
    sorted_ids, blocks, num_post = align_block_size(ids, gate_up_cfg["BLOCK_SIZE_M"], num_experts, None)
    out = torch.empty(m * top_k, inter, dtype=x.dtype, device=x.device)
    flat = weights.reshape(-1).contiguous()
    if cfg.get("GLUON") and w13.dtype == torch.int8:  # (the shipped GLUON entries run it on the H200)
        return lambda: gluon_moe.invoke_gate_up(x, w13, w13_scale, out, flat, sorted_ids, blocks, num_post, top_k,
                                                "silu", False, gate_up_cfg), out, cfg
    return lambda: fused_moe.invoke_gate_up(x, w13, w13_scale, out, flat, sorted_ids, blocks, num_post, top_k,
                                            "silu", False, gate_up_cfg), out, cfg


def library_down(a, w2, w2_scale, weights, ids, top_k, dtype):
    """The library's down launch (times the routing weight) with the shipped config for this M."""
    m = ids.shape[0]
    num_experts, inter = w2.shape[0], w2.shape[2]
    cfg = configs.get_config(m, num_experts, inter, top_k, dtype)
    cfg = configs.without(cfg, "DEQUANT_ONCE", "PAIRS", "DEDUP_PAIRS", "SUM_TOPK", "SUM_LAST", "FUSED_DECODE",
                          "SPLIT_K")
    gate_up_cfg, down_cfg = configs.split_config(cfg)
    sorted_ids, blocks, num_post = align_block_size(ids, gate_up_cfg["BLOCK_SIZE_M"], num_experts, None)
    out = torch.empty(m * top_k, w2.shape[1], dtype=a.dtype, device=a.device)
    flat = weights.reshape(-1).contiguous()
    if cfg.get("GLUON") and w2.dtype == torch.int8:
        return lambda: gluon_moe.invoke_down(a, w2, w2_scale, out, flat, sorted_ids, blocks, num_post, True,
                                             down_cfg), out, cfg
    return lambda: fused_moe.invoke_down(a, w2, w2_scale, out, flat, sorted_ids, blocks, num_post, True,
                                         down_cfg), out, cfg


def run_down(args):
    """--gemm down: the down GEMM in the wsrr form (tiles with the suffix w only) against the library's."""
    torch.manual_seed(0)
    rows = []
    for name in args.shapes:
        _, (e, h, i, k) = bench.parse_shape(name)
        w2f = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) / i ** 0.5
        w2, s2 = quantize_weights(w2f)
        for m in (int(v) for v in args.m.split(",")):
            a = torch.randn(m * k, i, device="cuda", dtype=torch.bfloat16)
            ap = permute_k(a)  # (as the gate/up GEMM's PERMUTE_OUT writes it)
            weights, ids = select_experts(torch.randn(m, e, device="cuda"), k)
            run8, out8, cfg8 = library_down(a, w2, s2, weights, ids, k, torch.int8)
            run16, _, _ = library_down(a, w2f, None, weights, ids, k, torch.bfloat16)
            run8()
            row = dict(shape=name, M=m, gemm="down", int8_config=cfg8, int8_us=bench_us(run8), bf16_us=bench_us(run16))
            flat = weights.reshape(-1).contiguous()
            for tile in args.tiles.split(","):
                bm, bn, st, nw = (int(v) for v in re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)w", tile).groups())
                try:
                    sorted_ids, blocks, num_post = align_block_size(ids, bm, e, None)
                    out = torch.empty(m * k, h, dtype=torch.bfloat16, device="cuda")
                    fn = lambda: down_wsrr(ap, w2, s2, flat, sorted_ids, blocks, num_post, out,  # noqa: E731
                                           block_m=bm, block_n=bn, stages=st, num_warps=nw,
                                           loader_regs=72 if bm > 128 else 56)
                    fn()
                    err = ((out.float() - out8.float()).norm() / out8.float().norm()).item()
                    row[f"rr_{tile}_us"], row[f"rr_{tile}_err"] = bench_us(fn), err
                except Exception as exc:
                    row[f"rr_{tile}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            _report(args, name, m, row, rows)
        torch.cuda.empty_cache()


def _report(args, name, m, row, rows):
    cells = "  ".join(f"rr {t}: {row[f'rr_{t}_us']:8.1f} us (err {row[f'rr_{t}_err']:.1e}"
                      f"{'' if row[f'rr_{t}_err'] <= 2e-2 else ' WRONG'})"  # (NaN: WRONG too)
                      if f"rr_{t}_us" in row else f"rr {t}: failed" for t in args.tiles.split(","))
    print(f"{name:16s} M={m:<5d} int8 {row['int8_us']:8.1f} us  bf16 {row['bf16_us']:8.1f} us  {cells}", flush=True)
    if args.out:
        with open(os.path.join(args.out, f"gluon_moe_rr_probe{'_down' if args.gemm == 'down' else ''}.json"),
                  "w") as f:
            json.dump(dict(benchmark="gluon_moe_rr_probe", gpu=torch.cuda.get_device_name(),
                           commit=bench.library_commit()[0], triton=triton.__version__, command=" ".join(sys.argv),
                           rows=rows), f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["mixtral-8x7b", "qwen3-30b-a3b"])
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--tiles", default="128x64x3x4,128x128x3x8,64x64x3x4",
                    help="BLOCK_M(tokens)xBLOCK_N(columns of I)xSTAGESxWARPS[dDEPTH][h][w], comma-separated; "
                         "dDEPTH: weight tiles in flight in registers (1, 2), h: fp16 rows and conversion, "
                         "w: the warp-specialized form (wsrr; WARPS: its consumer warps)")
    ap.add_argument("--gemm", default="gate_up", choices=["gate_up", "down"],
                    help="down: the down GEMM, wsrr tiles (suffix w) only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.gemm == "down":
        return run_down(args)
    torch.manual_seed(0)
    rows = []
    for name in args.shapes:
        _, (e, h, i, k) = bench.parse_shape(name)
        w13f = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5
        w13, s13 = quantize_weights(w13f)
        w13r = repack_rows(w13.reshape(e * 2 * i, h)).reshape(e, 2 * i, h)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
            weights, ids = select_experts(torch.randn(m, e, device="cuda"), k)
            run8, out8, cfg8 = library_gate_up(x, w13, s13, weights, ids, k, torch.int8)
            run16, _, _ = library_gate_up(x, w13f, None, weights, ids, k, torch.bfloat16)
            run8()
            row = dict(shape=name, M=m, int8_config=cfg8, int8_us=bench_us(run8), bf16_us=bench_us(run16))
            for tile in args.tiles.split(","):
                bm, bn, st, nw, depth, half, ws = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?:d(\d))?(h)?(w|ip?)?",
                                                              tile).groups()
                bm, bn, st, nw, depth = int(bm), int(bn), int(st), int(nw), int(depth or 1)
                xk, inv = invoke_fp16_rows(x) if half else (x, None)
                try:
                    sorted_ids, blocks, num_post = align_block_size(ids, bm, e, None)
                    out = torch.empty(m * k, i, dtype=torch.bfloat16, device="cuda")
                    if ws == "w":
                        fn = lambda: gate_up_wsrr(permute_k(x), w13, s13, sorted_ids, blocks,  # noqa: E731
                                                  num_post, k, out, block_m=bm, block_n=bn, stages=st, num_warps=nw)
                    elif ws:  # one accumulator; with p, h written K-permuted (for the down GEMM in this form)
                        fn = lambda: gate_up_wsrr1(permute_k(x), w13, s13, sorted_ids, blocks, num_post,  # noqa: E731
                                                   k, out, block_m=bm, block_n=bn, stages=st, num_warps=nw,
                                                   loader_regs=72 if bm > 128 else 56, permute_out=ws == "ip")
                    else:
                        fn = lambda: gate_up_rr(xk, w13r, s13, sorted_ids, blocks, num_post, k, out,  # noqa: E731
                                                block_m=bm, block_n=bn, stages=st, num_warps=nw, x_inv_scale=inv,
                                                depth=depth)
                    fn()
                    got = repack_rows(out) if ws == "ip" else out  # (repack_rows undoes permute_k)
                    err = ((got.float() - out8.float()).norm() / out8.float().norm()).item()
                    row[f"rr_{tile}_us"], row[f"rr_{tile}_err"] = bench_us(fn), err
                except Exception as exc:  # a tile this kernel cannot compile: recorded, the rest still runs
                    row[f"rr_{tile}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            _report(args, name, m, row, rows)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
