"""Quantized releases read as the float checkpoints they encode (by ``experts-int8 quantize``).

Seven encodings cover the MoE releases that ship no float weights:

* FP8 with block scales (``quant_method: fp8`` and a ``weight_block_size [bn, bk]``: DeepSeek-V3/R1,
  MiniMax-M2, Qwen3's -FP8): each F8 ``<name>.weight`` ``[..., N, K]`` beside ``<name>.weight_scale_inv``
  ``[..., ceil(N/bn), ceil(K/bk)]``, one factor per block of rows and columns; the weight is their product.
  DeepSeek-V4's releases keep the factors in ``<name>.scale`` instead (and some in ``<name>.qscale_weight``,
  which transformers reads for Mistral Large 4), and DeepSeek-V4 stores its routed experts in FP4: an I8
  ``<name>.weight`` ``[..., N, K/2]`` (two e2m1 codes a byte, low nibble first) beside ``<name>.scale``
  ``[..., N, K/32]``, one factor per 32 values of a row (UE8M0 powers of two).
* AutoFP8's per-tensor FP8 (``quant_method: fp8``, ``activation_scheme`` ``static`` or ``dynamic`` and no
  ``weight_block_size``: neuralmagic's older -FP8 releases, Mixtral-8x7B-Instruct-v0.1-FP8..., as vLLM's fp8 loader
  reads them): each quantized Linear's F8 ``<module>.weight`` ``[N, K]`` beside ``<module>.weight_scale``, one
  factor for the tensor (``[]`` or ``[1]``); the weight is their product. Static activation scales
  (``<module>.input_scale``) are dropped, as they are from a block-scaled release that has them (transformers'
  own static FP8 names them ``<module>.activation_scale``), and so are an FP8 KV cache's scales (``k_proj``'s and
  ``v_proj``'s ``output_scale``): an int8-weight model runs its activations and its KV cache in float.
* transformers' own per-tensor FP8 (``FineGrainedFP8Config`` with ``weight_block_size`` null: the same config as
  AutoFP8's): each quantized weight's F8 ``<name>`` ``[..., N, K]`` beside ``<name>_scale_inv`` (not
  ``weight_scale``): ``[]`` or ``[1]`` (a Linear's ``FP8Linear`` parameter), or ``[..., a, b]``, one factor per
  block of N/a rows and K/b columns (equal blocks, as its ``Fp8Dequantize`` derives them from the grid): its
  ``save_pretrained`` writes a Linear's ``[1, 1]`` (``Fp8Quantize``'s one block, the whole matrix) and a fused
  experts tensor's ``[E, 1, 1]``, and where it splits the experts back per expert (Mixtral's ``w1``/``w3``/``w2``,
  Qwen3's ``gate_proj``...) it leaves their factors under the merged names, ``<experts>.gate_up_proj_scale_inv``
  (the gate's rows first, then the up's) and ``<experts>.down_proj_scale_inv`` (transformers' own reload on a CPU,
  which dequantizes, finds those unexpected and leaves its experts unscaled), as it does a fused experts tensor it
  renames (Granite's ``input_linear.weight``: ``<experts>.gate_up_proj_scale_inv``); each weight is its product, in
  float32 rounded once to the config's dtype (as ``Fp8Dequantize`` makes it). Static activation scales
  (``<name>.activation_scale``, ``<experts>.gate_up_proj_activation_scale`` ``[E]``...) are dropped.
* compressed-tensors' FP8 (``quant_method: compressed-tensors``, ``format: float-quantized``: RedHatAI's and
  neuralmagic's -FP8-dynamic and -FP8 releases): each quantized Linear's F8 ``<module>.weight`` ``[N, K]`` beside
  ``<module>.weight_scale``, one factor for the tensor (``[]`` or ``[1]``), per row (``[N, 1]``, ``channel``) or per
  block of the config's ``block_structure [bn, bk]`` (``[ceil(N/bn), ceil(K/bk)]``); the weight is their product
  (as compressed-tensors' own decompression makes it). Static activation scales (``<module>.input_scale``) are
  dropped: an int8-weight model runs its activations in float.
* compressed-tensors' NVFP4 (``format: nvfp4-pack-quantized``, weights ``num_bits 4``, ``type float``, ``strategy
  tensor_group``, ``group_size 16``: RedHatAI's -NVFP4 releases, made by llm-compressor): each quantized Linear's U8
  ``<module>.weight_packed`` ``[N, K/2]`` (two e2m1 codes a byte, low nibble first: value ``2j`` in the low four
  bits, ``2j+1`` in the high; bit 3 the sign) beside its F8_E4M3 ``weight_scale`` ``[N, K/16]``, one factor per 16
  values of a row, and F32 ``weight_global_scale`` ``[1]``; the weight is ``code * (weight_scale /
  weight_global_scale)``, the factor divided first, in float32, as compressed-tensors' own decompression computes
  it (``NVFP4PackedCompressor.decompress``: ``unpack_fp4_from_uint8``, then ``dequantize`` dividing the scale by
  the global one), then rounded once. Its decompression rounds to bfloat16 whatever the model's dtype (its
  unpacked codes' dtype): the same values in a bfloat16 model, its releases' case; a float16 or float32 config
  here gets one rounding to its own dtype instead. Activations' ``<module>.input_global_scale`` are dropped, and so
  are the KV cache's scales under a ``kv_cache_scheme``. compressed-tensors' ``format: mixed-precision`` (what
  llm-compressor writes where config groups differ in format, each group then naming its own: NVFP4 experts beside
  FP8 attention...) is read where every group is one of these two: each weight by its own encoding (NVFP4's
  ``weight_packed``, FP8's F8 ``weight``), the FP8 groups alike in strategy and block; a group in another format,
  or naming none, is refused by name.
* NVIDIA ModelOpt's (nvidia's -FP8 and -FP4 releases: config.json's ``quant_method: modelopt`` with ``quant_algo``,
  ``group_size``, ``kv_cache_scheme``, or an ``hf_quant_config.json`` alone, ``{"producer": {"name": "modelopt"},
  "quantization": {"quant_algo", "group_size", "kv_cache_quant_algo", "exclude_modules"}}``; as vLLM's ModelOpt
  loader reads them). ``FP8``: each quantized Linear's F8 ``weight`` beside an F32 ``weight_scale`` ``[]``, AutoFP8's
  per-tensor product. ``NVFP4`` (and ``W4A16_NVFP4``, the same weights): a U8 ``weight`` ``[N, K/2]`` (low nibble
  first), an F8_E4M3 ``weight_scale`` ``[N, K/16]`` and an F32 ``weight_scale_2`` ``[]`` (amax / (6 * 448): a
  multiplier, not compressed-tensors' divisor); the weight is ``code * (weight_scale * weight_scale_2)``, the
  factor multiplied first, in float32, as ModelOpt's own ``NVFP4QTensor.dequantize`` computes it, then rounded to
  the config's dtype. ``input_scale`` is dropped, and with a quantized KV cache the attention's ``k_scale`` and
  ``v_scale`` (on ``k_proj``/``v_proj`` or the attention module); the hf_quant_config.json is not copied to the int8
  checkpoint.
* MXFP4 (``quant_method: mxfp4``: GPT-OSS): ``<name>_blocks`` uint8 ``[E, N, G, 16]``, two 4-bit e2m1 codes a
  byte (low nibble first, 32 values a group), and ``<name>_scales`` uint8 ``[E, N, G]``, a power of two a group
  (exponent + 127); the weight is ``<name>`` ``[E, 32 G, N]``, the layout of GPT-OSS's float experts.

Each decodes in float32 and is rounded to the config's dtype (as transformers' own decoders do: MXFP4's values
are exact in float32, FP8's products with float32 scales are rounded there first), on the device its stored
tensors are on (exact products and one rounding: the same values on a GPU as on the CPU). (compressed-tensors
multiplies in its scales' dtype, then casts: the same values for float32 scales, and for bfloat16 ones in a
bfloat16 model, its releases' two cases; transformers fuses their experts as products in float32, as here.)
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
FP8_SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0", "U8")  # (the last two: UE8M0 powers of two)
# e2m1's sixteen codes: sign bit, two exponent bits, one mantissa bit
MXFP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
FP4_PACKED_DTYPE = "I8"  # (an FP8 release's FP4 weights: two e2m1 codes a byte, in int8 as transformers reads them)
FP4_GROUP = 32  # values of a row that share one factor
FP8_ACTIVATION_SCHEMES = ("static", "dynamic")  # (a per-tensor release names one, as vLLM's fp8 loader needs)
FP8_ACTIVATION_SCALES = (".input_scale", ".activation_scale")  # (static activations': vLLM's and transformers' names)
FP8_MERGED_ACTIVATION_SCALE = "_activation_scale"  # (transformers' static FP8 experts': one per expert, [E])
FP8_KV_CACHE_SCALES = (".output_scale",)  # (AutoFP8's FP8 KV cache: k_proj's and v_proj's outputs, vLLM's k/v scales)
CT_FORMAT = "float-quantized"  # (compressed-tensors' FP8 format: weights and scales stored as they are, not packed)
CT_NVFP4_FORMAT = "nvfp4-pack-quantized"  # (its NVFP4 one: two e2m1 codes a byte, an e4m3 factor a group of 16)
CT_MIXED_FORMAT = "mixed-precision"  # (llm-compressor's where config groups differ in format: each group names its own)
NVFP4_GROUP = 16
CT_STRATEGIES = ("tensor", "channel", "block")
CT_SCALE_DTYPES = ("F32", "BF16", "F16")
CT_ACTIVATION_SCALES = (".input_scale", ".input_zero_point", ".input_global_scale")  # (static activations': no use
# without FP8 or FP4 matmuls)
CT_KV_CACHE_SCALES = (".k_scale", ".v_scale", ".q_scale")  # (an FP8 KV cache's, with kv_cache_scheme: none here)
MODELOPT_ALGOS = {"FP8": "FP8", "NVFP4": "NVFP4", "W4A16_NVFP4": "NVFP4"}  # (quant_algo -> its weights' encoding)
MODELOPT_CONFIG = "hf_quant_config.json"  # (ModelOpt's description of a release, beside or instead of config.json's)
FLOAT_DTYPES = {"bfloat16": (torch.bfloat16, "BF16"), "float16": (torch.float16, "F16"),
                "float32": (torch.float32, "F32")}


def release_encoding(config: dict, src) -> Optional[dict]:
    """The ``quantization_config`` of a release this module decodes; None for a float one. A release quantized
    any other way is refused (checked before anything is read or written)."""
    qc = config.get("quantization_config")
    if not qc:
        return modelopt_config(src)
    if not isinstance(qc, dict):
        raise ValueError(f"config.json's quantization_config is a JSON {type(qc).__name__}, not an object")
    method, block, scheme = qc.get("quant_method"), qc.get("weight_block_size"), qc.get("activation_scheme")
    if method == "compressed-tensors":
        _compressed_weights(qc, src)  # (its refusal, naming what it does not decode)
        return qc
    if isinstance(method, str) and method.lower().startswith("modelopt"):  # (also ``modelopt_fp4``, as vLLM reads)
        _modelopt_algo(qc, src)
        return dict(qc, quant_method="modelopt")
    # (static activation scales are no refusal: the weights decode alike, and the scales are dropped)
    if method == "mxfp4" or (method == "fp8" and (_two_sizes(block) or (
            block is None and scheme in FP8_ACTIVATION_SCHEMES))):
        return qc
    raise ValueError(f"{src} is already quantized (quant_method {method!r}"
                     + (f", weight_block_size {block!r}, activation_scheme {scheme!r}" if method == "fp8" else "")
                     + "); convert the original float checkpoint instead (quant_method fp8 releases with block "
                     "scales, a weight_block_size of two sizes, or AutoFP8's or transformers' per-tensor ones, no "
                     "weight_block_size and activation_scheme static or dynamic; compressed-tensors' float-quantized "
                     "FP8 and nvfp4-pack-quantized NVFP4 ones, ModelOpt's FP8 and NVFP4 ones and MXFP4 ones are read "
                     "directly)")


def _compressed_weights(qc: dict, src="") -> tuple[frozenset, Optional[str], Optional[tuple[int, int]]]:
    """(formats, FP8 strategy, FP8 block size or None) of a compressed-tensors release's weights, where it is one
    this module decodes: format float-quantized, every config group's weights 8-bit symmetric floats with one factor
    per tensor, row or block, alike in all groups (which group a module is in is then of no matter); format
    nvfp4-pack-quantized, every group's 4-bit symmetric floats in groups of 16 values with a global factor
    (``tensor_group``); or format mixed-precision (llm-compressor's when groups differ in format), each group in one
    of those two by its own ``format``. Raises for others, naming the group, saying what is not read."""
    instead = ("convert the original float checkpoint instead (compressed-tensors' float-quantized FP8 releases, "
               "8-bit symmetric float weights with tensor, channel or block scales, nvfp4-pack-quantized NVFP4 "
               "ones and mixed-precision ones of those two are read directly)")
    fmt = qc.get("format")
    if fmt not in (CT_FORMAT, CT_NVFP4_FORMAT, CT_MIXED_FORMAT):
        raise ValueError(f"{src} is compressed-tensors in format {fmt!r}, not {CT_FORMAT!r}, {CT_NVFP4_FORMAT!r} "
                         f"or {CT_MIXED_FORMAT!r} of those; {instead}")
    sparsity = qc.get("sparsity_config")
    for what, used in (("sparsity_config", sparsity and not (isinstance(sparsity, dict) and sparsity.get(
            "format") in (None, "dense"))), ("transform_config", qc.get("transform_config"))):
        if used:  # (sparse or rotated weights: not the plain products decoded here)
            raise ValueError(f"{src} is compressed-tensors with a {what} as well as quantized weights; {instead}")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{src} is compressed-tensors without config_groups that say how its weights are "
                         f"quantized; the config.json is damaged: download it again")
    formats, schemes = set(), set()
    for name, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict):
            raise ValueError(f"{src}: compressed-tensors config group {name!r} quantizes no weights; {instead}")
        # (mixed-precision: each group says its own format; otherwise a group's, where given, is the release's)
        own = group.get("format") if fmt == CT_MIXED_FORMAT else fmt
        if own not in (CT_FORMAT, CT_NVFP4_FORMAT):
            raise ValueError(f"{src}: compressed-tensors config group {name!r} of a {fmt!r} release is in format "
                             f"{own!r}, not {CT_FORMAT!r} or {CT_NVFP4_FORMAT!r}; {instead}")
        block = w.get("block_structure") if w.get("strategy") == "block" else None
        nvfp4 = own == CT_NVFP4_FORMAT
        if nvfp4:  # (what its NVFP4 compressor packs: e2m1 codes, an e4m3 factor a group of 16, a global one)
            bad = (w.get("num_bits") != 4 or w.get("type") != "float" or w.get("symmetric", True) is not True
                   or w.get("strategy") != "tensor_group" or w.get("group_size") != NVFP4_GROUP)
        else:
            bad = (w.get("num_bits") != 8 or w.get("type") != "float" or w.get("symmetric", True) is not True
                   or w.get("strategy") not in CT_STRATEGIES
                   or (w.get("strategy") == "block" and not _two_sizes(block)))
        if bad or group.get("format") not in (None, own):
            said = ", ".join(f"{k} {w.get(k)!r}" for k in ("num_bits", "type", "strategy", "symmetric")
                             + (("group_size",) if nvfp4 else ("block_structure",) if w.get("strategy") == "block"
                                else ()))
            raise ValueError(f"{src}: compressed-tensors config group {name!r} quantizes weights with {said}"
                             + (f", format {group['format']!r}" if group.get("format") not in (None, own)
                                else "") + f" in format {own!r}; {instead}")
        formats.add(own)
        if not nvfp4:  # (each FP8 weight's scales are read by the one strategy: the FP8 groups must agree)
            schemes.add((w["strategy"], tuple(block) if block else None))
    if len(schemes) > 1:
        raise ValueError(f"{src}: compressed-tensors config groups quantize weights in different ways "
                         f"({', '.join(sorted(f'{st} {list(b)}' if b else st for st, b in schemes))}); {instead}")
    return (frozenset(formats), *(schemes.pop() if schemes else (None, None)))


def modelopt_config(src) -> Optional[dict]:
    """A release that ModelOpt describes only in its ``hf_quant_config.json`` (``{"producer": {"name":
    "modelopt"}, "quantization": {...}}``, as vLLM reads it): its config as a ``quantization_config``; None where
    there is none (a float checkpoint)."""
    path = Path(src) / MODELOPT_CONFIG if str(src) else None
    if path is None or not path.is_file():
        return None
    try:
        qc = json.loads(path.read_text())
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); it is damaged (download it again), or remove it if the "
                         f"checkpoint is a float one") from None
    if not isinstance(qc, dict) or not isinstance(qc.get("quantization"), dict):
        raise ValueError(f"{path} has no \"quantization\" object that says how the weights are quantized; it is "
                         f"damaged (download it again), or remove it if the checkpoint is a float one")
    qc = dict(qc, quant_method="modelopt")
    _modelopt_algo(qc, src)
    return qc


def _modelopt_algo(qc: dict, src="") -> tuple[str, int, bool]:
    """(weights' encoding, ``FP8`` or ``NVFP4``; group size; whether the KV cache is quantized) of a ModelOpt
    release's config: its ``quantization`` object (``hf_quant_config.json``'s layout) or the config itself
    (config.json's: ``quant_algo``, ``group_size``, ``kv_cache_scheme``), as vLLM's ModelOpt loader reads them.
    Raises for the algorithms not read."""
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else qc
    algo = str(inner.get("quant_algo") or "").upper()
    group = inner.get("group_size") or (16 if MODELOPT_ALGOS.get(algo) == "NVFP4" else None)
    if algo not in MODELOPT_ALGOS or (MODELOPT_ALGOS[algo] == "NVFP4" and group != NVFP4_GROUP):
        raise ValueError(f"{src} is quantized by ModelOpt with quant_algo {inner.get('quant_algo')!r}"
                         + (f", group_size {group!r}" if algo in MODELOPT_ALGOS else "") + "; convert the original "
                         f"float checkpoint instead (ModelOpt's FP8 releases, one factor a tensor, and its NVFP4 "
                         f"ones, groups of {NVFP4_GROUP}, are read directly)")
    return MODELOPT_ALGOS[algo], group, bool(inner.get("kv_cache_quant_algo") or inner.get("kv_cache_scheme"))


def _two_sizes(block) -> bool:
    return isinstance(block, list) and len(block) == 2 and all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)


def dequantize_fp8_blocks(w: torch.Tensor, scale_inv: torch.Tensor, *, block, dtype) -> torch.Tensor:
    """``w`` (FP8 ``[..., N, K]``) times its per-block factors ``scale_inv`` ``[..., ceil(N/bn), ceil(K/bk)]``
    (floats, or UE8M0 powers of two: F8_E8M0, or their exponent bytes as uint8, exponent + 127), one ``[N, K]``
    matrix at a time (a fused experts tensor's float32 temporaries would be several times its size)."""
    n, k = w.shape[-2:]
    if scale_inv.dtype == torch.uint8:
        scale_inv = scale_inv.view(torch.float8_e8m0fnu)
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    for o, q, s in zip(out.view(-1, n, k), w.reshape(-1, n, k), scale_inv.reshape(-1, *scale_inv.shape[-2:])):
        factors = s.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
        o.copy_(q.float() * factors)
    return out


def dequantize_fp8_scaled(w: torch.Tensor, scale: torch.Tensor, *, block, dtype) -> torch.Tensor:
    """compressed-tensors' or AutoFP8's FP8 ``w`` ``[N, K]`` times its ``scale``: one factor for the tensor, a row
    or a block, all blocks of factors (of ``[N, K]``, ``[1, K]`` or the config's size) as
    :func:`dequantize_fp8_blocks` reads them."""
    n, k = w.shape
    return dequantize_fp8_blocks(w, scale.reshape(-(-n // block[0]), -(-k // block[1])), block=block, dtype=dtype)


def dequantize_fp4_rows(packed: torch.Tensor, scales: torch.Tensor, *, dtype, group: int = FP4_GROUP) -> torch.Tensor:
    """FP4 ``packed`` (int8 or uint8 ``[..., N, K/2]``, two e2m1 codes a byte, low nibble first) times its factors
    ``scales`` ``[..., N, K/group]`` (UE8M0 powers of two: F8_E8M0, or their exponent bytes as uint8; or floats), one
    per ``group`` values of a row -> ``[..., N, K]`` in ``dtype``, one ``[N, K]`` matrix at a time."""
    n, half = packed.shape[-2:]
    if scales.dtype == torch.uint8:
        scales = scales.view(torch.float8_e8m0fnu)
    lut = torch.tensor(MXFP4_VALUES, device=packed.device)
    pairs = torch.stack((lut.repeat(16), lut.repeat_interleave(16)), dim=-1)  # byte -> (low, high) values
    out = torch.empty(*packed.shape[:-1], 2 * half, dtype=dtype, device=packed.device)
    for o, q, s in zip(out.view(-1, n, 2 * half), packed.reshape(-1, n, half),
                       scales.reshape(-1, *scales.shape[-2:])):
        values = pairs[q.view(torch.uint8).int()].view(n, 2 * half)
        if (2 * half) % group == 0:  # (a release's rows: whole groups, the factors broadcast)
            o.view(n, -1, group).copy_(values.view(n, -1, group) * s.float()[..., None])
        else:
            o.copy_(values * s.float().repeat_interleave(group, 1)[:, :2 * half])
    return out


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, *, dtype) -> torch.Tensor:
    """compressed-tensors' NVFP4 ``packed`` (uint8 ``[N, K/2]``, low nibble first) times ``scale / global_scale``:
    its e4m3 ``scale`` ``[N, K/16]``, one a group of 16 values of a row, divided by the float32 ``global_scale``
    (``[1]``) first, in float32, as its own decompression divides and multiplies (the same roundings)."""
    return dequantize_fp4_rows(packed, scale.float() / global_scale.float(), dtype=dtype, group=NVFP4_GROUP)


def dequantize_modelopt_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor, *,
                              dtype) -> torch.Tensor:
    """ModelOpt's NVFP4 ``packed`` (uint8 ``[N, K/2]``, low nibble first) times ``scale * scale_2``: its e4m3
    ``scale`` ``[N, K/16]`` times the float32 ``scale_2`` (``[]`` or ``[1]``: amax / (6 * 448), a multiplier, as
    vLLM's loader takes it) first, in float32, then the codes times that factor, then ``dtype``: the order of
    ModelOpt's own ``NVFP4QTensor.dequantize`` (the same float32 roundings)."""
    return dequantize_fp4_rows(packed, scale.float() * scale_2.float(), dtype=dtype, group=NVFP4_GROUP)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, *, dtype) -> torch.Tensor:
    """MXFP4 ``blocks`` ``[E, N, G, 16]`` and ``scales`` ``[E, N, G]`` -> ``[E, 32 G, N]`` in ``dtype``, one
    expert at a time (the codes of a whole tensor as indices would take 16 bytes a value)."""
    e, n, g, _ = blocks.shape
    lut = torch.tensor(MXFP4_VALUES, device=blocks.device)
    out = torch.empty(e, 32 * g, n, dtype=dtype, device=blocks.device)
    for x in range(e):
        codes = torch.stack((blocks[x] & 15, blocks[x] >> 4), dim=-1).long()  # [N, G, 16, 2]: low nibble first
        values = torch.ldexp(lut[codes].flatten(-2), scales[x].long().sub(127)[..., None])  # [N, G, 32]
        out[x] = values.flatten(-2).t().to(dtype)
    return out


def float_decoders(qc: dict, headers: dict, config: dict, experts: Optional[tuple[str, str, str]] = None,
                   renames=()) -> dict[str, tuple[tuple[str, ...], Callable]]:
    """Each encoded weight's float key -> (the stored keys it decodes from, the function that decodes them).
    ``headers`` (key -> (safetensors dtype, shape)) is changed to the float tensors' (the stored keys consumed).
    ``experts``: the checkpoint's per-expert (gate, up, down) projection names, where transformers merges them
    (a transformers-saved per-tensor release keeps their factors in the merged tensors' names); ``renames``:
    ``(pattern, name, part, parts)``: the name transformers loads a whole experts tensor as, renamed (Granite's
    ``input_linear.weight``) or concatenated (Step-3.7's ``moe.gate_proj.weight``, part 0 of 2 of the rows; such a
    release keeps their factors in the names it loads them as)."""
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    if name not in FLOAT_DTYPES:
        raise ValueError(f"config.json's dtype {name!r} is not one of {', '.join(FLOAT_DTYPES)}")
    dtype, dtype_name = FLOAT_DTYPES[name]
    modelopt = _modelopt_algo(qc) if qc["quant_method"] == "modelopt" else None
    # (AutoFP8's, transformers', ModelOpt's FP8)
    per_tensor = (qc["quant_method"] == "fp8" and qc.get("weight_block_size") is None) or (
        modelopt is not None and modelopt[0] == "FP8")
    if qc["quant_method"] == "fp8" and not per_tensor:
        decoders, shapes = _block_fp8_decoders(tuple(qc["weight_block_size"]), headers, dtype)
    elif qc["quant_method"] == "compressed-tensors":
        # (each weight by its own encoding: NVFP4 ones are ``weight_packed``, FP8 ones F8 ``weight``; a
        # mixed-precision release has both, one decoder set per format its groups name)
        decoders, shapes, formats = {}, {}, _compressed_weights(qc)[0]
        for fmt, decode in ((CT_NVFP4_FORMAT, partial(_nvfp4_decoders, headers, dtype)), (CT_FORMAT, partial(
                _scaled_fp8_decoders, qc, False, headers, experts, renames, dtype))):
            if fmt in formats:
                found, found_shapes = decode()
                decoders.update(found)
                shapes.update(found_shapes)
    elif modelopt is not None and modelopt[0] == "NVFP4":
        decoders, shapes = _nvfp4_decoders(headers, dtype, modelopt=True)
    elif per_tensor:
        decoders, shapes = _scaled_fp8_decoders(qc, True, headers, experts, renames, dtype)
    else:
        decoders, shapes = _mxfp4_decoders(headers, dtype)
    activations = {"fp8": FP8_ACTIVATION_SCALES + FP8_KV_CACHE_SCALES + (FP8_MERGED_ACTIVATION_SCALE,),
                   "compressed-tensors": CT_ACTIVATION_SCALES, "modelopt": (".input_scale",)}.get(
                       qc["quant_method"], ())
    consumed = {k for keys, _ in decoders.values() for k in keys}
    for key in [k for k in headers if k.endswith(activations)]:
        if f"{key.rsplit('.', 1)[0]}.weight" in decoders or (key.endswith(FP8_MERGED_ACTIVATION_SCALE) and (
                f"{key.removesuffix(FP8_MERGED_ACTIVATION_SCALE)}_scale_inv" in consumed)):
            del headers[key]  # (an int8-weight model runs its activations and its KV cache in float)
    # (a ``.scale`` is a weight's factors only beside its ``.weight``: DeepSeek-V4's other ``.scale`` are parameters;
    # an FP8 release's activation scales likewise)
    factors = ("_scale_inv", "_scales", "_blocks", ".qscale_weight")
    beside = (".scale", *FP8_ACTIVATION_SCALES, *FP8_KV_CACHE_SCALES) if qc["quant_method"] == "fp8" else (".scale",)
    if qc["quant_method"] == "compressed-tensors" or per_tensor:
        factors += (".weight_scale",)
    if qc["quant_method"] == "compressed-tensors":
        factors += (".weight_zero_point", ".weight_packed", ".weight_global_scale", *CT_ACTIVATION_SCALES)
    if qc["quant_method"] == "modelopt":
        factors += (".weight_scale", ".weight_scale_2", ".input_scale")
    if (qc.get("kv_cache_scheme") if qc["quant_method"] == "compressed-tensors" else modelopt and modelopt[2]):
        # (the KV cache is kept in float: the attention's scales, on k_proj/v_proj or on the attention module, would
        # be unexpected)
        for key in [k for k in headers if k.endswith(CT_KV_CACHE_SCALES)]:
            del headers[key]
    stray = sorted(k for k in headers if k not in consumed and (k.endswith(factors) or (
        k.endswith(beside) and f"{k.rsplit('.', 1)[0]}.weight" in headers)))
    if stray:
        raise ValueError(f"{stray[0]} belongs to no {qc['quant_method']} weight of the checkpoint; it is "
                         f"incomplete or not what its config.json says")
    for k in consumed:
        del headers[k]
    headers.update({key: (dtype_name, shape) for key, shape in shapes.items()})
    return decoders


def _block_fp8_decoders(block, headers: dict, dtype) -> tuple[dict, dict]:
    """(decoders, float shapes) of an FP8 release with block scales (and DeepSeek-V4's FP4 experts)."""
    decoders, shapes = {}, {}
    for key, (stored, shape) in headers.items():
        if stored not in FP8_DTYPES and stored != FP4_PACKED_DTYPE:
            continue
        scale = _fp8_scale_key(key, headers)
        if scale is None and stored == FP4_PACKED_DTYPE and not key.endswith(".weight"):
            continue  # (an int8 tensor that is no weight: kept as it is; an I8 weight is FP4 missing its factors)
        if scale is None:
            raise ValueError(f"{key} is {stored} without its block scales {key}_scale_inv (or "
                             f"{key.removesuffix('.weight')}.scale); the FP8 checkpoint is incomplete: download "
                             f"it again")
        if stored == FP4_PACKED_DTYPE:  # (DeepSeek-V4's routed experts)
            width = 2 * shape[-1] if shape else 0
            want, what = (*shape[:-1], -(-width // FP4_GROUP)), f"in groups of {FP4_GROUP} values a row"
            decode, shapes[key] = partial(dequantize_fp4_rows, dtype=dtype), (*shape[:-1], width)
            encoded = "FP4 (I8, two values a byte)"
        else:
            want = (*shape[:-2], *(-(-n // b) for n, b in zip(shape[-2:], block)))
            what, encoded = f"in blocks of {list(block)}", stored
            decode, shapes[key] = partial(dequantize_fp8_blocks, block=block, dtype=dtype), tuple(shape)
        if len(shape) < 2 or tuple(headers[scale][1]) != want or headers[scale][0] not in FP8_SCALE_DTYPES:
            raise ValueError(f"{scale} is {headers[scale][0]} {list(headers[scale][1])}, not the "
                             f"{list(want)} scales ({', '.join(FP8_SCALE_DTYPES)}) that {encoded} {list(shape)} "
                             f"{what} needs")
        decoders[key] = ((key, scale), decode)
    return decoders, shapes


def _scaled_fp8_decoders(qc: dict, per_tensor: bool, headers: dict, experts, renames, dtype) -> tuple[dict, dict]:
    """(decoders, float shapes) of an FP8 release with one factor a tensor, a row or a block: AutoFP8's and
    transformers' per-tensor ones (``per_tensor``), compressed-tensors' float-quantized ones."""
    decoders, shapes = {}, {}
    _, strategy, block = ("", "tensor", None) if per_tensor else _compressed_weights(qc)
    release = "FP8" if per_tensor else "compressed-tensors"
    for key, (stored, shape) in headers.items():
        if stored not in FP8_DTYPES or key.endswith(".weight_scale"):  # (an NVFP4 weight's e4m3 factors: stray here)
            continue
        scale = f"{key}_scale"
        if per_tensor and scale not in headers:  # (transformers' own: a grid of equal blocks, or its experts')
            found = _fp8_grid(key, shape, headers, experts, renames, dtype)
            if found is None:
                raise ValueError(f"{key} is {stored} without its scales {scale} or {key}_scale_inv"
                                 + "".join(f" (or {k})" for k, _, _ in _grid_scale_keys(key, experts, renames)[1:2])
                                 + f"; the {release} checkpoint is incomplete (download it again) or keeps them "
                                 f"where they are not read (a weight transformers splits while loading: convert "
                                 f"the float checkpoint instead)")
            decoders[key], shapes[key] = found, tuple(shape)
            continue
        if scale not in headers:
            raise ValueError(f"{key} is {stored} without its scales {scale}; the {release} checkpoint is "
                             f"incomplete: download it again")
        n, k = (max(size, 1) for size in shape) if len(shape) == 2 else (1, 1)
        size, want = {"tensor": ((n, k), ((), (1,))), "channel": ((1, k), ((n, 1),)),
                      "block": (block, ((-(-n // block[0]), -(-k // block[1])),) if block else ())}[strategy]
        if len(shape) != 2 or tuple(headers[scale][1]) not in want or headers[scale][0] not in CT_SCALE_DTYPES:
            raise ValueError(f"{scale} is {headers[scale][0]} {list(headers[scale][1])}, not the "
                             f"{' or '.join(str(list(s)) for s in want)} scales ({', '.join(CT_SCALE_DTYPES)}) "
                             f"that {stored} {list(shape)} with {strategy} scales"
                             + (f" of blocks {list(block)}" if block else "") + " needs")
        decoders[key] = ((key, scale), partial(dequantize_fp8_scaled, block=size, dtype=dtype))
        shapes[key] = tuple(shape)
    return decoders, shapes


def _nvfp4_decoders(headers: dict, dtype, modelopt: bool = False) -> tuple[dict, dict]:
    """(decoders, float shapes) of an NVFP4 release: each quantized Linear's U8 codes ``[N, K/2]`` with its F8_E4M3
    ``weight_scale`` ``[N, K/16]`` and an F32 global factor ``[1]`` (or ``[]``) -> ``<module>.weight`` ``[N, K]``:
    compressed-tensors' ``<module>.weight_packed`` and ``weight_global_scale`` (a divisor), or with ``modelopt``
    ModelOpt's ``<module>.weight`` and ``weight_scale_2`` (a multiplier)."""
    decoders, shapes = {}, {}
    release = "ModelOpt" if modelopt else "compressed-tensors"
    for key, (stored, shape) in headers.items():
        if not key.endswith(".weight" if modelopt else ".weight_packed") or (modelopt and stored != "U8" and (
                f"{key}_scale" not in headers)):
            continue  # (a ModelOpt release's modules it excludes keep float weights)
        base = key if modelopt else key.removesuffix("_packed")  # (``<module>.weight``: the float weight's key)
        scale, global_scale = f"{base}_scale", f"{base}_scale_2" if modelopt else f"{base}_global_scale"
        if stored != "U8" or len(shape) != 2:
            raise ValueError(f"{key} is {stored} {list(shape)}, not NVFP4 codes (U8 [N, K/2], two values a byte)")
        want = (shape[0], -(-2 * shape[1] // NVFP4_GROUP))
        for factor, (dtypes, shapes_ok, what) in ((scale, (("F8_E4M3",), (want,), f"{list(want)} group scales")), (
                global_scale, (("F32",), ((1,), ()), "[1] global scale"))):
            if factor not in headers:
                raise ValueError(f"{key} is NVFP4 without its {factor}; the {release} checkpoint is incomplete: "
                                 f"download it again")
            if headers[factor][0] not in dtypes or tuple(headers[factor][1]) not in shapes_ok:
                raise ValueError(f"{factor} is {headers[factor][0]} {list(headers[factor][1])}, not the "
                                 f"{dtypes[0]} {what} that NVFP4 {list(shape)} needs")
        decode = dequantize_modelopt_nvfp4 if modelopt else dequantize_nvfp4
        decoders[base] = ((key, scale, global_scale), partial(decode, dtype=dtype))
        shapes[base] = (shape[0], 2 * shape[1])
    return decoders, shapes


def _mxfp4_decoders(headers: dict, dtype) -> tuple[dict, dict]:
    """(decoders, float shapes) of an MXFP4 release (GPT-OSS)."""
    decoders, shapes = {}, {}
    for key, (stored, shape) in headers.items():
        if not key.endswith("_blocks"):
            continue
        base = key.removesuffix("_blocks")
        scales = f"{base}_scales"
        if stored != "U8" or len(shape) != 4 or shape[-1] != 16:
            raise ValueError(f"{key} is {stored} {list(shape)}, not MXFP4 blocks (U8 [E, N, G, 16])")
        if headers.get(scales, (None, None))[0] != "U8" or tuple(headers[scales][1]) != tuple(shape[:3]):
            got = f"{headers[scales][0]} {list(headers[scales][1])}" if scales in headers else "missing"
            raise ValueError(f"{scales} is {got}, not the U8 {list(shape[:3])} scales {key} needs")
        decoders[base] = ((key, scales), partial(dequantize_mxfp4, dtype=dtype))
        shapes[base] = (shape[0], 32 * shape[2], shape[1])
    return decoders, shapes


def _merged_scale_keys(key: str, experts) -> list[tuple[str, int, int]]:
    """The factors transformers saves for a per-expert weight ``<experts>.<e>.<projection>.weight`` (its
    merged tensor's ``<experts>.gate_up_proj_scale_inv`` ``[E, a, b]``, the gate the first of its two parts, or
    ``down_proj``'s, or ``up_proj``'s without a gate): [(key, part, parts)], the likelier first; none for others."""
    found = re.match(r"(.+\.experts)\.\d+\.(\w+)\.weight$", key)
    if not experts or not found:
        return []
    base, name = found.groups()
    return {experts[0]: [(f"{base}.gate_up_proj_scale_inv", 0, 2)],
            experts[1]: [(f"{base}.gate_up_proj_scale_inv", 1, 2), (f"{base}.up_proj_scale_inv", 0, 1)],
            experts[2]: [(f"{base}.down_proj_scale_inv", 0, 1)]}.get(name, [])


def _grid_scale_keys(key: str, experts, renames) -> list[tuple[str, int, int]]:
    """Where transformers saves ``key``'s factors: [(key, part, parts)], ``<key>_scale_inv``, the name it loads a
    whole experts tensor as (``renames``) with ``_scale_inv``, or a per-expert weight's merged tensor's
    (:func:`_merged_scale_keys`)."""
    loaded = [(pattern.sub(target, key), part, parts) for pattern, target, part, parts in renames]
    return [(f"{key}_scale_inv", 0, 1)] + [(f"{name}_scale_inv", part, parts) for name, part, parts in loaded
                                           if name != key] + _merged_scale_keys(key, experts)


def _fp8_grid(key: str, shape, headers: dict, experts, renames, dtype) -> Optional[tuple[tuple[str, ...], Callable]]:
    """transformers' per-tensor FP8 (``FineGrainedFP8Config`` without a ``weight_block_size``): ``key``'s
    ``<key>_scale_inv`` (``[]`` or ``[1]``, or ``[..., a, b]``: a block of N/a rows and K/b columns each, as
    transformers' ``Fp8Dequantize`` derives it, ``[1, 1]`` as it saves a Linear's), or, for a per-expert weight, its
    expert's factors in the merged tensor's (:func:`_merged_scale_keys`: saved so, the weights split back), or a
    renamed experts tensor's under the name transformers loads it as (:func:`_grid_scale_keys`); the
    (stored keys, decoder), None where there are none. Blocks that do not divide the matrix are refused."""
    scale, part, parts = next(((s, p, n) for s, p, n in _grid_scale_keys(key, experts, renames) if s in headers),
                              (None, 0, 1))
    if scale is None:
        return None
    merged = (scale, part, parts) in _merged_scale_keys(key, experts)
    expert = int(key.rsplit(".", 3)[-3]) if merged else None
    sdtype, sshape = headers[scale][0], tuple(headers[scale][1])
    if sshape in ((), (1,)) and len(shape) == 2 and not merged:
        sshape = (1, 1)  # (a Linear's one factor, as FP8Linear holds it)
    (n, k), (a, b) = (shape[-2:] if len(shape) >= 2 else (0, 0)), (sshape[-2:] if len(sshape) >= 2 else (0, 0))
    # (the leading sizes: a merged tensor's experts hold this one; otherwise they are the weight's own)
    lead = (len(sshape) == 3 and expert < sshape[0]) if merged else sshape[:-2] == tuple(shape[:-2])
    if not (n and lead and a and b) or (n * parts) % a or k % b or sdtype not in FP8_SCALE_DTYPES:
        raise ValueError(f"{scale} is {sdtype} {list(headers[scale][1])}, not the scales "
                         f"({', '.join(FP8_SCALE_DTYPES)}) of equal blocks that {headers[key][0]} {list(shape)}"
                         + (f" (expert {expert}, part {part + 1} of {parts} of its rows)" if merged else "")
                         + " needs: [] or [1], or [..., a, b] with a dividing its rows and b its columns")
    return (key, scale), partial(_dequantize_fp8_grid, expert=expert if merged else None, part=part, parts=parts,
                                 dtype=dtype)


def _dequantize_fp8_grid(w: torch.Tensor, scale_inv: torch.Tensor, *, expert, part, parts, dtype) -> torch.Tensor:
    """``w`` ``[..., N, K]`` times the factors ``scale_inv`` of equal blocks (:func:`_fp8_grid`); of a merged
    tensor's expert ``expert`` where not None; of rows ``part`` of ``parts`` (each row's factors picked out)."""
    n, k = w.shape[-2:]
    if scale_inv.dtype == torch.uint8:
        scale_inv = scale_inv.view(torch.float8_e8m0fnu)
    grid = scale_inv.float().reshape(1, 1) if scale_inv.dim() < 2 else scale_inv.float()
    grid = grid if expert is None else grid[expert]
    if expert is not None or parts > 1:
        grid = grid.repeat_interleave(n * parts // grid.shape[-2], -2)[..., part * n:(part + 1) * n, :]
    return dequantize_fp8_blocks(w, grid, block=(n // grid.shape[-2], k // grid.shape[-1]), dtype=dtype)


def _fp8_scale_key(key: str, headers: dict) -> Optional[str]:
    """The factors of an FP8 release's weight ``key``: ``<key>_scale_inv`` (DeepSeek-V3's layout), ``<name>.scale``
    (DeepSeek-V4's) or ``<name>.qscale_weight`` (Mistral Large 4's), as transformers reads them; None for none."""
    base = key.removesuffix(".weight")
    for scale in (f"{key}_scale_inv", f"{base}.scale", f"{base}.qscale_weight"):
        if scale in headers and scale != key:
            return scale
    return None
