"""Hugging Face transformers integration: int8 routed experts one argument away.

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(), ...)
    model.save_pretrained(out)                        # int8 experts + fp32 scales + quantization_config
    model = AutoModelForCausalLM.from_pretrained(out) # reloads int8 directly once experts_int8 is imported
    quantize_(model)                                  # a model already in memory
    model.dequantize()                                # back to the model's own float experts (q * scale)

How it plugs in (transformers' own mechanisms, no per-model patches):
  * :class:`ExpertsInt8Config` / :class:`ExpertsInt8HfQuantizer` are registered under the quant method
    ``"experts_int8"`` with ``register_quantization_config`` / ``register_quantizer``.
  * Every transformers 5 experts module (``@use_experts_implementation``: fused ``gate_up_proj
    [E, 2I, H]`` + ``down_proj [E, H, I]``; ``up_proj [E, I, H]`` for experts without a gate) is swapped, on
    the meta device, for
    :class:`experts_int8.layer.Int8Experts`. Routing stays with the model's own router.
  * Loading a float checkpoint: transformers' converters merge the per-expert keys on disk
    (``experts.{e}.w1.weight``, ``experts.{e}.gate_proj.weight``, ...) into the fused tensor; our
    quantize op then turns it into int8 + fp32 scales, one expert at a time on the target device.
    Expert converters run on the CPU (``force_cpu``), so device memory holds the int8 model plus
    at most one expert's float copy (and its fp32 temporaries). A checkpoint that already has fused
    float keys is quantized from that one tensor (one layer's gate_up at most). The quantizer reports
    1 byte per expert weight (``param_element_size``), so transformers' caching-allocator warm-up
    reserves the int8 size, not the checkpoint's bf16 size.
  * Saving writes the fused int8 tensors and their scales under the in-memory names
    (``...experts.gate_up_proj``, ``...experts.gate_up_proj_scale``, ...), so reloading is a plain
    key match that needs no conversion and no re-quantization: the experts' converters (merges,
    transposes, renames of whole tensors) are dropped on save and on an int8 load alike.
  * Each :class:`Int8Experts` keeps the float module it replaced on the meta device (no memory), so
    ``model.dequantize()`` rebuilds the model's own class, in the checkpoint's layout: saved, it writes the
    float checkpoint's keys again.
  * ``experts_implementation="experts_int8"`` is also registered in transformers' ``ExpertsInterface``:
    it runs any (float) experts module through our fused kernel.

Only routed experts become int8; attention, routers, shared experts, embeddings and lm_head keep the
checkpoint dtype. :data:`ARCHITECTURES` lists the supported model types with their routing options.
"""

from __future__ import annotations

import functools
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import regex  # (transformers' own dependency) for its match timeout: see _names
import torch
from torch import nn
from transformers.core_model_loading import (
    ConversionOps,
    PrefixChange,
    WeightConverter,
    WeightRenaming,
)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, _default_apply_gate, use_experts_implementation
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils import logging as hf_logging
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..checkpoint import (EXPERT_COUNT_KEYS, FLOAT_DTYPES, SAFETENSORS_DTYPES, CheckpointKeys, check_int8_checkpoint,
                          from_fused_layout, read_headers, to_fused_layout)
from ..layer import (Int8Experts, accelerate_hooks, carry_hooks, detect_activation, int8_experts_forward,
                     offloaded_by_accelerate, w13_name)
from ..parallel import ParallelExperts, PendingShard, fill_pending_shards, finish_load, loading_split
from ..quant import check_weights, dequantize_weights, quantize_rows
from ..reference import ACTIVATIONS, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, act_and_mul, clamp_of
from ..routing import SCORINGS, select_experts, sparsemixer

QUANT_METHOD = "experts_int8"
logger = hf_logging.get_logger(__name__)


# --------------------------------------------------------------------------------------------------
# The architecture table: one row per supported model type.
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """How one architecture routes tokens, in :func:`experts_int8.select_experts` terms.

    ``router``: attribute of the MoE block (the experts module's parent) that holds the router.
    ``routing(config)``: select_experts keyword options for the (text) config. (The model's own router
    picks the experts; these are for kernel calls outside transformers, and the tests check them against
    the router.)
    ``correction_bias``: dotted path, from the MoE block, of the selection-only score bias, if any.
    ``layout``: "fused" (transformers 5 experts: ``gate_up_proj [E, 2I, H]`` gate then up,
    ``down_proj [E, H, I]``), "transposed" (transformers' ``is_transposed`` experts: ``[E, H, 2I]`` gate
    then up, ``[E, I, H]``) or "gpt_oss" (``gate_up_proj [E, H, 2I]`` with gate and up columns
    interleaved, ``down_proj [E, I, H]``, expert biases, clamped SwiGLU), converted while quantizing.
    """

    router: str
    routing: Callable[[Any], dict]
    correction_bias: Optional[str] = None
    layout: str = "fused"

    def selection_bias(self, moe_block: nn.Module) -> Optional[torch.Tensor]:
        """``moe_block``'s selection-only score bias (at ``correction_bias``), None where it has none (or switched
        it off: LFM2's use_expert_bias=False)."""
        if self.correction_bias is None:
            return None
        return functools.reduce(lambda obj, name: getattr(obj, name, None), self.correction_bias.split("."), moe_block)


def _softmax_topk(renormalize: Callable[[Any], bool]):
    return lambda c: {"top_k": c.num_experts_per_tok, "renormalize": bool(renormalize(c))}


def _deepseek_v2(c) -> dict:
    opts = {"top_k": c.num_experts_per_tok, "renormalize": False,
            "routed_scaling_factor": float(c.routed_scaling_factor)}
    if getattr(c, "topk_method", "greedy") == "group_limited_greedy":
        opts.update(num_expert_group=c.n_group, topk_group=c.topk_group)
    return opts


def _deepseek_v3(c) -> dict:  # sigmoid, biased choice, groups (the _DEEPSEEK_V3 rows of ARCHITECTURES)
    return {"top_k": c.num_experts_per_tok, "scoring": "sigmoid", "renormalize": bool(c.norm_topk_prob),
            "num_expert_group": c.n_group, "topk_group": c.topk_group,
            "routed_scaling_factor": float(c.routed_scaling_factor)}


def _beam(c) -> dict:  # DeepSeek-V3's router; the MoE block applies the scaling factor after the experts
    return {k: v for k, v in _deepseek_v3(c).items() if k != "routed_scaling_factor"}


def _sigmoid_topk(c) -> dict:  # Cohere2 MoE's sigmoid form, AFMoE (with their norm_topk_prob and scaling factor)
    return {"top_k": c.num_experts_per_tok, "scoring": "sigmoid",
            "renormalize": bool(getattr(c, "norm_topk_prob", True)),
            "routed_scaling_factor": float(getattr(c, "routed_scaling_factor", 1.0))}


def _minimax_m2(c) -> dict:  # sigmoid, biased choice, always renormalized, never scaled (whatever the config says)
    return {"top_k": c.num_experts_per_tok, "scoring": "sigmoid", "renormalize": True}


def _deepseek_v4(c) -> dict:  # sqrt(softplus) scores of the logits as the router gives them, biased choice
    if c.scoring_func not in SCORINGS:
        raise ValueError(f"DeepSeek-V4 scoring_func {c.scoring_func!r} is none of select_experts' scorings {SCORINGS}")
    return {"top_k": c.num_experts_per_tok, "scoring": c.scoring_func, "renormalize": True,
            "routed_scaling_factor": float(c.routed_scaling_factor), "score_in_logits_dtype": True}


def _lfm2(c) -> dict:  # sigmoid scores in the logits' own dtype (its router does not upcast them)
    return {**_sigmoid_topk(c), "score_in_logits_dtype": True}


_ALWAYS = _softmax_topk(lambda c: True)
_NORM_TOPK_PROB = _softmax_topk(lambda c: c.norm_topk_prob)


def _two_best_groups(n_group: int, topk_group: int):
    """Groups ranked by their two best scores without a bias: select_experts ranks so with a correction bias, so
    route with a zero one."""
    def route(router_logits, top_k, renormalize):
        return select_experts(router_logits, top_k, renormalize=renormalize, num_expert_group=n_group,
                              topk_group=topk_group, correction_bias=router_logits.new_zeros(router_logits.shape[1]),
                              score_in_logits_dtype=True)

    return route


def _mistral4(c) -> dict:  # softmax scores in the logits' own dtype (not upcast), groups ranked by their two best
    opts = {**_NORM_TOPK_PROB(c), "routed_scaling_factor": float(c.routed_scaling_factor)}
    if c.n_group > 1:
        opts["custom_routing_function"] = _two_best_groups(c.n_group, c.topk_group)
    else:  # (one group: no group ranking)
        opts["score_in_logits_dtype"] = True
    return opts


def _cohere2_moe(c) -> dict:  # the top-k logits, then a softmax over them (== renormalized softmax) or sigmoids
    return _ALWAYS(c) if c.expert_selection_fn == "softmax" else _sigmoid_topk(c)


def _afmoe(c) -> dict:  # sigmoid, biased choice, always renormalized, scaled by route_scale
    return {**_sigmoid_topk(c), "renormalize": True, "routed_scaling_factor": float(c.route_scale)}


# DeepSeek-V3's router, which many architectures reuse: sigmoid scores, grouped top-k, a selection-only bias
_DEEPSEEK_V3 = Arch("gate", _deepseek_v3, correction_bias="gate.e_score_correction_bias")

ARCHITECTURES: dict[str, Arch] = {
    "mixtral": Arch("gate", _ALWAYS),
    "qwen2_moe": Arch("gate", _NORM_TOPK_PROB),
    "qwen3_moe": Arch("gate", _NORM_TOPK_PROB),
    "qwen3_next": Arch("gate", _NORM_TOPK_PROB),
    "qwen3_5_moe_text": Arch("gate", _ALWAYS),
    "qwen3_vl_moe_text": Arch("gate", _ALWAYS),  # (vision-language models: the text model's type)
    "olmoe": Arch("gate", _NORM_TOPK_PROB),
    "deepseek_v2": Arch("gate", _deepseek_v2),
    "deepseek_v3": _DEEPSEEK_V3,
    "glm4_moe": _DEEPSEEK_V3,
    "glm4_moe_lite": _DEEPSEEK_V3,
    "glm4v_moe_text": _DEEPSEEK_V3,
    "dots1": _DEEPSEEK_V3,
    "exaone_moe": _DEEPSEEK_V3,
    "kimi_linear": _DEEPSEEK_V3,
    "deepseek_v32": _DEEPSEEK_V3,
    "glm_moe_dsa": _DEEPSEEK_V3,
    "mimo_v2_flash": _DEEPSEEK_V3,
    "solar_open": _DEEPSEEK_V3,
    # (clamped SwiGLU experts: their own _apply_gate, see _gating_of)
    "hy_v4": _DEEPSEEK_V3,
    "glm5_next_text": _DEEPSEEK_V3,
    "bailing_hybrid": _DEEPSEEK_V3,
    "deepseek_v4": Arch("gate", _deepseek_v4, correction_bias="gate.e_score_correction_bias"),  # (+ hash layers)
    # (its experts gate in fp32 and cast back: the kernel's own way, see _gates_as)
    "beam": Arch("gate", _beam, correction_bias="gate.e_score_correction_bias"),
    "mistral4": Arch("gate", _mistral4),  # (Mistral Small 4: the text model of a mistral3 model)
    "afmoe": Arch("router", _afmoe, correction_bias="expert_bias"),
    "cohere2_moe": Arch("gate", _cohere2_moe),
    "flex_olmo": Arch("gate", _NORM_TOPK_PROB),
    "minimax": Arch("gate", _ALWAYS),
    "minimax_m2": Arch("gate", _minimax_m2, correction_bias="e_score_correction_bias"),
    # (M2's router in the gate; the MoE block scales after the experts; clamped SwiGLU experts)
    "minimax_m3_vl_text": Arch("gate", _minimax_m2, correction_bias="gate.e_score_correction_bias"),
    "step3p5": Arch("gate", _minimax_m2, correction_bias="gate.e_score_correction_bias"),  # (Step-3.7's text model)
    "lfm2_moe": Arch("gate", _lfm2, correction_bias="expert_bias"),  # (when use_expert_bias)
    # softmax scores, a biased choice (its "moe_statics"), renormalized
    "ernie4_5_moe": Arch("gate", _ALWAYS, correction_bias="gate.moe_statics.e_score_correction_bias"),
    "hunyuan_v1_moe": Arch("gate", _ALWAYS),
    "jamba": Arch("router", _softmax_topk(lambda c: False)),
    # softmax over the top-k logits == softmax over all, renormalized over the top k
    "granitemoe": Arch("router", _ALWAYS),
    "granitemoehybrid": Arch("router", _ALWAYS),
    "granitemoeshared": Arch("router", _ALWAYS),
    "phimoe": Arch("router", lambda c: {"top_k": c.num_experts_per_tok, "renormalize": False,
                                        "custom_routing_function": sparsemixer(c.router_jitter_noise)}),
    "nemotron_h": _DEEPSEEK_V3,  # (no gate: relu2(up))
    "gpt_oss": Arch("router", _ALWAYS, layout="gpt_oss"),
    "aria_text": Arch("router", lambda c: {"top_k": c.moe_topk, "renormalize": True}, layout="transposed"),
}


def _layout_of(model: nn.Module) -> str:
    """The architecture's experts layout; outside the table, what the experts modules' flags say."""
    arch = ARCHITECTURES.get(_model_type(model))
    if arch is not None:
        return arch.layout
    transposed = any(getattr(m, "is_transposed", False) for _, m in find_experts(model))
    return "transposed" if transposed else "fused"


def remote_code_message(config: dict) -> str:
    return (f"model_type {config.get('model_type')!r} is the checkpoint's own code (auto_map), which experts-int8 "
            f"does not run: set config.json's model_type to the transformers architecture it follows (e.g. "
            f"deepseek_v3 for kimi_k2)")


def _meta_model(model_dir, config: dict) -> nn.Module:
    """The model in ``model_dir`` (``config``: its ``config.json``) built on the meta device: nothing allocated."""
    from transformers import AutoConfig

    from ..run import auto_model_class

    try:
        hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)  # (never a prompt on stdin)
    except (KeyError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise ValueError(remote_code_message(config)) from None
        raise ValueError(f"transformers cannot build model_type {config.get('model_type')!r}: {e}") from None
    with torch.device("meta"):
        return auto_model_class(config).from_config(hf_config)


def experts_module_names(model_dir, config: dict) -> list[str]:
    """The names of the routed experts modules of the model transformers builds for ``model_dir`` (on the meta
    device): the names ``modules_to_not_convert`` is matched against when the model loads."""
    return [name for name, _ in find_experts(_meta_model(model_dir, config))]


def dense_linear_names(model_dir, config: dict) -> list[str]:
    """The names, in the model transformers builds for ``model_dir`` (on the meta device), of the modules outside its
    routed experts that a compressed-tensors ``"Linear"`` target matches (a class named Linear in their MRO).
    transformers renames some modules on load (PhiMoE's ``block_sparse_moe.gate`` is ``mlp.router``, NemotronH's
    ``backbone`` is ``model``), and its compressed-tensors load matches the ignore list against these names."""
    model = _meta_model(model_dir, config)
    experts = tuple(name + "." for name, _ in find_experts(model))
    return sorted(name for name, m in model.named_modules()
                  if name and not name.startswith(experts) and any(c.__name__ == "Linear" for c in type(m).__mro__))


def experts_form(model_dir, config: dict) -> dict:
    """The form of the routed experts of the model in ``model_dir``, read from its modules on the meta device:
    ``gated`` (False: ``up_proj`` only), the kernel's ``activation``, whether they have ``biases``, and ``clamp``:
    a clamped SwiGLU's options (``swiglu_limit``...; those of its first clamped layer where layers differ, as
    Step-3.7's do; empty for none)."""
    model = _meta_model(model_dir, config)
    experts = [m for _, m in find_experts(model)]
    if not experts:
        raise ValueError("the model has no routed experts transformers' standard modules hold")
    layout = _layout_of(model)
    gatings = [_gating_of(m, layout) for m in experts]
    clamp = next(({k: v for k, v in g.items() if k != "activation"} for g in gatings if len(g) > 1), {})
    return dict(gated=all(getattr(m, "has_gate", True) for m in experts), activation=gatings[0]["activation"],
                biases=any(name.endswith("bias") for m in experts for name, _ in m.named_parameters(recurse=False)),
                clamp=clamp)


def layout_from_config(model_dir, config: dict) -> Optional[str]:
    """The experts layout of the model in ``model_dir`` (``config``: its ``config.json``), read from its modules
    built on the meta device (nothing allocated); raises ValueError where loading with ExpertsInt8Config would
    refuse them. None: the config builds a dense model (no experts modules, no expert count)."""
    model = _meta_model(model_dir, config)
    if not find_experts(model) and not _declared_experts(model):
        return None
    _plan(model, ExpertsInt8Config())  # (standard experts with an activation the kernel has, or raises)
    return _layout_of(model)


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"expected a transformers PreTrainedModel (with .config), got {type(model).__name__}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "model_type", None) or getattr(config, "model_type", None)


def routing_options(model: nn.Module, moe_block: Optional[nn.Module] = None) -> dict:
    """select_experts options of ``model``'s architecture (+ the correction bias of ``moe_block``)."""
    arch = _arch(model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    opts = arch.routing(config)
    if moe_block is None:
        return opts
    router = getattr(moe_block, arch.router)
    if hasattr(router, "tid2eid"):
        raise ValueError(f"{type(router).__name__} is hash-routed: its experts come from the token ids "
                         f"(tid2eid[input_ids]), not from router logits, so select_experts cannot choose them")
    top_k = getattr(router, "top_k", None)
    if isinstance(top_k, int):  # per-layer top-k (Hunyuan's moe_topk may be a list)
        opts["top_k"] = top_k
    bias = arch.selection_bias(moe_block)
    if bias is not None:
        opts["correction_bias"] = bias.reshape(-1)
    return opts


def _arch(model: nn.Module) -> Arch:
    model_type = _model_type(model)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"experts_int8 has no routing row for model_type {model_type!r} (tested: {sorted(ARCHITECTURES)}). "
            f"Adding one is a row in experts_int8.integrations.transformers.ARCHITECTURES."
        )
    return ARCHITECTURES[model_type]


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------
class ExpertsInt8Config(QuantizationConfigMixin):
    """W8A16 for the routed experts of an MoE model: per-expert, per-output-row symmetric int8.

    Args:
        modules_to_not_convert: module names, name fragments at module boundaries (``"layers.1"`` names
            ``model.layers.1.mlp.experts``, not ``layers.11``) or regular expressions thereof
            (``"layers[.](0|1)[.]"``) whose experts stay in the checkpoint dtype. Non-expert modules are never
            converted anyway; an entry that names no experts module is warned about.
        allow_no_experts: when the model has no MoE experts, warn and leave it unchanged instead of
            raising (an MoE whose experts are modules of its own is refused all the same).
    """

    def __init__(self, modules_to_not_convert: Optional[list[str]] = None, allow_no_experts: bool = False,
                 **kwargs):
        self.quant_method = QUANT_METHOD
        self.bits = 8
        self.scheme = "symmetric_per_row"
        if modules_to_not_convert is not None:
            modules_to_not_convert = list(_patterns(modules_to_not_convert))
        self.modules_to_not_convert = modules_to_not_convert
        if not isinstance(allow_no_experts, bool):
            raise TypeError(f"allow_no_experts must be a bool, got {allow_no_experts!r}")
        self.allow_no_experts = allow_no_experts
        method = kwargs.pop("quant_method", QUANT_METHOD)
        if method != QUANT_METHOD:
            raise ValueError(f"quant_method {method!r} is another method's config; ExpertsInt8Config is "
                             f"{QUANT_METHOD!r}")
        for key, expected in (("bits", 8), ("scheme", "symmetric_per_row")):
            if key in kwargs and kwargs.pop(key) != expected:
                raise ValueError(f"ExpertsInt8Config only supports {key}={expected!r}")
        if kwargs:
            raise TypeError(f"ExpertsInt8Config got unexpected arguments: {sorted(kwargs)}")

    def skips(self, module_name: str) -> bool:
        # (checked again: transformers' update() and plain assignment set attributes past __init__)
        return any(_names(m, module_name) for m in _patterns(self.modules_to_not_convert or ()))


def _patterns(modules_to_not_convert) -> tuple[str, ...]:
    """``modules_to_not_convert`` checked: a list of str, each a valid regular expression."""
    if isinstance(modules_to_not_convert, str) or not isinstance(modules_to_not_convert, (list, tuple, set)) or not all(
            isinstance(m, str) for m in modules_to_not_convert):
        raise TypeError(f"modules_to_not_convert must be a list of str, got {modules_to_not_convert!r}")
    for m in modules_to_not_convert:
        try:
            regex.compile(m)  # (the engine _names matches with)
        except regex.error as exc:
            raise ValueError(f"modules_to_not_convert entry {m!r} is not a valid pattern ({exc})") from None
    return tuple(modules_to_not_convert)


# A config's patterns come with checkpoints the user did not write: one of nested repetition, matched by Python's
# re, stalled a load for hours (the time grows exponentially with the name's length); regex has a time limit
MATCH_TIMEOUT_S = 1.0


def _names(pattern: str, module_name: str) -> bool:
    """Whether ``pattern`` (a name, a fragment or a regex) occurs in ``module_name`` at module boundaries: it starts
    the name or follows a dot (or starts with one), and ends it or is followed by a dot (or ends with one)."""
    if not pattern:
        return False
    try:
        return regex.search(rf"(?:^|(?<=\.)|(?=\.))(?:{pattern})(?:(?<=\.)|(?=\.|$))", module_name,
                            timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        raise ValueError(f"modules_to_not_convert entry {pattern!r} took over {MATCH_TIMEOUT_S:g} s to match the "
                         f"module name {module_name!r} (a pattern of nested repetition); use module names or a "
                         f"simpler pattern, and check where the config came from") from None


def _follow_checkpoint(model: nn.Module, config: ExpertsInt8Config, headers: dict) -> None:
    """Let an int8 checkpoint's tensors decide which experts it keeps float where the two rules experts_int8 has
    read ``modules_to_not_convert`` by disagree: before 398edb9 an entry named every module whose name holds it
    as plain text (``"layers.1"`` took layers 10-19 too, ``"layers.1."`` only layer 1); since, at module
    boundaries as a regex (``"layers.1"`` is layer 1 alone, ``"layers.1."`` takes layers 10-19 too). A module the
    rules disagree on follows its stored ``down_proj``: int8 (with its scales) or float. The config then names
    exactly the modules kept float, so the model and a save of it read the same under the current rule."""
    patterns = [m for m in config.modules_to_not_convert or () if m]
    if not patterns or not headers:
        return
    keys = CheckpointKeys(headers)
    kept, changed = [], []
    for name, _ in find_experts(model):
        skip = config.skips(name)
        if skip != any(m in name for m in patterns):  # the rules disagree: the stored tensors decide
            key = keys.find(f"{name}.down_proj")
            dtype = headers[key][0] if key is not None else None
            if dtype == SAFETENSORS_DTYPES[torch.int8] or dtype in FLOAT_DTYPES:
                stored_float = dtype in FLOAT_DTYPES
                if stored_float != skip:
                    changed.append(f"{name} ({'float' if stored_float else 'int8'})")
                    skip = stored_float
        if skip:
            kept.append(name)
    if changed:
        logger.warning(f"experts_int8: this checkpoint's modules_to_not_convert {patterns} was written under the "
                       f"plain-text matching of earlier versions; its tensors decide {', '.join(changed)}. Read "
                       f"as the modules it keeps float: {kept}")
        config.modules_to_not_convert = [re.escape(name) for name in kept] or None


# --------------------------------------------------------------------------------------------------
# Finding and replacing experts modules
# --------------------------------------------------------------------------------------------------
def _is_experts_module(module: nn.Module) -> bool:
    """A transformers 5 fused experts module (``up_proj`` in place of ``gate_up_proj`` without a gate), or ours."""
    if isinstance(module, Int8Experts):
        return True
    w13, w2 = getattr(module, w13_name(module), None), getattr(module, "down_proj", None)
    return isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor) and w13.dim() == 3 and w2.dim() == 3


def find_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every routed-experts module of ``model`` (float or already int8)."""
    return [(name, m) for name, m in model.named_modules() if _is_experts_module(m)]


@functools.cache
def _dispatching_forward():
    """The code of the forward ``@use_experts_implementation`` gives a class: a call of the configured experts
    function, which computes the experts alone (the one the int8 module replaces)."""
    probe = use_experts_implementation(type("_Probe", (nn.Module,), {"forward": lambda self, *args: None}))
    return probe.forward.__code__


def _check_layout(name: str, module: nn.Module, layout: str = "fused") -> None:
    if getattr(type(module).forward, "__code__", None) is not _dispatching_forward():
        # a subclass's own forward around the standard experts (a per-expert norm, say) would be dropped
        raise ValueError(f"{name}: {type(module).__name__} replaces the forward of transformers' standard experts "
                         f"module with its own, which the int8 module (the experts alone) would drop")
    if layout == "gpt_oss":
        e, h, two_i = module.gate_up_proj.shape
        ok = (two_i % 2 == 0 and tuple(module.down_proj.shape) == (e, two_i // 2, h)
              and getattr(module, "gate_up_proj_bias", None) is not None
              and getattr(module, "down_proj_bias", None) is not None)
        if not ok:
            raise ValueError(f"{name}: expected GPT-OSS experts gate_up_proj [E, H, 2I], down_proj [E, I, H] "
                             f"and both biases, got {tuple(module.gate_up_proj.shape)} and "
                             f"{tuple(module.down_proj.shape)}")
        swiglu = (getattr(module, "alpha", SWIGLU_OAI_ALPHA), getattr(module, "limit", SWIGLU_OAI_LIMIT))
        if swiglu != (SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT):
            raise ValueError(f"{name}: the kernel's clamped SwiGLU has alpha={SWIGLU_OAI_ALPHA}, "
                             f"limit={SWIGLU_OAI_LIMIT}; this model uses alpha={swiglu[0]}, limit={swiglu[1]}")
        return
    _check_flags(name, module, layout)
    _gating_of(module, layout, name)  # (raises for a gating or an activation the kernel lacks)


def _check_flags(name: str, module: nn.Module, layout: str) -> None:
    """A transformers standard experts module computes act(gate) * up (act(up) without a gate) with our weights
    in ``layout``."""
    bad = [f"{flag}={getattr(module, flag)}" for flag, ok in
           (("is_transposed", layout == "transposed"), ("has_bias", False), ("is_concatenated", True))
           if getattr(module, flag, ok) != ok]
    if getattr(module, "has_post_expert_norm", False):
        bad.append("has_post_expert_norm=True")
    if bad:
        rows = "2I" if getattr(module, "has_gate", True) else "I"
        shapes = (f"[E, H, {rows}] and down_proj [E, I, H]" if layout == "transposed"
                  else f"[E, {rows}, H] and down_proj [E, H, I]")
        raise ValueError(f"{name}: experts layout not supported by experts_int8 ({', '.join(bad)}); expected "
                         f"{w13_name(module)} {shapes} without bias")


def _gating_of(module: nn.Module, layout: str, name: str = "experts") -> dict:
    """The Int8Experts options (``activation``, and a clamped SwiGLU's ``swiglu_limit``, ``swiglu_alpha``,
    ``limit_after_act``) that compute what ``module`` computes: its ``act_fn``'s activation, or, where its class
    gates with its own ``_apply_gate``, the kernel's form that gives the same values (its limit read from the
    module's ``limit`` / ``swiglu_limit``, checked by evaluating the gate). Raises for any other gating."""
    if layout == "gpt_oss":
        return dict(activation="swiglu_oai")
    gate = getattr(type(module), "_apply_gate", _default_apply_gate)
    if gate is _default_apply_gate:
        return dict(activation=_activation_of(module, layout, name))
    if not hasattr(module, "is_concatenated"):  # (only the standard forward is known to compute down(gate(x)) * w)
        raise ValueError(f"{name}: {type(module).__name__} computes its own gating (_apply_gate) in a forward of its "
                         f"own, not transformers' standard experts module's; upgrade transformers")
    for options in _gating_candidates(module):
        if _gates_as(module, gate, options):
            return options
    raise ValueError(f"{name}: {type(module).__name__} computes its own gating (_apply_gate), none of the kernel's: "
                     f"act(gate) * up, or a clamped SwiGLU whose limit the module holds as `limit` or `swiglu_limit`")


_LIMITS, _SLOPES = ("limit", "swiglu_limit"), ("swiglu_alpha", "alpha")  # (a clamped SwiGLU's numbers on its module)


def _gating_candidates(module: nn.Module):
    """The kernel's gatings a module with its own ``_apply_gate`` may compute: its act_fn's activation (any, without
    one) plain or clamped at the module's limit (before or after the activation), and swiglu_oai at its limit and
    slope."""
    try:
        activations = [detect_activation(module.act_fn)]
    except (AttributeError, ValueError):  # (HY-V4's and GLM-5-Next's gates call silu themselves)
        activations = [a for a in ACTIVATIONS if a != "swiglu_oai"]
    limits = _module_numbers(module, *_LIMITS)
    for activation in activations:
        yield dict(activation=activation)
        for limit in limits:
            yield dict(activation=activation, swiglu_limit=limit)
            yield dict(activation=activation, swiglu_limit=limit, limit_after_act=True)
    for limit in limits:
        for alpha in _module_numbers(module, *_SLOPES) or [SWIGLU_OAI_ALPHA]:
            yield dict(activation="swiglu_oai", swiglu_limit=limit, swiglu_alpha=alpha)


def _module_numbers(module: nn.Module, *names: str) -> list[float]:
    """The positive finite numbers ``module`` holds as attributes ``names`` (its limits, its slope), sorted, once
    each (an infinite limit is no clamp)."""
    values = (getattr(module, n, None) for n in names)
    return sorted({float(v) for v in values
                   if isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v < float("inf")})


@torch.no_grad()
def _gates_as(module: nn.Module, gate: Callable, options: dict) -> bool:
    """Whether ``module``'s own ``gate`` computes the kernel's gating ``options`` (see :func:`_gating_of`), judged on
    fp32 values from 1e-3 to 1e4 in size, and around twice each limit the module holds (a clamp at a limit the
    probe never crossed would not show): a gating that only computes in fp32 and casts back (the kernel's
    activation is fp32 too) agrees; a clamp, an offset or a scale of its own shows."""
    # (fp32 on the CPU by name: transformers builds the model under a meta device and its dtype as the default)
    where = dict(device="cpu", dtype=torch.float32)
    limits = _module_numbers(module, *_LIMITS)
    scales = torch.cat([torch.logspace(-3, 4, 8, **where), 2 * torch.tensor(limits, **where)])
    probe = torch.randn(len(scales), 64, generator=torch.Generator().manual_seed(0), **where)
    probe *= scales[:, None]
    options = dict(options)
    activation = options.pop("activation")
    try:
        theirs = gate(module, probe)
    except Exception:  # (a gating that reads tensors of its own, on the meta device while loading, say)
        return False
    ours = act_and_mul(probe, activation, clamp_of(activation, **options))
    # (equal up to the order of the gate's own fp32 operations)
    return theirs.shape == ours.shape and torch.allclose(theirs, ours, rtol=1e-6, atol=0.0)


class NoExpertsError(ValueError):
    """The model has no routed-experts modules to quantize."""


class TensorMismatchError(ValueError):
    """A loaded experts tensor has another shape or dtype than the model's config describes."""


def _plan(model: nn.Module, config: ExpertsInt8Config) -> Optional[list[tuple[str, nn.Module]]]:
    """The float experts modules to convert. None: nothing to do (no experts and allowed)."""
    found = find_experts(model)
    experts = [(n, m) for n, m in found if not isinstance(m, Int8Experts)]
    if not found:
        declared = _declared_experts(model)
        if declared:  # an MoE all the same: its experts are modules of its own (DBRX, JetMoE, Switch)
            raise ValueError(f"experts_int8 does not support model_type {_model_type(model)!r}: its config declares "
                             f"{declared} routed experts, but none is a transformers standard experts module (fused "
                             f"gate_up_proj [E, 2I, H] + down_proj [E, H, I]); supported: {sorted(ARCHITECTURES)}")
        msg = (f"{type(model).__name__} has no MoE experts modules (fused gate_up_proj [E, 2I, H] + "
               f"down_proj [E, H, I]); experts_int8 only quantizes routed experts")
        if config.allow_no_experts:
            logger.warning(msg + "; leaving the model unchanged (allow_no_experts=True)")
            return None
        raise NoExpertsError(msg + ". Pass ExpertsInt8Config(allow_no_experts=True) to load it unchanged.")
    model_type = _model_type(model)
    if model_type not in ARCHITECTURES:
        # transformers' standard experts modules (@use_experts_implementation) all compute the same thing,
        # which its own grouped_mm path relies on: quantize those, with a warning; refuse anything else.
        custom = [name for name, module in experts if not hasattr(module, "is_concatenated")]
        if custom:
            raise ValueError(f"experts_int8 does not support model_type {model_type!r}: {custom[0]} is not a "
                             f"transformers standard experts module; supported: {sorted(ARCHITECTURES)}. Adding one "
                             f"is a row in experts_int8.integrations.transformers.ARCHITECTURES.")
    names = [name for name, _ in found]
    unused = [m for m in config.modules_to_not_convert or () if not any(_names(m, name) for name in names)]
    if unused:
        logger.warning(f"experts_int8: modules_to_not_convert {unused} name no routed experts module (e.g. "
                       f"{names[0]}); they change nothing")
    layout = _layout_of(model)
    todo = []
    for name, module in experts:
        if config.skips(name):
            continue
        try:
            _check_layout(name, module, layout)
        except ValueError as e:  # the model type first: what a user searches for and reports
            raise ValueError(f"experts_int8 cannot quantize this {model_type!r} model: {e}") from None
        todo.append((name, module))
    if model_type not in ARCHITECTURES:
        logger.warning(f"experts_int8: model_type {model_type!r} is not one of the tested architectures; its experts "
                       f"are transformers' standard ones, so they are quantized. Check the quality with "
                       f"experts_int8.evaluate.routing_quality (float model, int8 model, input ids).")
    return todo


def _declared_experts(model: nn.Module) -> Optional[str]:
    """``key=count`` of the routed experts ``model``'s config declares, where none of its experts modules is a
    standard one; None for a dense model, and for a tested type, whose experts are standard: none found, its
    config makes every layer dense (a one-layer Jamba's first experts layer is layer 1)."""
    return None if _model_type(model) in ARCHITECTURES else _expert_count(model.config.to_dict())


def _expert_count(config: dict) -> Optional[str]:
    """``key=count`` of the first routed-experts count above one that ``config`` (a config's dict) or one of its
    sub-configs sets; None for a dense model (Doge's config names 16384 experts it uses only with is_moe)."""
    if config.get("is_moe") is False:
        return None
    for key, value in config.items():
        if key in EXPERT_COUNT_KEYS and type(value) is int and value > 1:
            return f"{key}={value}"
        found = _expert_count(value) if isinstance(value, dict) else None
        if found:
            return found
    return None


def _activation_of(module: nn.Module, layout: str, name: str = "experts") -> str:
    """The kernel's name for the activation ``module``'s own ``act_fn`` computes (:func:`_gating_of` for its
    gating as a whole)."""
    if layout == "gpt_oss":
        return "swiglu_oai"
    try:
        return detect_activation(module.act_fn)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _int8_param_names(model: nn.Module) -> set[str]:
    return {f"{n}.{t}" for n, m in model.named_modules() if isinstance(m, Int8Experts) for t in m.tensor_names()[:4]}


def _is_expert_converter(conversion, int8_names: set[str]) -> bool:
    """A merge of per-expert tensors into an experts tensor (WeightConverter), or a rename of a whole
    experts tensor (Granite's ``input_linear.weight`` -> ``experts.gate_up_proj``). A rename of a module
    (Mixtral's ``block_sparse_moe`` -> ``mlp``) is neither: it applies to every key under it."""
    if not isinstance(conversion, (WeightConverter, WeightRenaming)):
        return False
    whole = isinstance(conversion, WeightRenaming)
    targets = getattr(conversion, "target_patterns", None) or []
    targets = [targets] if isinstance(targets, str) else targets
    for target in targets:
        plain = re.sub(r"[\^\$\\]", "", target)
        if plain and any(name.endswith(plain) if whole else plain in name for name in int8_names):
            return True
    return False


def _drop_expert_converters(model: nn.Module) -> None:
    """Make save_pretrained write our fused int8 tensors as they are (no split into per-expert keys)."""
    int8_names = _int8_param_names(model)
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping

            conversions = get_model_conversion_mapping(model, add_legacy=False)
        except Exception:  # noqa: BLE001 -- no mapping for this model: nothing to revert on save
            conversions = []
        # Same as transformers for models not built by from_pretrained: no prefix changes on save.
        conversions = [c for c in conversions if not isinstance(c, PrefixChange)]
    kept = [c for c in conversions if not _is_expert_converter(c, int8_names)]
    # (dequantize puts them back: the float experts save under the checkpoint's per-expert keys again)
    model._experts_int8_converters = [c for c in conversions if c not in kept]
    model._weight_conversions = kept


# --------------------------------------------------------------------------------------------------
# Quantization during loading
# --------------------------------------------------------------------------------------------------
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # device_map values accelerate resolves


def _refuse_disk(device_map, experts) -> None:
    """Refuse a device map that offloads any of the routed ``experts`` (module names) to disk, before the weights
    are read (accelerate would write the int8 tensors cast to the float placeholders' dtype)."""
    on_disk = [name for name in experts if _placed(device_map, name) == "disk"]
    if on_disk:
        raise ValueError(f"the device map offloads {on_disk[0]} to disk, which experts_int8 does not support: "
                         f"give the routed experts a GPU or the CPU (for device_map='auto', raise max_memory)")


def _refuse_split_offload(device_map, experts) -> None:
    """Refuse, under split_while_loading without a device of its own, a device map that puts any of the routed
    ``experts`` on the CPU beside accelerator entries: accelerate offloads such a layer (its tensors on the meta
    device, brought to the main GPU for each forward) when it dispatches the model, before the split parts are read;
    they would then stay on the CPU, hookless, and the first forward would hand them GPU hidden states."""
    loading = loading_split()
    if loading is None or loading.device is not None or not isinstance(device_map, dict):
        return
    gpus = sorted({str(d) for d in device_map.values() if str(d) not in ("cpu", "disk")})
    on_cpu = [name for name in experts if str(_placed(device_map, name)) == "cpu"]
    if gpus and on_cpu:
        raise ValueError(f"split_while_loading: the device map offloads {on_cpu[0]} to the CPU while the model runs "
                         f"on {gpus[0]}; accelerate's offload does not reach the experts' parts, which are read after "
                         f"it dispatches the model. Map the routed experts to this rank's GPU (for "
                         f"device_map='auto', raise its max_memory), or give split_while_loading(device=...) that GPU")


def _placed(device_map, name: str):
    """The device map's entry for ``name``: a dict's longest matching prefix, else the map itself."""
    if not isinstance(device_map, dict):
        return device_map
    best, best_len = None, -1
    for prefix, dev in device_map.items():
        if (prefix == "" or name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
            best, best_len = dev, len(prefix)
    return best


def _device_for(device_map, name: str) -> Optional[torch.device]:
    """Where transformers will place ``name`` (None: leave the tensor where it is)."""
    device_map = _placed(device_map, name)
    if device_map is None:
        return None
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    if isinstance(device_map, str) and device_map in _STRATEGIES:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device_map, str) and device_map == "disk":
        return torch.device("cpu")
    try:
        return torch.device(device_map)
    except (TypeError, RuntimeError):
        return None


def _source_key(full_name: str, sources, targets, expert: int, rows: str) -> str:
    """Best-effort checkpoint key of one expert's part of a merged tensor (for error messages)."""
    sources = [re.sub(r"[\^\$\\]", "", s) for s in (sources or [])]
    targets = [re.sub(r"[\^\$\\]", "", t) for t in (targets or [])]
    if not sources or not targets:
        return f"{full_name}[expert {expert}]"
    prefix = full_name.split(targets[0])[0] if targets[0] in full_name else ""
    if len(sources) == 2 and rows in ("gate", "up"):
        src = sources[0] if rows == "gate" else sources[1]
    else:
        src = sources[0]
    return prefix + src.replace("*", str(expert))


def _stale_single_file(files) -> str:
    """A note for a failed int8 load whose one file is a model.safetensors beside a shards' index: transformers reads
    model.safetensors first, and save_pretrained with shards leaves an earlier unsharded save's file in the folder."""
    files = [str(f) for f in files or ()]
    if len(files) != 1 or os.path.basename(files[0]) != "model.safetensors":
        return ""
    index = os.path.join(os.path.dirname(files[0]), "model.safetensors.index.json")
    if not os.path.isfile(index):
        return ""
    return (f"\n  transformers read {files[0]}, not the shards {os.path.basename(index)} beside it names: a "
            f"model.safetensors left by an earlier save_pretrained into this folder (a sharded save keeps it)? "
            f"Delete whichever of the two is stale")


class Int8Quantize(ConversionOps):
    """Loading op: a fused float experts tensor ``[E, N, K]`` -> int8 + ``<name>_scale`` fp32 ``[E, N]``."""

    def __init__(self, hf_quantizer: "ExpertsInt8HfQuantizer"):
        self.hf_quantizer = hf_quantizer

    def convert(self, input_dict, source_patterns=None, target_patterns=None, **kwargs):
        out = {}
        for key, value in input_dict.items():
            tensor = value[0] if isinstance(value, (list, tuple)) else value
            if key.endswith("_bias"):  # expert biases: our layout, fp32, not quantized
                device = _device_for(self.hf_quantizer._device_map, key) or tensor.device
                out[key] = to_fused_layout(self.hf_quantizer._layout, key.rpartition(".")[2],
                                           tensor).float().to(device).contiguous()
                self.hf_quantizer._quantized.add(key)
                continue
            try:
                q, s = self._quantize(key, tensor, source_patterns, target_patterns)
            except ValueError as e:
                # transformers would log this and only say "see the report": record it, fill a placeholder,
                # and fail the whole load with this message in _process_model_after_weight_loading.
                self.hf_quantizer._errors.append(str(e))
                e_, n, k = tensor.shape if tensor.dim() == 3 else (0, 0, 0)
                q = torch.zeros((e_, n, k), dtype=torch.int8)
                s = torch.ones((e_, n), dtype=torch.float32)
            out[key] = q
            out[key + "_scale"] = s
            self.hf_quantizer._quantized.add(key)
        return out

    def _quantize(self, key, w, sources, targets):
        if w.dim() != 3 or not w.is_floating_point():
            raise ValueError(f"{key}: expected a float [E, N, K] experts tensor, got {w.dtype} {tuple(w.shape)}")
        device = _device_for(self.hf_quantizer._device_map, key) or w.device
        layout, tensor = self.hf_quantizer._layout, key.rpartition(".")[2]
        e = w.shape[0]
        n, k = to_fused_layout(layout, tensor, torch.empty(w.shape[1:], device="meta")).shape
        q = torch.empty((e, n, k), dtype=torch.int8, device=device)
        scale = torch.empty((e, n), dtype=torch.float32, device=device)
        is_gate_up = key.endswith("gate_up_proj")
        half = "up" if key.endswith("up_proj") else "down"  # (gate_up_proj: whichever half is not finite)
        for i in range(e):
            # Always a copy: on the GPU this is the one float expert on the device at a time (and on
            # the CPU the tests can count it, instead of seeing a view of the merged host tensor).
            wi = to_fused_layout(layout, tensor, w[i].to(device, copy=True)).contiguous()
            try:  # (quantize_rows looks at the values only where a row's extremes are not finite: no pass here)
                q[i], scale[i] = quantize_rows(wi, f"{key}[expert {i}]")
            except ValueError:
                if torch.isfinite(wi).all():  # (float64 past float32's range: quantize_rows' own message)
                    raise
                if is_gate_up:
                    half = "gate" if not torch.isfinite(wi[: n // 2]).all() else "up"
                name = _source_key(key, sources, targets, i, half)
                raise ValueError(f"checkpoint tensor {name} (-> {key}, expert {i}) contains NaN or Inf; "
                                 f"int8 quantization needs finite weights") from None
            del wi
        return q, scale


# --------------------------------------------------------------------------------------------------
# The HfQuantizer
# --------------------------------------------------------------------------------------------------
class ExpertsInt8HfQuantizer(HfQuantizer):
    """transformers quantizer for ``quant_method="experts_int8"``."""

    requires_calibration = False

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._device_map = None
        self._errors: list[str] = []
        self._quantized: set[str] = set()
        self._targets: set[str] = set()  # full names of the int8 weights (and expert biases) to fill
        self._layout = "fused"  # the architecture's experts layout in the checkpoint (Arch.layout)
        self._loading = None  # the parallel.Loading of a split_while_loading around this load
        self.split = None  # the parallel.Split the model's experts are parts of, once split
        self._files: list = []
        self._float_dtypes: dict[str, torch.dtype] = {}  # pre-quantized loads: each float tensor's dtype in the model

    @property
    def quantized_element_size(self) -> float:
        return 1

    def param_element_size(self, model, param_name: str, param: torch.Tensor) -> float:
        """Bytes per element the loaded ``param_name`` will take: 1 for the experts we quantize.

        transformers sizes its caching-allocator warm-up (``caching_allocator_warmup``: one
        ``torch.empty`` of the whole model's size on each accelerator, before any weight is read) and
        its ``device_map="auto"`` placement with this. The expert placeholders on the meta device are
        in the checkpoint's float dtype (see ``_process_model_before_weight_loading``), so without this
        the warm-up alone allocates the full bf16 model on the device (measured on an H200 with
        transformers 5.17: peak 3.40 GiB = the bf16 model, for a 1.90 GiB int8 model). transformers
        5.24's default derives this from ``quantized_element_size``; 5.17's ignores it.
        """
        if self.param_needs_quantization(model, param_name):
            # int8 weights (the fp32 scales are their own, already fp32, buffers); biases become fp32
            return 4 if param_name.endswith("_bias") else 1
        return param.element_size()

    def validate_environment(self, *args, **kwargs):
        loading = loading_split()
        if loading is not None:  # a load starts: its exchange of shapes lies ahead (split_while_loading's exit)
            loading.owes_exchange, loading.exchange_on = True, None
        self._device_map = kwargs.get("device_map", self._device_map)
        _refuse_disk(self._device_map, getattr(self, "_experts", ()))  # ("auto" resolved: called again with the map)
        _refuse_split_offload(self._device_map, getattr(self, "_experts", ()))
        if (loading is not None and loading.device is None and loading.split.world_size > 1
                and self._device_map in _STRATEGIES and torch.cuda.device_count() > 1):
            # every rank would place its model over the same GPUs (its parts of the experts included)
            raise ValueError(f"split_while_loading over {loading.split.world_size} ranks: device_map="
                             f"{self._device_map!r} spreads each rank's model over all {torch.cuda.device_count()} "
                             f"visible GPUs. Give each rank its own: device_map=f'cuda:{{rank}}', or "
                             f"split_while_loading(device=...)")

    def update_device_map(self, device_map):
        self._device_map = device_map
        return device_map

    def _process_model_before_weight_loading(self, model, device_map=None, checkpoint_files=None, **kwargs):
        if device_map is not None:
            self._device_map = device_map
        headers = read_headers(checkpoint_files) if self.pre_quantized and checkpoint_files else None
        if headers:
            _follow_checkpoint(model, self.quantization_config, headers)
        todo = _plan(model, self.quantization_config)
        if todo is None:
            return model
        self._experts = [name for name, _ in todo]
        _refuse_disk(self._device_map, self._experts)
        _refuse_split_offload(self._device_map, self._experts)
        dist_config = getattr(model.config, "distributed_config", None)
        if (getattr(dist_config, "ep_size", None) or 1) > 1 or getattr(dist_config, "enable_expert_parallel", False):
            raise ValueError("transformers' expert parallelism (distributed_config's ep_size / enable_expert_parallel) "
                             "does not split int8 experts; split them with experts_int8.parallel instead "
                             "(split_while_loading or parallelize_experts, mode 'ep' or 'tp')")
        self._layout = _layout_of(model)
        biased = self._layout == "gpt_oss"
        self._loading = loading_split()
        if self._loading is not None and not self.pre_quantized:
            raise ValueError("split_while_loading reads experts_int8 (int8) checkpoints; this one is float. Quantize "
                             "it once (experts-int8 quantize), or load it whole and call parallelize_experts")
        expected = {}  # the saved int8 tensors' safetensors dtype and shape (pre-quantized checkpoints)
        for name, module in todo:
            w13, w2 = getattr(module, w13_name(module)), module.down_proj
            e, h, i = to_fused_layout(self._layout, "down_proj", w2).shape
            with torch.device("meta"):
                new = Int8Experts(e, h, i, **_gating_of(module, self._layout), bias=biased,
                                  gated=getattr(module, "has_gate", True))
                if not self.pre_quantized:
                    # Placeholders in the checkpoint's float dtype and layout until Int8Quantize fills them:
                    # some transformers versions (5.17) cast each tensor to its meta param's dtype first.
                    setattr(new, new.w13_name, nn.Parameter(torch.empty_like(w13), requires_grad=False))
                    new.down_proj = nn.Parameter(torch.empty_like(w2), requires_grad=False)
                    if biased:
                        new.gate_up_proj_bias = torch.empty_like(module.gate_up_proj_bias)
                        new.down_proj_bias = torch.empty_like(module.down_proj_bias)
            if self.pre_quantized:
                for t, value in new.state_dict().items():
                    expected[f"{name}.{t}"] = (SAFETENSORS_DTYPES[value.dtype], tuple(value.shape))
            _keep_float_module(new, module)
            if self._loading is not None:  # this rank's part is read after loading (fill_pending_shards)
                model.set_submodule(name, PendingShard(new))
                model._keys_to_ignore_on_load_unexpected = (
                    set(model._keys_to_ignore_on_load_unexpected or ()) | {"^" + re.escape(name + ".")})
                continue
            model.set_submodule(name, new)
            self._targets.update(f"{name}.{t}" for t in new.tensor_names() if not t.endswith("_scale"))
        self._files = list(checkpoint_files or [])
        if self.pre_quantized:
            self._float_dtypes = _loaded_dtypes(model)
        if self.pre_quantized and checkpoint_files:
            # Fail before loading anything when a saved int8 tensor or its scale is missing or mis-shaped
            # (transformers would re-initialize it and only log a report).
            try:
                check_int8_checkpoint(headers, expected)
            except ValueError as e:
                note = _stale_single_file(checkpoint_files)
                if not note:
                    raise
                raise ValueError(f"{e}{note}") from None
        return model

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        return not self.pre_quantized and param_name in self._targets

    def get_quantize_ops(self):
        return Int8Quantize(self)

    def update_weight_conversions(self, weight_conversions, model=None):
        if self.pre_quantized:
            # An int8 checkpoint holds each experts tensor under its model name, in the kernel's layout
            # (save_pretrained and experts-int8 quantize write no per-expert keys): a merge or transpose
            # meant for the float checkpoint must not run on it (transformers 5.17 transposed Qwen3-VL's).
            return [c for c in weight_conversions if not _is_expert_converter(c, self._targets)]
        # Merge each layer's per-expert float tensors on the CPU: device memory never holds more than
        # one expert's float copy (Int8Quantize moves expert by expert to the device).
        for conversion in weight_conversions:
            if isinstance(conversion, WeightConverter) and _is_expert_converter(conversion, self._targets):
                conversion.force_cpu = True
        return list(weight_conversions)

    def get_weight_conversions(self):
        return []

    def _process_model_after_weight_loading(self, model, **kwargs):
        if self._errors:
            raise ValueError("experts_int8 could not quantize the checkpoint:\n  " + "\n  ".join(self._errors))
        if self._loading is not None and not self._files:
            raise ValueError("split_while_loading: transformers gave no checkpoint files to read the experts from")
        if self._loading is not None:
            loading = self._loading
            self.split = loading.split
            loading.parts += fill_pending_shards(
                model, self._files, loading,
                lambda name: loading.device or _device_for(self._device_map, name) or torch.device("cpu"))
        if not self.pre_quantized:
            missing = sorted(self._targets - self._quantized)
            if missing:
                raise ValueError(f"experts_int8: the checkpoint provided no weights for {len(missing)} experts "
                                 f"tensors, e.g. {missing[:3]}; they would be left uninitialized")
        _restore_float_dtypes(model, self._float_dtypes)
        verify_int8_model(model, self.quantization_config)
        _drop_expert_converters(model)
        if self._loading is not None:  # (after the checks: each rank checks its own parts, read from its own slice)
            finish_load(self._loading)
        return model

    def dequantize(self, model, dtype=None):
        # transformers' default is model.config.dtype, which model.to(dtype) leaves as it was: the experts come
        # back in the dtype the rest of the model has now
        if dtype is None:
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return super().dequantize(model, dtype=dtype)

    def _dequantize(self, model, dtype=None):
        """``model.dequantize()``: each int8 experts module becomes the model's own float one again, holding
        q * scale in ``dtype`` (see ``dequantize``), in the checkpoint's layout.

        Its parameters require grad as the model's do: frozen if any float parameter of the model is frozen
        (``model.requires_grad_(False)``, a PEFT base under its adapters, a frozen router; not a router's selection
        bias that the model itself builds frozen, AFMoE's and ERNIE 4.5's), or if they were frozen
        when ``quantize_`` replaced them; trainable otherwise (a model loaded int8 and left as it loaded)."""
        if any(isinstance(m, (ParallelExperts, PendingShard)) for m in model.modules()):
            raise ValueError("the experts are split across ranks (parallelize_experts / split_while_loading): a "
                             "rank's part cannot become the model's float module; dequantize before splitting")
        layout = _layout_of(model)
        # all checked first: a refusal leaves the model as it was, int8 throughout
        experts = [(name, module, _float_module_of(name, module, layout)) for name, module in find_experts(model)
                   if isinstance(module, Int8Experts)]
        # (a router's selection bias is a parameter that AFMoE and ERNIE 4.5 freeze themselves: not the user's doing)
        arch = ARCHITECTURES.get(_model_type(model))
        own = {id(arch.selection_bias(model.get_submodule(block)))
               for block in {name.rpartition(".")[0] for name, _, _ in experts}} if arch is not None else set()
        frozen = any(p.is_floating_point() and not p.requires_grad and id(p) not in own for p in model.parameters())
        for name, module, float_module in experts:
            model.set_submodule(name, _to_float(module, float_module, layout, dtype, trainable=not frozen))
        dropped = model.__dict__.pop("_experts_int8_converters", [])
        if dropped and getattr(model, "_weight_conversions", None) is not None:
            model._weight_conversions = model._weight_conversions + [c for c in dropped
                                                                     if c not in model._weight_conversions]
        return model

    def is_serializable(self, safe_serialization=None):
        # save_pretrained asks this before it writes anything: a split model is refused here with nothing
        # written (its state_dict would refuse too, after config.json; see parallel.ParallelExperts)
        if self.split is not None:
            raise ValueError(f"this model's experts hold only {self.split}: a checkpoint of it would lack the "
                             f"other ranks' parts. Save the model before splitting it")
        return True

    @property
    def is_trainable(self) -> bool:
        # Adapters (PEFT's LoRA on attention, say) train around the frozen int8 experts: the gradient flows
        # through them (ops' backward). transformers' Trainer still refuses a quantized model without adapters.
        return True

    @property
    def is_compileable(self) -> bool:
        return True


def _loaded_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    """The dtype transformers loads each float tensor of ``model`` (built in the load's dtype) in: fp32 where the
    model's keep-in-fp32 lists name it (``_keep_in_fp32_modules`` for a float16 load, ``_keep_in_fp32_modules_strict``
    for bfloat16 too, as its ``_get_dtype_plan``, matched as its loader matches them), its own dtype otherwise."""
    strict = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    keep = {torch.float16: strict + list(getattr(model, "_keep_in_fp32_modules", None) or ()), torch.bfloat16: strict}
    patterns = {dtype: [re.compile(k.replace("*", ".*")) for k in names] for dtype, names in keep.items()}
    return {name: torch.float32 if any(p.search(name) for p in patterns.get(t.dtype, ())) else t.dtype
            for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_floating_point()}


def _restore_float_dtypes(model: nn.Module, dtypes: dict[str, torch.dtype]) -> None:
    """Each loaded float tensor of a pre-quantized model in the dtype the model gave it (the load's ``dtype``; fp32
    for the int8 experts' scales and biases). transformers before 5.22 loads a tensor of such a checkpoint whose
    key it renames (Mixtral's ``block_sparse_moe.*``) in the checkpoint's dtype instead: a bf16 int8 checkpoint
    loaded with ``dtype=torch.float16`` kept bf16 routers (the forward failed on mixed dtypes), and the bf16 scales
    of one saved from a model cast before 4124398 were refused. 5.22 casts them while loading; this does the same
    after it. For a module accelerate offloads, both its meta tensor (each forward casts the hook's copy to that
    tensor's dtype) and the hook's stored copy (what ``verify_int8_model`` reads) take the dtype."""
    for name, dtype in dtypes.items():
        module_name, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue
        tensors = module._parameters if attr in module._parameters else module._buffers
        t = tensors.get(attr)
        if t is None or not t.is_floating_point():
            continue
        stored = _stored(module, attr)
        if stored is not t and stored.is_floating_point() and stored.dtype != dtype:
            stored.data = stored.data.to(dtype)  # (in place: the hook's map hands out this same tensor)
        if t.dtype == dtype:
            continue
        if isinstance(t, nn.Parameter):
            t.data = t.data.to(dtype)  # (the same Parameter: tied weights stay tied)
        else:
            tensors[attr] = t.to(dtype)


def _stored(module: nn.Module, name: str) -> torch.Tensor:
    """``module``'s tensor ``name``; for a module accelerate offloads (its tensors on the meta device until a
    forward brings them in), the copy its hook keeps."""
    value = getattr(module, name)
    if value.device.type != "meta":
        return value
    for hook in accelerate_hooks(module):
        weights = getattr(hook, "weights_map", None) if getattr(hook, "offload", False) else None
        if weights is not None and name in weights:
            return weights[name]
    return value


def verify_int8_model(model: nn.Module, config: Optional[ExpertsInt8Config] = None) -> int:
    """Check every routed experts module is int8 with sane fp32 scales; returns how many are.

    Raises ValueError naming the module when an experts module was left in float (and not listed
    in ``modules_to_not_convert``) or a tensor has the wrong dtype / shape / non-finite scales.
    """
    count = 0
    for name, module in find_experts(model):
        if not isinstance(module, Int8Experts):
            if config is not None and config.skips(name):
                if not module.down_proj.is_floating_point():  # int8 tensors loaded into a float module
                    raise ValueError(f"{name} is left float by modules_to_not_convert, but the checkpoint holds "
                                     f"{module.down_proj.dtype} weights for it: its config does not match its "
                                     f"tensors")
                continue
            raise ValueError(f"routed experts {name} ({type(module).__name__}) were left in "
                             f"{module.down_proj.dtype}; expected int8")
        e, h, i, w13, rows = (module.num_experts, module.hidden_size, module.intermediate_size, module.w13_name,
                              module.w13_rows)
        for t, shape, dtype in ((w13, (e, rows, h), torch.int8), ("down_proj", (e, h, i), torch.int8),
                                (f"{w13}_scale", (e, rows), torch.float32),
                                ("down_proj_scale", (e, h), torch.float32)):
            value = _stored(module, t)
            if value.device.type == "meta":
                raise ValueError(f"{name}.{t} was not loaded (still on the meta device)")
            if value.dtype != dtype or tuple(value.shape) != shape:
                raise TensorMismatchError(f"{name}.{t}: expected {dtype} {shape}, got {value.dtype} "
                                          f"{tuple(value.shape)}")
        if module.has_bias:
            for t, shape in ((f"{w13}_bias", (e, rows)), ("down_proj_bias", (e, h))):
                b = _stored(module, t)
                if b.device.type == "meta" or tuple(b.shape) != shape or not bool(torch.isfinite(b).all()):
                    raise ValueError(f"{name}.{t}: expected finite float {shape} expert biases, got "
                                     f"{b.dtype} {tuple(b.shape)} on {b.device}")
        for t in (f"{w13}_scale", "down_proj_scale"):
            s = _stored(module, t)
            if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
                raise ValueError(f"{name}.{t} holds non-finite or non-positive scales; the checkpoint's "
                                 f"scales are missing or corrupt")
        count += 1
    return count


# --------------------------------------------------------------------------------------------------
# The float module behind each int8 one (model.dequantize())
# --------------------------------------------------------------------------------------------------
def _keep_float_module(new: Int8Experts, float_module: nn.Module) -> None:
    """Give ``new`` the float experts module it replaces, moved to the meta device (no memory), so that
    ``model.dequantize()`` can rebuild the model's own class. Set past nn.Module's registry: not a
    submodule, so it is never saved, moved or listed."""
    object.__setattr__(new, "_float_module", float_module.to("meta"))


def _float_module_of(name: str, module: Int8Experts, layout: str) -> nn.Module:
    """The float module ``module`` becomes again, once checked that its int8 tensors fill it (shapes only: nothing
    is computed, so that ``dequantize`` checks every module before it changes one)."""
    float_module = module.__dict__.get("_float_module")
    if float_module is None:
        raise ValueError(f"{name} was not made by experts_int8's transformers integration (from_pretrained or "
                         f"quantize_): there is no float module to rebuild; load the float checkpoint instead")
    if offloaded_by_accelerate(module):  # (accelerate's placement hook: device_map="auto" and the like)
        raise ValueError(f"{name} is offloaded by accelerate (its weights come from an int8 weights map at each "
                         f"forward), which dequantize cannot rewrite: load the model onto devices that hold it")
    wanted = dict(float_module.named_parameters())
    shapes = {t: tuple(from_fused_layout(layout, t, torch.empty(getattr(module, t).shape, device="meta")).shape)
              for t in module.tensor_names() if not t.endswith("_scale")}
    if shapes != {t: tuple(p.shape) for t, p in wanted.items()} or dict(float_module.named_buffers()):
        raise ValueError(f"{name}: its int8 tensors {shapes} do not fill its float module "
                         f"({type(float_module).__name__}: {[(t, tuple(p.shape)) for t, p in wanted.items()]})")
    return float_module


def _to_float(module: Int8Experts, float_module: nn.Module, layout: str, dtype: Optional[torch.dtype],
              trainable: bool = True) -> nn.Module:
    """``float_module`` (from :func:`_float_module_of`) holding ``module``'s weights dequantized, its parameters
    requiring grad if they did when it was set aside and ``trainable``."""
    hook = getattr(module, "_hf_hook", None)
    wanted = dict(float_module.named_parameters())
    dtype = dtype or next(iter(wanted.values())).dtype
    w13 = module.w13_name
    tensors = {w13: dequantize_weights(getattr(module, w13), getattr(module, f"{w13}_scale"), dtype),
               "down_proj": dequantize_weights(module.down_proj, module.down_proj_scale, dtype)}
    if module.has_bias:
        tensors[f"{w13}_bias"] = getattr(module, f"{w13}_bias").to(dtype)
        tensors["down_proj_bias"] = module.down_proj_bias.to(dtype)
    tensors = {t: from_fused_layout(layout, t, v).contiguous() for t, v in tensors.items()}
    for t, value in tensors.items():
        setattr(float_module, t, nn.Parameter(value, requires_grad=trainable and wanted[t].requires_grad))
    float_module.train(module.training)  # (set aside in the mode it had then: training, if made while loading)
    carry_hooks(module, float_module)
    if hook is not None:  # the float module runs where the int8 one did
        from accelerate.hooks import add_hook_to_module

        add_hook_to_module(float_module, hook)
    del module.__dict__["_float_module"]
    return float_module


# --------------------------------------------------------------------------------------------------
# quantize_: a model already in memory
# --------------------------------------------------------------------------------------------------
def _transformers_model(model: nn.Module) -> nn.Module:
    """``model``, or the transformers model a wrapper of it holds (peft's PeftModel: ``base_model.model``)."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    held = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    if not held:
        return model  # (refused further on: no config)
    outer = set(held[0].modules())
    if any(m not in outer for m in held):
        raise ValueError(f"{type(model).__name__} holds several transformers models: quantize_ each of them")
    return held[0]


def quantize_(model: nn.Module, config: Optional[ExpertsInt8Config] = None, **kwargs) -> nn.Module:
    """Replace the routed experts of ``model`` with :class:`Int8Experts`, in place; returns ``model``.

    Each experts module is quantized on its own device and its float tensors are released right
    after, so peak memory grows by one experts module at most. All weights are checked for NaN/Inf
    first, so a failure leaves the model untouched.

    ``model`` may be a wrapper around the transformers model (peft's ``PeftModel``): the model it holds
    is quantized and marked int8, so that its save_pretrained and dequantize() know it.
    """
    if "filter_fn" in kwargs:  # (torchao's quantize_ picks the modules with one)
        raise TypeError("quantize_() takes no filter_fn: only routed experts modules are quantized, and "
                        "ExpertsInt8Config(modules_to_not_convert=[...]) names those to keep float (module names, "
                        "fragments such as 'layers.1' or regular expressions)")
    if kwargs:
        raise TypeError(f"quantize_() got unexpected keyword arguments {sorted(kwargs)}")
    config = config if config is not None else ExpertsInt8Config()
    if not isinstance(config, ExpertsInt8Config):
        raise TypeError(f"config must be an ExpertsInt8Config, got {type(config).__name__}")
    wrapper, model = model, _transformers_model(model)
    split = [name for name, m in model.named_modules() if isinstance(m, ParallelExperts)]
    if split:  # (a new quantizer would also forget the split, which keeps save_pretrained from writing a part)
        raise ValueError(f"{split[0]} is already int8 and split over ranks (experts_int8.parallel): quantize_ the "
                         f"whole model before splitting it")
    converted = [name for name, m in find_experts(model) if isinstance(m, Int8Experts) and config.skips(name)]
    if converted:
        raise ValueError(f"{converted[0]} is already int8, but this config's modules_to_not_convert names it: a "
                         f"model saved with it would not load; leave it out of modules_to_not_convert")
    todo = _plan(model, config)
    if todo is None:
        return wrapper
    layout = _layout_of(model)
    biases = ("gate_up_proj_bias", "down_proj_bias") if layout == "gpt_oss" else ()
    for name, module in todo:  # validate everything before changing anything
        for t in (w13_name(module), "down_proj", *biases):
            w = getattr(module, t)
            if w.device.type == "meta":
                if offloaded_by_accelerate(module):  # (the weights live in its hook's map: not ours to rewrite)
                    raise ValueError(f"{name} is offloaded by accelerate (its weights are on the meta device, brought "
                                     f"in from its hook's weights map at each forward), which quantize_ cannot rewrite "
                                     f"(model left unchanged): quantize_ the model before dispatching it, or load it "
                                     f"with quantization_config=ExpertsInt8Config() and the device_map")
                raise ValueError(f"{name}.{t} is on the meta device; load the weights first")
            if not w.is_floating_point():
                raise TypeError(f"{name}.{t}: expected float weights, got {w.dtype}")
            for i in range(w.shape[0]):
                try:
                    check_weights(w[i], f"{name}.{t}[expert {i}]")
                except ValueError as exc:
                    raise ValueError(f"{exc} (model left unchanged)") from None
    for name, module in todo:
        bias_tensors = {t: to_fused_layout(layout, t, getattr(module, t).data) for t in biases}
        w13 = w13_name(module)
        new = Int8Experts.from_float(to_fused_layout(layout, w13, getattr(module, w13).data),
                                     to_fused_layout(layout, "down_proj", module.down_proj.data),
                                     **_gating_of(module, layout), name=name, **bias_tensors)
        new.train(module.training)
        carry_hooks(module, new)
        hook = getattr(module, "_hf_hook", None)  # accelerate's placement hook (a device map naming the module)
        if hook is not None:  # the int8 module runs where the float one did (as dequantize() gives it back)
            from accelerate.hooks import add_hook_to_module

            add_hook_to_module(new, hook)
        model.set_submodule(name, new)
        _keep_float_module(new, module)  # (to the meta device: its float tensors are freed now)
        del module
    config_obj = model.config
    config_obj.quantization_config = config
    model.hf_quantizer = ExpertsInt8HfQuantizer(config, pre_quantized=True)
    model.is_quantized = True
    model.quantization_method = QUANT_METHOD
    _drop_expert_converters(model)
    verify_int8_model(model, config)
    return wrapper


# --------------------------------------------------------------------------------------------------
# Registration with transformers
# --------------------------------------------------------------------------------------------------
def _experts_interface_forward(module: nn.Module, hidden_states, top_k_index, top_k_weights):
    """``experts_implementation="experts_int8"``: a float model's experts through the kernel, which reads
    transformers' standard layout as it is (no copy per call): other layouts are refused, not misread."""
    gating = None
    if not isinstance(module, Int8Experts):
        try:
            _check_flags(type(module).__name__, module, "fused")
            if getattr(type(module), "_apply_gate", _default_apply_gate) is not _default_apply_gate:
                gating = _own_gating(module)
        except ValueError as e:
            raise ValueError(f"experts_implementation='experts_int8' on float weights: {e}. Quantize the model "
                             f"instead (quantization_config=ExpertsInt8Config()): that converts the layout once"
                             ) from None
    return int8_experts_forward(module, hidden_states, top_k_index, top_k_weights, gating=gating)


def _own_gating(module: nn.Module) -> dict:
    """The kernel's gating for a module with its own ``_apply_gate`` (a clamped SwiGLU), found by evaluating it once
    and kept on the module; found again where its limits or act_fn change."""
    # (the act_fn itself, not its id: a replaced one freed could lend its id to the next)
    key = (getattr(module, "act_fn", None), _module_numbers(module, *_LIMITS), _module_numbers(module, *_SLOPES))
    kept = module.__dict__.get("_experts_int8_gating")
    if kept is None or kept[0] != key:
        found = _gating_found(module)
        if isinstance(found, str):  # (its refusal, raised here: inside a compiled graph as outside)
            raise ValueError(found)
        kept = (key, dict(found))
        module.__dict__["_experts_int8_gating"] = kept
    return kept[1]


# (evaluates the module's gate on a probe, once: run eagerly while torch.compile traces, its result a constant of
# the graph, as _activation_cached's is, so that fullgraph=True compiles it; a graph break there is refused)
@torch.compiler.assume_constant_result
def _gating_found(module: nn.Module) -> tuple | str:
    """``_gating_of``'s options as (name, value) pairs, or its refusal's message."""
    try:
        return tuple(_gating_of(module, "fused", type(module).__name__).items())
    except ValueError as e:
        return str(e)


def _register() -> None:
    if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(QUANT_METHOD)(ExpertsInt8Config)
    if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(QUANT_METHOD)(ExpertsInt8HfQuantizer)
    if QUANT_METHOD not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(QUANT_METHOD, _experts_interface_forward)


_register()
