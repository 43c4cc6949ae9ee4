"""Hopper (sm_90) prefill GEMMs of a W8A16 MoE layer in the warp-specialized register form ("WSRR").

Where :mod:`.gluon_moe` converts each int8 weight tile into a bf16/fp16 tile in shared memory for
wgmma to read (a round trip that holds its int8 GEMMs at the shared-memory ceiling, 0.67-0.8 of the
tensor rate: benchmarks/NOTES.md items 54, 91), here the product is computed transposed (tokens are
wgmma's N) so the weights are wgmma's *register* operand and never go back to shared memory:

* a loader partition (4 warps, few registers) gathers the block's token rows and the expert's int8
  weight rows into a shared-memory ring by cp.async (mbarriers ``loaded``/``free`` per slot);
* the consumer warpgroups (the registers the loader gives up) read each weight fragment with
  16-byte shared loads, convert it, and issue its wgmma, two register operands in turn so one K tile's
  wgmma runs while the next is converted (NOTES items 94-96).

A thread's fragment of a 64-wide K block holds k = 2c, 2c+1, 2c+8, 2c+9, ... (c: its lane in the
quad): 16 bytes that are not contiguous in a weight row. Instead of repacking the weights, the
activations are K-permuted (:func:`permute_k`): a permutation applied to both operands of a dot
product leaves it unchanged, so each thread reads 16 contiguous bytes and the weights stay exactly as
quantized (checkpoints, the Triton kernels and the decode path are untouched).

Gate/up: gate and up rows are gathered 8 apart, so one m64 wgmma per warpgroup covers 32 columns of I
and each thread holds a column's gate (accumulator row r) and up (row r + 8): act(gate) * up in
registers (:func:`.gluon_moe.glu`, any activation, expert biases added first), one accumulator (256 tokens
x 128 weight rows on the main tile). Experts without a gate: 16 columns of I a warp, their up rows alone,
act(up). The columns are chosen so that h comes out already K-permuted for the down GEMM, with contiguous
stores. Down: pair rows x 16 columns of H a consumer warp over K = I, plus the bias, times the routing
weight, stored in quarters of the rows (the whole tile's addresses would spill). Both K loops take whole
64-wide tiles in pairs and one more where their count is odd (GPT-OSS: H = I = 2880, 45 tiles).

:func:`supported` says when it applies; a config selects it with ``WSRR: 1``, on the tile of
``WSRR_ROWS`` tokens (:data:`TILES`, 256 unless set; :mod:`.configs`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from .fused_moe import ACTIVATION_CODES, _kernel, clamp_meta, compile_for_sm90
from .gluon_moe import _GL_DTYPES, _async_load, _cta_barrier, _row_block, bias_args, glu, hopper_smem_limit

BLOCK_K = 64  # the fragment's K block
GROUP_M = 8
LOADER_WARPS = gl.constexpr(4)


@dataclasses.dataclass(frozen=True)
class Tile:
    """A program's tile: ``rows`` tokens (pair rows: wgmma's N) and 16 weight rows a consumer warp (gate/up:
    8 columns of I a warp, gate and up interleaved; down: 16 columns of H a warp)."""
    rows: int
    consumer_warps: int
    loader_regs: int  # registers a loader thread keeps; the consumers get the rest (setmaxnreg)
    stages: int  # the ring's depth unless a config sets WSRR_STAGES
    maxnreg: Optional[int] = None  # the launch's register cap: 128 lets two programs share an SM

    def gate_up_cols(self, gated: bool = True) -> int:
        """Columns of I a gate/up program covers: 8 a consumer warp with a gate (its 16 weight rows are 8
        columns' gate and up), 16 without (up rows alone)."""
        return (8 if gated else 16) * self.consumer_warps

    @property
    def down_cols(self) -> int:
        return 16 * self.consumer_warps

    def smem_bytes(self, stages: Optional[int] = None) -> int:  # the ring (x and int8 weight tiles) and barriers
        return (stages or self.stages) * (self.rows * BLOCK_K * 2 + 16 * self.consumer_warps * BLOCK_K) + 1024


# 256 rows on two consumer warpgroups, one program a SM (72 loader registers: 56 spill 8 bytes; the
# consumers get 216-240); 128 rows on one warpgroup, two programs a SM (the launch capped at 128
# registers: consumers 200-232, loader 56), for experts of few rows (benchmarks/NOTES.md item 99).
# Rings: 4 slots on the 256-row tile (3 lose 3-17%, 5 gain nothing), 5 on the 128-row one (2.5-6%
# faster than 4 at M=256; items 110-112)
TILES = {256: Tile(256, 8, 72, 4), 128: Tile(128, 4, 56, 5, maxnreg=128)}


def permute_k(x: torch.Tensor) -> torch.Tensor:
    """``[M, K]`` activations (K a multiple of 64) with each 64-wide K block in the order the register
    fragments read unrepacked weight bytes: column j holds x's column :func:`memory_position` (j). One
    Triton launch that moves whole 64-wide blocks (torch's strided copy of the permuted view took ~3x a
    copy's time on the H200: 25 µs at 4096 x 2048 bf16, benchmarks/NOTES.md item 120)."""
    m, k = x.shape
    out = torch.empty((m, k), dtype=x.dtype, device=x.device)
    if m:
        _kernel(permute_k_kernel, x.device)[(triton.cdiv(m, PERMUTE_ROWS), k // 64)](
            x, out, m, x.stride(0), x.stride(1), out.stride(0), BLOCK_R=PERMUTE_ROWS, num_warps=4,
            enable_fp_fusion=True)
    return out


PERMUTE_ROWS = 64


@triton.jit
def permute_k_kernel(x_ptr, out_ptr, M, stride_xm, stride_xk, stride_om, BLOCK_R: tl.constexpr):
    """Rows [r0, r0 + BLOCK_R) of one 64-wide K block: loaded as they are, the block's columns reordered
    in registers ([4 s, 4 c, 2 e1, 2 e0] -> [4 c, 2 e1, 4 s, 2 e0], see :func:`memory_position`), stored."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * 64 + tl.arange(0, 64)
    mask = rows[:, None] < M
    v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask)
    v = tl.reshape(tl.permute(tl.reshape(v, (BLOCK_R, 4, 4, 2, 2)), (0, 2, 3, 1, 4)), (BLOCK_R, 64))
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :], v, mask=mask)


@gluon.constexpr_function  # (callable from host code too)
def memory_position(k: int) -> int:
    """The byte of a weight row that a fragment holds as logical k (within each 64-wide block: a thread
    c of a quad holds k = 16s + 8e1 + 2c + e0 at its 16 contiguous bytes 16c + 4s + 2e1 + e0)."""
    b = k & 63
    return (k & ~63) | (b & 1) | ((b >> 3) & 1) << 1 | ((b >> 4) & 3) << 2 | ((b >> 1) & 3) << 4


def supported(x: torch.Tensor, w13: torch.Tensor, w13_scale, w2: torch.Tensor, mul_routed_weight_first: bool,
              rows: int = 256, stages: Optional[int] = None) -> bool:
    """Whether this layer can run here on TILES[rows] with a ring of ``stages`` (the tile's own unless
    given): a layer the Hopper Gluon kernels read (:func:`.gluon_moe.hopper_smem_limit`: experts with a gate
    or without, any activation, expert biases or none) with room for the ring, routing weights on the
    output, H a multiple of 64 (whole K tiles in gate/up, one more after the pairs where their count is odd);
    I any size (no multiple of 64: h padded to whole blocks and the down GEMM's last K tile partial,
    :func:`h_columns`); a program's columns past I (gate/up) or H (down) are masked."""
    smem_limit = hopper_smem_limit(x, w13, w13_scale, w2)
    return (smem_limit is not None and smem_limit >= TILES[rows].smem_bytes(stages) and not mul_routed_weight_first
            and w2.shape[1] % BLOCK_K == 0)


@gluon.constexpr_function
def _fragment_layout(lin):
    """The A-operand layout with each K coordinate moved to the byte it is read from
    (:func:`memory_position`), registers ordered so a thread's 16 contiguous bytes come first."""
    def to_memory(basis):
        n, k = basis
        return [n, memory_position(k)]
    regs = sorted((to_memory(b) for b in lin.reg_bases), key=lambda b: (b[0] != 0, b[1] if b[0] == 0 else 0))
    return gl.DistributedLinearLayout(regs, [to_memory(b) for b in lin.lane_bases],
                                      [to_memory(b) for b in lin.warp_bases], lin.block_bases, lin.shape)


@gluon.jit
def _memory_position(k):
    b = k & 63
    return (k & ~63) | (b & 1) | ((b >> 3) & 1) << 1 | ((b >> 4) & 3) << 2 | ((b >> 1) & 3) << 4


@gluon.jit
def _gate_up_rows(n0, r, I, GATED: gl.constexpr, WRAP: gl.constexpr):
    """The w13 row of a gate/up program's weight row r. With GATED: column memory_position(n0 + 8 (r // 16) +
    r % 8)'s gate (r % 16 < 8) or up (I rows further); the permutation is taken of the whole column index (a
    program of 32 columns, the 128-row tile, covers half of a 64-wide block). Without: up row
    memory_position(n0 + r). WRAP: columns past I (a program reaching past I, or h's padding to whole 64-wide
    blocks) wrap; what they compute is never read as a real column."""
    col = _memory_position(n0 + (r // 16) * 8 + r % 8) if GATED else _memory_position(n0 + r)
    if WRAP:
        col = col % I
    if GATED:
        col += ((r // 8) % 2) * I
    return col


@gluon.jit
def _ring(STAGES: gl.constexpr, BLOCK_M: gl.constexpr, W_ROWS: gl.constexpr, BLOCK_K: gl.constexpr,
          dtype: gl.constexpr, X_SMEM: gl.constexpr):
    """Activation tiles, int8 weight tiles (plain rows: a thread's 16 bytes together), and per slot its
    `loaded` (one async arrival per loader thread) and `free` (one arrival) barriers."""
    x_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int8, [STAGES, W_ROWS, BLOCK_K], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    loaded = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(loaded.index(s), count=32 * LOADER_WARPS)
        mbarrier.init(free.index(s), count=1)
    return x_ring, w_ring, loaded, free


@gluon.jit
def _loader(x_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, first_row, n0, expert, num_valid,
            top_k, N, K, stride_xm, stride_we, stride_wn, GATE_UP: gl.constexpr, GATED: gl.constexpr,
            WRAP: gl.constexpr, MASK_K: gl.constexpr):
    """Fills the ring: token rows sorted_token_ids // top_k of x (padding rows zero-filled) and the
    expert's weight rows; for GATE_UP slot row r is :func:`_gate_up_rows`, else row n0 + r; with WRAP rows
    past the N outputs (columns of I for GATE_UP, H for down) wrap (their columns are not stored or not
    read). MASK_K: K is no multiple of BLOCK_K (the down GEMM over I = 1440): weight bytes past K load as
    zeros, so h's padding columns add nothing."""
    STAGES: gl.constexpr = x_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    BLOCK_K: gl.constexpr = x_ring.type.shape[2]
    W_ROWS: gl.constexpr = w_ring.type.shape[1]
    x_load: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_K, BLOCK_K // 8], [LOADER_WARPS, 1], [1, 0])
    w_load: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [LOADER_WARPS, 1], [1, 0])
    rows = gl.load(sorted_token_ids_ptr + first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load)))
    row_mask = rows < num_valid
    offs_xk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, x_load))
    x_ptrs = x_ptr + (rows // top_k).to(gl.int64)[:, None] * stride_xm + offs_xk[None, :]
    r = gl.arange(0, W_ROWS, layout=gl.SliceLayout(1, w_load))
    if GATE_UP:
        w_rows = _gate_up_rows(n0, r, N, GATED, WRAP)
    else:
        w_rows = n0 + r
        if WRAP:
            w_rows = w_rows % N
    offs_wk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, w_load))
    w_ptrs = w_ptr + expert * stride_we + w_rows.to(gl.int64)[:, None] * stride_wn + offs_wk[None, :]
    for j in range(gl.cdiv(K, BLOCK_K)):
        slot = j % STAGES
        mbarrier.wait(free.index(slot), ((j // STAGES) & 1) ^ 1)  # (a fresh barrier passes phase 1)
        _async_load(x_ring.index(slot), x_ptrs + j * BLOCK_K, mask=row_mask[:, None])
        if MASK_K:
            _async_load(w_ring.index(slot), w_ptrs + j * BLOCK_K, mask=offs_wk[None, :] + j * BLOCK_K < K)
        else:  # (whole tiles)
            _async_load(w_ring.index(slot), w_ptrs + j * BLOCK_K)
        async_copy.mbarrier_arrive(loaded.index(slot), increment_count=False)  # per thread, when its copies land


@gluon.jit
def _operand(w_ring, loaded, j, w_layout: gl.constexpr, a_layout: gl.constexpr, dtype: gl.constexpr):
    """Tile j's weight fragment, once its slot has landed: 16-byte shared loads, converted, and relabelled
    as the register operand (bytes [c, s, e1, e0] as logical k [s, e1, c, e0]: register renaming)."""
    STAGES: gl.constexpr = w_ring.type.shape[0]
    W_ROWS: gl.constexpr = w_ring.type.shape[1]
    BLOCK_K: gl.constexpr = w_ring.type.shape[2]
    slot = j % STAGES
    mbarrier.wait(loaded.index(slot), (j // STAGES) & 1)
    w = gl.reshape(w_ring.index(slot).load(w_layout).to(dtype), [W_ROWS, BLOCK_K // 64, 4, 4, 2, 2])
    return gl.convert_layout(gl.reshape(gl.permute(w, [0, 1, 3, 4, 2, 5]), [W_ROWS, BLOCK_K]), a_layout)


@gluon.jit
def _consumer(x_ring, w_ring, loaded, free, K, acc_layout: gl.constexpr, dtype: gl.constexpr, ODD_K: gl.constexpr):
    """The K loop: two register operands in turn, tile j's wgmma in flight while tile j+1 is read and
    converted; each operand a dependency of the wait that retires its wgmma, so nothing rewrites it
    earlier; a slot freed once its wgmma has retired in every consumer warpgroup. ODD_K: one more tile
    after the pairs (a constexpr: a run-time branch around a wgmma makes ptxas serialize them all)."""
    STAGES: gl.constexpr = x_ring.type.shape[0]
    BLOCK_M: gl.constexpr = x_ring.type.shape[1]
    BLOCK_K: gl.constexpr = x_ring.type.shape[2]
    W_ROWS: gl.constexpr = w_ring.type.shape[1]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = _fragment_layout(gl.to_linear_layout(a_layout, [W_ROWS, BLOCK_K]))
    acc = gl.zeros((W_ROWS, BLOCK_M), dtype=gl.float32, layout=acc_layout)
    a_odd = gl.zeros((W_ROWS, BLOCK_K), dtype=dtype, layout=a_layout)
    for i in range(gl.cdiv(K, BLOCK_K) // 2):
        j = 2 * i
        a_even = _operand(w_ring, loaded, j, w_layout, a_layout, dtype)
        fence_async_shared()  # x landed by cp.async (generic proxy), read by the wgmma (async proxy)
        acc = warpgroup_mma(a_even, x_ring.index(j % STAGES).permute((1, 0)), acc, is_async=True)
        acc, a_odd = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_odd))  # tile j-1 retired
        _cta_barrier()  # ... in every warpgroup (a barrier of the consumer warps only)
        mbarrier.arrive(free.index((j + STAGES - 1) % STAGES), pred=j > 0)
        a_odd = _operand(w_ring, loaded, j + 1, w_layout, a_layout, dtype)
        fence_async_shared()
        acc = warpgroup_mma(a_odd, x_ring.index((j + 1) % STAGES).permute((1, 0)), acc, is_async=True)
        acc, a_even = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_even))  # tile j retired
        _cta_barrier()
        mbarrier.arrive(free.index(j % STAGES))
    if ODD_K:  # the last tile (the loader has issued every tile: no slot to free)
        j = gl.cdiv(K, BLOCK_K) - 1
        a_even = _operand(w_ring, loaded, j, w_layout, a_layout, dtype)
        fence_async_shared()
        acc = warpgroup_mma(a_even, x_ring.index(j % STAGES).permute((1, 0)), acc, is_async=True)
        acc, a_odd = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_odd))
        acc, a_even = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_even))
    else:
        acc, a_odd = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_odd))
    return (acc, )  # (warp_specialize returns a tuple)


@gluon.jit
def _gemm(x_ptr, w_ptr, sorted_token_ids_ptr, pid_m, n0, expert, num_valid, top_k, N, K, stride_xm,
          stride_we, stride_wn, acc_layout: gl.constexpr, W_ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
          BLOCK_K: gl.constexpr, STAGES: gl.constexpr, X_SMEM: gl.constexpr, LOADER_REGS: gl.constexpr,
          GATE_UP: gl.constexpr, GATED: gl.constexpr, ODD_K: gl.constexpr, WRAP: gl.constexpr,
          MASK_K: gl.constexpr = False):
    """The block's [W_ROWS, BLOCK_M] fp32 product over K: the loader and consumer partitions."""
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    x_ring, w_ring, loaded, free = _ring(STAGES, BLOCK_M, W_ROWS, BLOCK_K, dtype, X_SMEM)
    acc, = gl.warp_specialize([
        (_consumer, (x_ring, w_ring, loaded, free, K, acc_layout, dtype, ODD_K)),
        (_loader, (x_ptr, w_ptr, x_ring, w_ring, loaded, free, sorted_token_ids_ptr, pid_m * BLOCK_M, n0, expert,
                   num_valid, top_k, N, K, stride_xm, stride_we, stride_wn, GATE_UP, GATED, WRAP, MASK_K)),
    ], [LOADER_WARPS], [LOADER_REGS])
    return acc


@gluon.jit
def _store_rows(out_ptr, tile, sorted_token_ids_ptr, first, n0, num_valid, stride_om, topk_weights_ptr,
                MUL_WEIGHT: gl.constexpr, n_limit=0, MASK_COLS: gl.constexpr = False):
    """A transposed tile (columns n0.. x pair rows from sorted position ``first``), times the routing
    weights with MUL_WEIGHT, into its rows of ``out`` (padding rows skipped; with MASK_COLS, columns from
    ``n_limit`` on too)."""
    layout: gl.constexpr = tile.type.layout
    rows = gl.load(sorted_token_ids_ptr + first + gl.arange(0, tile.type.shape[1], layout=gl.SliceLayout(0, layout)))
    row_mask = rows < num_valid
    if MUL_WEIGHT:
        tile = tile * gl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(gl.float32)[None, :]
    cols = n0 + gl.arange(0, tile.type.shape[0], layout=gl.SliceLayout(1, layout))
    mask = row_mask[None, :]
    if MASK_COLS:
        mask = mask & (cols[:, None] < n_limit)
    gl.store(out_ptr + rows.to(gl.int64)[None, :] * stride_om + cols[:, None], tile.to(out_ptr.dtype.element_ty),
             mask=mask)


@gluon.jit
def _column_halves(t):
    """A tile's left and right columns (register renaming: the top column bit is a register's)."""
    return gl.split(gl.permute(gl.reshape(t, [t.type.shape[0], 2, t.type.shape[1] // 2]), [0, 2, 1]))


@gluon.jit
def _store_quarters(out_ptr, t, sorted_token_ids_ptr, first, n0, num_valid, stride_om, topk_weights_ptr,
                    MUL_WEIGHT: gl.constexpr, n_limit=0, MASK_COLS: gl.constexpr = False):
    """:func:`_store_rows` of a tile in quarters of its pair rows: the whole tile's 64-bit addresses would
    spill (a thread's 128 values on the 256-row tile)."""
    BLOCK_M: gl.constexpr = t.type.shape[1]
    t0, t1 = _column_halves(t)
    t00, t01 = _column_halves(t0)
    _store_rows(out_ptr, t00, sorted_token_ids_ptr, first, n0, num_valid, stride_om, topk_weights_ptr, MUL_WEIGHT,
                n_limit, MASK_COLS)
    _store_rows(out_ptr, t01, sorted_token_ids_ptr, first + BLOCK_M // 4, n0, num_valid, stride_om,
                topk_weights_ptr, MUL_WEIGHT, n_limit, MASK_COLS)
    t10, t11 = _column_halves(t1)
    _store_rows(out_ptr, t10, sorted_token_ids_ptr, first + BLOCK_M // 2, n0, num_valid, stride_om,
                topk_weights_ptr, MUL_WEIGHT, n_limit, MASK_COLS)
    _store_rows(out_ptr, t11, sorted_token_ids_ptr, first + 3 * BLOCK_M // 4, n0, num_valid, stride_om,
                topk_weights_ptr, MUL_WEIGHT, n_limit, MASK_COLS)


@gluon.jit
def moe_gate_up_wsrr_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, sorted_token_ids_ptr, block_expert_ids_ptr,
                            num_tokens_post_padded_ptr, num_valid, num_sorted, I, H, stride_xm, stride_we, stride_wn,
                            stride_se, stride_om, top_k,
                            bias_ptr, stride_be,  # [E, 2I] ([E, I] without a gate), read only when HAS_BIAS
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                            GROUP_M: gl.constexpr, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                            X_SMEM: gl.constexpr, GATED: gl.constexpr, ACTIVATION: gl.constexpr,
                            HAS_BIAS: gl.constexpr, ODD_K: gl.constexpr, PAD_I: gl.constexpr,
                            SWIGLU_ALPHA: gl.constexpr, SWIGLU_LIMIT: gl.constexpr, LIMIT_AFTER_ACT: gl.constexpr,
                            num_warps: gl.constexpr):
    """h = act(x W_gate^T + b_gate) * (x W_up^T + b_up), or act(x W_up^T + b_up) without GATED (w13 the I
    up rows alone), for a block of BLOCK_M pair rows and BLOCK_N columns of I, written K-permuted (h's
    column n0 + j holds column memory_position(n0 + j)): what the down kernel reads. ODD_K: H / 64 is odd.
    PAD_I: I is no multiple of 64, and h has I's columns padded to whole 64-wide blocks (:func:`h_columns`):
    the permutation puts real columns in the padding, so every padded column is written, those past I
    from wrapped rows (finite values that the down kernel's zero weight bytes past I cancel)."""
    W_ROWS: gl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    WRAP: gl.constexpr = PAD_I or not GATED
    n_out = I  # h's columns
    if PAD_I:
        n_out = gl.cdiv(I, 64) * 64
    pid_m, n0 = _row_block(num_sorted, n_out, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)
    if expert < 0:  # an expert on another rank: zeros, as the other kernels write (without a gate: not past h's)
        zeros_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        _store_rows(out_ptr, gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=zeros_layout),
                    sorted_token_ids_ptr, pid_m * BLOCK_M, n0, num_valid, stride_om, scale_ptr, False, n_out,
                    not GATED)
        return
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    acc = _gemm(x_ptr, w_ptr, sorted_token_ids_ptr, pid_m, n0, expert, num_valid, top_k, I, H, stride_xm, stride_we,
                stride_wn, acc_layout, W_ROWS, BLOCK_M, BLOCK_K, STAGES, X_SMEM, LOADER_REGS, True, GATED, ODD_K,
                WRAP)
    w_rows = _gate_up_rows(n0, gl.arange(0, W_ROWS, layout=gl.SliceLayout(1, acc_layout)), I, GATED, WRAP)
    acc = acc * gl.load(scale_ptr + expert * stride_se + w_rows)[:, None]
    if HAS_BIAS:
        acc = acc + gl.load(bias_ptr + expert * stride_be + w_rows).to(gl.float32)[:, None]
    if GATED:  # a thread holds rows r and r + 8: the split below pairs them without moving data
        gate, up = gl.split(gl.permute(gl.reshape(acc, [W_ROWS // 16, 2, 8, BLOCK_M]), [0, 2, 3, 1]))
        h = gl.reshape(glu(gate, up, ACTIVATION, True, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT), [BLOCK_N, BLOCK_M])
        _store_rows(out_ptr, h, sorted_token_ids_ptr, pid_m * BLOCK_M, n0, num_valid, stride_om, scale_ptr, False)
    else:  # (columns past h's not stored)
        h = glu(acc, acc, ACTIVATION, False, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT)
        _store_quarters(out_ptr, h, sorted_token_ids_ptr,
                        pid_m * BLOCK_M, n0, num_valid, stride_om, scale_ptr, False, n_out, True)


@gluon.jit
def moe_down_wsrr_kernel(a_ptr, w_ptr, scale_ptr, out_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                         block_expert_ids_ptr, num_tokens_post_padded_ptr, num_valid, num_sorted, H, I, stride_am,
                         stride_we, stride_wn, stride_se, stride_om,
                         bias_ptr, stride_be,  # [E, H], read only when HAS_BIAS
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                         GROUP_M: gl.constexpr, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                         X_SMEM: gl.constexpr, HAS_BIAS: gl.constexpr, ODD_K: gl.constexpr,
                         MASK_N: gl.constexpr, MASK_K: gl.constexpr, num_warps: gl.constexpr):
    """out[pair, n0:n0+BLOCK_N] = (h[pair] @ w2[e]^T + b) * routing weight, h K-permuted (as the gate/up
    kernel writes it); ODD_K: I's K tiles (the last one partial with MASK_K) are odd in number; MASK_N: H is
    no multiple of BLOCK_N (the last program's rows past H wrap and are not stored); MASK_K: I is no
    multiple of 64 (h padded to whole tiles; the weight bytes past I load as zeros)."""
    pid_m, n0 = _row_block(num_sorted, H, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= gl.load(num_tokens_post_padded_ptr):
        return
    first = pid_m * BLOCK_M
    expert = gl.load(block_expert_ids_ptr + pid_m).to(gl.int64)
    if expert < 0:
        zeros_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
        _store_rows(out_ptr, gl.zeros((BLOCK_N, BLOCK_M), dtype=gl.float32, layout=zeros_layout),
                    sorted_token_ids_ptr, first, n0, num_valid, stride_om, topk_weights_ptr, False, H, MASK_N)
        return
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_M, 16])
    acc = _gemm(a_ptr, w_ptr, sorted_token_ids_ptr, pid_m, n0, expert, num_valid, 1, H, I, stride_am, stride_we,
                stride_wn, acc_layout, BLOCK_N, BLOCK_M, BLOCK_K, STAGES, X_SMEM, LOADER_REGS, False, True, ODD_K,
                MASK_N, MASK_K)
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    if MASK_N:
        cols = cols % H
    y = acc * gl.load(scale_ptr + expert * stride_se + cols)[:, None]
    if HAS_BIAS:
        y = y + gl.load(bias_ptr + expert * stride_be + cols).to(gl.float32)[:, None]
    _store_quarters(out_ptr, y, sorted_token_ids_ptr, first, n0, num_valid, stride_om, topk_weights_ptr, True, H,
                    MASK_N)


def _meta(dtype: torch.dtype, tile: Tile, block_n: int, stages: Optional[int]) -> dict:
    meta = dict(BLOCK_M=tile.rows, BLOCK_N=block_n, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, STAGES=stages or tile.stages,
                LOADER_REGS=tile.loader_regs, num_warps=tile.consumer_warps,
                X_SMEM=gl.NVMMASharedLayout.get_default_for([tile.rows, BLOCK_K], _GL_DTYPES[dtype]))
    return meta if tile.maxnreg is None else dict(meta, maxnreg=tile.maxnreg)


def _odd_k(k: int) -> bool:
    """Whether a K loop over ``k`` takes one more tile after its pairs (a partial last tile counts)."""
    return triton.cdiv(k, BLOCK_K) % 2 == 1


def h_columns(inter: int) -> int:
    """Columns of the intermediate ``h`` the register form writes for experts of ``inter`` columns: whole
    64-wide blocks, since the K permutation moves columns within a block."""
    return triton.cdiv(inter, BLOCK_K) * BLOCK_K


def invoke_gate_up(xp, w13, w13_scale, h, sorted_token_ids, block_expert_ids, num_tokens_post_padded, top_k, inter,
                   tile: Tile, stages: Optional[int] = None, activation: str = "silu", w13_bias=None, clamp=None):
    """``h [pairs, h_columns(inter)]`` (K-permuted) from ``xp = permute_k(x)``; rows aligned in blocks of
    ``tile.rows``; ``w13`` holds 2I rows (gate, up) or I (up alone), ``w13_bias`` (optional) as many values
    an expert; ``clamp`` as :func:`.fused_moe.clamp_meta` takes it."""
    hidden = xp.shape[1]
    gated = w13.shape[1] == 2 * inter
    num_sorted = sorted_token_ids.numel()
    grid = (triton.cdiv(num_sorted, tile.rows) * triton.cdiv(h.shape[1], tile.gate_up_cols(gated)),)
    bias, has_bias = bias_args(w13, w13_bias)
    moe_gate_up_wsrr_kernel[grid](xp, w13, w13_scale, h, sorted_token_ids, block_expert_ids, num_tokens_post_padded,
                                  top_k * xp.shape[0], num_sorted, inter, hidden, xp.stride(0), w13.stride(0),
                                  w13.stride(1), w13_scale.stride(0), h.stride(0), top_k, *bias, GATED=gated,
                                  ACTIVATION=ACTIVATION_CODES[activation], ODD_K=_odd_k(hidden),
                                  PAD_I=inter % BLOCK_K != 0, **clamp_meta(activation, clamp, gated), **has_bias,
                                  **_meta(xp.dtype, tile, tile.gate_up_cols(gated), stages), enable_fp_fusion=True)


def invoke_down(h, w2, w2_scale, y, topk_weights, sorted_token_ids, block_expert_ids, num_tokens_post_padded,
                tile: Tile, stages: Optional[int] = None, w2_bias=None):
    """``y [pairs, H]`` = each pair's expert output (plus ``w2_bias`` [E, H], optional) times its routing
    weight, from the K-permuted ``h``."""
    hidden, inter = w2.shape[1], w2.shape[2]
    num_sorted = sorted_token_ids.numel()
    grid = (triton.cdiv(num_sorted, tile.rows) * triton.cdiv(hidden, tile.down_cols),)
    bias, has_bias = bias_args(w2, w2_bias)
    moe_down_wsrr_kernel[grid](h, w2, w2_scale, y, topk_weights, sorted_token_ids, block_expert_ids,
                               num_tokens_post_padded, topk_weights.numel(), num_sorted, hidden, inter, h.stride(0),
                               w2.stride(0), w2.stride(1), w2_scale.stride(0), y.stride(0), *bias,
                               ODD_K=_odd_k(inter), MASK_N=hidden % tile.down_cols != 0,
                               MASK_K=inter % BLOCK_K != 0, **has_bias,
                               **_meta(h.dtype, tile, tile.down_cols, stages), enable_fp_fusion=True)


def expert_outputs(x, w13, w13_scale, w2, w2_scale, topk_weights, aligned, h, y, rows: int = 256,
                   stages: Optional[int] = None, activation: str = "silu", w13_bias=None, w2_bias=None, clamp=None):
    """Both GEMMs of the layer on TILES[rows] with a ring of ``stages`` (the tile's own unless given) over
    the ``aligned`` blocks (``(sorted_token_ids, block_expert_ids, num_tokens_post_padded)`` in blocks of
    ``rows``): ``y [M * top_k, H]`` gets each aligned (token, slot) pair's expert output times its routing
    weight (flat ``topk_weights``), for :func:`.fused_moe.invoke_sum` to add up; ``h [M * top_k,
    h_columns(I)]`` is the intermediate (K-permuted); ``activation`` one of fused_moe's ACTIVATION_CODES (with
    ``clamp``, :func:`.fused_moe.clamp_meta`); expert biases optional."""
    tile = TILES[rows]
    top_k = topk_weights.numel() // x.shape[0]
    invoke_gate_up(permute_k(x), w13, w13_scale, h, *aligned, top_k, w2.shape[2], tile, stages, activation,
                   w13_bias, clamp)
    invoke_down(h, w2, w2_scale, y, topk_weights, *aligned, tile, stages, w2_bias)
    return y


def sm90_cubin(which: str, dtype: torch.dtype = torch.bfloat16, rows: int = 256, stages: Optional[int] = None,
               gated: bool = True, odd_k: bool = False, activation: str = "silu", biased: bool = False,
               mask_n: bool = False, pad_i: bool = False) -> bytes:
    """The ``"gate_up"`` or ``"down"`` kernel on TILES[rows] (a ring of ``stages``; over an odd number of K
    tiles with ``odd_k``; with expert biases if ``biased``; gate_up with ``activation``, for experts without
    a gate unless ``gated``; down with its last program's rows past H masked with ``mask_n``; for I no
    multiple of 64 with ``pad_i``) compiled for sm_90 without a GPU: to check offline what ptxas made of the
    K loop (benchmarks/wgmma_operand_check.py reads its SASS)."""
    tile = TILES[rows]
    own = dict(ODD_K=odd_k, HAS_BIAS=biased)
    if which == "gate_up":
        kernel, block_n = moe_gate_up_wsrr_kernel, tile.gate_up_cols(gated)
        own.update(GATED=gated, ACTIVATION=ACTIVATION_CODES[activation], PAD_I=pad_i,
                   **clamp_meta(activation, None, gated))
    else:
        kernel, block_n = moe_down_wsrr_kernel, tile.down_cols
        own.update(MASK_N=mask_n, MASK_K=pad_i)
    constexprs = dict(_meta(dtype, tile, block_n, stages), **own)
    num_warps, maxnreg = constexprs.pop("num_warps"), constexprs.pop("maxnreg", None)
    act = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[dtype]
    ptr_types = {"w_ptr": "*i8", "scale_ptr": "*fp32", "topk_weights_ptr": "*fp32", "sorted_token_ids_ptr": "*i32",
                 "block_expert_ids_ptr": "*i32", "num_tokens_post_padded_ptr": "*i32"}
    pointers = {name: ptr_types.get(name, act) for name in kernel.arg_names if name.endswith("_ptr")}
    return compile_for_sm90(kernel, constexprs, pointers, num_warps, maxnreg=maxnreg).asm["cubin"]
