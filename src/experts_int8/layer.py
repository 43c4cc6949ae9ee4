"""``Int8Experts``: the routed experts of one MoE layer with int8 weights (W8A16).

Legend: E local experts, H hidden, I intermediate (per expert), T tokens, k experts per token.

Tensors (same layout as transformers 5 and vLLM; ``requires_grad`` is False everywhere):
  ``gate_up_proj``        int8 ``[E, 2I, H]``  gate rows ``[:I]`` then up rows ``[I:]``
  ``gate_up_proj_scale``  fp32 ``[E, 2I]``     one scale per output row
  ``down_proj``           int8 ``[E, H, I]``
  ``down_proj_scale``     fp32 ``[E, H]``
  ``gate_up_proj_bias``   fp32 ``[E, 2I]``     optional expert biases (``bias=True``, e.g. GPT-OSS)
  ``down_proj_bias``      fp32 ``[E, H]``

Experts without a gate (``has_gate=False``, e.g. NemotronH: ``down(act(up(x)))``) hold ``up_proj`` int8
``[E, I, H]`` with ``up_proj_scale`` (and ``up_proj_bias``) ``[E, I]`` in place of the ``gate_up_proj`` tensors:
the names of transformers' own modules, so checkpoints load and save under them.

The module only computes experts: routing (the router, top-k, renormalisation, ...) stays with the
model, which calls ``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`` like
every transformers 5 experts module.

Ready for tensor / expert parallelism: scales are always computed from full rows, so a rank that
holds a slice of I keeps the matching rows of ``gate_up_proj`` (both halves) with their scales, and
the matching columns of ``down_proj`` with the *unchanged* ``down_proj_scale``. A rank holding a
subset of experts sets ``expert_map [global E]`` (global id -> local index or -1) and
``global_num_experts``; :func:`experts_int8.fused_experts` already honours both.
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch
from torch import nn
from torch.nn.utils import parametrize

from .ops import BACKENDS, fused_experts
from .quant import check_weights, quantize_weights
from .reference import ACTIVATIONS, GATED_ONLY, act_and_mul, clamp_of, is_gated, unknown_activation

def detect_activation(act_fn) -> str:
    """Which of :data:`experts_int8.reference.ACTIVATIONS` ``act_fn`` computes, found by evaluating it.

    Reading the function's behaviour rather than a config name keeps this independent of how each
    architecture names its activation (``hidden_act``, ``hidden_activation``, ``mlp_hidden_act``, or none:
    Aria's experts are SiLU whatever ``hidden_act`` says).
    """
    probe = torch.linspace(-6.0, 6.0, 97, dtype=torch.float64)
    try:
        got = act_fn(probe)
    except Exception as exc:  # noqa: BLE001 - reported with the module's name by the caller
        raise ValueError(f"cannot evaluate activation {act_fn!r}: {exc}") from exc
    for name in ACTIVATIONS:
        # act_and_mul(cat(g, 1)) = act(g) * 1: the activation exactly as the kernel computes it.
        ref = act_and_mul(torch.cat([probe, torch.ones_like(probe)]), name)
        if torch.allclose(got.to(torch.float64), ref, rtol=1e-5, atol=1e-6):
            return name
    raise ValueError(f"activation {act_fn!r} is none of the kernel's activations {ACTIVATIONS}")


def w13_name(module: nn.Module) -> str:
    """The experts' first projection: ``gate_up_proj`` (gate then up rows), or ``up_proj`` for experts without a
    gate (transformers' and ours: ``has_gate=False``)."""
    return "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"


_probed = functools.lru_cache(maxsize=64)(detect_activation)


# nn.Module's hook registries (torch's names): forward hooks and pre-hooks with their with_kwargs / always_call
# entries, backward hooks, state-dict hooks
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def carry_hooks(old: nn.Module, new: nn.Module) -> None:
    """Move to ``new``, which takes ``old``'s place in the model, the hooks registered on ``old``: the same dicts,
    so that the handles their registration returned still remove them (a handle keeps its dict and an id).
    ``old`` is left empty ones: it may live on (the whole module parallelize_experts was given alone, the float
    module quantize_ sets aside, which dequantize() gives them back to), and dicts shared with ``new`` would run
    ``new``'s hooks (ParallelExperts' refusal to save a part) on it, and hooks registered on either on both."""
    for attr in _HOOK_DICTS:
        hooks, own = old.__dict__.get(attr), new.__dict__.get(attr)
        if hooks is None or own is None:
            continue
        if hooks is not own:
            hooks.update(own)  # (hooks of its own, ParallelExperts' refusal to save a part, run after them)
            object.__setattr__(new, attr, hooks)
        object.__setattr__(old, attr, type(hooks)())
    if old.__dict__.get("_is_full_backward_hook") is not None:
        object.__setattr__(new, "_is_full_backward_hook", old._is_full_backward_hook)
    for hook in new._load_state_dict_pre_hooks.values():  # (given the module they were registered on: now new)
        if getattr(hook, "with_module", False) and hook.module() is old:
            hook.module = weakref.ref(new)


def accelerate_hooks(module: nn.Module) -> tuple:
    """accelerate's hooks on ``module``: its ``_hf_hook``, or the hooks a ``SequentialHook`` chains
    (``add_hook_to_module(..., append=True)``: ``cpu_offload`` of a module with tensors of its own chains its device
    hook and its offload hook so)."""
    def flat(hook) -> tuple:
        chained = getattr(hook, "hooks", None)
        if isinstance(chained, (list, tuple)):
            return tuple(h for c in chained for h in flat(c))
        return () if hook is None else (hook,)

    return flat(getattr(module, "_hf_hook", None))


def offloaded_by_accelerate(module: nn.Module) -> bool:
    """Whether an accelerate hook offloads ``module``'s tensors (on the meta device, its weights map's copies brought
    in for each forward)."""
    return any(getattr(h, "offload", False) or getattr(h, "weights_map", None) is not None
               for h in accelerate_hooks(module))


@torch.compiler.assume_constant_result
def _activation_cached(act_fn) -> str:
    """detect_activation, once per function, and a constant to torch.compile (a graph cannot branch on data)."""
    return _probed(act_fn)


class Int8Experts(nn.Module):
    """Routed experts with int8 weights and fp32 per-row scales, computed by :func:`fused_experts`."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        activation: str = "silu",
        bias: bool = False,
        gated: bool = True,
        global_num_experts: Optional[int] = None,
        device: Optional[torch.device | str] = None,
        backend: str = "auto",
        swiglu_limit: Optional[float] = None,
        swiglu_alpha: Optional[float] = None,
        limit_after_act: bool = False,
    ):
        """``swiglu_limit``, ``swiglu_alpha``, ``limit_after_act``: a clamped SwiGLU, as :func:`fused_experts`
        takes them."""
        super().__init__()
        for name, value in (("num_experts", num_experts), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(unknown_activation(activation))
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if not gated and activation in GATED_ONLY:
            raise ValueError(f"activation {activation!r} needs gate and up rows; experts without a gate cannot use it")
        clamp_of(activation, swiglu_limit, swiglu_alpha, limit_after_act, gated)  # (raises for options that do not fit)
        # (plain floats: a numpy scalar or an int given stores as the float the kernel compiles for)
        self.swiglu_limit = None if swiglu_limit is None else float(swiglu_limit)
        self.swiglu_alpha = None if swiglu_alpha is None else float(swiglu_alpha)
        self.limit_after_act = limit_after_act
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.backend = backend
        self.global_num_experts = global_num_experts if global_num_experts is not None else num_experts
        self.has_gate = gated
        self.w13_name = w13_name(self)
        e, h, i = num_experts, hidden_size, intermediate_size
        rows = 2 * i if gated else i

        def int8(*shape):
            return nn.Parameter(torch.empty(shape, dtype=torch.int8, device=device), requires_grad=False)

        self.register_parameter(self.w13_name, int8(e, rows, h))
        self.down_proj = int8(e, h, i)
        # Scales are buffers: transformers' loader keeps buffers as plain tensors (never trainable).
        # NaN until loaded: one left out of a load (strict=False) gives NaN outputs, not whatever memory held
        def unloaded(*shape):
            return torch.full(shape, float("nan"), dtype=torch.float32, device=device)

        self.register_buffer(f"{self.w13_name}_scale", unloaded(e, rows))
        self.register_buffer("down_proj_scale", unloaded(e, h))
        self.has_bias = bias
        if bias:
            self.register_buffer(f"{self.w13_name}_bias", unloaded(e, rows))
            self.register_buffer("down_proj_bias", unloaded(e, h))
        # Expert parallelism: global expert id -> local index or -1. None: all experts are local. (A buffer once
        # set, by set_expert_map; a None buffer would trip accelerate's offload_buffers.)
        self.expert_map: Optional[torch.Tensor] = None
        self.part_of = None  # a split's shard: the parallel.Split it is this rank's part of

    def set_expert_map(self, expert_map: torch.Tensor) -> None:
        """Keep only the experts ``expert_map`` (global id -> local index or -1) names local; a non-persistent
        buffer, so that ``.to()`` moves it with the experts."""
        if "expert_map" not in self._buffers:
            del self.expert_map
        self.register_buffer("expert_map", expert_map, persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """A float model's weights are refused before anything is copied: copied into the int8 tensors they would
        truncate to integers (mostly zeros) beside the old scales, and the model would run on them."""
        for name in (self.w13_name, "down_proj"):
            given = state_dict.get(prefix + name)
            if isinstance(given, torch.Tensor) and given.dtype != torch.int8:
                error_msgs.append(f"{prefix}{name}: {given.dtype} weights for int8 experts (they would be truncated "
                                  f"to integers); load them into the float model and quantize_ it, or dequantize() "
                                  f"this one first")
                return
        given = ((prefix + name, state_dict.get(prefix + name)) for name in self._buffers)  # (not the whole dict)
        other = {key: t for key, t in given
                 if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float32}
        if other:  # (assign=True would put them in as they are: scales and biases stay fp32, as _apply keeps them)
            state_dict = {**state_dict, **{key: t.float() for key, t in other.items()}}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, recurse=True):
        """``.to(dtype)``, ``.half()`` and the like move the fp32 scales and biases but keep them fp32: cast with a
        bf16 model they would lose precision, and a checkpoint saved from it would not load."""
        kept = {name: b for name, b in self._buffers.items() if b is not None and b.dtype == torch.float32}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after is not None and after.dtype != torch.float32:
                self._buffers[name] = before.to(after.device)
        for name in (self.w13_name, "down_proj"):
            weight = self._parameters.get(name)  # (None under a parametrization, whose original is its own)
            if weight is not None and weight.dtype != torch.int8:
                weight.data = weight.data.to(torch.int8)  # (.type() casts every tensor: [-127, 127] returns exactly)
        return self

    @classmethod
    def from_float(cls, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *, activation: str = "silu",
                   name: str = "experts", gate_up_proj_bias: Optional[torch.Tensor] = None,
                   down_proj_bias: Optional[torch.Tensor] = None, **kwargs) -> "Int8Experts":
        """Quantize float ``gate_up_proj [E, 2I, H]`` (or, for experts without a gate, ``up_proj [E, I, H]``)
        and ``down_proj [E, H, I]`` (same device as given); optional biases ``[E, 2I]`` (``[E, I]``) /
        ``[E, H]`` are kept in fp32."""
        if gate_up_proj.dim() != 3 or down_proj.dim() != 3:
            raise ValueError(f"{name}: expected gate_up_proj [E, 2I, H] (up_proj [E, I, H] without a gate) and "
                             f"down_proj [E, H, I], got {tuple(gate_up_proj.shape)} and {tuple(down_proj.shape)}")
        e, h, i = down_proj.shape
        if tuple(gate_up_proj.shape) not in ((e, 2 * i, h), (e, i, h)):
            raise ValueError(f"{name}: gate_up_proj {tuple(gate_up_proj.shape)} does not match down_proj "
                             f"{tuple(down_proj.shape)} (expected ({e}, {2 * i}, {h}), or ({e}, {i}, {h}) without a "
                             f"gate)")
        if (gate_up_proj_bias is None) != (down_proj_bias is None):
            raise ValueError(f"{name}: give both expert biases or neither")
        gated = is_gated(gate_up_proj, down_proj)
        with torch.device("meta"):
            module = cls(e, h, i, activation=activation, bias=gate_up_proj_bias is not None, gated=gated, **kwargs)
        q13, s13 = quantize_weights(gate_up_proj.detach(), name=f"{name}.{module.w13_name}")
        q2, s2 = quantize_weights(down_proj.detach(), name=f"{name}.down_proj")
        module.load_quantized(q13, s13, q2, s2)
        if module.has_bias:
            module.load_biases(gate_up_proj_bias, down_proj_bias)
        return module

    @property
    def w13_rows(self) -> int:
        """Rows of the first projection: 2I (gate and up), or I without a gate."""
        return (2 if self.has_gate else 1) * self.intermediate_size

    def load_biases(self, gate_up_proj_bias: torch.Tensor, down_proj_bias: torch.Tensor) -> None:
        """Install the expert biases (kept in fp32) after checking their shapes."""
        w13 = f"{self.w13_name}_bias"
        for name, t, shape in ((w13, gate_up_proj_bias, (self.num_experts, self.w13_rows)),
                               ("down_proj_bias", down_proj_bias, (self.num_experts, self.hidden_size))):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or not t.is_floating_point():
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a float {shape} tensor, got {got}")
            check_weights(t, name)
        setattr(self, w13, gate_up_proj_bias.detach().float())
        self.down_proj_bias = down_proj_bias.detach().float()

    def load_quantized(self, gate_up_proj, gate_up_proj_scale, down_proj, down_proj_scale) -> None:
        """Install already-quantized tensors (the first two: ``up_proj`` and its scale without a gate) after
        checking their shapes and dtypes."""
        e, h, i, w13 = self.num_experts, self.hidden_size, self.intermediate_size, self.w13_name
        expected = {
            w13: (gate_up_proj, (e, self.w13_rows, h), torch.int8),
            f"{w13}_scale": (gate_up_proj_scale, (e, self.w13_rows), torch.float32),
            "down_proj": (down_proj, (e, h, i), torch.int8),
            "down_proj_scale": (down_proj_scale, (e, h), torch.float32),
        }
        for name, (t, shape, dtype) in expected.items():
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"{name} must be {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
        setattr(self, w13, nn.Parameter(gate_up_proj, requires_grad=False))
        self.down_proj = nn.Parameter(down_proj, requires_grad=False)
        setattr(self, f"{w13}_scale", gate_up_proj_scale)
        self.down_proj_scale = down_proj_scale

    def tensor_names(self) -> tuple[str, ...]:
        """The state-dict names of this module's weights, scales and biases."""
        names = (self.w13_name, f"{self.w13_name}_scale", "down_proj", "down_proj_scale")
        return names + ((f"{self.w13_name}_bias", "down_proj_bias") if self.has_bias else ())

    @property
    def swiglu_options(self) -> dict:
        """The clamped SwiGLU's options given (the constructor's keywords; empty for a plain gating)."""
        options = dict(swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha,
                       limit_after_act=self.limit_after_act)
        return {k: v for k, v in options.items() if v not in (None, False)}

    def extra_repr(self) -> str:
        clamp = "".join(f", {k}={v}" for k, v in self.swiglu_options.items())
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, activation={self.activation}{clamp}, "
                f"bias={self.has_bias}{'' if self.has_gate else ', gate=False'}, int8 (W8A16)")

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """``hidden_states [T, H]``, ``top_k_index [T, k]``, ``top_k_weights [T, k]`` -> ``[T, H]``."""
        for name in (self.w13_name, "down_proj"):  # (float weights would run as float, the scales ignored)
            if getattr(self, name).dtype != torch.int8:
                raise TypeError(f"{name} of Int8Experts is {getattr(self, name).dtype}, not int8: it was replaced or "
                                f"cast; load int8 weights, or dequantize() the model for float experts")
        return int8_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def int8_experts_forward(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor, gating: Optional[dict] = None) -> torch.Tensor:
    """Experts forward for any module with ``gate_up_proj [E, 2I, H]`` (or ``up_proj [E, I, H]`` without a gate)
    and ``down_proj [E, H, I]``.

    int8 weights use ``<name>_scale`` / ``down_proj_scale``; float (bf16/fp16/fp32) weights run
    unquantized through the same kernel. This is also the function behind transformers'
    ``experts_implementation="experts_int8"``, which passes ``gating`` (``activation`` and a clamped SwiGLU's
    options) for a float module that gates in its own way; otherwise an Int8Experts' own, or the activation
    its ``act_fn`` computes.
    """
    name = w13_name(module)
    if parametrize.is_parametrized(module) and getattr(module, name).dtype == torch.int8:
        # e.g. peft's LoRA on the experts' own tensors (target_parameters): its factors cast to int8 round to
        # integers and carry no gradient, so the adapter would silently train nothing
        raise ValueError(f"the int8 experts' tensors are parametrized ({', '.join(module.parametrizations)}), e.g. "
                         f"by a LoRA adapter on them (peft's target_parameters, or target_modules='all-linear', which "
                         f"peft extends to the experts of MoE models): int8 weights and their scales take none. Put "
                         f"adapters on other layers by name (target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj'], "
                         f"dense MLPs), or dequantize() the model first")
    w13, w2 = getattr(module, name), module.down_proj
    s13 = getattr(module, f"{name}_scale", None) if w13.dtype == torch.int8 else None
    s2 = getattr(module, "down_proj_scale", None) if w2.dtype == torch.int8 else None
    if s13 is not None and s13.dtype != torch.float32:  # e.g. after model.to(torch.bfloat16)
        s13, s2 = s13.float(), s2.float()
    if gating is None:
        act = getattr(module, "activation", None)
        if act is None:  # a transformers experts class: what its own act_fn computes
            act = _activation_cached(module.act_fn)
        gating = dict(activation=act, **(module.swiglu_options if isinstance(module, Int8Experts) else {}))
    x = hidden_states
    if w13.dtype != torch.int8 and w13.dtype != x.dtype:
        w13, w2 = w13.to(x.dtype), w2.to(x.dtype)
    return fused_experts(
        x.contiguous(), w13, w2, top_k_weights, top_k_index,
        w13_scale=s13, w2_scale=s2,
        expert_map=getattr(module, "expert_map", None),
        global_num_experts=getattr(module, "global_num_experts", None),
        backend=getattr(module, "backend", "auto"),
        w13_bias=getattr(module, f"{name}_bias", None),
        w2_bias=getattr(module, "down_proj_bias", None),
        **gating,
    )
