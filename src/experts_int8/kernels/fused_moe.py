"""The two grouped GEMMs of a W8A16 MoE layer, in Triton, and their launchers.

Legend: M tokens, k experts per token, H hidden, I intermediate, E local experts.
Rows are the flat (token, slot) pairs ``t in [0, M*k)``; the index arrays ``sorted_token_ids``,
``block_expert_ids`` and ``num_tokens_post_padded`` are described in :mod:`.align`.

  moe_gate_up_kernel: x[M, H] @ w13[e]^T (+ bias) -> gate, up -> act(gate) * up -> inter[M*k, I]
  moe_down_kernel:    inter[M*k, I] @ w2[e]^T (+ bias) (* routing weight)   -> out[M*k, H]

Experts without a gate (w13 [E, I, H], up rows only) run gate_up with GATED off: one weight tile and one
dot a K step, ``act(up)`` stored; the down GEMM is the same.

Numerics: int8 (or float) weight tile -> activation dtype in registers (int8 -> fp16 by our own
exact PTX on GPUs) -> ``tl.dot`` with fp32 accumulation -> per-output-row weight scale once after the
K loop -> routing weight and activation in fp32 -> one cast at the store. Every program owns a
BLOCK_M x BLOCK_N output tile; a block whose expert is absent (-1) writes zeros, a block past
``num_tokens_post_padded`` exits.
Grid of both kernels: ``(cdiv(num_sorted, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)`` with N = I or H
(under SUM_TOPK the down grid has M row blocks, one per token).

Options a config may switch on (:mod:`.configs`; the tuner keeps whichever measures faster):
  SWAP_AB       weights as the left ``tl.dot`` operand (on Hopper: wgmma's register operand, async)
  FUSE_GATE_UP  gate_up: gate and up tiles joined into one dot of width 2*BLOCK_N (not with SWAP_AB;
                experts without a gate have one tile: the launcher drops it)
  PAIRS         decode: one block per (token, slot) pair, experts from the top-k ids, no align step
  DEDUP_PAIRS   with PAIRS: the first pair routed to an expert (and every BLOCK_M-th after it) takes
                the rows of the pairs routed to it; the others' programs exit, so no expert is read twice
  SPLIT_K       down only: I split over programs writing fp32 partial sums, added with the top-k sum
  SUM_TOPK      down only, with PAIRS: one block per token sums its k experts' rows and writes [M, H]
  SUM_LAST      down only: every program stores fp32 partials and counts them per (token, column tile);
                the program storing a token's last one adds them up and writes [M, H] (no sum launch)
  FP16_DOT      gate_up with bf16 x: the dot in fp16 on x's rows scaled by powers of two (one small
                launch), undone in the epilogue; int8 -> fp16 takes 1.25 instructions a weight where
                int8 -> bf16 takes 2 (see _int8_to_fp16)
  TMA           weight tiles by tensor-descriptor copies (Hopper's copy engine) instead of per-thread
                pointer loads; the activation rows stay pointer loads (they are gathered)

Config key ``PDL`` (Hopper and newer): both GEMMs are launched as programmatic dependents, so a
grid's programs are scheduled while the previous kernel (align, gate_up) drains; each program waits
at its start for that kernel's writes (``gdc_wait``). With ``PDL: 1`` it lets the next kernel launch
right after that; with ``PDL: 2`` only after its K loop, so the dependents of a grid of several waves
are scheduled as its last programs finish their loops, not while it still has programs to start
(form 1 cost 8-20% at M=2-4 on the H200, form 2 at most 3.5%; each wins 1-6% at some decode rows:
benchmarks/NOTES.md items 28, 145). The down override ``PDL_PREFETCH: n`` moves the down GEMM's wait
to just before its K loop: its programs first load their rows, expert and epilogue operands and ask
L2 for their first n K tiles of weights (none of which gate_up writes; what gate_up read was complete
before any gate_up program let this grid launch), while gate_up's last programs still run.

On CPU tensors the same kernel source runs under Triton's interpreter, which Triton enables only
when ``TRITON_INTERPRET=1`` is set before it is first imported (the tests do this on machines
without a GPU).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from ..reference import GATED_ONLY, Clamp, clamp_of

ACTIVATION_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swiglu_oai": 3, "relu2": 4}
# DEDUP_PAIRS keeps every pair's expert id in registers in each program (a [BLOCK_M, pairs] match):
# up to this many pairs; ops.py takes the align path beyond.
DEDUP_MAX_PAIRS = 256


@triton.jit
def _pdl_prologue(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel's writes are visible (nothing before this reads them);
    form 1 then lets the next kernel's programs be scheduled as this grid drains."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_loop_done(PDL: tl.constexpr):
    """PDL form 2: the next kernel may launch once every program has passed its K loop (or exited). It
    still waits for this grid's completion before it reads anything (gdc_wait), so this only moves when
    its programs are scheduled."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _program_block(num_sorted, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's row block and first output column. Grouped ordering: GROUP_M row-blocks share each
    sweep over N, so weight tiles stay in L2."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    first_m = (pid // (GROUP_M * num_pid_n)) * GROUP_M
    group_m = min(tl.cdiv(num_sorted, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_m
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_m
    return pid_m, pid_n * BLOCK_N


@triton.jit
def _block_rows(pid_m, sorted_token_ids_ptr, block_expert_ids_ptr, num_valid, BLOCK_M: tl.constexpr,
                PAIRS: tl.constexpr, DEDUP_PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr):
    """Row block ``pid_m``'s rows (flat pair ids, padding ``>= num_valid``), their mask and its expert
    (-1: not on this rank, or nothing to do: the caller stores its masked rows' zeros and returns).
    With PAIRS (no align step) block ``b`` is pair ``b`` alone and ``block_expert_ids`` are the pairs'
    experts; with DEDUP_PAIRS as well, it takes the rows of :func:`_dedup_pair_rows`."""
    if PAIRS:
        if DEDUP_PAIRS:
            rows, leads = _dedup_pair_rows(pid_m, block_expert_ids_ptr, num_valid, BLOCK_M, PAIRS_P2)
            rows = tl.where(leads, rows, num_valid)  # not a leader: another program computes this pair
            expert = tl.where(leads, tl.load(block_expert_ids_ptr + pid_m).to(tl.int64), -1)
            return rows, rows < num_valid, expert
        rows = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_valid).to(tl.int64)
    else:
        rows = tl.load(sorted_token_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return rows, rows < num_valid, tl.load(block_expert_ids_ptr + pid_m).to(tl.int64)


@triton.jit
def _dedup_pair_rows(pid_m, pair_experts_ptr, num_valid, BLOCK_M: tl.constexpr, PAIRS_P2: tl.constexpr):
    """DEDUP_PAIRS: block ``pid_m`` is pair ``pid_m``. Among the pairs routed to its expert (in pair
    order) it leads when its rank is a multiple of BLOCK_M, and then takes the BLOCK_M pairs from its
    own on as rows (padding ``num_valid``). Returns ``(rows, leads)``; every pair is in exactly one
    leader's rows, found from the (at most PAIRS_P2) top-k ids alone: no align launch."""
    p = tl.arange(0, PAIRS_P2)
    experts = tl.load(pair_experts_ptr + p, mask=p < num_valid, other=-2)  # -2: past the batch, no expert
    same = experts == tl.load(pair_experts_ptr + pid_m)
    mine = tl.sum((same & (p < pid_m)).to(tl.int32), 0)
    slot = tl.where(same, tl.cumsum(same.to(tl.int32), 0) - 1 - mine, -1)
    match = slot[None, :] == tl.arange(0, BLOCK_M)[:, None]  # (BLOCK_M, PAIRS_P2): row j <- pair p
    rows = tl.where(tl.sum(match.to(tl.int32), 1) > 0, tl.sum(tl.where(match, p[None, :], 0), 1), num_valid)
    return rows.to(tl.int64), mine % BLOCK_M == 0


# int8 -> fp16, 4 weights per 32-bit register ($2 in; $0, $1 out) in 5 instructions: bias each byte to
# unsigned (xor 0x80), put it under the exponent of 1024 (half 0x64XX = 1024 + u), subtract 1152 =
# 1024 + 128. Exact. (Triton's own cast takes a quarter-rate I2F per weight.) Also used by gluon_moe.
INT8_TO_FP16_PTX = tl.constexpr("""{
        .reg .b32 t, m;
        xor.b32 t, $2, 0x80808080;
        prmt.b32 $0, t, 0x64646464, 0x4140;
        prmt.b32 $1, t, 0x64646464, 0x4342;
        mov.b32 m, 0x64806480;
        sub.f16x2 $0, $0, m;
        sub.f16x2 $1, $1, m;
        }""")


@triton.jit
def _int8_to_fp16(w):
    return tl.inline_asm_elementwise(INT8_TO_FP16_PTX, "=r,=r,r", [w], dtype=tl.float16, is_pure=True, pack=4)


# An L2 prefetch of the 128-byte line at global address $1 when $2 is nonzero; nothing waits for it.
# $0 is a dummy: inline asm returns a value.
PREFETCH_L2_PTX = tl.constexpr("""{
        .reg .pred p;
        setp.ne.b32 p, $2, 0;
        @p prefetch.global.L2 [$1];
        mov.b32 $0, 0;
        }""")


@triton.jit
def _prefetch_rows_l2(row_ptrs, k0, k_end, LINES: tl.constexpr):
    """PDL_PREFETCH: ask L2 for elements [k0, k_end) of each row at ``row_ptrs`` (one prefetch per 128-byte
    line, LINES a power of two covering the range plus a line for an unaligned start; a line asked for
    twice costs nothing more)."""
    step: tl.constexpr = 128 // (row_ptrs.dtype.element_ty.primitive_bitwidth // 8)
    j = tl.arange(0, LINES)
    ptrs = row_ptrs[:, None] + tl.minimum(k0 + j * step, k_end - 1)[None, :]
    ask = tl.broadcast_to((j * step < k_end - k0 + step).to(tl.int32)[None, :], ptrs.shape)
    tl.inline_asm_elementwise(PREFETCH_L2_PTX, "=r,l,r", [ptrs, ask], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _dot_operand(w, a, FAST_CVT: tl.constexpr):
    """Weight tile ``w`` in the dtype of the other operand ``a``: int8 -> fp16 by :func:`_int8_to_fp16`
    on GPUs (FAST_CVT); every other case (and the interpreter, which runs no assembly) by Triton's cast."""
    if FAST_CVT and w.dtype.is_int8() and a.dtype.is_fp16():
        return _int8_to_fp16(w)
    return w.to(a.dtype)


@triton.jit
def _weight_tile(w_ptrs, w_desc, row0, kb, k_left, offs_k, cols, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr,
                 TMA: tl.constexpr, MASK_N: tl.constexpr):
    """The K step ``kb`` of a weight tile: ``(BLOCK_K, BLOCK_N)`` for the right dot operand,
    ``(BLOCK_N, BLOCK_K)`` under SWAP_AB. By pointers (masked along K, and with MASK_N along N to the
    tile's ``cols``: the rows not loaded cost no bytes), or with TMA as one tensor-descriptor copy of
    rows ``[row0, row0 + BLOCK_N)`` of the ``(E*N, K)`` weight view (the copy engine fills zeros past K
    and past the last row; rows past this expert's N only feed masked output columns)."""
    if TMA:
        w = w_desc.load([row0, kb * BLOCK_K])
        if not SWAP_AB:
            w = tl.trans(w)
    elif SWAP_AB:
        mask = offs_k[None, :] < k_left
        if MASK_N:
            mask &= cols[:, None]
        w = tl.load(w_ptrs, mask=mask, other=0)
    else:
        mask = offs_k[:, None] < k_left
        if MASK_N:
            mask &= cols[None, :]
        w = tl.load(w_ptrs, mask=mask, other=0)
    return w


@triton.jit
def _gate_up_epilogue_operands(scale_ptr, bias_ptr, topk_weights_ptr, x_inv_scale_ptr, expert, offs_wn, rows, x_rows,
                               row_mask, I, stride_se, stride_be, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                               MUL_ROUTED_WEIGHT: tl.constexpr, ROW_SCALE: tl.constexpr, GATED: tl.constexpr):
    """The gate_up epilogue's loads: the weight rows' scales (gate, up), x's row scales (FP16_DOT), the
    biases (gate, up) and the routing weights; 1.0 / 0.0 for those the launch does not have. Without
    GATED the rows are up rows alone: their scales and biases come back as the gate's (``_g``)."""
    scale_g, scale_u, inv, bias_g, bias_u, rw = 1.0, 1.0, 1.0, 0.0, 0.0, 1.0
    if HAS_SCALE:
        s_ptrs = scale_ptr + expert * stride_se + offs_wn
        scale_g = tl.load(s_ptrs)
        if GATED:
            scale_u = tl.load(s_ptrs + I)
    if ROW_SCALE:  # FP16_DOT: the power-of-two scale of each token's row, undone on the accumulators (exact)
        inv = tl.load(x_inv_scale_ptr + x_rows, mask=row_mask, other=0.0)
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_wn
        bias_g = tl.load(b_ptrs).to(tl.float32)
        if GATED:
            bias_u = tl.load(b_ptrs + I).to(tl.float32)
    if MUL_ROUTED_WEIGHT:
        rw = tl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return scale_g, scale_u, inv, bias_g, bias_u, rw


@triton.jit
def moe_gate_up_kernel(
    x_ptr,  # (M, H) activation dtype, row stride stride_xm, unit column stride
    w_ptr,  # (E, 2I, H) int8 or activation dtype, unit stride along H; (E, I, H) without GATED
    scale_ptr,  # (E, 2I) fp32 per-row scales ((E, I) without GATED); read only when HAS_SCALE
    bias_ptr,  # (E, 2I) expert biases ((E, I) without GATED), any float dtype; read only when HAS_BIAS
    out_ptr,  # (M*k, I) activation dtype: act(gate) * up, or act(up) without GATED
    topk_weights_ptr,  # (M*k,) any float dtype; read only when MUL_ROUTED_WEIGHT (weight applied on the input)
    sorted_token_ids_ptr,  # (num_sorted,) int32
    block_expert_ids_ptr,  # (num_sorted // BLOCK_M,) int32
    num_tokens_post_padded_ptr,  # (1,) int32
    num_valid,  # M * k
    num_sorted,
    I,
    H,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    stride_om,
    counts_ptr,  # (num_counts,) int32 zeroed here for the down GEMM's SUM_LAST; used only with ZERO_COUNTS
    num_counts,
    w_desc,  # with TMA: tensor descriptor of w as (E*2I, H) ((E*I, H) without GATED), block (BLOCK_N, BLOCK_K)
    x_inv_scale_ptr,  # (M,) fp32: x's rows were scaled by 1 / this (FP16_DOT); read only when ROW_SCALE
    TOP_K: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    PAIRS: tl.constexpr,
    DEDUP_PAIRS: tl.constexpr,
    PAIRS_P2: tl.constexpr,  # power of two >= M*k; read only with DEDUP_PAIRS
    FUSE_GATE_UP: tl.constexpr,
    SWIGLU_ALPHA: tl.constexpr,  # swiglu_oai's sigmoid slope
    SWIGLU_LIMIT: tl.constexpr,  # a clamped SwiGLU's limit (reference.Clamp), or None
    LIMIT_AFTER_ACT: tl.constexpr,
    ZERO_COUNTS: tl.constexpr,
    PDL: tl.constexpr,
    TMA: tl.constexpr,
    FAST_CVT: tl.constexpr,
    ROW_SCALE: tl.constexpr,
    TILE_N: tl.constexpr,  # columns of I a program computes, <= BLOCK_N (the rest of its tile is masked)
    LATE_EPILOGUE: tl.constexpr,
    GATED: tl.constexpr,  # w holds gate then up rows; else up rows alone (no second dot, act(up) stored)
):
    _pdl_prologue(PDL)
    if ZERO_COUNTS:  # the down GEMM's arrival counters (SUM_LAST), zeroed here: no memset launch
        if tl.program_id(0) == 0:
            for start in range(0, num_counts, 1024):
                offs = start + tl.arange(0, 1024)
                tl.store(counts_ptr + offs, tl.zeros((1024,), dtype=tl.int32), mask=offs < num_counts)
    # TILE_N < BLOCK_N: narrower programs than the dot's tile, so that the grid fills whole waves of the
    # GPU's resident programs (8x7b at M=1: 1.70 -> 1.94 waves, 2% faster; benchmarks/NOTES.md item 128)
    pid_m, n0 = _program_block(num_sorted, I, BLOCK_M, TILE_N, GROUP_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    MASK_N: tl.constexpr = TILE_N < BLOCK_N
    cols = offs_n < I
    if MASK_N:
        cols &= tl.arange(0, BLOCK_N) < TILE_N
    if not PAIRS:  # with PAIRS the grid holds exactly one block per pair
        if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded_ptr):
            return
    rows, row_mask, expert = _block_rows(pid_m, sorted_token_ids_ptr, block_expert_ids_ptr, num_valid, BLOCK_M,
                                         PAIRS, DEDUP_PAIRS, PAIRS_P2)
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    out_mask = row_mask[:, None] & cols[None, :]
    if expert < 0:
        tl.store(out_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty), mask=out_mask)
        return

    offs_k = tl.arange(0, BLOCK_K)
    offs_wn = offs_n % I  # wrapped, so weight loads need no mask along N
    x_rows = rows // TOP_K
    if SWAP_AB:  # weights as the left operand, loaded (N, K): acc^T = w x^T
        a_ptrs = x_ptr + x_rows[None, :] * stride_xm + offs_k[:, None]  # (BLOCK_K, BLOCK_M)
        g_ptrs = w_ptr + expert * stride_we + offs_wn[:, None] * stride_wn + offs_k[None, :]  # (BLOCK_N, BLOCK_K)
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if GATED:
            acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        a_ptrs = x_ptr + x_rows[:, None] * stride_xm + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
        g_ptrs = w_ptr + expert * stride_we + offs_wn[None, :] * stride_wn + offs_k[:, None]  # (BLOCK_K, BLOCK_N)
        if FUSE_GATE_UP:  # gate and up columns interleaved, split after the K loop
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        else:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if GATED:
                acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        u_ptrs = g_ptrs + I * stride_wn
        g_row = (expert * 2 * I + n0).to(tl.int32)  # TMA: the tile's first gate row in the (E*2I, H) view
    else:  # (FUSE_GATE_UP needs both: the launcher drops it)
        g_row = (expert * I + n0).to(tl.int32)  # TMA: the tile's first (up) row in the (E*I, H) view
    # The epilogue's operands are loaded before the K loop, so that a short (decode) program does not end
    # on one more memory round trip after its last dot (benchmarks/NOTES.md item 131); LATE_EPILOGUE keeps
    # them after it, for entries whose programs would lose a resident slot to the registers they hold
    if not LATE_EPILOGUE:
        scale_g, scale_u, inv, bias_g, bias_u, rw = _gate_up_epilogue_operands(
            scale_ptr, bias_ptr, topk_weights_ptr, x_inv_scale_ptr, expert, offs_wn, rows, x_rows, row_mask, I,
            stride_se, stride_be, HAS_SCALE, HAS_BIAS, MUL_ROUTED_WEIGHT, ROW_SCALE, GATED)
    for kb in range(0, tl.cdiv(H, BLOCK_K)):
        k_left = H - kb * BLOCK_K
        g = _weight_tile(g_ptrs, w_desc, g_row, kb, k_left, offs_k, cols, BLOCK_K, SWAP_AB, TMA, MASK_N)
        if GATED:
            u = _weight_tile(u_ptrs, w_desc, g_row + I, kb, k_left, offs_k, cols, BLOCK_K, SWAP_AB, TMA, MASK_N)
        if SWAP_AB:
            a = tl.load(a_ptrs, mask=row_mask[None, :] & (offs_k[:, None] < k_left), other=0.0)
            acc_g = tl.dot(_dot_operand(g, a, FAST_CVT), a, acc_g, input_precision=DOT_PRECISION)
            if GATED:
                acc_u = tl.dot(_dot_operand(u, a, FAST_CVT), a, acc_u, input_precision=DOT_PRECISION)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            if FUSE_GATE_UP:  # one dot of width 2*BLOCK_N: one convert/store/fence/wgmma per K step, not two
                w = tl.reshape(tl.join(g, u), (BLOCK_K, 2 * BLOCK_N))
                acc = tl.dot(a, _dot_operand(w, a, FAST_CVT), acc, input_precision=DOT_PRECISION)
            else:
                acc_g = tl.dot(a, _dot_operand(g, a, FAST_CVT), acc_g, input_precision=DOT_PRECISION)
                if GATED:
                    acc_u = tl.dot(a, _dot_operand(u, a, FAST_CVT), acc_u, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        if GATED:
            u_ptrs += BLOCK_K
    _pdl_loop_done(PDL)
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        if GATED:
            acc_u = tl.trans(acc_u)
    elif FUSE_GATE_UP:  # a thread holds adjacent accumulator columns, so this split moves no data
        acc_g, acc_u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))

    if LATE_EPILOGUE:
        scale_g, scale_u, inv, bias_g, bias_u, rw = _gate_up_epilogue_operands(
            scale_ptr, bias_ptr, topk_weights_ptr, x_inv_scale_ptr, expert, offs_wn, rows, x_rows, row_mask, I,
            stride_se, stride_be, HAS_SCALE, HAS_BIAS, MUL_ROUTED_WEIGHT, ROW_SCALE, GATED)
    if HAS_SCALE:
        acc_g *= scale_g[None, :]
        if GATED:
            acc_u *= scale_u[None, :]
    if ROW_SCALE:
        acc_g *= inv[:, None]
        if GATED:
            acc_u *= inv[:, None]
    if HAS_BIAS:  # (never together with MUL_ROUTED_WEIGHT: the launcher's caller checks)
        acc_g += bias_g[None, :]
        if GATED:
            acc_u += bias_u[None, :]
    if MUL_ROUTED_WEIGHT:
        acc_g *= rw[:, None]
        if GATED:
            acc_u *= rw[:, None]
    # without GATED: act(up), the up rows' accumulator being acc_g (and _activate reads no acc_u)
    h = _activate(acc_g, acc_u if GATED else acc_g, ACTIVATION, SWIGLU_ALPHA, SWIGLU_LIMIT, LIMIT_AFTER_ACT, GATED)
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _activate(acc_g, acc_u, ACTIVATION: tl.constexpr, SWIGLU_ALPHA: tl.constexpr, SWIGLU_LIMIT: tl.constexpr,
              LIMIT_AFTER_ACT: tl.constexpr, GATED: tl.constexpr):
    """act(gate) * up, in fp32, clamped as reference.act_and_mul clamps it; without GATED act(acc_g) alone
    (``acc_u`` unread, no clamp; swiglu_oai is gated only)."""
    if SWIGLU_LIMIT is not None:
        if not LIMIT_AFTER_ACT:
            acc_g = tl.minimum(acc_g, SWIGLU_LIMIT)
        acc_u = tl.minimum(tl.maximum(acc_u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
    if ACTIVATION == 0:  # silu
        gate = acc_g * tl.sigmoid(acc_g)
    elif ACTIVATION == 1:  # gelu (erf)
        gate = 0.5 * acc_g * (1.0 + tl.math.erf(acc_g * 0.7071067811865476))
    elif ACTIVATION == 2:  # gelu, tanh approximation: 0.5 g (1 + tanh(z)) = g * sigmoid(2z)
        gate = acc_g * tl.sigmoid(1.5957691216057308 * (acc_g + 0.044715 * acc_g * acc_g * acc_g))
    elif ACTIVATION == 4:  # relu2 (NemotronH): relu(g)^2
        g = tl.maximum(acc_g, 0.0)
        gate = g * g
    else:  # swiglu_oai (GPT-OSS; clamped above): gate * sigmoid(alpha * gate) * (up + 1)
        gate = acc_g * tl.sigmoid(SWIGLU_ALPHA * acc_g)
        acc_u = acc_u + 1.0
    if LIMIT_AFTER_ACT:
        gate = tl.minimum(gate, SWIGLU_LIMIT)
    if GATED:
        gate = gate * acc_u
    return gate


def clamp_meta(activation: str, clamp: Optional[Clamp], gated: bool = True) -> dict:
    """The gate_up kernels' constexprs for ``clamp`` (None: ``activation``'s own), checked by reference.clamp_of
    (experts without a gate take none); each limit compiles its own kernel."""
    clamp = clamp_of(activation, *(clamp or ()), gated=gated)
    return dict(SWIGLU_ALPHA=clamp.alpha, SWIGLU_LIMIT=clamp.limit, LIMIT_AFTER_ACT=clamp.after_act)


@triton.jit
def _down_epilogue_operands(scale_ptr, bias_ptr, topk_weights_ptr, expert, offs_wn, rows, row_mask, stride_se,
                            stride_be, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                            MUL_ROUTED_WEIGHT: tl.constexpr):
    """The down epilogue's loads: the weight rows' scales, the biases, the routing weights (1.0 / 0.0 when absent)."""
    scale, bias, rw = 1.0, 0.0, 1.0
    if HAS_SCALE:
        scale = tl.load(scale_ptr + expert * stride_se + offs_wn)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_wn).to(tl.float32)
    if MUL_ROUTED_WEIGHT:
        rw = tl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return scale, bias, rw


@triton.jit
def _down_tile(a_ptr, w_ptr, w_desc, scale_ptr, bias_ptr, topk_weights_ptr, rows, row_mask, expert, n0, offs_wn,
               H, I, stride_am, stride_we, stride_wn, stride_se, stride_be, kb_start, kb_end,
               HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
               DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               SWAP_AB: tl.constexpr, SPLIT_K: tl.constexpr, TMA: tl.constexpr, FAST_CVT: tl.constexpr,
               LATE_EPILOGUE: tl.constexpr, PREFETCH_TILES: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    """fp32 ``(BLOCK_M, BLOCK_N)`` tile of ``a[rows] @ w2[expert, offs_wn]^T`` over K blocks
    ``[kb_start, kb_end)``, times the row scales, plus the bias (in the first split-K partial only),
    times the routing weights. With PREFETCH_TILES (under PDL) the program waits for the previous
    kernel's writes only here, before its K loop: the epilogue's operands are loaded and its first
    PREFETCH_TILES K tiles of weights asked of L2 while gate_up still runs."""
    offs_k = tl.arange(0, BLOCK_K)
    if SWAP_AB:  # weights as the left operand, loaded (N, K): acc^T = w a^T
        a_ptrs = a_ptr + rows[None, :] * stride_am + offs_k[:, None]  # (BLOCK_K, BLOCK_M)
        w_ptrs = w_ptr + expert * stride_we + offs_wn[:, None] * stride_wn + offs_k[None, :]  # (BLOCK_N, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
        w_ptrs = w_ptr + expert * stride_we + offs_wn[None, :] * stride_wn + offs_k[:, None]  # (BLOCK_K, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_ptrs += kb_start * BLOCK_K
    w_ptrs += kb_start * BLOCK_K
    w_row = (expert * H + n0).to(tl.int32)  # TMA: the tile's first row in the (E*H, I) view
    if not LATE_EPILOGUE:  # the epilogue's operands before the K loop, as in the gate_up kernel
        scale, bias, rw = _down_epilogue_operands(scale_ptr, bias_ptr, topk_weights_ptr, expert, offs_wn, rows,
                                                  row_mask, stride_se, stride_be, HAS_SCALE, HAS_BIAS,
                                                  MUL_ROUTED_WEIGHT)
    if PREFETCH_TILES:  # the weights do not depend on gate_up: in flight to L2 before the wait
        k0 = kb_start * BLOCK_K
        _prefetch_rows_l2(w_ptr + expert * stride_we + offs_wn.to(tl.int64) * stride_wn, k0,
                          tl.minimum(tl.minimum(kb_start + PREFETCH_TILES, kb_end) * BLOCK_K, I), PREFETCH_LINES)
        tl.extra.cuda.gdc_wait()
    for kb in range(kb_start, kb_end):
        k_left = I - kb * BLOCK_K
        w = _weight_tile(w_ptrs, w_desc, w_row, kb, k_left, offs_k, offs_wn, BLOCK_K, SWAP_AB, TMA, False)
        if SWAP_AB:
            a = tl.load(a_ptrs, mask=row_mask[None, :] & (offs_k[:, None] < k_left), other=0.0)
            acc = tl.dot(_dot_operand(w, a, FAST_CVT), a, acc, input_precision=DOT_PRECISION)
        else:
            a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            acc = tl.dot(a, _dot_operand(w, a, FAST_CVT), acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SWAP_AB:
        acc = tl.trans(acc)

    if LATE_EPILOGUE:
        scale, bias, rw = _down_epilogue_operands(scale_ptr, bias_ptr, topk_weights_ptr, expert, offs_wn, rows,
                                                  row_mask, stride_se, stride_be, HAS_SCALE, HAS_BIAS,
                                                  MUL_ROUTED_WEIGHT)
    if HAS_SCALE:
        acc *= scale[None, :]
    if HAS_BIAS:
        if SPLIT_K > 1:  # the bias belongs to one of the partial sums
            bias = tl.where(tl.program_id(1) == 0, bias, 0.0)
        acc += bias[None, :]
    if MUL_ROUTED_WEIGHT:
        acc *= rw[:, None]
    return acc


@triton.jit
def moe_down_kernel(
    a_ptr,  # (M*k, I) activation dtype (the gate_up output), unit column stride
    w_ptr,  # (E, H, I) int8 or activation dtype, unit stride along I
    scale_ptr,  # (E, H) fp32 per-row scales; read only when HAS_SCALE
    bias_ptr,  # (E, H) expert biases, any float dtype; read only when HAS_BIAS
    out_ptr,  # (M*k, H) activation dtype; (M, H) with SUM_TOPK
    topk_weights_ptr,  # (M*k,) any float dtype; read only when MUL_ROUTED_WEIGHT
    sorted_token_ids_ptr,  # (num_sorted,) int32
    block_expert_ids_ptr,  # (num_sorted // BLOCK_M,) int32; with PAIRS the (M*k,) experts of the pairs
    num_tokens_post_padded_ptr,  # (1,) int32
    num_valid,  # M * k
    num_sorted,
    H,
    I,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_be,
    stride_om,
    stride_os,  # between split-K partials; used only when SPLIT_K > 1
    sums_ptr,  # (M, H) activation dtype: the layer's output; written only with SUM_LAST
    counts_ptr,  # (M, cdiv(H, BLOCK_N)) int32, zero on entry; used only with SUM_LAST
    stride_sums,
    w_desc,  # with TMA: tensor descriptor of w as (E*H, I), block (BLOCK_N, BLOCK_K); else unused
    TOP_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr,
    PAIRS: tl.constexpr,
    DEDUP_PAIRS: tl.constexpr,
    PAIRS_P2: tl.constexpr,  # power of two >= M*k; read only with DEDUP_PAIRS
    SPLIT_K: tl.constexpr,
    SUM_TOPK: tl.constexpr,
    SUM_LAST: tl.constexpr,
    PDL: tl.constexpr,
    TMA: tl.constexpr,
    FAST_CVT: tl.constexpr,
    LATE_EPILOGUE: tl.constexpr,  # the epilogue's loads after the K loop (see the gate_up kernel)
    PREFETCH_TILES: tl.constexpr,  # PDL_PREFETCH under PDL, not SUM_TOPK (else 0): the wait just before the K loop
    PREFETCH_LINES: tl.constexpr,  # 128-byte lines a row's PREFETCH_TILES K tiles span, to a power of two
):
    if PREFETCH_TILES:  # the wait moves to _down_tile, after what does not read gate_up's output
        if PDL == 1:
            tl.extra.cuda.gdc_launch_dependents()
    else:
        _pdl_prologue(PDL)
    pid_m, n0 = _program_block(num_sorted, H, BLOCK_M, BLOCK_N, GROUP_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_wn = offs_n % H
    if SUM_TOPK:  # (with PAIRS) block pid_m is token pid_m: its k down-projections summed here
        lane0 = tl.arange(0, BLOCK_M) == 0
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j in range(TOP_K):
            pair = pid_m * TOP_K + j
            expert = tl.load(block_expert_ids_ptr + pair).to(tl.int64)
            if expert >= 0:  # an expert on another rank adds nothing here
                rows = tl.where(lane0, pair, num_valid).to(tl.int64)
                total += _down_tile(a_ptr, w_ptr, w_desc, scale_ptr, bias_ptr, topk_weights_ptr, rows, lane0,
                                    expert, n0, offs_wn, H, I, stride_am, stride_we, stride_wn, stride_se,
                                    stride_be, 0, tl.cdiv(I, BLOCK_K), HAS_SCALE, HAS_BIAS, MUL_ROUTED_WEIGHT,
                                    DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB, 1, TMA,
                                    FAST_CVT, LATE_EPILOGUE, 0, 1)
        _pdl_loop_done(PDL)
        out_ptrs = out_ptr + tl.where(lane0, pid_m, 0).to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=lane0[:, None] & (offs_n[None, :] < H))
        return

    if not PAIRS:  # with PAIRS the grid holds exactly one block per pair
        if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded_ptr):
            return
    rows, row_mask, expert = _block_rows(pid_m, sorted_token_ids_ptr, block_expert_ids_ptr, num_valid, BLOCK_M,
                                         PAIRS, DEDUP_PAIRS, PAIRS_P2)
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    num_kb = tl.cdiv(I, BLOCK_K)
    kb_start = 0
    kb_end = num_kb
    if SPLIT_K > 1:  # this program sums one slice of I into its own partial output (fp32)
        split = tl.program_id(1)
        kb_start = split * tl.cdiv(num_kb, SPLIT_K)
        kb_end = tl.minimum(kb_start + tl.cdiv(num_kb, SPLIT_K), num_kb)
        out_ptrs += split.to(tl.int64) * stride_os
    out_mask = row_mask[:, None] & (offs_n[None, :] < H)
    if expert < 0:
        if PREFETCH_TILES:
            tl.extra.cuda.gdc_wait()
        tl.store(out_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty), mask=out_mask)
        if SUM_LAST:
            _sum_if_last(out_ptr, sums_ptr, counts_ptr, rows, row_mask, offs_n, H, stride_om, stride_os,
                         stride_sums, TOP_K, SPLIT_K, BLOCK_M, BLOCK_N)
        return
    acc = _down_tile(a_ptr, w_ptr, w_desc, scale_ptr, bias_ptr, topk_weights_ptr, rows, row_mask, expert, n0,
                     offs_wn, H, I, stride_am, stride_we, stride_wn, stride_se, stride_be, kb_start, kb_end,
                     HAS_SCALE, HAS_BIAS, MUL_ROUTED_WEIGHT, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, SWAP_AB,
                     SPLIT_K, TMA, FAST_CVT, LATE_EPILOGUE, PREFETCH_TILES, PREFETCH_LINES)
    _pdl_loop_done(PDL)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    if SUM_LAST:
        _sum_if_last(out_ptr, sums_ptr, counts_ptr, rows, row_mask, offs_n, H, stride_om, stride_os,
                     stride_sums, TOP_K, SPLIT_K, BLOCK_M, BLOCK_N)


@triton.jit
def _sum_if_last(y_ptr, sums_ptr, counts_ptr, rows, row_mask, offs_n, H, stride_ym, stride_ys, stride_sums,
                 TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """SUM_LAST: count this program's partials of its rows' column tile as stored, one arrival per row
    (one row with PAIRS, a leader's pairs with DEDUP_PAIRS, an align block's pairs on the align path,
    whose blocks of absent experts store zeros and count too: a token routed twice to the expert counts
    twice, and only one of its arrivals can be the last); for each token whose last of
    TOP_K x SPLIT_K partials this program stored, add them up in a fixed order (the result does not
    depend on which program is last) and write its tile of the layer's output. No sum launch."""
    tokens = tl.where(row_mask, rows // TOP_K, 0).to(tl.int64)
    count_ptrs = counts_ptr + tokens * tl.cdiv(H, BLOCK_N) + tl.min(offs_n, axis=0) // BLOCK_N
    # Needed: the atomics below run on the threads that own the rows, so this barrier is what puts every
    # thread's partial store before their release (and the readers wait on the broadcast of the acquire)
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptrs, 1, mask=row_mask, sem="acq_rel", scope="gpu")
    last = row_mask & (arrived == TOP_K * SPLIT_K - 1)
    if tl.max(last.to(tl.int32), axis=0) > 0:
        mask = last[:, None] & (offs_n[None, :] < H)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            for j in tl.static_range(TOP_K):
                # .cg: from L2, where the other programs' partials are (this SM's L1 may hold an older call's)
                row = stride_ys.to(tl.int64) * s + (tokens * TOP_K + j) * stride_ym
                acc += tl.load(y_ptr + row[:, None] + offs_n[None, :], mask=mask, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
        tl.store(sums_ptr + tokens[:, None] * stride_sums + offs_n[None, :], acc.to(sums_ptr.dtype.element_ty),
                 mask=mask)


# Every launch (and offline compile) passes enable_fp_fusion=True: the fused multiply-adds these kernels were
# tuned and checked with. Left unset, Triton 3.9 warns on the first compile that its default turns to False in
# Triton 3.10 (TRITON_DEFAULT_FP_FUSION); the launch option is read by every Triton we support, and ignored by
# the interpreter.
def _kernel(kernel, device: torch.device):
    interpreted = isinstance(kernel, InterpretedFunction)
    if device.type == "cpu" and not interpreted:
        raise RuntimeError(
            "the Triton backend on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 in the "
            "environment before importing experts_int8, or use backend='torch'"
        )
    if device.type == "cuda" and interpreted:
        raise RuntimeError("TRITON_INTERPRET=1 is set, so Triton cannot compile for CUDA; unset it")
    return kernel


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 activations get true fp32 products (not tf32); 16-bit dtypes ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def _num_sorted(sorted_token_ids, topk_weights, config: dict) -> int:
    """Rows the grid covers: the align step's padded length, or one BLOCK_M block per pair (PAIRS)."""
    if config.get("PAIRS"):
        return topk_weights.numel() * config["BLOCK_SIZE_M"]
    return sorted_token_ids.numel()


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA devices of compute capability 9.0 and newer (not the
    interpreter, not ROCm)."""
    return device.type == "cuda" and torch.version.hip is None and _capability(device) >= (9, 0)


def pdl_meta(config: dict, device: torch.device) -> dict:
    """The entry's ``PDL`` form for the kernel and, when it is on, Triton's launch option for a
    programmatic dependent launch (where the device supports it; elsewhere a plain launch)."""
    form = config.get("PDL", 0)
    return dict(PDL=form, launch_pdl=True) if form and pdl_supported(device) else dict(PDL=0)


def fast_cvt(device: torch.device) -> bool:
    """Whether the kernels convert int8 weights to fp16 with their own PTX (NVIDIA GPUs; the
    interpreter and ROCm take Triton's cast)."""
    return device.type == "cuda" and torch.version.hip is None


def _capability(device: torch.device) -> tuple[int, int]:
    # asked on every launch (PDL, TMA, the align kernel's trigger): looked up once a GPU
    return _capability_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _launch_meta(config: dict, num_pairs: int) -> dict:
    dedup = bool(config.get("DEDUP_PAIRS", 0))
    if dedup and num_pairs > DEDUP_MAX_PAIRS:
        raise ValueError(f"DEDUP_PAIRS handles up to {DEDUP_MAX_PAIRS} (token, slot) pairs, got {num_pairs}")
    return dict(
        BLOCK_M=config["BLOCK_SIZE_M"],
        BLOCK_N=config["BLOCK_SIZE_N"],
        BLOCK_K=config["BLOCK_SIZE_K"],
        GROUP_M=config["GROUP_SIZE_M"],
        SWAP_AB=bool(config.get("SWAP_AB", 0)),
        PAIRS=bool(config.get("PAIRS", 0)),
        DEDUP_PAIRS=dedup,
        PAIRS_P2=max(16, triton.next_power_of_2(num_pairs)) if dedup else 16,
        TMA=bool(config.get("TMA", 0)),
        LATE_EPILOGUE=bool(config.get("LATE_EPILOGUE", 0)),
        num_warps=config["num_warps"],
        num_stages=config["num_stages"],
    )


def _gate_up_meta(config: dict, gated: bool = True) -> dict:
    """The gate_up kernel's own config keys (beside :func:`_launch_meta`'s). Experts without a gate
    (``gated`` False) have one weight tile a K step: FUSE_GATE_UP, joining gate and up, does not apply."""
    return dict(FUSE_GATE_UP=gated and bool(config.get("FUSE_GATE_UP", 0)), GATED=gated,
                TILE_N=config.get("TILE_N", config["BLOCK_SIZE_N"]))


def _down_meta(config: dict, element_size: int = 1, pdl: bool = False) -> dict:
    """The down kernel's own config keys (beside :func:`_launch_meta`'s). PDL_PREFETCH applies only where
    the launch is a programmatic dependent (``pdl``) and not to SUM_TOPK, whose programs wait first."""
    tiles = config.get("PDL_PREFETCH", 0) if pdl and not config.get("SUM_TOPK") else 0
    lines = triton.next_power_of_2(triton.cdiv(tiles * config["BLOCK_SIZE_K"] * element_size, 128) + 1)
    return dict(SPLIT_K=config.get("SPLIT_K", 1), SUM_TOPK=bool(config.get("SUM_TOPK", 0)),
                SUM_LAST=bool(config.get("SUM_LAST", 0)), PREFETCH_TILES=tiles, PREFETCH_LINES=lines)


def weight_descriptor(w: torch.Tensor, config: dict) -> TensorDescriptor | None:
    """TMA: expert weights ``w [E, N, K]`` as an ``(E*N, K)`` tensor descriptor whose blocks are the
    config's ``(BLOCK_SIZE_N, BLOCK_SIZE_K)`` weight tiles; None when the config has no TMA."""
    if not config.get("TMA"):
        return None
    num_experts, n, k = w.shape
    block = [config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]]
    if w.device.type == "cuda" and (torch.version.hip is not None or _capability(w.device) < (9, 0)):
        raise ValueError("config TMA needs an NVIDIA GPU of compute capability 9.0 or newer; drop TMA from the config")
    if not tma_layout_fits(w, config):
        raise ValueError(f"config TMA needs expert weights [E, N, K] contiguous over (E, N) with 16-byte aligned rows "
                         f"and weight tiles of at most 256 x 256; got strides {tuple(w.stride())}, tile {block}")
    return TensorDescriptor(w, [num_experts * n, k], [w.stride(1), 1], block)


def tma_layout_fits(w: torch.Tensor, config: dict) -> bool:
    """Whether expert weights ``w [E, N, K]`` are one ``(E*N, K)`` view with 16-byte aligned rows that the
    config's weight tiles (at most 256 x 256) can be copied from by a tensor descriptor."""
    n = w.shape[1]
    return (w.stride(2) == 1 and w.stride(0) == n * w.stride(1) and (w.stride(1) * w.element_size()) % 16 == 0
            and w.data_ptr() % 16 == 0 and max(config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]) <= 256)


def invoke_gate_up(x, w13, w13_scale, out, topk_weights, sorted_token_ids, block_expert_ids,
                   num_tokens_post_padded, top_k, activation, mul_routed_weight, config, w13_bias=None,
                   counts=None, clamp=None):
    """Launch GEMM1 (+ activation). ``out [M*k, I]`` is written in full (pad rows excepted); ``counts``
    (int32), when given, is zeroed by the same launch (the down GEMM's SUM_LAST counters). ``w13`` holds
    ``2I`` rows (gate, up: ``act(gate) * up``, clamped as ``clamp`` says: :func:`clamp_meta`) or, for experts
    without a gate, ``I`` (up: ``act(up)``)."""
    inter = out.shape[1]
    gated = w13.shape[1] == 2 * inter
    if not gated and w13.shape[1] != inter:
        raise ValueError(f"gate_up: w13 {tuple(w13.shape)} holds neither 2I nor I rows for out's I={inter}")
    if not gated and activation in GATED_ONLY:
        raise ValueError(f"activation {activation!r} needs gate and up rows; w13 {tuple(w13.shape)} holds up rows only")
    num_sorted = _num_sorted(sorted_token_ids, topk_weights, config)
    own = _gate_up_meta(config, gated)
    grid = (triton.cdiv(num_sorted, config["BLOCK_SIZE_M"]) * triton.cdiv(inter, own["TILE_N"]),)
    has_scale, has_bias = w13_scale is not None, w13_bias is not None
    x, x_inv_scale = fp16_dot_input(x, w13, config)
    return _kernel(moe_gate_up_kernel, x.device)[grid](
        x, w13, w13_scale if has_scale else w13, w13_bias if has_bias else w13, out, topk_weights,
        sorted_token_ids, block_expert_ids, num_tokens_post_padded,
        topk_weights.numel(), num_sorted, inter, x.shape[1],
        x.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0) if has_scale else 0,
        w13_bias.stride(0) if has_bias else 0, out.stride(0),
        sorted_token_ids if counts is None else counts, 0 if counts is None else counts.numel(),
        w_desc=weight_descriptor(w13, config), FAST_CVT=fast_cvt(x.device),
        x_inv_scale_ptr=x_inv_scale, ROW_SCALE=x_inv_scale is not None, TOP_K=top_k,
        ACTIVATION=ACTIVATION_CODES[activation], HAS_SCALE=has_scale, HAS_BIAS=has_bias,
        **clamp_meta(activation, clamp, gated), ZERO_COUNTS=counts is not None,
        MUL_ROUTED_WEIGHT=mul_routed_weight, DOT_PRECISION=_dot_precision(x.dtype),
        **own, **_launch_meta(config, topk_weights.numel()), **pdl_meta(config, x.device), enable_fp_fusion=True,
    )


def invoke_down(a, w2, w2_scale, out, topk_weights, sorted_token_ids, block_expert_ids,
                num_tokens_post_padded, mul_routed_weight, config, w2_bias=None, top_k=1, sums=None, counts=None):
    """Launch GEMM2 (* routing weight). ``out [M*k, H]``; ``[SPLIT_K, M*k, H]`` fp32 partial sums
    over slices of I when the config has ``SPLIT_K`` > 1 (the caller adds them up); ``[M, H]``, the
    sum over each token's ``top_k`` experts, when it has ``SUM_TOPK`` (with PAIRS). With ``SUM_LAST``
    ``out`` is always the fp32 ``[SPLIT_K, M*k, H]`` partials and ``sums [M, H]`` gets
    their sum over splits and the token's ``top_k`` experts, from the same launch; ``counts`` (int32,
    at least :func:`sum_last_counts` of them) must be zero on entry (the gate_up launch zeroes them)."""
    hidden, inter = w2.shape[1], w2.shape[2]
    num_sorted = _num_sorted(sorted_token_ids, topk_weights, config)
    pdl = pdl_meta(config, a.device)
    own = _down_meta(config, w2.element_size(), bool(pdl["PDL"]))
    split_k, sum_topk, sum_last = own["SPLIT_K"], own["SUM_TOPK"], own["SUM_LAST"]
    if (split_k > 1 or sum_last) and (out.dim() != 3 or out.shape[0] != split_k or out.dtype != torch.float32):
        raise ValueError(f"SPLIT_K={split_k}{' with SUM_LAST' if sum_last else ''} needs an fp32 out of shape "
                         f"[{split_k}, M*k, H], got {out.dtype} {tuple(out.shape)}")
    if sum_last:
        if sum_topk:
            raise ValueError("SUM_LAST and SUM_TOPK are two ways to sum a token's experts: choose one")
        num_tokens = topk_weights.numel() // top_k
        if sums is None or tuple(sums.shape) != (num_tokens, hidden) or sums.stride(1) != 1:
            raise ValueError(f"SUM_LAST writes sums [M, H] = [{num_tokens}, {hidden}], got "
                             f"{None if sums is None else tuple(sums.shape)}")
        needed = sum_last_counts(num_tokens, hidden, config)
        if counts is None or counts.dtype != torch.int32 or counts.numel() < needed:
            raise ValueError("SUM_LAST needs zeroed int32 counts, one per token and column tile of H")
    if sum_topk:
        if not config.get("PAIRS") or split_k > 1 or topk_weights.numel() % top_k:
            raise ValueError("SUM_TOPK needs PAIRS, no SPLIT_K and M*k pairs for the given top_k")
        num_sorted = num_sorted // top_k  # one block per token
        if tuple(out.shape) != (topk_weights.numel() // top_k, hidden):
            raise ValueError(f"SUM_TOPK writes [M, H] = [{topk_weights.numel() // top_k}, {hidden}], "
                             f"got out {tuple(out.shape)}")
    grid = (triton.cdiv(num_sorted, config["BLOCK_SIZE_M"]) * triton.cdiv(hidden, config["BLOCK_SIZE_N"]), split_k)
    has_scale, has_bias = w2_scale is not None, w2_bias is not None
    _kernel(moe_down_kernel, a.device)[grid](
        a, w2, w2_scale if has_scale else w2, w2_bias if has_bias else w2, out, topk_weights,
        sorted_token_ids, block_expert_ids, num_tokens_post_padded,
        topk_weights.numel(), num_sorted, hidden, inter,
        a.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0) if has_scale else 0,
        w2_bias.stride(0) if has_bias else 0, out.stride(-2), out.stride(0) if out.dim() == 3 else 0,
        sums if sum_last else out, counts if sum_last else sorted_token_ids, sums.stride(0) if sum_last else 0,
        w_desc=weight_descriptor(w2, config), FAST_CVT=fast_cvt(a.device),
        TOP_K=top_k, HAS_SCALE=has_scale, HAS_BIAS=has_bias,
        MUL_ROUTED_WEIGHT=mul_routed_weight, DOT_PRECISION=_dot_precision(a.dtype),
        **own, **_launch_meta(config, topk_weights.numel()), **pdl, enable_fp_fusion=True,
    )
    return sums if sum_last else out


def sum_last_counts(num_tokens: int, hidden: int, down_config: dict) -> int:
    """SUM_LAST's arrival counters: one per token and column tile of the down GEMM."""
    return num_tokens * triton.cdiv(hidden, down_config["BLOCK_SIZE_N"])


@triton.jit
def _row(y_ptr, row_offset, offs, mask):
    return tl.load(y_ptr + row_offset + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def moe_sum_kernel(y_ptr, out_ptr, H, stride_split, stride_row, stride_out,
                   TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """``out[t] = sum over s < SPLIT_K, j < TOP_K of y[s, t * TOP_K + j]`` in fp32, stored in out's dtype:
    the split-K partials and a token's k experts added, and the result cast, in one launch."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if SPLIT_K <= 8:  # split-K partials: unrolled, every load in flight at once
        for s in tl.static_range(SPLIT_K):
            for j in tl.static_range(TOP_K):
                acc += _row(y_ptr, stride_split.to(tl.int64) * s + (token * TOP_K + j) * stride_row, offs, mask)
    else:  # too many partials to unroll
        for s in range(SPLIT_K):
            for j in tl.static_range(TOP_K):
                acc += _row(y_ptr, stride_split.to(tl.int64) * s + (token * TOP_K + j) * stride_row, offs, mask)
    tl.store(out_ptr + token * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def invoke_sum(y: torch.Tensor, out: torch.Tensor, top_k: int) -> torch.Tensor:
    """``y [S, M*k, H]`` (S split-K partials, any float dtype) -> ``out [M, H]``, summed over S and k."""
    split_k, rows, hidden = y.shape
    if rows != out.shape[0] * top_k or out.shape[1] != hidden or y.stride(2) != 1 or out.stride(1) != 1:
        raise ValueError(f"moe_sum: y {tuple(y.shape)} and out {tuple(out.shape)} do not match top_k={top_k}")
    block_h = min(1024, triton.next_power_of_2(hidden))
    while split_k * top_k > 8 and out.shape[0] * triton.cdiv(hidden, block_h) < 256 and block_h > 64:
        block_h //= 2  # many rows to add per token: more, narrower programs
    grid = (out.shape[0], triton.cdiv(hidden, block_h))
    _kernel(moe_sum_kernel, y.device)[grid](y, out, hidden, y.stride(0), y.stride(1), out.stride(0),
                                             TOP_K=top_k, SPLIT_K=split_k, BLOCK_H=block_h, num_warps=4,
                                             enable_fp_fusion=True)
    return out


@triton.jit
def fp16_rows_kernel(x_ptr, out_ptr, inv_scale_ptr, H, stride_x, stride_out, BLOCK_H: tl.constexpr):
    """Row ``r`` of x times the power of two that puts its largest magnitude in [2^14, 2^15), stored
    as fp16 (exact but for values 2^28 below the row's largest, which fp16 holds as subnormals),
    and the inverse of that power in ``inv_scale[r]``: bf16 activations for FP16_DOT."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    biggest = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        v = tl.load(x_ptr + row * stride_x + start + offs, mask=start + offs < H, other=0.0).to(tl.float32)
        biggest = tl.maximum(biggest, tl.abs(v))
    # the biased exponent of the largest magnitude; a zero row, or one holding inf or nan, takes 2^14
    bits = tl.max(biggest, 0).to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    exponent = tl.where((exponent == 0) | (exponent == 255), 127, tl.maximum(exponent, 15))  # biased
    scale = ((127 + 14 - (exponent - 127)) << 23).to(tl.float32, bitcast=True)
    tl.store(inv_scale_ptr + row, ((exponent - 14) << 23).to(tl.float32, bitcast=True))
    for start in range(0, H, BLOCK_H):
        mask = start + offs < H
        v = tl.load(x_ptr + row * stride_x + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + start + offs, (v * scale).to(tl.float16), mask=mask)


def fp16_dot_input(x: torch.Tensor, w13: torch.Tensor,
                   config: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gate_up's activations: with FP16_DOT, bf16 x and int8 weights, x's rows scaled into fp16 and
    the inverses of their scales (:func:`invoke_fp16_rows`); otherwise ``(x, None)``."""
    if config.get("FP16_DOT") and x.dtype == torch.bfloat16 and w13.dtype == torch.int8:
        return invoke_fp16_rows(x)
    return x, None


def invoke_fp16_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, H]`` -> (fp16 rows scaled by powers of two, fp32 ``[M]`` inverses of those powers)."""
    m, hidden = x.shape
    out = torch.empty((m, hidden), dtype=torch.float16, device=x.device)
    inv_scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        block_h = min(1024, triton.next_power_of_2(hidden))
        _kernel(fp16_rows_kernel, x.device)[(m,)](x, out, inv_scale, hidden, x.stride(0), out.stride(0),
                                                  BLOCK_H=block_h, num_warps=4, enable_fp_fusion=True)
    return out, inv_scale


@triton.jit
def dequantize_kernel(q_ptr, scale_ptr, out_ptr, N, K, stride_qe, stride_qn, stride_se, BLOCK_K: tl.constexpr):
    """``out[e, n, :] = q[e, n, :] * scale[e, n]`` (fp32 product, stored in out's dtype); grid (E*N, K blocks)."""
    row = tl.program_id(0).to(tl.int64)
    e, n = row // N, row % N
    offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs < K
    q = tl.load(q_ptr + e * stride_qe + n * stride_qn + offs, mask=mask, other=0)
    w = q.to(tl.float32) * tl.load(scale_ptr + e * stride_se + n)
    tl.store(out_ptr + row * K + offs, w.to(out_ptr.dtype.element_ty), mask=mask)


def invoke_dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 experts ``q [E, N, K]`` (unit stride along K) with fp32 row scales ``[E, N]`` -> ``[E, N, K]``
    in ``dtype``, in one pass (the DEQUANT_ONCE path of large batches)."""
    num_experts, n, k = q.shape
    if q.stride(2) != 1 or scale.stride(1) != 1:
        raise ValueError("invoke_dequantize needs unit stride along K and along the scales' rows")
    out = torch.empty((num_experts, n, k), dtype=dtype, device=q.device)
    block_k = min(1024, triton.next_power_of_2(k))
    _kernel(dequantize_kernel, q.device)[(num_experts * n, triton.cdiv(k, block_k))](
        q, scale, out, n, k, q.stride(0), q.stride(1), scale.stride(0), BLOCK_K=block_k, num_warps=4,
        enable_fp_fusion=True)
    return out


def sm90_compile(which: str, config: dict, act_dtype: torch.dtype = torch.bfloat16, top_k: int = 2,
                 num_pairs: int = 16, gated: bool = True, weight_dtype: torch.dtype = torch.int8):
    """The ``"gate_up"`` or ``"down"`` Triton kernel as a table entry launches it on int8 weights with scales
    (no biases, the routing weights applied in the down GEMM), compiled for sm_90 without a GPU (Triton
    ships ptxas): ``.asm["cubin"]`` for registers (``cuobjdump -res-usage``) or SASS, ``.metadata.shared``
    for the shared memory a program takes (with the entry's form of programmatic dependent launch, ``PDL``).
    ``gated`` False: gate_up for experts without a gate (SiLU of the up rows). ``weight_dtype`` float (that
    of ``act_dtype``): float experts, without scales. Run it in a process without ``TRITON_INTERPRET``, whose
    patches of Triton's language break compilation."""
    from .configs import check_config, split_config

    gate_up, down = split_config(check_config(config))
    cfg = gate_up if which == "gate_up" else down
    meta = _launch_meta(cfg, num_pairs)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    act = {torch.bfloat16: "*bf16", torch.float16: "*fp16"}[act_dtype]
    int8 = weight_dtype == torch.int8
    if not int8 and weight_dtype != act_dtype:
        raise ValueError(f"sm90_compile: weights are int8 or of the activations' dtype {act_dtype}, got {weight_dtype}")
    constexprs = dict(meta, TOP_K=top_k, HAS_SCALE=int8, HAS_BIAS=False, DOT_PRECISION="tf32", PDL=cfg.get("PDL", 0),
                      FAST_CVT=True)
    if not meta["TMA"]:
        constexprs["w_desc"] = None
    if which == "gate_up":
        kernel = moe_gate_up_kernel
        constexprs.update(_gate_up_meta(cfg, gated), ACTIVATION=ACTIVATION_CODES["silu"], MUL_ROUTED_WEIGHT=False,
                          **clamp_meta("silu", None), ZERO_COUNTS=bool(down.get("SUM_LAST")),
                          ROW_SCALE=bool(cfg.get("FP16_DOT")) and act_dtype == torch.bfloat16 and int8)
        pointers = dict(x_ptr="*fp16" if constexprs["ROW_SCALE"] else act, out_ptr=act)
    else:
        kernel = moe_down_kernel
        constexprs.update(_down_meta(cfg, pdl=bool(cfg.get("PDL"))), MUL_ROUTED_WEIGHT=True)
        partials = constexprs["SPLIT_K"] > 1 or constexprs["SUM_LAST"]
        pointers = dict(a_ptr=act, out_ptr="*fp32" if partials else act, sums_ptr=act)
    pointers.update(w_ptr="*i8" if int8 else act, scale_ptr="*fp32", bias_ptr=act, topk_weights_ptr="*fp32",
                    x_inv_scale_ptr="*fp32", sorted_token_ids_ptr="*i32", block_expert_ids_ptr="*i32",
                    num_tokens_post_padded_ptr="*i32", counts_ptr="*i32",
                    # with TMA the weights come as a descriptor of (BLOCK_SIZE_N, BLOCK_SIZE_K) tiles
                    # (weight_descriptor)
                    w_desc=f"tensordesc<{'i8' if int8 else act[1:]}[{cfg['BLOCK_SIZE_N']}, {cfg['BLOCK_SIZE_K']}]>")
    return compile_for_sm90(kernel, constexprs, pointers, num_warps, num_stages=num_stages)


def compile_for_sm90(kernel, constexprs: dict, arg_types: dict, num_warps: int, *, num_stages: int | None = None,
                     maxnreg: int | None = None):
    """A Triton or Gluon ``kernel`` compiled for sm_90 without a GPU (Triton ships ptxas): arguments named in
    ``arg_types`` take those types (pointers, tensor descriptors), the others not in ``constexprs`` int32;
    pointers, strides and a GEMM's K (K, H or I) taken as multiples of 16, as Triton's launcher specializes
    them at run time. Run it in a process without ``TRITON_INTERPRET``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: "constexpr" if name in constexprs else arg_types.get(name, "i32") for name in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if signature[name] != "constexpr" and (name.endswith("_ptr") or name.startswith("stride")
                                                       or name in ("K", "H", "I"))}
    options = dict(num_warps=num_warps, enable_fp_fusion=True)  # (as every launch: see _kernel)
    if num_stages is not None:
        options["num_stages"] = num_stages
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    source = ASTSource(kernel, signature, constexprs, aligned)
    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    except ImportError:  # a Triton without Gluon: only Triton kernels to compile
        GluonJITFunction = ()
    if isinstance(kernel, GluonJITFunction):  # (Gluon takes num_warps as a constexpr too)
        source = GluonASTSource(kernel, signature, dict(constexprs, num_warps=num_warps), aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
