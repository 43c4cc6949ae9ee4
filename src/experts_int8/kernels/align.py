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
"""

from __future__ import annotations

from typing import Optional

import torch


def max_sorted_len(numel: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: each non-empty group (at most ``numel`` of them, plus the
    group of absent experts) adds fewer than ``block_m`` padding rows; rounded to whole blocks."""
    groups = min(numel, num_experts + 1)
    bound = numel + groups * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def align_block_size(
    topk_ids: torch.Tensor,
    block_m: int,
    num_experts: int,
    expert_map: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``topk_ids [M, k]`` (global ids) -> ``(sorted_token_ids, block_expert_ids, num_tokens_post_padded)``.

    Ids that are out of range, or that ``expert_map`` marks -1, land in the absent group.
    """
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    if expert_map is not None:
        in_range = (flat >= 0) & (flat < expert_map.numel())
        local = torch.where(in_range, expert_map.long()[flat.clamp(0, expert_map.numel() - 1)], -1)
    else:
        local = flat
    absent = num_experts  # the extra group index
    group = torch.where((local >= 0) & (local < num_experts), local, absent)

    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, group, torch.ones_like(group))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    count_start = counts.cumsum(0) - counts

    sorted_group, order = torch.sort(group, stable=True)
    rank = torch.arange(numel, device=device) - count_start[sorted_group]
    num_sorted = max_sorted_len(numel, num_experts, block_m)
    sorted_token_ids = torch.full((num_sorted,), numel, dtype=torch.int32, device=device)
    sorted_token_ids[padded_start[sorted_group] + rank] = order.to(torch.int32)

    block_start = torch.arange(0, num_sorted, block_m, device=device)
    block_group = torch.searchsorted(padded_end, block_start, right=True)
    block_expert_ids = torch.where(block_group < num_experts, block_group, -1).to(torch.int32)
    num_tokens_post_padded = padded_end[-1:].to(torch.int32)
    return sorted_token_ids, block_expert_ids, num_tokens_post_padded
