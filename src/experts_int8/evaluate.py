"""Quality of int8 experts on real weights: dense gated MLPs as 1-expert MoEs, and float-vs-int8 metrics.

A dense gated MLP ``down(act(gate(x)) * up(x))`` is exactly a Mixture-of-Experts with one expert
(E=1), one expert per token (k=1) and routing weight 1. :func:`dense_mlps_as_int8_experts_` uses
that to run any causal LM's MLPs through :func:`experts_int8.fused_experts` with int8 weights, so
pretrained dense checkpoints become real-weight test cases for the MoE kernel. :func:`compare_models`
then measures what the quantization costs: perplexity of both models, top-1 next-token agreement and
the mean KL divergence ``KL(float || int8)`` of the next-token distributions, over sliding windows.
:func:`routing_quality` separates, in an MoE model, the int8 experts' own error from the top-k choices
that int8 noise upstream of a router flips (near-tied routers, as random ones are, flip often).

The first two are model-agnostic: they need a module tree with ``gate_proj``/``up_proj``/
``down_proj`` ``nn.Linear`` children (llama, mistral, qwen2/3, gemma, ...) and a causal LM whose
``forward(input_ids)`` returns an object with ``.logits``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .layer import Int8Experts, accelerate_hooks, carry_hooks, detect_activation
from .ops import BACKENDS
from .reference import ACTIVATIONS, activate

__all__ = ["Int8DenseMLP", "compare_models", "dense_mlps_as_int8_experts_", "detect_activation", "input_device",
           "routing_quality", "snr_db"]

_GATED_NAMES = ("gate_proj", "up_proj", "down_proj")


class Int8DenseMLP(nn.Module):
    """A dense gated MLP computed as a 1-expert :class:`~experts_int8.layer.Int8Experts`.

    ``experts.gate_up_proj [1, 2I, H]`` is ``[gate_proj.weight; up_proj.weight]`` in int8,
    ``experts.down_proj [1, H, I]`` is ``down_proj.weight``; both with fp32 per-row scales.
    Every token goes to expert 0 with weight 1.
    """

    def __init__(self, experts: Int8Experts):
        super().__init__()
        if experts.num_experts != 1:
            raise ValueError(f"Int8DenseMLP needs a 1-expert Int8Experts, got {experts.num_experts} experts")
        self.experts = experts

    @classmethod
    def from_linears(cls, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, *,
                     activation: str, backend: str = "auto", name: str = "mlp") -> "Int8DenseMLP":
        """Quantize the three bias-free ``nn.Linear`` of a gated MLP (weights stay on their device)."""
        w13 = torch.cat([gate_proj.weight.detach(), up_proj.weight.detach()], dim=0).unsqueeze(0)
        w2 = down_proj.weight.detach().unsqueeze(0)
        return cls(Int8Experts.from_float(w13, w2, activation=activation, backend=backend, name=name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, hidden = x.shape[:-1], x.shape[-1]
        x2d = x.reshape(-1, hidden)
        t = x2d.shape[0]
        ids = torch.zeros((t, 1), dtype=torch.int32, device=x.device)
        weights = torch.ones((t, 1), dtype=torch.float32, device=x.device)
        return self.experts(x2d, ids, weights).reshape(*lead, hidden)


def input_device(model: nn.Module) -> torch.device:
    """Where ``model``'s token ids go: its input embedding's device (``get_input_embeddings``), not its first
    parameter's (a VLM's is its vision tower's, which a device map may place elsewhere); a model without an
    input embedding: its first parameter's. Where accelerate
    offloads that parameter (a ``"cpu"`` or ``"disk"`` entry of a device map: on the meta device until a forward
    brings it in), the device its hook runs that module on."""
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embedding = None
    has_weights = isinstance(embedding, nn.Module) and next(embedding.parameters(), None) is not None
    module = embedding if has_weights else model
    for name, p in module.named_parameters():
        if p.device.type == "meta":
            owner = module.get_submodule(name.rpartition(".")[0])
            devices = [h.execution_device for h in accelerate_hooks(owner)
                       if getattr(h, "execution_device", None) is not None]
            if devices:
                return torch.device(devices[0])
        return p.device
    return torch.device("cpu")


def _gated_linears(module: nn.Module) -> Optional[tuple[nn.Linear, nn.Linear, nn.Linear]]:
    """``(gate, up, down)`` if ``module`` is a bias-free gated MLP with consistent shapes, else None."""
    children = [getattr(module, n, None) for n in _GATED_NAMES]
    if not all(type(c) is nn.Linear and c.bias is None for c in children):
        return None
    gate, up, down = children
    hidden, inter = gate.in_features, gate.out_features
    if (up.in_features, up.out_features) != (hidden, inter) or (down.in_features, down.out_features) != (inter, hidden):
        return None
    return gate, up, down


def _computes_plain_mlp(mod: nn.Module, gate: nn.Linear, up: nn.Linear, down: nn.Linear, activation: str) -> bool:
    """Whether ``mod``'s own forward computes ``down(act(gate(x)) * up(x))``, judged on inputs from 1 to 1e4 in size
    (a clamp shows past its limit). A forward that cannot run on its own (none, offloaded weights) counts as plain:
    the module's children say what it is."""
    w = gate.weight
    x = torch.randn(3, gate.in_features, generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
    x = x * torch.tensor([1.0, 1e2, 1e4], device=w.device, dtype=w.dtype)[:, None]
    try:
        theirs = type(mod).forward(mod, x).float()  # (not mod(x): its hooks are the user's, not for this probe)
        plain = down(activate(gate(x), activation, gated=False) * up(x)).float()
    except Exception:  # noqa: BLE001 - a module of any kind
        return True
    return theirs.shape == plain.shape and bool((theirs - plain).abs().max() <= 1e-3 * plain.abs().max())


@torch.no_grad()
def dense_mlps_as_int8_experts_(model: nn.Module, *, activation: Optional[str] = None,
                                backend: str = "auto") -> int:
    """Replace, in place, every dense gated MLP of ``model`` by an :class:`Int8DenseMLP`. Returns the count.

    A gated MLP is any module with ``gate_proj``, ``up_proj`` and ``down_proj`` children that are
    plain ``nn.Linear`` without bias (``[I, H]``, ``[I, H]``, ``[H, I]``), computing
    ``down(act(gate(x)) * up(x))``. Its activation is read from its ``act_fn`` child (see
    :func:`detect_activation`) unless ``activation`` is given. ``backend`` is passed to
    :func:`experts_int8.fused_experts` ("auto", "triton" or "torch"); change it later through each
    ``Int8Experts.backend``. Raises ``ValueError`` if the model has no such module.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS} or None, got {activation!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    targets = [(name, mod, lin) for name, mod in model.named_modules()
               if not isinstance(mod, Int8DenseMLP) and (lin := _gated_linears(mod)) is not None]
    if not targets:
        raise ValueError(
            f"{type(model).__name__} has no dense gated MLP to convert: expected modules with bias-free "
            f"nn.Linear children {', '.join(_GATED_NAMES)} (llama-style MLPs)"
        )
    # Decide everything before changing anything, so an error leaves the model untouched.
    plan = []
    for name, mod, linears in targets:
        if not name:
            raise ValueError("the model itself is a gated MLP; convert a module that contains it")
        if activation is not None:
            act = activation
        elif isinstance(getattr(mod, "act_fn", None), nn.Module):
            act = detect_activation(mod.act_fn)
        else:
            raise ValueError(f"{name}: no act_fn module to read the activation from; pass activation=")
        if not _computes_plain_mlp(mod, *linears, act):
            raise ValueError(f"{name}: {type(mod).__name__}'s forward computes more than down(act(gate(x)) * up(x)) "
                             f"(a clamp of its own, as Step-3.7's and Ling's MLPs have), which Int8DenseMLP would "
                             f"drop; nothing was converted")
        plan.append((name, mod, linears, act))
    for name, mod, (gate, up, down), act in plan:
        new = Int8DenseMLP.from_linears(gate, up, down, activation=act, backend=backend, name=name)
        carry_hooks(mod, new)
        model.set_submodule(name, new)
    return len(targets)


def _windows(n: int, window: int, stride: int):
    """``(begin, end, first_target)``: each target position in ``[1, n)`` is scored exactly once.

    Needs ``stride < window`` (overlapping windows): a window cannot score its own first token.

    Window ``[begin, end)`` scores targets ``[first_target, end)``; every scored token after the
    first window sees at least ``window - stride`` tokens of context.
    """
    prev_end, begin = 0, 0
    while prev_end < n:
        end = min(begin + window, n)
        yield begin, end, max(prev_end, begin + 1)
        prev_end, begin = end, begin + stride


@contextmanager
def _evaluating(*models: nn.Module):
    """The models in eval mode for the block, each module's own mode put back after it. In training mode dropout
    and some routers draw random numbers (PhiMoE's jitter and sampled top-k): the same call gave other metrics."""
    modes = [(m, m.training) for model in models for m in model.modules()]
    try:
        for model in models:
            model.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training


@torch.inference_mode()
def compare_models(float_model: nn.Module, int8_model: nn.Module,
                   token_ids: Union[torch.Tensor, Sequence[int]], *, window: int = 1024,
                   stride: int = 512) -> dict:
    """Score ``token_ids`` with both causal LMs over sliding windows and compare them.

    ``token_ids``: one sequence (1-D, or ``[1, N]``). Windows of ``window`` tokens advance by
    ``stride < window``; each token after the first is predicted once, in the first window that reaches it
    (with ``window - stride`` tokens of context or more beyond the first window), as in the usual
    strided perplexity evaluation. Returns:

    - ``ppl_float``, ``ppl_int8``: ``exp(mean negative log-likelihood)`` of the true next tokens
    - ``ppl_rel_diff``: ``ppl_int8 / ppl_float - 1``
    - ``top1_agreement``: fraction of positions where both models' argmax next token is the same
    - ``mean_kl``: mean over positions of ``KL(p_float || p_int8)`` in nats
    - ``top1_acc_float``, ``top1_acc_int8``: fraction of positions where the argmax is the true token
    - ``tokens``: number of scored positions (``N - 1``); ``windows``: number of windows run

    Log-probabilities and all sums are computed in fp64 from each model's logits. Both models run in eval mode
    (each module's mode is put back afterwards).
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"token_ids must be one sequence of at least 2 tokens, got shape {tuple(ids.shape)}")
    if not (isinstance(window, int) and isinstance(stride, int) and 1 <= stride < window):
        # stride < window: a window's first token is only predicted from the previous window
        raise ValueError(f"need 1 <= stride < window, got window={window}, stride={stride}")
    with _evaluating(float_model, int8_model):
        return _compare(float_model, int8_model, ids, window, stride)


def _compare(float_model, int8_model, ids, window, stride) -> dict:
    device = input_device(float_model)
    device_q = input_device(int8_model)
    nll_f = nll_q = kl = 0.0
    agree = hit_f = hit_q = count = n_windows = 0
    for begin, end, first in _windows(ids.numel(), window, stride):
        chunk = ids[begin:end]
        pos = slice(first - 1 - begin, end - 1 - begin)  # logits at position p predict token p + 1
        targets = ids[first:end]
        lp_f = F.log_softmax(float_model(chunk[None].to(device)).logits[0, pos].double(), dim=-1).cpu()
        lp_q = F.log_softmax(int8_model(chunk[None].to(device_q)).logits[0, pos].double(), dim=-1).cpu()
        tgt = targets[:, None]
        nll_f -= lp_f.gather(1, tgt).sum().item()
        nll_q -= lp_q.gather(1, tgt).sum().item()
        p_f = lp_f.exp()
        kl += torch.where(p_f > 0, p_f * (lp_f - lp_q), 0.0).sum().item()
        top_f, top_q = lp_f.argmax(-1), lp_q.argmax(-1)
        agree += int((top_f == top_q).sum())
        hit_f += int((top_f == targets).sum())
        hit_q += int((top_q == targets).sum())
        count += targets.numel()
        n_windows += 1
    ppl_f, ppl_q = math.exp(nll_f / count), math.exp(nll_q / count)
    return {
        "ppl_float": ppl_f,
        "ppl_int8": ppl_q,
        "ppl_rel_diff": ppl_q / ppl_f - 1.0,
        "top1_agreement": agree / count,
        "mean_kl": kl / count,
        "top1_acc_float": hit_f / count,
        "top1_acc_int8": hit_q / count,
        "tokens": count,
        "windows": n_windows,
    }


def snr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``out`` against ``ref`` in dB (inf where they are equal)."""
    ref, out = ref.double(), out.double()
    noise = (ref - out).pow(2).mean()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.pow(2).mean() / noise))


def _record_experts(model: nn.Module) -> tuple[list, list]:
    """Forward hooks on every experts module: a list, one entry per module (``find_experts``' order), that fills
    with (inputs, top-k ids, top-k weights, output) per call of that module, and the hook handles. A module the
    inputs do not reach keeps an empty entry (Ernie 4.5 VL's vision experts on a text-only prompt)."""
    from .integrations.transformers import find_experts

    experts = [m for _, m in find_experts(model)]
    seen = [[] for _ in experts]
    hooks = [m.register_forward_hook(lambda mod, args, out, calls=calls: calls.append(
        (args[0].detach().clone(), args[1].clone(), args[2].clone(), out.detach().clone())))
        for m, calls in zip(experts, seen)]
    return seen, hooks


@torch.inference_mode()
def routing_quality(float_model: nn.Module, int8_model: nn.Module, input_ids: torch.Tensor, **inputs) -> dict:
    """The int8 model against the float one on ``input_ids``, free-running and with the float model's routing.

    Near-tied routers turn the int8 noise upstream of them into flipped top-k choices, an O(1) change for
    those tokens that says nothing about the int8 experts themselves (trained routers are rarely tied;
    random ones often are). Returns the logits SNR of the free-running int8 model
    (``logits_snr_db_free_running``), the fraction of tokens whose top-k set changed in each MoE layer
    (``tokens_with_changed_topk_per_layer``), each int8 experts module on the float model's inputs, top-k
    ids and weights against that layer's float output (``moe_layer_snr_db_reference_routing``), and the
    int8 logits with every layer's top-k ids and weights replaced by the float model's
    (``logits_snr_db_reference_routing``). Both models take transformers 5's experts call
    ``experts(hidden_states, top_k_index, top_k_weights)``. ``inputs``: the models' other inputs, the same for
    both (``attention_mask``; a vision-language model's ``pixel_values`` and what goes with them). Both models run
    in eval mode (each module's mode is put back afterwards).
    """
    with _evaluating(float_model, int8_model):
        return _routing_quality(float_model, int8_model, input_ids, inputs)


def _routing_quality(float_model, int8_model, input_ids, inputs) -> dict:
    from .integrations.transformers import find_experts

    def run(model, hooks=()):
        try:
            device = input_device(model)
            others = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            return model(input_ids.to(device), **others).logits.float().cpu()
        finally:
            for h in hooks:
                h.remove()

    named = find_experts(int8_model)
    experts = [m for _, m in named]
    seen, hooks = _record_experts(float_model)
    ref_logits = run(float_model, hooks)
    if len(seen) != len(experts):
        raise ValueError(f"the models differ: the float model has {len(seen)} MoE layers, the int8 model "
                         f"{len(experts)}")
    mine, hooks = _record_experts(int8_model)
    free_logits = run(int8_model, hooks)
    # Each experts module against its own float calls (modules the inputs do not reach are left out)
    for (name, _), a, b in zip(named, seen, mine):
        if len(a) != len(b):
            raise ValueError(f"the models differ: {name} ran {len(a)} times in the float model, {len(b)} in the "
                             f"int8 model")
    if not any(seen):
        raise ValueError("no MoE layer ran on these inputs")
    changed = [float((a[1].sort(-1).values != b[1].sort(-1).values).any(-1).float().mean())
               for calls, its in zip(seen, mine) for a, b in zip(calls, its)]
    per_layer = [snr_db(out.float(), m(inp, ids, w).float())
                 for m, calls in zip(experts, seen) for inp, ids, w, out in calls]

    def float_routing(calls):
        it = iter(calls)
        return lambda mod, args: (args[0], *next(it)[1:3])

    hooks = [m.register_forward_pre_hook(float_routing(calls)) for m, calls in zip(experts, seen) if calls]
    forced_logits = run(int8_model, hooks)
    return {"logits_snr_db_free_running": snr_db(ref_logits, free_logits),
            "tokens_with_changed_topk_per_layer": changed,
            "logits_snr_db_reference_routing": snr_db(ref_logits, forced_logits),
            "moe_layer_snr_db_reference_routing": per_layer}
