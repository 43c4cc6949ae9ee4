"""Past one GPU: the routed experts split across the ranks of a ``torch.distributed`` process group.

Every rank runs the whole model on all tokens (attention, routers, dense layers stay replicated) and
holds only its part of each experts module, so the experts' memory and the weight bytes read per token
divide by the group's size W. Each rank's experts produce a partial output; one all-reduce adds them.

Two splits (``mode``):

- ``"tp"`` (tensor parallel): every rank keeps all E experts and a contiguous slice of I: the matching
  gate rows and up rows of ``gate_up_proj`` with their scales, and the matching columns of
  ``down_proj`` with ``down_proj_scale`` unchanged (scales come from full rows, so the int8 values are
  the same on one GPU or many). The down products of the slices add up to the full one. Decode
  reads 1/W of every hit expert on each rank, so all ranks stay busy at any M.
- ``"ep"`` (expert parallel): every rank keeps E/W whole experts; ``expert_map`` sends pairs routed to
  other ranks' experts to the kernel's absent group, where they contribute zero.

Expert biases: ``tp`` slices the gate/up bias with its rows and adds the down bias on rank 0 only (it
would be counted W times otherwise); ``ep`` keeps each expert's biases with it.

    torchrun --nproc-per-node 2 script.py   # in script.py:
    dist.init_process_group("nccl"); torch.cuda.set_device(local_rank)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    parallelize_experts(model, mode="tp", device=f"cuda:{local_rank}")  # shards, then moves the shard
    model.to(f"cuda:{local_rank}")
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .layer import Int8Experts

MODES = ("tp", "ep")


def _split(n: int, parts: int, index: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` when ``n`` items split into ``parts`` contiguous parts (the first
    ``n % parts`` parts one larger)."""
    base, extra = divmod(n, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (index < extra)


def shard_experts(module: Int8Experts, mode: str, rank: int, world_size: int,
                  device: Optional[torch.device] = None) -> Int8Experts:
    """Rank ``rank``'s part of ``module`` under ``mode`` (see the module docstring), as a new
    :class:`Int8Experts` with its own (contiguous) tensors on ``device`` (default: the module's)."""
    if not isinstance(module, Int8Experts):
        raise TypeError(f"shard_experts takes an Int8Experts module (quantize the model first), got "
                        f"{type(module).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    if module.expert_map is not None:
        raise ValueError("this experts module is already a shard (it has an expert_map)")
    e, h, i = module.num_experts, module.hidden_size, module.intermediate_size
    device = torch.device(device) if device is not None else module.gate_up_proj.device
    parts = i if mode == "tp" else e
    if world_size > parts:
        what, hint = ("columns of I", "") if mode == "tp" else ("experts", " or mode='tp'")
        raise ValueError(f"cannot split {parts} {what} over {world_size} ranks; use fewer ranks{hint}")
    lo, hi = _split(parts, world_size, rank)

    def take(t: torch.Tensor, *index) -> torch.Tensor:
        # always a copy, of the part only: the full tensor can be freed, and the shard's never alias it
        return t[index].to(device=device, memory_format=torch.contiguous_format, copy=True)

    if mode == "tp":
        rows = torch.cat([torch.arange(lo, hi), torch.arange(i + lo, i + hi)]).to(module.gate_up_proj.device)
        new_e, new_i = e, hi - lo
        w13, s13 = take(module.gate_up_proj, slice(None), rows), take(module.gate_up_proj_scale, slice(None), rows)
        w2, s2 = take(module.down_proj, slice(None), slice(None), slice(lo, hi)), take(module.down_proj_scale, slice(None))
        if module.has_bias:
            b13 = take(module.gate_up_proj_bias, slice(None), rows)
            b2 = take(module.down_proj_bias, slice(None))
            if rank != 0:
                b2.zero_()
    else:
        new_e, new_i = hi - lo, i
        experts = slice(lo, hi)
        w13, s13 = take(module.gate_up_proj, experts), take(module.gate_up_proj_scale, experts)
        w2, s2 = take(module.down_proj, experts), take(module.down_proj_scale, experts)
        if module.has_bias:
            b13, b2 = take(module.gate_up_proj_bias, experts), take(module.down_proj_bias, experts)
    with torch.device("meta"):
        shard = Int8Experts(new_e, h, new_i, activation=module.activation, bias=module.has_bias,
                            global_num_experts=e, backend=module.backend)
    shard.load_quantized(w13, s13, w2, s2)
    if module.has_bias:
        shard.load_biases(b13, b2)
    if mode == "ep":
        expert_map = torch.full((e,), -1, dtype=torch.int32)
        expert_map[lo:hi] = torch.arange(hi - lo, dtype=torch.int32)
        shard.expert_map = expert_map.to(device)
    return shard


class ParallelExperts(nn.Module):
    """One rank's part of an experts module (``local``), and the all-reduce that adds the ranks' partial
    outputs: called like any transformers 5 experts module."""

    def __init__(self, local: Int8Experts, mode: str, group: Optional[dist.ProcessGroup] = None):
        super().__init__()
        self.local, self.mode, self.group = local, mode, group

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = self.local(hidden_states, top_k_index, top_k_weights)
        dist.all_reduce(out, group=self.group)
        return out

    def extra_repr(self) -> str:
        return f"mode={self.mode}, world_size={dist.get_world_size(self.group)}"


def parallelize_experts(model: nn.Module, mode: str = "tp", group: Optional[dist.ProcessGroup] = None,
                        device: Optional[torch.device] = None) -> nn.Module:
    """Replace every :class:`Int8Experts` in ``model`` by this rank's part of it (``mode`` ``"tp"`` or
    ``"ep"``, over ``group``, default the whole world) wrapped in a :class:`ParallelExperts`; each part
    moves to ``device`` (default: where the module is). In place; returns ``model`` (for a lone
    :class:`Int8Experts`, its wrapped part). Call it on every
    rank with the same model (same weights), after ``dist.init_process_group``. The result is for inference:
    save a checkpoint before splitting (each rank holds only its part)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("parallelize_experts needs torch.distributed initialized on every rank first "
                           "(dist.init_process_group, e.g. under torchrun)")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if isinstance(model, Int8Experts):  # a lone experts module: its part, wrapped
        return ParallelExperts(shard_experts(model, mode, rank, world_size, device), mode, group)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, Int8Experts)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no Int8Experts modules: quantize it first "
                         f"(ExpertsInt8Config when loading, or quantize_)")
    for name, module in targets:
        part = ParallelExperts(shard_experts(module, mode, rank, world_size, device), mode, group)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, part)
    return model


__all__ = ["MODES", "ParallelExperts", "parallelize_experts", "shard_experts"]
