"""Align step: group the (token, slot) pairs by expert and pad each group to the GEMM's BLOCK_M.

Index arrays used by the kernels (``numel = M * k`` flat (token, slot) pairs, row ``t`` of them is
token ``t // k``, slot ``t % k``):

* ``sorted_token_ids [num_sorted]`` int32: flat pair ids grouped by expert, each group padded up to
  a multiple of BLOCK_M with the sentinel ``numel`` (a row the kernels mask out).
* ``block_expert_ids [num_sorted // BLOCK_M]`` int32: the local expert of each BLOCK_M block, or -1
  for a block of pairs whose expert is absent from this rank (the kernels write zeros there).
* ``num_tokens_post_padded [1]`` int32: where the padded groups end; blocks past it exit at once.

``num_sorted`` is a static upper bound computed from shapes only, so nothing here reads a device
value on the host: the step captures in a CUDA graph and traces under torch.compile.

With a tail (:func:`align_with_tail`), an expert whose last block would hold only 1..``tail_rows``
rows keeps those rows out of its padded group: they go to a second region of blocks of
``tail_block`` rows at the static offset ``num_sorted`` (the layer runs them on a small-M entry;
benchmarks/NOTES.md item 103: such a block costs a large tile's weight work for a few rows).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import fused_moe

# Which align path runs (H200, CUDA-graph replays, results/align_ab_H200.json): one Triton program
# holding every (token, slot) pair costs 16-19 us up to 1024 pairs but grows past that (30-35 us at
# 2048, 67-77 us at 4096, 155-172 us at 8192); torch's stable sort (a dozen ops; also the path off the
# GPU and the tests' oracle) costs 74-150 us at any size; three launches over chunks of pairs
# (CHUNKED_ALIGN) cost 16-26 us from 2048 to 65536 pairs on 8 experts (22-56 us on 128).
SINGLE_PROGRAM_MAX_PAIRS = 4096  # single program up to here, then the torch sort ...
CHUNKED_MIN_PAIRS = 2048  # ... or, with CHUNKED_ALIGN, the chunked path from here
# On since tests/test_gpu.py::test_chunked_align_equals_the_torch_sort passed on the H200 (the output
# equals the torch sort's, block experts included); False brings back the torch sort above 4096 pairs.
CHUNKED_ALIGN = True


def max_sorted_len(numel: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: each non-empty group (at most ``numel`` of them, plus the
    group of absent experts) adds fewer than ``block_m`` padding rows; rounded to whole blocks."""
    groups = min(numel, num_experts + 1)
    bound = numel + groups * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def max_tail_len(numel: int, num_experts: int, tail_rows: int, tail_block: int) -> int:
    """Upper bound of the tail region: at most one tail of <= ``tail_rows`` rows an expert, each padded
    to whole blocks of ``tail_block``."""
    return min(numel, num_experts) * triton.cdiv(tail_rows, tail_block) * tail_block if tail_rows else 0


@triton.jit
def _main_and_tail(counts, g, num_experts, BLOCK_M: tl.constexpr, TAIL_ROWS: tl.constexpr):
    """Per group: the rows that stay in its padded group, and those (1..TAIL_ROWS past a multiple of
    BLOCK_M, experts only) that go to the tail region."""
    left = counts % BLOCK_M
    tail = tl.where((g < num_experts) & (left > 0) & (left <= TAIL_ROWS), left, 0)
    return counts - tail, tail


@triton.jit
def _tail_region(num_tokens_post_padded_ptr, tail, main_start, main, num_sorted, TAIL_BLOCK: tl.constexpr):
    """The tail region's length (stored after the main region's); returns, per group, the main-region
    row from which its pairs are tail rows, how far those move (into the region at ``num_sorted``) and
    where its tail blocks end."""
    tail_padded = (tail + TAIL_BLOCK - 1) // TAIL_BLOCK * TAIL_BLOCK
    tail_end = tl.cumsum(tail_padded, 0)
    tl.store(num_tokens_post_padded_ptr + 1, tl.sum(tail_padded, 0))
    first_tail_row = main_start + main
    return first_tail_row, num_sorted + tail_end - tail_padded - first_tail_row, tail_end


@triton.jit
def _pair_groups(topk_ids_ptr, expert_map_ptr, offs, numel, num_experts, num_global, HAS_MAP: tl.constexpr):
    """Group of each pair at ``offs``: its local expert, ``num_experts`` (absent) or, past ``numel``,
    ``num_experts + 1`` (padding lanes, never stored)."""
    in_batch = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=in_batch, other=-1).to(tl.int32)
    if HAS_MAP:
        known = (ids >= 0) & (ids < num_global)
        ids = tl.where(known, tl.load(expert_map_ptr + ids, mask=known & in_batch, other=-1).to(tl.int32), -1)
    group = tl.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    return tl.where(in_batch, group, num_experts + 1)


@triton.jit
def _write_padding_and_block_experts(sorted_token_ids_ptr, block_expert_ids_ptr, padded_end, numel, num_experts,
                                     num_sorted, BLOCK_M: tl.constexpr, FILL: tl.constexpr,
                                     BLOCK_CHUNK: tl.constexpr):
    """Every sorted row to the sentinel ``numel`` (the pairs are scattered over it afterwards) and each
    block's expert."""
    _fill_sentinel(sorted_token_ids_ptr, numel, 0, num_sorted, FILL)
    _block_experts(block_expert_ids_ptr, padded_end, num_experts, 0, num_sorted // BLOCK_M, BLOCK_M, BLOCK_CHUNK)


@triton.jit
def _fill_sentinel(sorted_token_ids_ptr, numel, first, end, FILL: tl.constexpr):
    """Sorted rows [first, end) to the sentinel ``numel``."""
    for start in range(first, end, FILL):
        rows = start + tl.arange(0, FILL)
        tl.store(sorted_token_ids_ptr + rows, numel, mask=rows < end)


@triton.jit
def _block_experts(block_expert_ids_ptr, padded_end, num_experts, first, end, BLOCK_M: tl.constexpr,
                   BLOCK_CHUNK: tl.constexpr):
    """Blocks [first, end): each block's expert, the number of groups that end at or before its first row
    (-1: absent)."""
    for start in range(first, end, BLOCK_CHUNK):
        blocks = start + tl.arange(0, BLOCK_CHUNK)
        group_of_block = tl.sum((padded_end[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), 1)
        tl.store(block_expert_ids_ptr + blocks, tl.where(group_of_block < num_experts, group_of_block, -1),
                 mask=blocks < end)


@triton.jit
def align_single_program_kernel(
    topk_ids_ptr,  # (numel,) int32/int64 global expert ids
    expert_map_ptr,  # (num_global,) int32/int64 global -> local or -1; read only when HAS_MAP
    sorted_token_ids_ptr,  # (num_sorted,) int32, out
    block_expert_ids_ptr,  # (num_sorted // BLOCK_M,) int32, out
    num_tokens_post_padded_ptr,  # (1,) int32, out
    numel,
    num_experts,
    num_global,
    num_sorted,
    tail_len,
    HAS_MAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TAIL_ROWS: tl.constexpr,  # 0: no tail region
    TAIL_BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,  # power of two >= numel
    GROUPS: tl.constexpr,  # power of two >= num_experts + 2 (experts, the absent group, padding lanes)
    CHUNK: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid (1,): one program does the whole align step for up to PAIRS pairs."""
    if PDL:  # where the entry launches gate_up as its dependent (config PDL) it may be scheduled now (it waits
        # for these writes); where it does not, this is a no-op
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, PAIRS)
    group = _pair_groups(topk_ids_ptr, expert_map_ptr, offs, numel, num_experts, num_global, HAS_MAP)

    g = tl.arange(0, GROUPS)
    counts = tl.where(g <= num_experts, tl.histogram(group, GROUPS), 0)
    main, tail = _main_and_tail(counts, g, num_experts, BLOCK_M, TAIL_ROWS)
    padded = (main + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    # sorted position -> row: a pair's row is its group's padded start plus its rank in the group,
    # i.e. its sorted position minus the group's unpadded start
    shift = padded_end - padded - (tl.cumsum(counts, 0) - counts)
    tl.store(num_tokens_post_padded_ptr, tl.sum(padded, 0))
    _write_padding_and_block_experts(sorted_token_ids_ptr, block_expert_ids_ptr, padded_end, numel, num_experts,
                                     num_sorted, BLOCK_M, CHUNK, BLOCK_CHUNK)
    if TAIL_ROWS:
        first_tail_row, tail_shift, tail_end = _tail_region(num_tokens_post_padded_ptr, tail, padded_end - padded,
                                                            main, num_sorted, TAIL_BLOCK)
        _write_padding_and_block_experts(sorted_token_ids_ptr + num_sorted,
                                         block_expert_ids_ptr + num_sorted // BLOCK_M, tail_end, numel, num_experts,
                                         tail_len, TAIL_BLOCK, CHUNK, BLOCK_CHUNK)
    tl.debug_barrier()  # the sentinel stores above are overwritten below

    # Stable sort of the pairs by group: sort keys (group, pair index). The shift of each pair's group
    # is gathered in registers (no round trip through global memory: NOTES item 67).
    keys = tl.sort(group * PAIRS + offs)
    sorted_group = keys // PAIRS
    valid = sorted_group <= num_experts
    index = tl.where(valid, sorted_group, 0)
    dest = offs + tl.gather(shift, index, 0)
    if TAIL_ROWS:
        dest = tl.where(dest >= tl.gather(first_tail_row, index, 0), dest + tl.gather(tail_shift, index, 0), dest)
    tl.store(sorted_token_ids_ptr + dest, keys % PAIRS, mask=valid)


@triton.jit
def align_count_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_token_ids_ptr, numel, num_experts, num_global,
                       num_rows, rows_per_chunk, HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, GROUPS: tl.constexpr,
                       FILL: tl.constexpr):
    """Grid (num_chunks,): the group histogram of one chunk of CHUNK pairs -> ``counts[chunk, :]``, and
    the sentinel in this chunk's share of the ``num_rows`` sorted rows (both regions; the scatter launch
    writes the pairs' rows over it). One program wrote them all before: 9-37 µs of its launch at 64-128
    experts (benchmarks/NOTES.md item 121)."""
    chunk = tl.program_id(0)
    group = _pair_groups(topk_ids_ptr, expert_map_ptr, chunk * CHUNK + tl.arange(0, CHUNK), numel, num_experts,
                         num_global, HAS_MAP)
    tl.store(counts_ptr + chunk * GROUPS + tl.arange(0, GROUPS), tl.histogram(group, GROUPS))
    first = chunk * rows_per_chunk
    _fill_sentinel(sorted_token_ids_ptr, numel, first, tl.minimum(first + rows_per_chunk, num_rows), FILL)


@triton.jit
def align_offsets_kernel(counts_ptr, base_ptr, tail_ptr, ends_ptr, num_tokens_post_padded_ptr, num_chunks,
                         num_experts, num_sorted, BLOCK_M: tl.constexpr, TAIL_ROWS: tl.constexpr,
                         TAIL_BLOCK: tl.constexpr, GROUPS: tl.constexpr, ROWS: tl.constexpr):
    """Grid (1,): group sizes padded to BLOCK_M and where each chunk's pairs of each group go.

    ``base[chunk, g]`` = where group g starts (padded) + the group's pairs in earlier chunks - where
    group g starts inside this chunk's sorted order, so the scatter kernel's destination of its i-th
    sorted pair is ``base[chunk, group] + i``. Also writes the padded lengths, and in ``ends[0, g]`` and
    ``ends[1, g]`` where group g's padded rows end in the main and the tail region (the scatter launch
    derives the block experts from them); with a tail, ``tail[0, g]`` and ``tail[1, g]`` are group g's
    first tail row in the main region and how far its tail rows move.
    """
    g = tl.arange(0, GROUPS)
    real = g <= num_experts
    totals = tl.zeros((GROUPS,), dtype=tl.int32)
    for start in range(0, num_chunks, ROWS):
        rows = start + tl.arange(0, ROWS)
        c = tl.load(counts_ptr + rows[:, None] * GROUPS + g[None, :], mask=rows[:, None] < num_chunks, other=0)
        totals += tl.sum(c, 0)
    totals = tl.where(real, totals, 0)
    main, tail = _main_and_tail(totals, g, num_experts, BLOCK_M, TAIL_ROWS)
    padded = (main + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    tl.store(num_tokens_post_padded_ptr, tl.sum(padded, 0))
    tl.store(ends_ptr + g, padded_end)
    if TAIL_ROWS:
        first_tail_row, tail_shift, tail_end = _tail_region(num_tokens_post_padded_ptr, tail, padded_end - padded,
                                                            main, num_sorted, TAIL_BLOCK)
        tl.store(tail_ptr + g, first_tail_row)
        tl.store(tail_ptr + GROUPS + g, tail_shift)
        tl.store(ends_ptr + GROUPS + g, tail_end)
    before = padded_end - padded  # pairs of each group placed so far (earlier chunks), from its start
    for start in range(0, num_chunks, ROWS):
        rows = start + tl.arange(0, ROWS)
        mask = rows[:, None] < num_chunks
        c = tl.where(real[None, :], tl.load(counts_ptr + rows[:, None] * GROUPS + g[None, :], mask=mask, other=0), 0)
        earlier_chunks = tl.cumsum(c, 0) - c  # same group, earlier chunks within this step
        earlier_groups = tl.cumsum(c, 1) - c  # same chunk, smaller groups
        tl.store(base_ptr + rows[:, None] * GROUPS + g[None, :], before[None, :] + earlier_chunks - earlier_groups,
                 mask=mask)
        before += tl.sum(c, 0)


@triton.jit
def align_scatter_kernel(topk_ids_ptr, expert_map_ptr, base_ptr, tail_ptr, ends_ptr, sorted_token_ids_ptr,
                         block_expert_ids_ptr, numel, num_experts, num_global, num_blocks, num_tail_blocks,
                         blocks_per_chunk, tail_blocks_per_chunk, HAS_MAP: tl.constexpr, TAIL_ROWS: tl.constexpr,
                         CHUNK: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, TAIL_BLOCK: tl.constexpr,
                         BLOCK_CHUNK: tl.constexpr):
    """Grid (num_chunks,): a stable sort of one chunk's pairs by group, written to their places; and the
    experts of this chunk's share of the blocks (of both regions), from the groups' ends."""
    chunk = tl.program_id(0)
    g = tl.arange(0, GROUPS)
    first = chunk * blocks_per_chunk
    _block_experts(block_expert_ids_ptr, tl.load(ends_ptr + g), num_experts, first,
                   tl.minimum(first + blocks_per_chunk, num_blocks), BLOCK_M, BLOCK_CHUNK)
    if TAIL_ROWS:
        first = chunk * tail_blocks_per_chunk
        _block_experts(block_expert_ids_ptr + num_blocks, tl.load(ends_ptr + GROUPS + g), num_experts, first,
                       tl.minimum(first + tail_blocks_per_chunk, num_tail_blocks), TAIL_BLOCK, BLOCK_CHUNK)
    local = tl.arange(0, CHUNK)
    group = _pair_groups(topk_ids_ptr, expert_map_ptr, chunk * CHUNK + local, numel, num_experts, num_global,
                         HAS_MAP)
    keys = tl.sort(group * CHUNK + local)
    sorted_group = keys // CHUNK
    valid = sorted_group <= num_experts
    index = tl.where(valid, sorted_group, 0)
    dest = tl.load(base_ptr + chunk * GROUPS + index, mask=valid, other=0) + local
    if TAIL_ROWS:
        first_tail_row = tl.load(tail_ptr + index, mask=valid, other=0)
        dest = tl.where(dest >= first_tail_row, dest + tl.load(tail_ptr + GROUPS + index, mask=valid, other=0), dest)
    tl.store(sorted_token_ids_ptr + dest, chunk * CHUNK + keys % CHUNK, mask=valid)


def align_block_size(
    topk_ids: torch.Tensor,
    block_m: int,
    num_experts: int,
    expert_map: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``topk_ids [M, k]`` (global ids) -> ``(sorted_token_ids, block_expert_ids, num_tokens_post_padded)``.

    Ids that are out of range, or that ``expert_map`` marks -1, land in the absent group.
    """
    return _align(topk_ids, block_m, num_experts, expert_map, 0, 16)


def align_with_tail(topk_ids: torch.Tensor, block_m: int, num_experts: int, expert_map: Optional[torch.Tensor],
                    tail_rows: int, tail_block: int) -> tuple[tuple, tuple]:
    """As :func:`align_block_size`, but an expert's last 1..``tail_rows`` rows past a multiple of
    ``block_m`` go to a region of ``tail_block``-row blocks: ``(main, tail)``, each a
    ``(sorted_token_ids, block_expert_ids, num_tokens_post_padded)`` over its region (views of one
    allocation each)."""
    if not 0 < tail_rows < block_m or tail_block < 1:
        raise ValueError(f"tail_rows must lie in [1, {block_m}) and tail_block be positive, got {tail_rows} "
                         f"and {tail_block}")
    sorted_ids, blocks, num_post = _align(topk_ids, block_m, num_experts, expert_map, tail_rows, tail_block)
    main_len = max_sorted_len(topk_ids.numel(), num_experts, block_m)
    main = (sorted_ids[:main_len], blocks[:main_len // block_m], num_post[:1])
    return main, (sorted_ids[main_len:], blocks[main_len // block_m:], num_post[1:])


def _align(topk_ids, block_m, num_experts, expert_map, tail_rows, tail_block):
    """Both regions in one allocation each: ``sorted_token_ids [main + tail]``, ``block_expert_ids``
    (main blocks, then tail blocks), ``num_tokens_post_padded [1 or 2]``."""
    device = topk_ids.device
    numel = topk_ids.numel()
    if device.type == "cuda" or _interpreting():
        if CHUNKED_ALIGN and numel >= CHUNKED_MIN_PAIRS:
            return _align_chunked(topk_ids, block_m, num_experts, expert_map, tail_rows=tail_rows,
                                  tail_block=tail_block)
        if numel <= SINGLE_PROGRAM_MAX_PAIRS:
            return _align_single_program(topk_ids, block_m, num_experts, expert_map, tail_rows, tail_block)
    return _align_torch(topk_ids, block_m, num_experts, expert_map, tail_rows, tail_block)


def _align_torch(topk_ids, block_m, num_experts, expert_map, tail_rows=0, tail_block=16):
    """The align step in torch ops (stable sort): the path off the GPU and the oracle of the kernels."""
    device = topk_ids.device
    numel = topk_ids.numel()
    flat = topk_ids.reshape(-1).long()
    if expert_map is not None:
        in_range = (flat >= 0) & (flat < expert_map.numel())
        local = torch.where(in_range, expert_map.long()[flat.clamp(0, expert_map.numel() - 1)], -1)
    else:
        local = flat
    absent = num_experts  # the extra group index
    group = torch.where((local >= 0) & (local < num_experts), local, absent)

    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, group, torch.ones_like(group))
    left = counts % block_m
    tail = torch.where((left > 0) & (left <= tail_rows), left, 0)
    tail[absent] = 0
    main = counts - tail
    padded = (main + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    tail_padded = (tail + tail_block - 1) // tail_block * tail_block
    tail_end = tail_padded.cumsum(0)
    count_start = counts.cumsum(0) - counts

    sorted_group, order = torch.sort(group, stable=True)
    rank = torch.arange(numel, device=device) - count_start[sorted_group]
    num_sorted = max_sorted_len(numel, num_experts, block_m)
    tail_len = max_tail_len(numel, num_experts, tail_rows, tail_block)
    in_tail = rank >= main[sorted_group]
    dest = torch.where(in_tail, num_sorted + (tail_end - tail_padded)[sorted_group] + rank - main[sorted_group],
                       padded_start[sorted_group] + rank)
    sorted_token_ids = torch.full((num_sorted + tail_len,), numel, dtype=torch.int32, device=device)
    sorted_token_ids[dest] = order.to(torch.int32)

    def block_experts(ends, length, block):
        block_group = torch.searchsorted(ends, torch.arange(0, length, block, device=device), right=True)
        return torch.where(block_group < num_experts, block_group, -1).to(torch.int32)

    block_expert_ids = block_experts(padded_end, num_sorted, block_m)
    num_tokens_post_padded = padded_end[-1:].to(torch.int32)
    if tail_rows:
        block_expert_ids = torch.cat([block_expert_ids, block_experts(tail_end, tail_len, tail_block)])
        num_tokens_post_padded = torch.cat([num_tokens_post_padded, tail_end[-1:].to(torch.int32)])
    return sorted_token_ids, block_expert_ids, num_tokens_post_padded


def _interpreting() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(align_single_program_kernel, InterpretedFunction)


def _kernel_outputs(topk_ids, block_m, num_experts, tail_rows, tail_block):
    """What the Triton align paths write: ``(sorted_token_ids, block_expert_ids, num_tokens_post_padded)``
    (int32, uninitialized), and the main and tail regions' padded lengths and the power-of-two group
    count they launch with."""
    device = topk_ids.device
    num_sorted = max_sorted_len(topk_ids.numel(), num_experts, block_m)
    tail_len = max_tail_len(topk_ids.numel(), num_experts, tail_rows, tail_block)
    outputs = (torch.empty(num_sorted + tail_len, dtype=torch.int32, device=device),
               torch.empty(num_sorted // block_m + tail_len // tail_block, dtype=torch.int32, device=device),
               torch.empty(2 if tail_rows else 1, dtype=torch.int32, device=device))
    return outputs, num_sorted, tail_len, triton.next_power_of_2(num_experts + 2)


def _align_single_program(topk_ids, block_m, num_experts, expert_map, tail_rows=0, tail_block=16):
    device = topk_ids.device
    numel = topk_ids.numel()
    (sorted_token_ids, block_expert_ids, num_tokens_post_padded), num_sorted, tail_len, groups = _kernel_outputs(
        topk_ids, block_m, num_experts, tail_rows, tail_block)
    has_map = expert_map is not None
    align_single_program_kernel[(1,)](
        topk_ids.reshape(-1), expert_map if has_map else topk_ids, sorted_token_ids, block_expert_ids,
        num_tokens_post_padded, numel, num_experts, expert_map.numel() if has_map else 0, num_sorted, tail_len,
        HAS_MAP=has_map, BLOCK_M=block_m, TAIL_ROWS=tail_rows, TAIL_BLOCK=tail_block,
        PAIRS=max(16, triton.next_power_of_2(numel)), GROUPS=groups, CHUNK=1024,
        BLOCK_CHUNK=max(16, 8192 // groups), num_warps=4, PDL=fused_moe.pdl_supported(device), enable_fp_fusion=True,
    )
    return sorted_token_ids, block_expert_ids, num_tokens_post_padded


def _align_chunked(topk_ids, block_m, num_experts, expert_map, chunk: int = 1024, tail_rows=0, tail_block=16):
    """Three launches for any number of pairs: per-chunk histograms, offsets (one program), scatter."""
    device = topk_ids.device
    numel = topk_ids.numel()
    (sorted_token_ids, block_expert_ids, num_tokens_post_padded), num_sorted, tail_len, groups = _kernel_outputs(
        topk_ids, block_m, num_experts, tail_rows, tail_block)
    num_chunks = triton.cdiv(numel, chunk)
    counts = torch.empty((num_chunks, groups), dtype=torch.int32, device=device)
    base = torch.empty((num_chunks, groups), dtype=torch.int32, device=device)
    ends = torch.empty((2, groups), dtype=torch.int32, device=device)
    tail = torch.empty((2, groups), dtype=torch.int32, device=device) if tail_rows else base
    has_map = expert_map is not None
    ids = topk_ids.reshape(-1)
    emap = expert_map if has_map else ids
    num_global = expert_map.numel() if has_map else 0
    block_chunk = max(16, 8192 // groups)
    # the sentinel fill and the block experts spread over the chunks' programs (NOTES item 121)
    num_blocks, num_tail_blocks = num_sorted // block_m, tail_len // tail_block
    align_count_kernel[(num_chunks,)](ids, emap, counts, sorted_token_ids, numel, num_experts, num_global,
                                      num_sorted + tail_len, triton.cdiv(num_sorted + tail_len, num_chunks),
                                      HAS_MAP=has_map, CHUNK=chunk, GROUPS=groups, FILL=1024, num_warps=4,
                                      enable_fp_fusion=True)
    align_offsets_kernel[(1,)](counts, base, tail, ends, num_tokens_post_padded, num_chunks, num_experts, num_sorted,
                               BLOCK_M=block_m, TAIL_ROWS=tail_rows, TAIL_BLOCK=tail_block, GROUPS=groups,
                               ROWS=max(1, min(64, 8192 // groups)), num_warps=4, enable_fp_fusion=True)
    align_scatter_kernel[(num_chunks,)](ids, emap, base, tail, ends, sorted_token_ids, block_expert_ids, numel,
                                        num_experts, num_global, num_blocks, num_tail_blocks,
                                        triton.cdiv(num_blocks, num_chunks), triton.cdiv(num_tail_blocks, num_chunks),
                                        HAS_MAP=has_map, TAIL_ROWS=tail_rows, CHUNK=chunk, GROUPS=groups,
                                        BLOCK_M=block_m, TAIL_BLOCK=tail_block, BLOCK_CHUNK=block_chunk, num_warps=4,
                                        enable_fp_fusion=True)
    return sorted_token_ids, block_expert_ids, num_tokens_post_padded
