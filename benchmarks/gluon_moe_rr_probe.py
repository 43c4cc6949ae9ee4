"""Probe (Hopper, not used by the library): the MoE gate/up GEMM in the register form of
benchmarks/NOTES.md items 54-55, against the library's own gate/up launch on the same aligned rows.

The expert rows are repacked once (``gluon_w8a16_probe.repack_rows``); each program takes BLOCK_M
aligned (token, slot) rows of one expert and BLOCK_N columns of I, gathers the token rows of x into a
cp.async ring, loads its gate and up weight fragments from global memory straight into registers,
and issues two wgmmas with the weights as the register operand (the product transposed: tokens are
wgmma's N), then applies the scales and SiLU(gate) * up and writes its tile of h. No converted weight
tile ever goes through shared memory.

The warp-specialized register form that grew out of this probe (NOTES items 95-97) is the library's
``kernels/gluon_wsrr.py`` now; the probe's MoE versions of it ran at 0d6c280 and ad9712e
(results/wsrr_probe/, results/wsrr1_probe/).

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
from gluon_w8a16_probe import _async_load, _cta_barrier, bench_us, repack_rows  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,  # noqa: E402
                                                              warpgroup_mma, warpgroup_mma_wait)

from experts_int8 import bench, quantize_weights, select_experts  # noqa: E402
from experts_int8.kernels import configs, fused_moe, gluon_moe  # noqa: E402
from experts_int8.kernels.align import align_block_size  # noqa: E402
from experts_int8.kernels.fused_moe import INT8_TO_FP16_PTX, invoke_fp16_rows  # noqa: E402
from experts_int8.kernels.gluon_moe import _row_block  # noqa: E402
from experts_int8.kernels.gluon_wsrr import _fragment_layout  # noqa: E402


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
    w_layout: gl.constexpr = _fragment_layout(gl.to_linear_layout(a_layout, [BLOCK_N, BLOCK_K]))
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


def library_gate_up(x, w13, w13_scale, weights, ids, top_k, dtype):
    """The library's gate/up launch with the shipped config for this M (aligned outside the timing)."""
    m = x.shape[0]
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    cfg = configs.get_config(m, num_experts, inter, top_k, dtype)
    cfg = configs.without(cfg, "DEQUANT_ONCE", "PAIRS", "DEDUP_PAIRS", "SUM_TOPK", "SUM_LAST")
    gate_up_cfg, _ = configs.split_config(cfg)
    sorted_ids, blocks, num_post = align_block_size(ids, gate_up_cfg["BLOCK_SIZE_M"], num_experts, None)
    out = torch.empty(m * top_k, inter, dtype=x.dtype, device=x.device)
    flat = weights.reshape(-1).contiguous()
    if cfg.get("GLUON") and w13.dtype == torch.int8:  # (the shipped GLUON entries run it on the H200)
        return lambda: gluon_moe.invoke_gate_up(x, w13, w13_scale, out, flat, sorted_ids, blocks, num_post, top_k,
                                                "silu", False, gate_up_cfg), out, cfg
    return lambda: fused_moe.invoke_gate_up(x, w13, w13_scale, out, flat, sorted_ids, blocks, num_post, top_k,
                                            "silu", False, gate_up_cfg), out, cfg


def _report(args, name, m, row, rows):
    cells = "  ".join(f"rr {t}: {row[f'rr_{t}_us']:8.1f} us (err {row[f'rr_{t}_err']:.1e}"
                      f"{'' if row[f'rr_{t}_err'] <= 2e-2 else ' WRONG'})"  # (NaN: WRONG too)
                      if f"rr_{t}_us" in row else f"rr {t}: failed" for t in args.tiles.split(","))
    print(f"{name:16s} M={m:<5d} int8 {row['int8_us']:8.1f} us  bf16 {row['bf16_us']:8.1f} us  {cells}", flush=True)
    if args.out:
        with open(os.path.join(args.out, "gluon_moe_rr_probe.json"), "w") as f:
            json.dump(dict(benchmark="gluon_moe_rr_probe", gpu=torch.cuda.get_device_name(),
                           commit=bench.library_commit()[0], triton=triton.__version__, command=" ".join(sys.argv),
                           rows=rows), f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["mixtral-8x7b", "qwen3-30b-a3b"])
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--tiles", default="128x64x3x4,128x128x3x8,64x64x3x4",
                    help="BLOCK_M(tokens)xBLOCK_N(columns of I)xSTAGESxWARPS[dDEPTH][h], comma-separated; "
                         "dDEPTH: weight tiles in flight in registers (1, 2), h: fp16 rows and conversion")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
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
                bm, bn, st, nw, depth, half = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?:d(\d))?(h)?", tile).groups()
                bm, bn, st, nw, depth = int(bm), int(bn), int(st), int(nw), int(depth or 1)
                xk, inv = invoke_fp16_rows(x) if half else (x, None)
                try:
                    sorted_ids, blocks, num_post = align_block_size(ids, bm, e, None)
                    out = torch.empty(m * k, i, dtype=torch.bfloat16, device="cuda")
                    fn = lambda: gate_up_rr(xk, w13r, s13, sorted_ids, blocks, num_post, k, out,  # noqa: E731
                                            block_m=bm, block_n=bn, stages=st, num_warps=nw, x_inv_scale=inv,
                                            depth=depth)
                    fn()
                    err = ((out.float() - out8.float()).norm() / out8.float().norm()).item()
                    row[f"rr_{tile}_us"], row[f"rr_{tile}_err"] = bench_us(fn), err
                except Exception as exc:  # a tile this kernel cannot compile: recorded, the rest still runs
                    row[f"rr_{tile}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            _report(args, name, m, row, rows)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
