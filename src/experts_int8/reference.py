"""Pure-torch MoE: the oracle of every test and the CPU execution path.

Legend: M tokens, H hidden, I intermediate (per expert), E local experts, k experts per token.
``w13 [E, 2I, H]`` holds gate rows ``[:I]`` then up rows ``[I:]`` (the expert computes
``act(gate) * up``), or, for experts without a gate (NemotronH), up rows only: ``w13 [E, I, H]``,
``act(up)``; ``w2 [E, H, I]``.

Numerics mirror the Triton kernel: accumulate in fp32 (or fp64 when x is fp64), apply the per-row
weight scale after the product, the activation and routing weight in that precision, round the
intermediate to x's dtype once, and sum the k expert outputs in fp32.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "swiglu_oai", "relu2")
GATED_ONLY = ("swiglu_oai",)  # activations whose form reads the up rows (no ungated form)
# GPT-OSS's clamped SwiGLU: gate clamped above at LIMIT, up clamped to [-LIMIT, LIMIT],
# gate * sigmoid(ALPHA * gate) * (up + 1).
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


class Clamp(NamedTuple):
    """The clamps of a clamped SwiGLU, around ``act(gate) * up``: the gate clamped above at ``limit`` before the
    activation (DeepSeek-V4, GLM-5-Next, HY-V4), or ``act(gate)`` after it with ``after_act`` (Step-3.7, Ling), and
    ``up`` to ``[-limit, limit]``; ``alpha`` is swiglu_oai's sigmoid slope (GPT-OSS, MiniMax-M3). No limit: none."""
    limit: Optional[float] = None
    alpha: Optional[float] = None
    after_act: bool = False


NO_CLAMP = Clamp()


def clamp_of(activation: str, swiglu_limit=None, swiglu_alpha=None, limit_after_act=False, gated=True) -> Clamp:
    """The :class:`Clamp` that ``activation`` with these options computes (swiglu_oai's defaults are GPT-OSS's), or a
    ValueError saying which option does not apply (a limit, to experts without a gate: not ``gated``)."""
    for name, value in (("swiglu_limit", swiglu_limit), ("swiglu_alpha", swiglu_alpha)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")
    if not isinstance(limit_after_act, bool):
        raise TypeError(f"limit_after_act must be a bool, got {limit_after_act!r}")
    if not gated and swiglu_limit is not None:
        raise ValueError("swiglu_limit clamps gate and up rows; experts without a gate (w13 [E, I, H]) have none")
    if activation == "swiglu_oai":
        if limit_after_act:
            raise ValueError("limit_after_act does not apply to swiglu_oai, whose gate is clamped before its sigmoid")
        return Clamp(float(SWIGLU_OAI_LIMIT if swiglu_limit is None else swiglu_limit),
                     float(SWIGLU_OAI_ALPHA if swiglu_alpha is None else swiglu_alpha))
    if swiglu_alpha is not None:
        raise ValueError(f"swiglu_alpha is swiglu_oai's sigmoid slope; activation {activation!r} has none")
    if swiglu_limit is None:
        if limit_after_act:
            raise ValueError("limit_after_act needs swiglu_limit: the value act(gate) is clamped to")
        return NO_CLAMP
    return Clamp(float(swiglu_limit), None, limit_after_act)


# Other projects' names for the same activations (vLLM's fused MoE, transformers' ``hidden_act``): named in the
# error, not accepted, so that one spelling reaches the kernel and its tables
_OTHER_NAMES = {"swigluoai": "swiglu_oai", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def unknown_activation(activation) -> str:
    """The message for an ``activation`` not in ACTIVATIONS, naming ours where it is another spelling of one."""
    name = activation.lower() if isinstance(activation, str) else None
    ours = name if name in ACTIVATIONS else _OTHER_NAMES.get(name)
    hint = f" (experts_int8 calls it {ours!r})" if ours else ""
    return f"activation must be one of {ACTIVATIONS}, got {activation!r}{hint}"


def _act(g: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(g)
    if activation == "gelu":
        return F.gelu(g)
    if activation == "gelu_tanh":
        return F.gelu(g, approximate="tanh")
    if activation == "relu2":  # squared ReLU (NemotronH)
        return F.relu(g).square()
    if activation in GATED_ONLY:
        raise ValueError(f"activation {activation!r} needs gate and up rows; these experts have no gate")
    raise ValueError(unknown_activation(activation))


def act_and_mul(gate_up: torch.Tensor, activation: str, clamp: Optional[Clamp] = None) -> torch.Tensor:
    """``[..., 2I] -> [..., I]``: ``act(gate) * up``, clamped as ``clamp`` says (None: the activation's own,
    :func:`clamp_of`; for ``swiglu_oai`` GPT-OSS's form)."""
    clamp = clamp_of(activation) if clamp is None else clamp
    gate, up = gate_up.chunk(2, dim=-1)
    if clamp.limit is not None:
        if not clamp.after_act:
            gate = gate.clamp(max=clamp.limit)
        up = up.clamp(-clamp.limit, clamp.limit)
    if activation == "swiglu_oai":
        return gate * torch.sigmoid(clamp.alpha * gate) * (up + 1)
    gate = _act(gate, activation)
    if clamp.after_act:
        gate = gate.clamp(max=clamp.limit)
    return gate * up


def activate(h: torch.Tensor, activation: str, gated: bool = True, clamp: Optional[Clamp] = None) -> torch.Tensor:
    """The experts' intermediate: ``act(gate) * up`` from ``[..., 2I]``, or ``act(up)`` from ``[..., I]`` for
    experts without a gate (no clamp applies to them)."""
    return act_and_mul(h, activation, clamp) if gated else _act(h, activation)


def is_gated(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether ``w13`` holds gate and up rows (``[E, 2I, H]``) rather than up rows only (``[E, I, H]``)."""
    return w13.shape[1] == 2 * w2.shape[2]


# Decode (an expert with at most DECODE_ROWS rows): the int8 weight's float copy costs more than the product, and a
# whole [N, K] one goes through memory and back (1 byte read, 4 written, 4 read again per weight). Converted
# BLOCK elements (1 MiB in fp32) at a time, each block is multiplied while it is still in cache: 1.3-2x faster per
# expert on CPU (E=8 H=1024 I=3584 top-2, 1-8 tokens). Longer inputs convert once (their products dominate), and so
# does a GPU, where each block would be two more launches.
DECODE_ROWS = 16
BLOCK = 1 << 18


def _expert_matmul(a: torch.Tensor, w: torch.Tensor, scale: Optional[torch.Tensor], acc: torch.dtype):
    """``a [T, K] @ w[N, K]^T`` in ``acc`` precision, times the per-row scale of int8 weights."""
    a = a.to(acc)
    if w.dtype == torch.int8 and a.device.type == "cpu" and a.shape[0] <= DECODE_ROWS and w.numel() > BLOCK:
        out = torch.cat([a @ block.to(acc).t() for block in w.split(max(1, BLOCK // w.shape[1]))], dim=-1)
    else:
        out = a @ w.to(acc).t()
    return out if scale is None else out * scale.to(acc)


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Optional[torch.Tensor] = None,
    global_num_experts: Optional[int] = None,
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[float] = None,
    swiglu_alpha: Optional[float] = None,
    limit_after_act: bool = False,
) -> torch.Tensor:
    """Reference MoE over already-selected experts. Returns ``[M, H]`` in x's dtype.

    Optional expert biases ``w13_bias [E, 2I]`` (``[E, I]`` without a gate) and ``w2_bias [E, H]`` are added
    after the scaled products (before the activation, and before the routing weight). ``swiglu_limit``,
    ``swiglu_alpha``, ``limit_after_act``: a clamped SwiGLU (:func:`clamp_of`).

    ``expert_map[global_id]`` is the local index of that expert or -1 (expert lives elsewhere:
    the slot contributes 0). Inputs are assumed valid; :mod:`experts_int8.ops` validates.
    """
    # Its products accumulate in fp32 (fp64 for fp64 x) as the kernel's do, autocast or not: under autocast the
    # kernel's op keeps its own precision, and this path (which also gives the op's gradients) must match it.
    with torch.autocast(x.device.type, enabled=False):
        return _fused_experts(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation,
                              apply_router_weight_on_input, expert_map, w13_bias, w2_bias,
                              clamp_of(activation, swiglu_limit, swiglu_alpha, limit_after_act))


def _fused_experts(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, activation, apply_router_weight_on_input,
                   expert_map, w13_bias, w2_bias, clamp) -> torch.Tensor:
    m, k = topk_ids.shape
    gated = is_gated(w13, w2)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.zeros(m, k, w2.shape[1], dtype=acc, device=x.device)
    for e, tok, slot in _expert_pairs(topk_ids, expert_map):
        out[tok, slot] = _expert(x[tok], topk_weights[tok, slot], w13[e], _row(w13_scale, e), _row(w13_bias, e), w2[e],
                                 _row(w2_scale, e), _row(w2_bias, e), activation, gated, apply_router_weight_on_input,
                                 x.dtype, acc, clamp)
    return out.sum(dim=1).to(x.dtype)


def _row(t: Optional[torch.Tensor], e: int) -> Optional[torch.Tensor]:
    return None if t is None else t[e]


def _expert_pairs(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]):
    """``(e, tok, slot)`` for each local expert ``e`` the routing hits: the (token, slot) pairs routed to it."""
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    k = ids.shape[1]
    # The pairs sorted by expert (a stable sort: (token, slot) order within each), split by the counts: the host
    # reads the routing once, where a nonzero() per expert waited for the device once per expert
    experts, order = ids.flatten().sort(stable=True)
    hit, counts = torch.stack(torch.unique_consecutive(experts, return_counts=True)).tolist()
    for e, pairs in zip(hit, order.split(counts)):
        if e >= 0:  # (-1: an expert held elsewhere; its slot contributes 0)
            yield e, pairs // k, pairs % k


def _expert(x, weight, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, activation, gated, on_input, dtype, acc,
            clamp):
    """One expert's outputs ``[n, H]`` (in ``acc``, rounded to ``dtype`` as the kernel stores them) for its rows
    ``x [n, H]`` with routing weights ``weight [n]``."""
    weight = weight.to(acc).unsqueeze(-1)
    a = x.to(acc)
    if on_input:
        a = a * weight
    gate_up = _expert_matmul(a, w13, w13_scale, acc)
    if w13_bias is not None:
        gate_up = gate_up + w13_bias.to(acc)
    h = activate(gate_up, activation, gated, clamp).to(dtype)  # the kernel stores the intermediate in x's dtype
    y = _expert_matmul(h, w2, w2_scale, acc)
    if w2_bias is not None:
        y = y + w2_bias.to(acc)
    if not on_input:
        y = y * weight
    return y.to(dtype).to(acc)  # the kernel stores each expert's output in x's dtype


# The tensors of fused_experts that can take a gradient
DIFFERENTIABLE = ("x", "w13", "w2", "topk_weights", "w13_scale", "w2_scale", "w13_bias", "w2_bias")


def fused_experts_backward(
    grad: torch.Tensor,
    wanted: list[str],
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: Optional[torch.Tensor] = None,
    w2_scale: Optional[torch.Tensor] = None,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    expert_map: Optional[torch.Tensor] = None,
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[float] = None,
    swiglu_alpha: Optional[float] = None,
    limit_after_act: bool = False,
    functional: bool = False,
) -> list[torch.Tensor]:
    """The gradients of :func:`fused_experts`' inputs named in ``wanted`` (of :data:`DIFFERENTIABLE`), given the
    output's ``grad [M, H]``: its own autograd's, computed one expert at a time. Each expert's forward is recomputed
    and differentiated alone, so no more than one expert's weights are held in ``acc`` precision at once (autograd
    through the whole loop would keep a float copy of every expert hit until the end).

    ``functional``: differentiate with torch.func, for a custom op's implementation, where autograd does not
    record (torch.func refuses to run under saved-tensor hooks, such as ``torch.autograd.graph.save_on_cpu``, which
    autograd takes)."""
    with torch.autocast(x.device.type, enabled=False):
        tensors = dict(x=x, w13=w13, w2=w2, topk_weights=topk_weights, w13_scale=w13_scale, w2_scale=w2_scale,
                       w13_bias=w13_bias, w2_bias=w2_bias)
        gated = is_gated(w13, w2)
        clamp = clamp_of(activation, swiglu_limit, swiglu_alpha, limit_after_act)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        # x's rows take a gradient from each of their k experts (summed in acc); every other tensor's part belongs
        # to one expert, or one (token, slot) pair
        grads = {n: torch.zeros_like(tensors[n], dtype=acc if n == "x" else None) for n in wanted}
        grad = grad.to(acc)
        for e, tok, slot in _expert_pairs(topk_ids, expert_map):
            parts = dict(x=x[tok], topk_weights=topk_weights[tok, slot], w13=w13[e], w2=w2[e],
                         w13_scale=_row(w13_scale, e), w2_scale=_row(w2_scale, e), w13_bias=_row(w13_bias, e),
                         w2_bias=_row(w2_bias, e))

            def expert(*differentiated, parts=parts):
                p = {**parts, **dict(zip(wanted, differentiated))}
                return _expert(p["x"], p["topk_weights"], p["w13"], p["w13_scale"], p["w13_bias"], p["w2"],
                               p["w2_scale"], p["w2_bias"], activation, gated, apply_router_weight_on_input, x.dtype,
                               acc, clamp)

            for name, g in zip(wanted, _vjp(expert, [parts[n] for n in wanted], grad[tok], functional)):
                if name == "x":
                    grads[name].index_add_(0, tok, g.to(acc))
                elif name == "topk_weights":
                    grads[name][tok, slot] = g
                else:
                    grads[name][e] = g
        return [grads[n].to(tensors[n].dtype) for n in wanted]


def _vjp(fn, primals: list[torch.Tensor], cotangent: torch.Tensor, functional: bool) -> list[torch.Tensor]:
    """The gradients of ``fn(*primals)`` for ``cotangent``, through torch.func or autograd."""
    if functional:
        return torch.func.vjp(fn, *primals)[1](cotangent)
    if torch.is_grad_enabled():  # a backward with create_graph=True: these gradients are differentiated in turn
        return torch.autograd.grad(fn(*primals), primals, cotangent, create_graph=True, materialize_grads=True)
    with torch.enable_grad():
        leaves = [p.detach().requires_grad_() for p in primals]
        return torch.autograd.grad(fn(*leaves), leaves, cotangent, materialize_grads=True)
