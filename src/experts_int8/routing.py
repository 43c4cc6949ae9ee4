"""Router: turn ``router_logits [M, E]`` into ``topk_weights [M, k]`` (fp32) and ``topk_ids [M, k]`` (int32).

Covers the variants of the MoE families in use:
  * softmax (Mixtral, Qwen-MoE, OLMoE), sigmoid (DeepSeek-V3, Llama-4) or sqrt(softplus) (DeepSeek-V4) scores;
  * optional renormalisation of the k chosen weights;
  * grouped top-k (DeepSeek-V2/V3): keep the ``topk_group`` best of ``num_expert_group`` groups;
  * a score-correction bias that only steers *selection*; weights come from unbiased scores (DeepSeek-V3);
  * a routed scaling factor multiplied into the final weights;
  * PhiMoE's sparsemixer (:func:`sparsemixer`, a ``custom_routing_function``).
Everything stays on the device with no host synchronisation.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")


def _scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    if scoring == "softmax":
        return logits.softmax(dim=-1)
    return logits.sigmoid() if scoring == "sigmoid" else torch.nn.functional.softplus(logits).sqrt()


def shape_str(t) -> str:
    """A tensor's shape for an error message; what was given instead of a tensor, by its type."""
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _validate(router_logits, top_k, scoring, num_expert_group, topk_group, correction_bias,
              routed_scaling_factor=1.0):
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2:
        raise ValueError(f"router_logits must be a 2-D tensor [M, E], got {shape_str(router_logits)}")
    if not router_logits.is_floating_point():
        raise TypeError(f"router_logits must be floating point, got {router_logits.dtype}")
    num_experts = router_logits.shape[1]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be an int in [1, E={num_experts}], got {top_k!r}")
    if not isinstance(routed_scaling_factor, (int, float)) or isinstance(routed_scaling_factor, bool):
        raise TypeError(f"routed_scaling_factor must be a number, got {routed_scaling_factor!r}")
    if not math.isfinite(routed_scaling_factor) or routed_scaling_factor <= 0:  # (every token's weights would be)
        raise ValueError(f"routed_scaling_factor must be a finite number above 0, got {routed_scaling_factor!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError("num_expert_group and topk_group must be given together (grouped top-k)")
    if num_expert_group is not None:
        for name, value in (("num_expert_group", num_expert_group), ("topk_group", topk_group)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_experts % num_expert_group:
            raise ValueError(f"E={num_experts} is not divisible by num_expert_group={num_expert_group}")
        if not 1 <= topk_group <= num_expert_group:
            raise ValueError(f"topk_group must be in [1, num_expert_group={num_expert_group}], got {topk_group}")
        if topk_group * (num_experts // num_expert_group) < top_k:
            raise ValueError(
                f"topk_group={topk_group} groups of {num_experts // num_expert_group} experts cannot hold top_k={top_k}"
            )
    if correction_bias is not None and (not isinstance(correction_bias, torch.Tensor)
                                        or tuple(correction_bias.shape) != (num_experts,)):
        raise ValueError(f"correction_bias must be a tensor of shape ({num_experts},), got "
                         f"{shape_str(correction_bias)}")


# Argument names of other projects' fused MoE calls (vLLM's and SGLang's fused_moe, fused_experts and
# select_experts): a call written for them is refused with what each argument is here. (Their names for our
# required positional arguments, hidden_states, gating_output, w1 and topk, fail in Python's own binding first.)
OTHER_ARGS = {
    "w1_scale": "is w13_scale here",
    "w1_bias": "is w13_bias here",
    "scoring_func": "is scoring here",
    "e_score_correction_bias": "is correction_bias here",
    "use_grouped_topk": "is implied: pass num_expert_group and topk_group",
    "use_int8_w8a16": "is implied: int8 weights with w13_scale and w2_scale run W8A16, float weights unquantized",
    "per_channel_quant": "is implied: the scales are per output row",
    "inplace": "is not supported: the output is a new tensor",
    "block_shape": "is not supported: the scales are per output row, not per block",
    "w1_zp": "is not supported: the int8 weights are symmetric (no zero points)",
    "w2_zp": "is not supported: the int8 weights are symmetric (no zero points)",
    "a1_scale": "is not supported: activations stay in bf16/fp16/fp32 (W8A16)",
    "a2_scale": "is not supported: activations stay in bf16/fp16/fp32 (W8A16)",
    "use_fp8_w8a8": "is not supported: experts_int8 runs int8 weights with 16-bit activations (W8A16) only",
    "use_int8_w8a8": "is not supported: experts_int8 runs int8 weights with 16-bit activations (W8A16) only",
    "use_int4_w4a16": "is not supported: experts_int8 runs int8 weights with 16-bit activations (W8A16) only",
}


def refuse_unknown_args(fn: str, kwargs: dict) -> None:
    """TypeError for keyword arguments ``fn`` does not take, saying what those of :data:`OTHER_ARGS` are here."""
    if not kwargs:
        return
    hints = [f"{name!r} {OTHER_ARGS[name]}" for name in kwargs if name in OTHER_ARGS]
    raise TypeError(f"{fn}() got unexpected keyword arguments {sorted(kwargs)}" + (
        f" ({'; '.join(hints)})" if hints else ""))


def select_experts(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    correction_bias: Optional[torch.Tensor] = None,
    routed_scaling_factor: float = 1.0,
    custom_routing_function: Optional[Callable] = None,
    score_in_logits_dtype: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick ``top_k`` experts per token. Returns ``(topk_weights fp32 [M, k], topk_ids int32 [M, k])``.

    Scores are computed, biased, grouped and chosen in fp32, or with ``score_in_logits_dtype`` in the logits'
    own dtype, as routers that do not upcast them do (LFM2, Mistral 4): in bf16, rounding decides near ties.

    ``custom_routing_function(router_logits, top_k, renormalize) -> (weights, ids)`` replaces the
    built-in selection; its outputs are cast and the scaling factor still applies.
    """
    refuse_unknown_args("select_experts", kwargs)
    _validate(router_logits, top_k, scoring, num_expert_group, topk_group, correction_bias, routed_scaling_factor)
    if custom_routing_function is not None:
        if num_expert_group is not None or correction_bias is not None or scoring != "softmax" or score_in_logits_dtype:
            raise ValueError("custom_routing_function replaces the built-in selection: scoring, grouped top-k, "
                             "correction_bias and score_in_logits_dtype do not apply to it")
        weights, ids = custom_routing_function(router_logits, top_k, renormalize)
        want = (router_logits.shape[0], top_k)
        if not all(isinstance(t, torch.Tensor) and tuple(t.shape) == want for t in (weights, ids)):
            shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (weights, ids)]
            raise ValueError(f"custom_routing_function must return (weights, ids) of shape {want}, got {shapes}")
        return (weights.float() * routed_scaling_factor), ids.to(torch.int32)

    logits = router_logits if score_in_logits_dtype else router_logits.float()
    scores = _scores(logits, scoring)
    choice = scores if correction_bias is None else scores + correction_bias  # (an fp32 bias promotes)

    if num_expert_group is not None:
        m, e = choice.shape
        grouped = choice.view(m, num_expert_group, e // num_expert_group)
        if correction_bias is not None:  # DeepSeek-V3: a group is worth its two best biased scores
            group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
        else:  # DeepSeek-V2: a group is worth its best score
            group_score = grouped.amax(dim=-1)
        keep = torch.zeros_like(group_score)
        keep.scatter_(1, group_score.topk(topk_group, dim=-1).indices, 1.0)
        choice = grouped.masked_fill(keep.unsqueeze(-1) == 0, float("-inf")).view(m, e)

    topk_ids = choice.topk(top_k, dim=-1).indices
    topk_weights = scores.gather(1, topk_ids).float()
    if renormalize:  # per-expert scores can all underflow to 0: the routers of that kind add 1e-20 (never 0/0)
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + (1e-20 if scoring != "softmax" else 0))
    if routed_scaling_factor != 1.0:
        topk_weights = topk_weights * routed_scaling_factor
    return topk_weights, topk_ids.to(torch.int32)


def sparsemixer(jitter_eps: float) -> Callable:
    """PhiMoE's routing at inference, as a ``custom_routing_function`` for :func:`select_experts`.

    Two picks in turn: the best remaining expert, weighted by a softmax over the remaining experts whose
    logits lie within a relative ``2 * jitter_eps`` of its own (the rest masked out); then that expert
    leaves the pool. No renormalization.
    """
    def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if top_k != 2:
            raise ValueError(f"sparsemixer picks 2 experts, got top_k={top_k}")
        scores = router_logits.float()
        remaining, weights, ids = scores, [], []
        for _ in range(top_k):
            best, pick = remaining.max(dim=-1, keepdim=True)
            far = (best - scores) / scores.abs().clamp(min=best) > 2 * jitter_eps
            weights.append(remaining.masked_fill(far, float("-inf")).softmax(dim=-1).gather(-1, pick))
            ids.append(pick)
            remaining = remaining.scatter(-1, pick, float("-inf"))
        return torch.cat(weights, dim=-1), torch.cat(ids, dim=-1)

    return route
