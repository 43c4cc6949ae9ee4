"""transformers integration: ExpertsInt8Config / quantize_ on tiny random models of every supported architecture.

Each architecture's tiny model is written with ``save_pretrained`` (real per-expert keys on disk, bf16),
loaded through ExpertsInt8Config, compared with the bf16 model, generated from, saved and reloaded.
"""

from __future__ import annotations

import copy
import glob
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Optional

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from experts_int8 import ExpertsInt8Config, Int8Experts, quantize_, select_experts  # noqa: E402
from experts_int8.evaluate import routing_quality  # noqa: E402
from experts_int8.checkpoint import from_fused_layout  # noqa: E402
from experts_int8.integrations.transformers import (  # noqa: E402
    ARCHITECTURES,
    TensorMismatchError,
    _arch,
    _layout_of,
    find_experts,
    routing_options,
    to_fused_layout,
    verify_int8_model,
)
from experts_int8.layer import w13_name  # noqa: E402
from experts_int8.parallel import ParallelExperts, shard_experts  # noqa: E402
from experts_int8.quant import dequantize_weights, quantize_weights  # noqa: E402

from models import (  # noqa: E402
    ARCH_NAMES, CLAMPED_NAMES, CLAMPED_TEXT_TYPES, COMMON, VIDEO_NAMES, VISION_LANGUAGE_NAMES, auto_class, image_inputs, tiny_config,
    tiny_image_config, tiny_model,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# device_map needs accelerate; on CPU the default placement is the CPU anyway.
ON_DEVICE = {"device_map": "cuda"} if DEVICE == "cuda" else {}


def _w13(module, suffix: str = ""):
    """The experts' first projection (gate_up_proj, or up_proj without a gate), or its ``suffix`` tensor."""
    return getattr(module, w13_name(module) + suffix)


def _float_experts(model):
    return [(n, m) for n, m in find_experts(model) if not isinstance(m, Int8Experts)]


def _headers(path):
    out = {}
    for fn in glob.glob(os.path.join(path, "*.safetensors")):
        with safe_open(fn, "pt") as f:
            for k in f.keys():
                out[k] = (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape()))
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> directory of a bf16 checkpoint written by save_pretrained (built lazily, once)."""
    cache = {}

    def get(arch):
        if arch not in cache:
            path = tmp_path_factory.mktemp(arch) / "bf16"
            tiny_model(arch, dtype=torch.bfloat16).save_pretrained(path)
            cache[arch] = str(path)
        return cache[arch]

    return get


@pytest.fixture(scope="module")
def int8_models(checkpoints):
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = AutoModelForCausalLM.from_pretrained(
                checkpoints(arch), quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16, **ON_DEVICE)
        return cache[arch]

    return get


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, COMMON["vocab_size"], (2, 12), generator=g).to(DEVICE)


# ---------------------------------------------------------------------------------------------------
# Per architecture: accuracy, int8 in memory, generation, save -> reload
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_int8_model_close_to_bf16(arch, checkpoints, int8_models):
    """>= 30 dB with the bf16 model's routing, per MoE layer and for the logits; free-running too where no
    top-k choice flipped. (The tiny random routers have near-ties: on the H200, GPT-OSS's int8 noise flips
    a choice in its second layer and the free-running SNR reads 25.9 dB, while its bf16 and fp32 models
    flip one against the other on CPU; benchmarks/NOTES.md item 181.)"""
    ref_model = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.bfloat16, **ON_DEVICE)
    quality = routing_quality(ref_model, int8_models(arch), _inputs())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, (arch, quality)
    assert quality["logits_snr_db_reference_routing"] >= 30.0, (arch, quality)
    # The quantization must actually change something (not a float model in disguise).
    assert quality["logits_snr_db_reference_routing"] < float("inf"), (arch, quality)
    if not any(quality["tokens_with_changed_topk_per_layer"]):
        assert quality["logits_snr_db_free_running"] >= 30.0, (arch, quality)


def test_routing_quality_refuses_models_that_differ():
    with pytest.raises(ValueError, match="the models differ: the float model has 2 MoE layers, the int8 model 1"):
        routing_quality(tiny_model("mixtral"), quantize_(tiny_model("deepseek_v2")), _inputs().cpu())


def test_routing_quality_refuses_an_experts_module_run_unlike_its_float_one_or_none_run():
    """Same layers, but a MoE block of one model that skips its experts: the counts differ, named by module; and
    where neither model runs any experts there is nothing to measure."""
    model = tiny_model("mixtral")
    int8_model = quantize_(copy.deepcopy(model))
    skip = lambda hidden_states: hidden_states  # noqa: E731 - a MoE block that never calls its experts
    int8_model.model.layers[1].mlp.forward = skip
    with pytest.raises(ValueError, match=r"the models differ: model\.layers\.1\.mlp\.experts ran 1 times in the "
                                         r"float model, 0 in the int8 model"):
        routing_quality(model, int8_model, _inputs().cpu())
    for m in (model, int8_model):
        for layer in m.model.layers:
            layer.mlp.forward = skip
    with pytest.raises(ValueError, match="no MoE layer ran on these inputs"):
        routing_quality(model, int8_model, _inputs().cpu())


def test_routing_quality_runs_the_models_in_eval_mode():
    """PhiMoE's router samples its top-k in training mode: models left in it gave other numbers each call."""
    model = tiny_model("phimoe").train()
    int8_model = quantize_(copy.deepcopy(model)).train()
    first, second = (routing_quality(model, int8_model, _inputs().cpu()) for _ in range(2))
    assert first == second
    assert model.training and int8_model.training


def test_routing_quality_of_experts_the_inputs_do_not_reach(caplog):
    """Ernie 4.5 VL's vision experts run on image tokens only: on a text prompt routing_quality measures the
    text experts (it said the models differ)."""
    config_class = getattr(transformers, "Ernie4_5_VLMoeConfig", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no Ernie4_5_VLMoeConfig")
    text = dict(COMMON, head_dim=16, num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=[32, 16],
                moe_num_experts=4, moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]})
    config = config_class(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                               intermediate_size=32, out_hidden_size=64))
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config).eval()
    int8_model = quantize_(copy.deepcopy(model))
    names = [name for name, _ in find_experts(int8_model)]
    assert any("vision_moe" in name for name in names) and verify_int8_model(int8_model) == len(names) == 2
    quality = routing_quality(model, int8_model, _inputs().cpu())
    assert len(quality["moe_layer_snr_db_reference_routing"]) == 1, quality  # (its MoE layer's text experts)
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality
    assert 30.0 <= quality["logits_snr_db_reference_routing"] < float("inf"), quality


def test_verify_int8_model_refuses_unloaded_mismatched_or_corrupt_experts_tensors():
    """Each tensor of an int8 experts module is checked: still on the meta device, another dtype, a NaN, infinite
    or zero scale, a non-finite bias; the error names the module's tensor."""
    model = quantize_(tiny_model("gpt_oss"))
    name, m = find_experts(model)[0]
    assert verify_int8_model(model) == 2
    good = {t: getattr(m, t).clone() for t in ("down_proj", "down_proj_scale", "down_proj_bias")}
    m.down_proj_scale = torch.empty(good["down_proj_scale"].shape, device="meta")
    with pytest.raises(ValueError, match=f"{name}.down_proj_scale was not loaded"):
        verify_int8_model(model)
    m.down_proj_scale = good["down_proj_scale"].clone()
    m.down_proj = torch.nn.Parameter(good["down_proj"].float(), requires_grad=False)
    with pytest.raises(TensorMismatchError, match=f"{name}.down_proj: expected torch.int8"):
        verify_int8_model(model)
    m.down_proj = torch.nn.Parameter(good["down_proj"], requires_grad=False)
    for bad in (float("nan"), float("inf"), 0.0):
        m.down_proj_scale[0, 0] = bad
        with pytest.raises(ValueError, match=f"{name}.down_proj_scale holds non-finite or non-positive scales"):
            verify_int8_model(model)
        m.down_proj_scale.copy_(good["down_proj_scale"])
    m.down_proj_bias[1, 2] = float("inf")
    with pytest.raises(ValueError, match=f"{name}.down_proj_bias: expected finite float"):
        verify_int8_model(model)
    m.down_proj_bias.copy_(good["down_proj_bias"])
    assert verify_int8_model(model) == 2


def test_verify_int8_model_checks_the_weights_accelerate_offloads():
    """A module offloaded by accelerate holds its int8 weights on the meta device and reads them from its hook's
    weights map at each forward: those are checked."""
    accelerate_hooks = pytest.importorskip("accelerate.hooks")
    model = quantize_(tiny_model("mixtral"))
    name, m = find_experts(model)[0]
    weights = {t: v.clone() for t, v in m.state_dict().items()}
    accelerate_hooks.add_hook_to_module(m, accelerate_hooks.AlignDevicesHook(execution_device="cpu", offload=True,
                                                                             weights_map=weights))
    assert m.down_proj.device.type == "meta" and verify_int8_model(model) == 2
    weights["down_proj"] = weights["down_proj"].to(torch.int16)
    with pytest.raises(TensorMismatchError, match=f"{name}.down_proj: expected torch.int8 .* got torch.int16"):
        verify_int8_model(model)
    del weights["down_proj"]
    with pytest.raises(ValueError, match=f"{name}.down_proj was not loaded"):
        verify_int8_model(model)


def test_verify_int8_model_refuses_float_experts_unless_left_float_by_the_config():
    model = tiny_model("mixtral")
    with pytest.raises(ValueError, match=r"routed experts model\.layers\.0\.mlp\.experts \(MixtralExperts\) were "
                                         r"left in torch\.float32; expected int8"):
        verify_int8_model(model)
    names = [name for name, _ in find_experts(model)]
    assert verify_int8_model(model, ExpertsInt8Config(modules_to_not_convert=names)) == 0


def test_quantize_refuses_a_module_that_is_no_transformers_model():
    with pytest.raises(TypeError, match="expected a transformers PreTrainedModel \\(with .config\\), got Sequential"):
        quantize_(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_quantize_with_torchaos_filter_fn_names_modules_to_not_convert():
    model = tiny_model("mixtral")
    with pytest.raises(TypeError, match=r"no filter_fn: .*ExpertsInt8Config\(modules_to_not_convert=\[\.\.\.\]\)"):
        quantize_(model, ExpertsInt8Config(), filter_fn=lambda module, name: True)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['device'\]"):
        quantize_(model, device="cpu")
    assert not any(isinstance(m, Int8Experts) for m in model.modules())  # (left float)


def test_quantize_refuses_experts_the_kernel_would_compute_otherwise_and_leaves_the_model_float():
    """GPT-OSS experts with another clamped SwiGLU or without their biases, and experts with a norm after each
    expert (has_post_expert_norm): refused by name, before any module is converted."""
    cases = [("gpt_oss", lambda e: setattr(e, "alpha", 1.5), "this model uses alpha=1.5, limit=7.0"),
             ("gpt_oss", lambda e: setattr(e, "limit", 9.0), "this model uses alpha=1.702, limit=9.0"),
             ("gpt_oss", lambda e: setattr(e, "down_proj_bias", None), "expected GPT-OSS experts gate_up_proj"),
             ("mixtral", lambda e: setattr(e, "has_post_expert_norm", True), "has_post_expert_norm=True")]
    for arch, change, message in cases:
        model = tiny_model(arch)
        name, experts = find_experts(model)[1]
        change(experts)
        with pytest.raises(ValueError, match=re.escape(f"{name}: ") + ".*" + re.escape(message)):
            quantize_(model)
        assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model)), arch


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_every_routed_expert_is_int8(arch, checkpoints, int8_models):
    ref_model = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.bfloat16)
    q_model = int8_models(arch)
    n_moe = len(find_experts(ref_model))
    assert n_moe >= 1
    int8_modules = [m for _, m in find_experts(q_model) if isinstance(m, Int8Experts)]
    assert len(int8_modules) == n_moe and not _float_experts(q_model)
    assert verify_int8_model(q_model) == n_moe
    for m in int8_modules:
        assert _w13(m).dtype == torch.int8 and m.down_proj.dtype == torch.int8
        assert _w13(m, "_scale").dtype == torch.float32 and m.down_proj_scale.dtype == torch.float32
        assert not _w13(m).requires_grad
    # No 3-D float tensor anywhere in the model (all routed experts are int8)...
    floats_3d = [n for n, p in q_model.state_dict().items() if p.dim() == 3 and p.is_floating_point()
                 and "experts" in n]
    assert floats_3d == []
    # ...and everything else (attention, routers, shared experts, embeddings, lm_head) keeps its dtype.
    ref_sd = ref_model.state_dict()
    int8_names = {f"{n}.{t}" for n, m in find_experts(q_model) for t in m.state_dict()}
    for name, value in q_model.state_dict().items():
        if name in int8_names:
            continue
        assert name in ref_sd, name
        assert value.dtype == ref_sd[name].dtype, name
        assert torch.equal(value.cpu(), ref_sd[name].cpu()), name


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_greedy_generation_32_tokens(arch, int8_models):
    model = int8_models(arch)
    x = _inputs(1)[:1, :5]
    out = model.generate(x, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert out.shape == (1, 5 + 32)
    assert torch.equal(out[:, :5], x)
    assert 0 <= int(out.min()) and int(out.max()) < COMMON["vocab_size"]


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_save_reload_identical(arch, int8_models, tmp_path):
    model = int8_models(arch)
    model.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith(".safetensors") for f in files) and not any(f.endswith(".bin") for f in files)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "experts_int8"
    headers = _headers(tmp_path)
    n_moe = len(find_experts(model))
    int8_keys = [k for k, (dt, _) in headers.items() if dt == "I8"]
    scale_keys = [k for k in headers if k.endswith("_proj_scale")]
    assert len(int8_keys) == 2 * n_moe and len(scale_keys) == 2 * n_moe
    assert all(headers[k][0] == "F32" for k in scale_keys)
    # No float expert weight went to disk (expert biases, GPT-OSS, are fp32 [E, N] vectors).
    assert not [k for k, (dt, _) in headers.items() if ".experts." in k and dt in ("BF16", "F16", "F32")
                and not k.endswith("_scale") and not k.endswith("_proj_bias")]
    assert all(dt == "F32" and len(shape) == 2 for k, (dt, shape) in headers.items() if k.endswith("_proj_bias"))

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, **ON_DEVICE)
    assert verify_int8_model(reloaded) == n_moe
    x = _inputs(2)
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)
    for (n1, m1), (n2, m2) in zip(find_experts(model), find_experts(reloaded)):
        assert n1 == n2
        assert torch.equal(_w13(m1), _w13(m2)) and torch.equal(m1.down_proj_scale, m2.down_proj_scale)


def _assert_routing_table_matches_router(model, tokens: Optional[int] = None):
    """On the first MoE layer routed by its logits (DeepSeek-V4's first are routed by token ids), for the model's
    own input (or ``tokens`` random hidden states fed to the layer)."""
    logits_seen, routed_seen = [], []
    name, experts = next((name, experts) for name, experts in find_experts(model)
                         if not hasattr(getattr(model.get_submodule(name.rpartition(".")[0]), _arch(model).router),
                                        "tid2eid"))
    block = model.get_submodule(name.rpartition(".")[0])
    router = getattr(block, _arch(model).router)
    # The router's output varies across architectures and transformers versions (logits, (logits, weights,
    # ids), or Granite's (ids, weights, logits) in 5.17): the logits are its float tensor over all experts.
    # The experts module always receives (hidden_states, top_k_index, top_k_weights).
    def logits_of(out):
        return next(t for t in (out if isinstance(out, tuple) else (out,))
                    if t.is_floating_point() and t.shape[-1] == experts.num_experts)

    hooks = [router.register_forward_hook(lambda mod, args, out: logits_seen.append(logits_of(out))),
             experts.register_forward_pre_hook(lambda mod, args: routed_seen.append(args[1:3]))]
    try:
        with torch.no_grad():
            if tokens is None:
                model(_inputs(3))
            else:
                hidden = experts.down_proj.shape[1] if experts.down_proj.dim() == 3 else None
                hidden = getattr(model.config.get_text_config(), "hidden_size", hidden)
                block(torch.randn(1, tokens, hidden, generator=torch.Generator().manual_seed(0)).to(
                    device=next(block.parameters()).device, dtype=next(block.parameters()).dtype))
    finally:
        for h in hooks:
            h.remove()
    logits, (ids, weights) = logits_seen[0], routed_seen[0]
    w, i = select_experts(logits, **routing_options(model, block))  # (the logits as the router gave them)
    order_ref, order = ids.sort(dim=-1), i.long().sort(dim=-1)
    assert torch.equal(order_ref.values, order.values)
    tol = dict(rtol=1e-4, atol=1e-5) if weights.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(weights.float().gather(1, order_ref.indices), w.gather(1, order.indices), **tol)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_routing_table_matches_model_router(arch, int8_models):
    """The table's select_experts options reproduce each architecture's own router."""
    _assert_routing_table_matches_router(int8_models(arch))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("arch, overrides", [
    ("lfm2_moe", {}), ("mistral3", {}), ("mistral3", dict(n_group=1, topk_group=1)), ("mixtral", {}),
    ("deepseek_v3", {}), ("minimax_m2", dict(routed_scaling_factor=2.0, norm_topk_prob=False)),
])
def test_routing_table_matches_model_router_on_many_tokens(arch, overrides, dtype):
    """4096 tokens in 16-bit: LFM2's and Mistral 4's routers score in the logits' own dtype, where rounding decides
    near ties (the table scored in fp32 and chose other experts for 19-37 tokens in bf16); MiniMax-M2's router
    always renormalizes and never scales, whatever its config says."""
    _assert_routing_table_matches_router(tiny_model(arch, dtype=dtype, **overrides).to(DEVICE), tokens=4096)


@pytest.mark.parametrize("arch, overrides", [
    ("cohere2_moe", dict(expert_selection_fn="sigmoid")),
    ("cohere2_moe", dict(expert_selection_fn="sigmoid", norm_topk_prob=False)),
    ("mistral3", dict(n_group=1, topk_group=1)),  # (Mistral 4 with one group: no grouped top-k)
])
def test_routing_table_matches_model_router_in_other_router_settings(arch, overrides):
    """Router settings the tiny models leave at one value: the table follows the router in the others too."""
    _assert_routing_table_matches_router(tiny_model(arch, dtype=torch.bfloat16, **overrides).to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", CLAMPED_NAMES)
def test_routing_table_matches_clamped_models_routers(arch, dtype):
    """The rows of the clamped-SwiGLU types on 4096 tokens: DeepSeek-V3's grouped sigmoid router (HY-V4,
    GLM-5-Next, Ling-hybrid), MiniMax-M2's in the gate with the block scaling after the experts (MiniMax-M3,
    Step-3.7), DeepSeek-V4's sqrt(softplus) scores of its unconverted logits."""
    _assert_routing_table_matches_router(tiny_model(arch, dtype=dtype).to(DEVICE), tokens=4096)


def test_routing_options_refuse_a_hash_routed_layer():
    """DeepSeek-V4's first layers choose experts by token id: routing_options says so, and the model's int8
    experts still run those layers as the model routes them."""
    model = tiny_model("deepseek_v4")
    name = find_experts(model)[0][0]
    with pytest.raises(ValueError, match="hash-routed: its experts come from the token ids"):
        routing_options(model, model.get_submodule(name.rpartition(".")[0]))
    int8_model = quantize_(copy.deepcopy(model))
    quality = routing_quality(model, int8_model, _inputs().cpu())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality


@pytest.mark.parametrize("arch", CLAMPED_NAMES)
def test_clamped_types_rows_are_their_text_models_types(arch):
    assert tiny_config(arch).get_text_config().model_type == CLAMPED_TEXT_TYPES[arch]


@pytest.mark.parametrize("arch", VISION_LANGUAGE_NAMES)
def test_vision_language_moe_text_model_int8(arch, tmp_path):
    """A vision-language model's MoE text model: int8 while loading through AutoModelForImageTextToText,
    as close to bf16 as the text-only models, its routing row right, identical after save and reload."""
    tiny_model(arch, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    ref_model = auto_class(arch).from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16, **ON_DEVICE)
    model = auto_class(arch).from_pretrained(tmp_path / "bf16", quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16, **ON_DEVICE)
    assert verify_int8_model(model) == len(find_experts(ref_model)) > 0
    quality = routing_quality(ref_model, model, _inputs())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, (arch, quality)
    assert 30.0 <= quality["logits_snr_db_reference_routing"] < float("inf"), (arch, quality)
    _assert_routing_table_matches_router(model)
    model.save_pretrained(tmp_path / "int8")
    reloaded = auto_class(arch).from_pretrained(tmp_path / "int8", **ON_DEVICE)
    with torch.no_grad():
        assert torch.equal(model(_inputs(2)).logits, reloaded(_inputs(2)).logits)


@pytest.mark.parametrize("arch", VISION_LANGUAGE_NAMES)
def test_vision_language_moe_int8_with_images(arch, tmp_path):
    """Images (and videos, where the model takes them) through the int8 model: its text model's experts run on
    the vision tower's features as close to bf16 as on text, quantize_ gives the loaded model's logits, a save
    reloads them and generates the same; no experts module outside the text model."""
    config = tiny_image_config(arch)
    tiny_model(arch, dtype=torch.bfloat16, config=config).save_pretrained(tmp_path / "bf16")
    ref_model = auto_class(arch).from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16, **ON_DEVICE)
    model = auto_class(arch).from_pretrained(tmp_path / "bf16", quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16, **ON_DEVICE)
    names = [name for name, _ in find_experts(ref_model)]
    assert verify_int8_model(model) == len(names) > 0 and all(".language_model." in name for name in names)
    in_memory = auto_class(arch).from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16, **ON_DEVICE)
    quantize_(in_memory)
    model.save_pretrained(tmp_path / "int8")
    reloaded = auto_class(arch).from_pretrained(tmp_path / "int8", **ON_DEVICE)

    def on_device(inputs):
        return {k: v.to(DEVICE, torch.bfloat16 if v.is_floating_point() else v.dtype) for k, v in inputs.items()}

    for video in (False, True) if arch in VIDEO_NAMES else (False,):
        inputs = on_device(image_inputs(arch, config, video=video))
        blank = {k: torch.zeros_like(v) if k.startswith("pixel_values") else v for k, v in inputs.items()}
        with torch.no_grad():  # (the vision features reach the text model)
            assert not torch.equal(ref_model(**inputs).logits, ref_model(**blank).logits)
        quality = routing_quality(ref_model, model, **inputs)
        assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, (arch, video, quality)
        assert 30.0 <= quality["logits_snr_db_reference_routing"] < float("inf"), (arch, video, quality)
        if not any(quality["tokens_with_changed_topk_per_layer"]):
            assert quality["logits_snr_db_free_running"] >= 30.0, (arch, video, quality)
        with torch.no_grad():
            logits = model(**inputs).logits
            assert torch.equal(in_memory(**inputs).logits, logits)
            assert torch.equal(reloaded(**inputs).logits, logits)
    generated = [m.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False) for m in (model, reloaded)]
    assert torch.equal(*generated) and generated[0].shape == (2, inputs["input_ids"].shape[1] + 3)


def test_architecture_table_covers_tested_models():
    text_models = {tiny_config(arch).get_text_config().model_type for arch in VISION_LANGUAGE_NAMES}
    assert set(ARCH_NAMES) | text_models | set(CLAMPED_TEXT_TYPES.values()) == set(ARCHITECTURES)


# ---------------------------------------------------------------------------------------------------
# Loading paths
# ---------------------------------------------------------------------------------------------------
def test_fused_float_checkpoint_gives_same_int8(tmp_path, int8_models):
    """A float checkpoint with fused expert keys (transformers' in-memory layout) loads to the same int8."""
    arch = "qwen3_moe"
    float_model = tiny_model(arch, dtype=torch.bfloat16)
    float_model.save_pretrained(tmp_path, save_original_format=False)
    assert any(k.endswith("experts.gate_up_proj") for k in _headers(tmp_path))
    fused = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config(),
                                                 dtype=torch.bfloat16)
    per_expert = int8_models(arch)
    for (_, a), (_, b) in zip(find_experts(fused), find_experts(per_expert)):
        assert torch.equal(a.gate_up_proj.cpu(), b.gate_up_proj.cpu())
        assert torch.equal(a.down_proj_scale.cpu(), b.down_proj_scale.cpu())


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_quantize_in_memory_matches_loading_and_frees(arch, checkpoints, int8_models):
    model = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.bfloat16, **ON_DEVICE)
    old = [m for _, m in find_experts(model)]
    w13 = to_fused_layout(_arch(model).layout, w13_name(old[0]), _w13(old[0]).detach().clone())
    quantize_(model)
    assert all(p.device.type == "meta" for m in old for p in m.parameters())  # the bf16 tensors were released
    loaded = int8_models(arch)
    for (_, a), (_, b) in zip(find_experts(model), find_experts(loaded)):
        assert torch.equal(_w13(a), _w13(b)) and torch.equal(_w13(a, "_scale"), _w13(b, "_scale"))
    q, s = quantize_weights(w13)
    assert torch.equal(_w13(find_experts(model)[0][1]), q)
    x = _inputs(4)
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)
    assert model.config.quantization_config.quant_method == "experts_int8"


def test_quantize_in_memory_saves_and_reloads(tmp_path):
    model = tiny_model("olmoe", dtype=torch.bfloat16)
    quantize_(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    x = _inputs(5).cpu()
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)


def test_adapters_train_through_the_int8_experts():
    """The gradient of a layer before the experts (an adapter's place) through the kernel's op equals the
    reference path's; transformers is told the model trains (with adapters: its experts stay frozen)."""
    grads = {}
    for backend in ("triton", "torch"):
        model = quantize_(tiny_model("olmoe", dtype=torch.float32)).to(DEVICE)  # (Triton on CPU: the interpreter)
        assert model.hf_quantizer.is_trainable
        for _, m in find_experts(model):
            m.backend = backend
        model.requires_grad_(False)
        first = model.model.layers[0].self_attn.q_proj.weight
        first.requires_grad_(True)
        loss = model(_inputs(9), labels=_inputs(9)).loss
        loss.backward()
        grads[backend] = first.grad
    assert grads["triton"].abs().sum() > 0
    # (on a GPU the kernel's fp32 products run on TF32 tensor cores; the backward is the reference path's)
    tol = dict(rtol=1e-4, atol=1e-6) if DEVICE == "cpu" else dict(rtol=2e-2, atol=1e-4)
    assert torch.allclose(grads["triton"], grads["torch"], **tol)


def test_a_sharded_int8_save_over_an_unsharded_float_one_says_which_file_was_read(tmp_path):
    """save_pretrained with shards leaves an earlier unsharded save's model.safetensors in the folder, and
    transformers reads that one first: the refusal of its float experts says so (it only said 'not found')."""
    tiny_model("olmoe", dtype=torch.bfloat16).save_pretrained(tmp_path)
    quantize_(tiny_model("olmoe", dtype=torch.bfloat16)).save_pretrained(tmp_path, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "model.safetensors.index.json").is_file()
    with pytest.raises(ValueError, match="not found in the checkpoint(.|\n)*model.safetensors left by an earlier "
                                         "save_pretrained"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    AutoModelForCausalLM.from_pretrained(tmp_path)  # (the shards hold the int8 model)


def test_bare_import_is_enough_to_reload_an_int8_checkpoint(tmp_path):
    # transformers skips an unknown quant_method with only a warning and loads the int8 tensors as float
    # weights, so `import experts_int8` alone must register it (a fresh interpreter: this one has it already).
    model = tiny_model("olmoe", dtype=torch.bfloat16)
    quantize_(model)
    model.save_pretrained(tmp_path / "int8")
    x = _inputs(7).cpu()
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys, torch, experts_int8\n"
        "from transformers import AutoModelForCausalLM\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "with torch.no_grad():\n"
        "    torch.save(m(torch.load(sys.argv[2])).logits, sys.argv[3])\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "int8"), str(tmp_path / "x.pt"),
                    str(tmp_path / "logits.pt")], check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    with torch.no_grad():
        assert torch.equal(model(x).logits, torch.load(tmp_path / "logits.pt"))


@pytest.mark.parametrize("first", ["experts_int8", "transformers", "transformers.models.mixtral"])
def test_the_integration_loads_with_transformers_not_before(first):
    """The integration costs about two seconds of imports: a kernel user or the CLI's help without transformers
    does not pay them; whichever of the two is imported first, the quant method is registered once both are."""
    script = (
        "import sys, importlib\n"
        f"importlib.import_module({first!r})\n"
        "import experts_int8\n"
        f"assert ('transformers' in sys.modules) == {first != 'experts_int8'}\n"
        "import transformers\n"
        "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
        "assert 'experts_int8' in AUTO_QUANTIZER_MAPPING\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_a_lookup_of_transformers_before_its_import_still_registers_the_quant_method():
    """``importlib.util.find_spec("transformers")`` (how accelerate's is_transformers_available() and other libraries
    check that it is installed) between ``import experts_int8`` and transformers' import took the import hook away:
    the import that followed registered nothing, and an int8 checkpoint would load as float weights. A reload of
    experts_int8 keeps one hook."""
    script = (
        "import sys, importlib, importlib.util\n"
        "import experts_int8\n"
        "importlib.reload(experts_int8)\n"
        "assert importlib.util.find_spec('transformers') is not None\n"
        "assert 'transformers' not in sys.modules\n"
        "import transformers\n"
        "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
        "assert 'experts_int8' in AUTO_QUANTIZER_MAPPING\n"
        "assert not [f for f in sys.meta_path if getattr(f, '_experts_int8_hook', False)]\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("layout", ["fused", "transposed", "gpt_oss"])
def test_from_fused_layout_inverts_to_fused_layout(layout):
    e, h, i = 3, 8, 6
    shapes = {"fused": {"gate_up_proj": (e, 2 * i, h), "down_proj": (e, h, i)},
              "transposed": {"gate_up_proj": (e, h, 2 * i), "down_proj": (e, i, h)},
              "gpt_oss": {"gate_up_proj": (e, h, 2 * i), "down_proj": (e, i, h)}}[layout]
    shapes |= {"gate_up_proj_bias": (e, 2 * i), "down_proj_bias": (e, h)}
    for tensor, shape in shapes.items():
        w = torch.randn(shape)
        ours = to_fused_layout(layout, tensor, w)
        assert tuple(ours.shape[-2:]) == {"gate_up_proj": (2 * i, h), "down_proj": (h, i)}.get(tensor, ours.shape[-2:])
        assert torch.equal(from_fused_layout(layout, tensor, ours), w)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss", "nemotron_h"])  # per-expert keys; interleaved + biases; no gate
def test_dequantize_gives_back_the_models_float_experts(arch, checkpoints, tmp_path):
    float_model = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(checkpoints(arch), quantization_config=ExpertsInt8Config(),
                                                 dtype=torch.bfloat16, **ON_DEVICE)
    x = _inputs(8)
    with torch.no_grad():
        int8_logits = model(x).logits
    layout = _layout_of(model)
    expected = {}  # q * scale of every int8 tensor, in the checkpoint's layout
    for name, m in find_experts(model):
        w13 = m.w13_name
        assert all(p.device.type == "meta" for p in m._float_module.parameters())  # no float memory held
        expected[name] = {w13: dequantize_weights(_w13(m), _w13(m, "_scale"), torch.bfloat16),
                          "down_proj": dequantize_weights(m.down_proj, m.down_proj_scale, torch.bfloat16)}
        if m.has_bias:
            expected[name] |= {f"{w13}_bias": _w13(m, "_bias").bfloat16(), "down_proj_bias": m.down_proj_bias.bfloat16()}
        expected[name] = {t: from_fused_layout(layout, t, v) for t, v in expected[name].items()}

    hooked = None
    if importlib.util.find_spec("accelerate"):  # a placement hook moves with the module it placed
        from accelerate.hooks import AlignDevicesHook, add_hook_to_module

        hooked = find_experts(model)[0][0]
        add_hook_to_module(model.get_submodule(hooked), AlignDevicesHook(execution_device=x.device))
    model.dequantize()
    assert not model.is_quantized and getattr(model.config, "quantization_config", None) is None
    if hooked:
        assert isinstance(model.get_submodule(hooked)._hf_hook, AlignDevicesHook)
    floats = dict(find_experts(float_model))
    for name, m in find_experts(model):
        assert type(m) is type(floats[name])
        params = dict(m.named_parameters())
        assert params.keys() == expected[name].keys()
        for t, p in params.items():
            assert torch.equal(p, expected[name][t]) and p.dtype == torch.bfloat16
            assert p.requires_grad == dict(floats[name].named_parameters())[t].requires_grad
    with torch.no_grad():
        logits = model(x).logits
    # The same weights through transformers' float experts instead of the int8 kernel: bf16 rounding apart.
    assert torch.allclose(logits.float(), int8_logits.float(), atol=0.05, rtol=0.02)

    model.save_pretrained(tmp_path)  # the float checkpoint's own keys again, and no quantization_config
    saved, original = ({k: dt for k, (dt, _) in _headers(p).items()} for p in (tmp_path, checkpoints(arch)))
    assert saved.keys() == original.keys()  # (transformers 5.17 wrote fused experts keys: its converters were dropped)
    # the experts' dtypes (transformers 5.17 keeps some router tensors fp32 when a quantizer loads the model)
    assert {k: v for k, v in saved.items() if ".experts." in k} == {
        k: v for k, v in original.items() if ".experts." in k}
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, **ON_DEVICE)
    with torch.no_grad():
        assert torch.equal(reloaded(x).logits, logits)


@pytest.mark.parametrize("first,now", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_dequantize_follows_the_models_dtype_now(first, now):
    # transformers passes config.dtype, which model.to() does not update: bf16 experts in an fp32 model before
    model = quantize_(tiny_model("olmoe", dtype=first)).to(now)
    int8 = {name: (_w13(m), _w13(m, "_scale"), m.down_proj, m.down_proj_scale) for name, m in find_experts(model)}
    model.dequantize()
    for name, m in find_experts(model):
        q13, s13, q2, s2 = int8[name]
        assert m.gate_up_proj.dtype == now and torch.equal(m.gate_up_proj, dequantize_weights(q13, s13, now))
        assert torch.equal(m.down_proj, dequantize_weights(q2, s2, now))


def test_adapters_on_the_int8_weights_themselves_are_refused():
    """A parametrization of an int8 tensor (peft's LoRA with target_parameters) casts its factors to int8:
    they round away and take no gradient, so the adapter would silently train nothing."""
    model = quantize_(tiny_model("olmoe", dtype=torch.float32))
    name, experts = find_experts(model)[0]

    class AddZero(torch.nn.Module):
        def forward(self, w):
            return w

    torch.nn.utils.parametrize.register_parametrization(experts, "gate_up_proj", AddZero(), unsafe=True)
    with pytest.raises(ValueError, match="int8 experts' tensors are parametrized .*dequantize\\(\\) the model first"):
        model(_inputs(10).cpu())


def test_peft_all_linear_on_int8_experts_says_what_to_do():
    """peft's target_modules="all-linear", the usual QLoRA recipe, also puts LoRA on an MoE model's experts (its
    conversion for transformers 5 adds their tensors as target_parameters): the refusal names it, and the layers
    named instead train."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(quantize_(tiny_model("qwen3_moe", dtype=torch.float32)),
                                peft.LoraConfig(r=2, target_modules="all-linear"))
    if not model.peft_config["default"].target_parameters:
        pytest.skip(f"peft {peft.__version__}'s all-linear leaves the experts alone")
    with pytest.raises(ValueError, match="target_modules='all-linear'.*target_modules=\\['q_proj'"):
        model(_inputs(10).cpu())
    model = peft.get_peft_model(quantize_(tiny_model("qwen3_moe", dtype=torch.float32)),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model(_inputs(10).cpu(), labels=_inputs(10).cpu()).loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_A" in n)


def test_loading_a_float_checkpoint_without_some_experts_weights_is_refused(tmp_path):
    """transformers gives weights a checkpoint lacks random values and only logs it: missing experts tensors would
    be int8 placeholders never filled. The load fails, naming them."""
    tiny_model("mixtral", dtype=torch.bfloat16).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not ("layers.1." in k and ".experts." in k)},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape("the checkpoint provided no weights for 2 experts tensors, e.g. "
                                                   "['model.layers.1.mlp.experts.down_proj',")):
        AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config())


def test_dequantize_refuses_what_it_cannot_rebuild():
    model = quantize_(tiny_model("olmoe", dtype=torch.bfloat16))
    name, m = find_experts(model)[0]
    model.set_submodule(name, ParallelExperts(shard_experts(m, "ep", 0, 1), "ep"))
    with pytest.raises(ValueError, match="split across ranks.*dequantize before splitting"):
        model.dequantize()
    hand_made = Int8Experts.from_float(dequantize_weights(_w13(m), _w13(m, "_scale")),
                                       dequantize_weights(m.down_proj, m.down_proj_scale))
    if importlib.util.find_spec("accelerate"):
        from accelerate.hooks import AlignDevicesHook, add_hook_to_module

        model.set_submodule(name, m)
        add_hook_to_module(m, AlignDevicesHook(execution_device="cpu", offload=True, weights_map={}))
        with pytest.raises(ValueError, match=f"{name} is offloaded by accelerate"):
            model.dequantize()
    model.set_submodule(name, hand_made)
    with pytest.raises(ValueError, match=f"{name} was not made by experts_int8's transformers integration"):
        model.dequantize()
    model = quantize_(tiny_model("olmoe", dtype=torch.bfloat16))
    name, m = find_experts(model)[0]
    m.down_proj = torch.nn.Parameter(m.down_proj[:, :, :-8].contiguous(), requires_grad=False)  # (a resized expert)
    with pytest.raises(ValueError, match=re.escape(f"{name}: its int8 tensors") + ".*do not fill its float module"):
        model.dequantize()
    assert all(isinstance(e, Int8Experts) for _, e in find_experts(model))


def test_dequantize_refused_for_a_later_module_changes_nothing(tmp_path):
    """A refusal found at the second experts module left the first already float: the model was still marked int8,
    and save_pretrained wrote a checkpoint that could not load."""
    model = quantize_(tiny_model("mixtral", dtype=torch.float32))
    (first, m0), (second, m1) = find_experts(model)
    model.set_submodule(second, Int8Experts.from_float(dequantize_weights(_w13(m1), _w13(m1, "_scale")),
                                                       dequantize_weights(m1.down_proj, m1.down_proj_scale)))
    ids = _inputs(3).cpu()
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(ValueError, match=f"{second} was not made by experts_int8's transformers integration"):
        model.dequantize()
    assert model.get_submodule(first) is m0 and "_float_module" in m0.__dict__
    assert model.hf_quantizer is not None and model.config.quantization_config is not None
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path)(ids).logits, before)


def test_swapped_experts_modules_keep_the_models_train_or_eval_mode(checkpoints):
    """quantize_ put new modules in training mode into an eval model, and dequantize() brought back the float module
    in the mode it had when it was set aside (training, for one made while loading) whatever the model's now."""
    model = tiny_model("olmoe", dtype=torch.float32)  # (eval)
    quantize_(model)
    assert not any(m.training for m in model.modules())
    model.train()
    model.dequantize()
    assert all(m.training for m in model.modules())
    loaded = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config())
    loaded.dequantize()
    assert not any(m.training for m in loaded.modules())


class _Wrapper(torch.nn.Module):
    """What peft's PeftModel is to the model it holds: a module above it, attributes looked up through it."""

    def __init__(self, model):
        super().__init__()
        self.base_model = model

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.base_model, name)

    def forward(self, *args, **kwargs):
        return self.base_model(*args, **kwargs)


@pytest.mark.parametrize("wrapper", ["stand_in", "peft"])
def test_quantize_a_wrapped_model_marks_the_model_inside(wrapper, tmp_path):
    """quantize_ on peft's PeftModel set the quantizer on the wrapper: the transformers model inside was not marked
    int8, so dequantize() through the wrapper was refused and its save_pretrained wrote a checkpoint that could
    not load."""
    model = tiny_model("olmoe", dtype=torch.float32)
    if wrapper == "peft":
        peft = pytest.importorskip("peft")
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    else:
        wrapped = _Wrapper(model)
    assert quantize_(wrapped) is wrapped
    assert model.is_quantized and isinstance(model.hf_quantizer.quantization_config, ExpertsInt8Config)
    assert "hf_quantizer" not in vars(wrapped)
    x = _inputs(4).cpu()
    with torch.no_grad():
        int8_logits = wrapped(x).logits
    wrapped.dequantize()
    assert not model.is_quantized and not any(isinstance(m, Int8Experts) for _, m in find_experts(model))
    quantize_(wrapped)
    base = wrapped.merge_and_unload() if wrapper == "peft" else model  # (LoRA's B starts at zero: no change)
    base.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path)(x).logits, int8_logits)
    with pytest.raises(ValueError, match="holds several transformers models"):
        quantize_(torch.nn.ModuleList([tiny_model("olmoe"), tiny_model("olmoe")]))


def test_dequantized_experts_stay_frozen_in_a_frozen_model(checkpoints):
    """dequantize() gave trainable float experts to a model frozen after it was quantized or loaded
    (model.requires_grad_(False), a PEFT base under its adapters): they require grad as the model's float
    parameters do, frozen if any is."""
    def experts_grad(model):
        return {p.requires_grad for _, m in find_experts(model) for p in m.parameters()}

    model = quantize_(tiny_model("olmoe", dtype=torch.float32))
    model.requires_grad_(False)
    model.dequantize()
    assert experts_grad(model) == {False} and not any(p.requires_grad for p in model.parameters())

    loaded = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config())
    adapter = loaded.model.layers[0].self_attn.q_proj.weight  # (a LoRA factor's place: the only trainable one)
    loaded.requires_grad_(False)
    adapter.requires_grad_(True)
    loaded.dequantize()
    assert experts_grad(loaded) == {False} and adapter.requires_grad

    loaded = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config())
    loaded.dequantize()  # nothing frozen: trainable, as after a float load
    assert experts_grad(loaded) == {True}

    model = tiny_model("olmoe", dtype=torch.float32)
    for _, m in find_experts(model):
        m.requires_grad_(False)  # only the experts frozen, when quantize_ replaced them: they stay frozen
    quantize_(model).dequantize()
    assert experts_grad(model) == {False}
    assert all(p.requires_grad for n, p in model.named_parameters() if ".experts." not in n)


@pytest.mark.parametrize("arch", ["afmoe", "ernie4_5_moe"])
def test_dequantized_experts_train_in_a_model_that_freezes_its_own_selection_bias(arch):
    """AFMoE and ERNIE 4.5 build their routers' selection bias as a parameter that does not require grad: dequantize()
    read it as a frozen model and gave frozen experts to a model nobody had frozen (a float load's train)."""
    def experts_grad(model):
        return {p.requires_grad for _, m in find_experts(model) for p in m.parameters()}

    model = tiny_model(arch, dtype=torch.float32)
    assert experts_grad(model) == {True}
    assert any(not p.requires_grad for p in model.parameters())  # (the selection bias, as the model builds it)
    quantize_(model).dequantize()
    assert experts_grad(model) == {True}
    quantize_(model).requires_grad_(False)
    model.dequantize()
    assert experts_grad(model) == {False}


def test_hooks_on_an_experts_module_survive_the_swaps_and_their_handles_still_remove_them(checkpoints):
    """quantize_ and dequantize() put a new module in the model: the hooks a user had registered on the one it
    replaced (to record activations, say) stayed behind on it, and never ran again."""
    calls = []

    def recorder(kind):
        return lambda module, *args: calls.append((kind, type(module).__name__))

    def register(module):
        return [module.register_forward_pre_hook(recorder("pre"), with_kwargs=True),
                module.register_forward_hook(recorder("post")),
                module.register_forward_hook(recorder("post_kwargs"), with_kwargs=True, always_call=True),
                module.register_state_dict_post_hook(recorder("state_dict")),
                module.register_load_state_dict_pre_hook(recorder("load"))]

    def run(model, name):
        calls.clear()
        with torch.no_grad():
            model(_inputs(2).cpu())
        model.get_submodule(name).load_state_dict(model.get_submodule(name).state_dict())
        return sorted(set(calls))

    model = tiny_model("olmoe", dtype=torch.float32)
    name = find_experts(model)[0][0]
    handles = register(model.get_submodule(name))
    quantize_(model)
    kinds = ["load", "post", "post_kwargs", "pre", "state_dict"]
    assert run(model, name) == [(k, "Int8Experts") for k in kinds]
    handles[1].remove()  # a handle from before the swap removes its hook from the module in the model now
    assert run(model, name) == [(k, "Int8Experts") for k in kinds if k != "post"]
    later = register(model.get_submodule(name))  # on the int8 module
    model.dequantize()
    assert run(model, name) == [(k, "OlmoeExperts") for k in kinds]
    for handle in handles + later:
        handle.remove()
    assert run(model, name) == []

    loaded = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config())
    name = find_experts(loaded)[0][0]
    handles = register(loaded.get_submodule(name))
    loaded.dequantize()
    assert run(loaded, name) == [(k, "MixtralExperts") for k in kinds]
    handles[0].remove()
    assert run(loaded, name) == [(k, "MixtralExperts") for k in kinds if k != "pre"]


def test_modules_to_not_convert_keeps_those_experts(checkpoints, tmp_path):
    config = ExpertsInt8Config(modules_to_not_convert=["layers.0."])
    model = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=config,
                                                 dtype=torch.bfloat16)
    kinds = {n: type(m).__name__ for n, m in find_experts(model)}
    assert kinds["model.layers.0.mlp.experts"] == "MixtralExperts"
    assert kinds["model.layers.1.mlp.experts"] == "Int8Experts"
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert {n: type(m).__name__ for n, m in find_experts(reloaded)} == kinds
    x = _inputs(6).cpu()
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)
    from experts_int8.run import load_model  # the CLI's loader honours the checkpoint's modules_to_not_convert

    loaded, kind = load_model(tmp_path)
    assert kind == "int8" and {n: type(m).__name__ for n, m in find_experts(loaded)} == kinds


@pytest.mark.parametrize("arch", ["qwen2_moe", "nemotron_h"])  # (nemotron_h: experts without a gate)
def test_experts_interface_backend_runs_float_model(checkpoints, arch):
    """``experts_implementation="experts_int8"`` routes a float model's experts through our fused path."""
    ref = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(checkpoints(arch), dtype=torch.float32,
                                                experts_implementation="experts_int8")
    assert ours.config._experts_implementation == "experts_int8"
    calls = []
    import experts_int8.layer as layer

    orig = layer.fused_experts
    layer.fused_experts = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    try:
        x = _inputs(7).cpu()
        with torch.no_grad():
            torch.testing.assert_close(ours(x).logits, ref(x).logits, rtol=1e-4, atol=1e-4)
    finally:
        layer.fused_experts = orig
    assert len(calls) == len(find_experts(ours))


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------
def _dense_llama():
    cfg = LlamaConfig(**COMMON, intermediate_size=32, num_hidden_layers=1)
    return AutoModelForCausalLM.from_config(cfg)


def test_model_without_moe_raises(tmp_path):
    model = _dense_llama()
    with pytest.raises(ValueError, match="no MoE experts"):
        quantize_(model)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no MoE experts"):
        AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config())


def test_model_without_moe_warns_when_allowed(caplog):
    model = _dense_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING):
        assert quantize_(model, ExpertsInt8Config(allow_no_experts=True)) is model
    assert "no MoE experts" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _dense_with_an_expert_count(kind):
    """A dense model whose config names a number of experts: a tested type's config whose layers are all dense (a
    one-layer Jamba: its first experts layer is layer 1), or Doge's default (``is_moe=False``, num_experts=16384)."""
    if kind == "jamba":
        return AutoModelForCausalLM.from_config(tiny_config("jamba", num_hidden_layers=1))
    config_class = getattr(transformers, "DogeConfig", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no DogeConfig")
    return AutoModelForCausalLM.from_config(config_class(**COMMON, intermediate_size=32, num_hidden_layers=1))


@pytest.mark.parametrize("kind", ["jamba", "doge"])
def test_dense_model_whose_config_names_an_expert_count_has_no_experts(kind, caplog):
    """Such a model is dense, not an MoE of unsupported experts: told it has no experts, and left unchanged with
    allow_no_experts."""
    model = _dense_with_an_expert_count(kind)
    assert not find_experts(model)
    with pytest.raises(ValueError, match="no MoE experts"):
        quantize_(model)
    with caplog.at_level(logging.WARNING):
        assert quantize_(model, ExpertsInt8Config(allow_no_experts=True)) is model
    assert "no MoE experts" in caplog.text


@pytest.mark.parametrize("allow_no_experts", [False, True])
def test_moe_whose_experts_are_modules_of_its_own_is_refused_as_unsupported(allow_no_experts):
    """JetMoE's experts are its own modules, not transformers' standard ones: an MoE all the same, refused as one
    (not told it has no experts, nor left float by allow_no_experts)."""
    config = transformers.JetMoeConfig(**{**COMMON, "num_key_value_heads": 4}, intermediate_size=32,
                                       num_hidden_layers=1, kv_channels=16, num_local_experts=4, num_experts_per_tok=2)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="does not support model_type 'jetmoe': its config declares "
                                         "num_local_experts=4 routed experts, but none is a transformers standard "
                                         "experts module") as err:
        quantize_(model, ExpertsInt8Config(allow_no_experts=allow_no_experts))
    assert all(arch in str(err.value) for arch in ARCH_NAMES)
    assert not getattr(model, "is_quantized", False)


def test_architecture_outside_the_table_with_standard_experts_is_quantized_with_a_warning(caplog):
    model = tiny_model("mellum")
    int8_model = tiny_model("mellum")
    with caplog.at_level(logging.WARNING):
        quantize_(int8_model)
    assert "model_type 'mellum' is not one of the tested architectures" in caplog.text
    assert verify_int8_model(int8_model) == 2
    quality = routing_quality(model, int8_model, _inputs().cpu())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality
    with pytest.raises(ValueError, match="no routing row for model_type 'mellum'"):
        routing_options(int8_model)


@pytest.mark.parametrize("damage, match", [
    ("undecorated", "is not a transformers standard experts module; supported: "),
    ("own_gating", "computes its own gating"),
    # a forward of its own around the standard one (a per-expert norm after it, say) the int8 module would drop
    ("own_forward", "OwnForward replaces the forward of transformers' standard experts module"),
    ("activation", r"layers\.1\.mlp\.experts: activation ReLU\(\) is none of the kernel's activations"),
])
def test_experts_outside_the_standard_are_refused_and_left_alone(damage, match):
    model = tiny_model("mellum")
    _, experts = find_experts(model)[-1]
    if damage == "undecorated":  # no use_experts_implementation flags: a module of its own
        del experts.is_concatenated
    elif damage == "activation":  # the experts' own function decides, whatever the config names
        experts.act_fn = torch.nn.ReLU()
    elif damage == "own_forward":
        standard = type(experts)
        experts.__class__ = type("OwnForward", (standard,),
                                 {"forward": lambda self, *args: 2 * standard.forward(self, *args)})
    else:
        experts.__class__ = type("OwnGating", (type(experts),), {"_apply_gate": lambda self, gate_up: gate_up})
    with pytest.raises(ValueError, match=match) as err:
        quantize_(model)
    if damage == "undecorated":
        assert all(arch in str(err.value) for arch in ARCH_NAMES)
    else:  # the model type leads, what a user searches for and reports
        assert str(err.value).startswith("experts_int8 cannot quantize this 'mellum' model: ")
    assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model))  # nothing half-converted


@pytest.mark.parametrize("gating, accepted", [
    # Beam's: act(gate) * up in fp32, cast back (the kernel's activation is fp32 anyway)
    (lambda self, gate_up: (self.act_fn(gate_up.chunk(2, -1)[0].float()) * gate_up.chunk(2, -1)[1].float()).to(
        gate_up.dtype), True),
    # a clamp (DeepSeek-V4's kind), only where values pass 7: still refused
    (lambda self, gate_up: self.act_fn(gate_up.chunk(2, -1)[0].clamp(max=7.0)) * gate_up.chunk(2, -1)[1], False),
    # one that reads a tensor of its own (the probe cannot run it): refused too
    (lambda self, gate_up: self.act_fn(gate_up.chunk(2, -1)[0]) * gate_up.chunk(2, -1)[1] * self.gate_scale, False),
])
def test_a_gating_of_its_own_is_accepted_where_it_computes_the_kernels(gating, accepted):
    model = tiny_model("mellum")
    for _, experts in find_experts(model):
        experts.__class__ = type("OwnGating", (type(experts),), {"_apply_gate": gating})
    if not accepted:
        with pytest.raises(ValueError, match="computes its own gating"):
            quantize_(model)
        return
    int8_model = quantize_(copy.deepcopy(model))
    assert verify_int8_model(int8_model) == 2
    quality = routing_quality(model, int8_model, _inputs().cpu())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality


# What the kernel computes for the experts of the model types that clamp their SwiGLU in a gate of their own
# (tests/models.py's tiny limits, small enough that the tiny weights cross them)
_CLAMPED_FORMS = {
    "deepseek_v4": dict(activation="silu", swiglu_limit=1.0),
    "hy_v4": dict(activation="silu", swiglu_limit=1.0),
    "glm5_next": dict(activation="silu", swiglu_limit=1.0),
    "step3p7": dict(activation="silu", swiglu_limit=0.5, limit_after_act=True),
    "bailing_hybrid": dict(activation="silu", swiglu_limit=0.5, limit_after_act=True),
    "minimax_m3_vl_text": dict(activation="swiglu_oai", swiglu_limit=1.0, swiglu_alpha=1.702),
}


@pytest.mark.parametrize("arch", CLAMPED_NAMES)
def test_clamped_swiglu_experts_quantize_with_their_own_clamp(arch, tmp_path):
    """DeepSeek-V4, HY-V4, GLM-5-Next (gate clamped before SiLU), Step-3.7, Ling-hybrid (after it) and MiniMax-M3
    (GPT-OSS's form at its own limit): quantized with the clamp their gate computes, read from the module and
    checked by evaluating it, both ways in (quantize_, and while loading) and back from a save."""
    model = tiny_model(arch)
    int8_model = quantize_(copy.deepcopy(model))
    modules = [m for _, m in find_experts(int8_model)]
    assert modules and all(isinstance(m, Int8Experts) for m in modules)
    assert [{"activation": m.activation, **m.swiglu_options} for m in modules] == [_CLAMPED_FORMS[arch]] * len(modules)
    inputs = _inputs().cpu()
    quality = routing_quality(model, int8_model, inputs)
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality
    with torch.no_grad():
        logits = int8_model(inputs).logits
    model.save_pretrained(tmp_path / "float")
    loaded = auto_class(arch).from_pretrained(tmp_path / "float", quantization_config=ExpertsInt8Config(),
                                              dtype=torch.float32)
    loaded.save_pretrained(tmp_path / "int8")
    reloaded = auto_class(arch).from_pretrained(tmp_path / "int8", dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(loaded(inputs).logits, logits, rtol=1e-5, atol=1e-5)
        assert torch.allclose(reloaded(inputs).logits, logits, rtol=1e-5, atol=1e-5)
    # the clamps matter on these weights: the same int8 experts without them fall far short
    for m in modules:
        m.swiglu_limit, m.swiglu_alpha, m.limit_after_act = None, None, False
    loose = routing_quality(model, int8_model, inputs)
    assert max(loose["moe_layer_snr_db_reference_routing"]) < 25.0, loose


def _mellum_gating_its_own_way(limit: float, clamp_at: Optional[float] = None):
    """A tiny Mellum whose experts hold ``limit`` and clamp their SwiGLU (before SiLU) at ``clamp_at``, their own
    limit where None, in an ``_apply_gate`` of their own."""
    model = tiny_model("mellum")
    for _, experts in find_experts(model):
        experts.limit = limit
        experts.__class__ = type("OwnGating", (type(experts),), {"_apply_gate": lambda self, gate_up: self.act_fn(
            gate_up.chunk(2, -1)[0].clamp(max=clamp_at or self.limit)) * gate_up.chunk(2, -1)[1].clamp(
            -(clamp_at or self.limit), clamp_at or self.limit)})
    return model


def test_a_clamp_at_another_limit_than_the_module_holds_is_refused():
    model = _mellum_gating_its_own_way(limit=2.0, clamp_at=7.0)
    with pytest.raises(ValueError, match="computes its own gating"):
        quantize_(model)
    for _, experts in find_experts(model):
        experts.limit = 7.0
    assert verify_int8_model(quantize_(model)) == 2


def test_own_gating_outside_the_standard_experts_forward_is_refused():
    """A listed type's experts whose own _apply_gate is called by a forward of their own (transformers 5.17's
    Step-3.7 experts): the kernel computes the standard forward, so they are refused, saying to upgrade."""
    model = tiny_model("minimax_m3_vl_text")
    for _, experts in find_experts(model):
        del experts.is_concatenated
    with pytest.raises(ValueError, match="in a forward of its own.*upgrade transformers"):
        quantize_(model)


def test_an_infinite_limit_is_no_clamp():
    """An own gate clamping at an infinite limit (transformers' way of saying no clamp) is the plain SiLU."""
    model = _mellum_gating_its_own_way(limit=float("inf"))
    int8_model = quantize_(model)
    assert [(m.activation, m.swiglu_options) for _, m in find_experts(int8_model)] == [("silu", {})] * 2


def test_a_clamp_at_a_limit_past_the_fixed_probe_is_kept():
    """A limit larger than every value of the probe's fixed scales (up to ~3e4) is probed around itself: the clamp
    is kept, not taken for a plain SiLU that only agrees below the limit."""
    model = _mellum_gating_its_own_way(limit=1e5)
    int8_model = quantize_(model)
    assert [m.swiglu_options for _, m in find_experts(int8_model)] == [dict(swiglu_limit=1e5)] * 2


def test_transposed_experts_outside_the_table_are_quantized(monkeypatch):
    """Aria's experts are transformers' is_transposed ones ([E, H, 2I], [E, I, H]) and SiLU while its config's
    hidden_act is gelu_pytorch_tanh: without a row, the module's own flags and act_fn decide."""
    monkeypatch.delitem(ARCHITECTURES, "aria_text")
    model = tiny_model("aria")
    int8_model = copy.deepcopy(model)
    quantize_(int8_model)
    assert verify_int8_model(int8_model) == 2
    assert {m.activation for _, m in find_experts(int8_model)} == {"silu"}
    quality = routing_quality(model, int8_model, _inputs().cpu())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality


def test_experts_interface_refuses_experts_it_would_misread():
    model = tiny_model("aria")
    model.set_experts_implementation("experts_int8")
    says = r"AriaExperts: experts layout not supported by experts_int8 \(is_transposed=True\)"
    with pytest.raises(ValueError, match=r"experts_implementation='experts_int8' on float weights: " + says):
        with torch.no_grad():
            model(_inputs(2).cpu())


@pytest.mark.parametrize("arch", CLAMPED_NAMES)
def test_experts_interface_runs_clamped_float_experts(arch, monkeypatch):
    """A float model whose experts clamp their SwiGLU in their own gate, through experts_implementation=
    "experts_int8": the kernel computes the clamp the module's gate computes (found once per module, not on every
    forward), and the model's logits match its own forward's."""
    model = tiny_model(arch)
    ours = copy.deepcopy(model)
    ours.set_experts_implementation("experts_int8")
    import experts_int8.integrations.transformers as integration

    found = []
    gating_found = integration._gating_found
    monkeypatch.setattr(integration, "_gating_found", lambda m: (found.append(m), gating_found(m))[1])
    x = _inputs(3).cpu()
    with torch.no_grad():
        ref = model(x).logits
        for _ in range(2):
            torch.testing.assert_close(ours(x).logits, ref, rtol=1e-4, atol=1e-4)
    modules = [m for _, m in find_experts(ours)]
    assert len(found) == len(modules) and {id(m) for m in found} == {id(m) for m in modules}
    assert [m._experts_int8_gating[1] for m in modules] == [_CLAMPED_FORMS[arch]] * len(modules)


@pytest.mark.parametrize("arch", ["deepseek_v4", "minimax_m3_vl_text"])
def test_experts_interface_clamped_float_experts_compile_fullgraph(arch):
    """A float model with clamped own-gate experts through experts_implementation="experts_int8", compiled with
    fullgraph=True before any eager call, and again after a limit changes: the gate is evaluated while tracing,
    not behind a graph break (torch.compiler.disable refused fullgraph=True), and the logits are the model's own."""
    model = tiny_model(arch)
    ours = copy.deepcopy(model)
    ours.set_experts_implementation("experts_int8")
    compiled = torch.compile(ours.forward, fullgraph=True, backend="eager")
    x = _inputs(4).cpu()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).logits, model(x).logits, rtol=1e-4, atol=1e-4)
        for m in (model, ours):
            for _, experts in find_experts(m):
                for name in ("limit", "swiglu_limit"):
                    if getattr(experts, name, None) is not None:
                        setattr(experts, name, 0.25)
        torch.testing.assert_close(compiled(x).logits, model(x).logits, rtol=1e-4, atol=1e-4)
    assert all(m._experts_int8_gating[1]["swiglu_limit"] == 0.25 for _, m in find_experts(ours))


def test_experts_interface_refusal_under_compile_says_what_it_refuses():
    """The refusal of an own gating none of the kernel's computes keeps its message inside a compiled forward."""
    model = tiny_model("mellum")
    for _, experts in find_experts(model):
        experts.limit = 2.0  # the gate below clamps at 7
        experts.__class__ = type("OwnGating", (type(experts),), {"_apply_gate": lambda self, gate_up: self.act_fn(
            gate_up.chunk(2, -1)[0].clamp(max=7.0)) * gate_up.chunk(2, -1)[1].clamp(-7.0, 7.0)})
    model.set_experts_implementation("experts_int8")
    with pytest.raises(ValueError, match=r"on float weights: .*computes its own gating"):
        with torch.no_grad():
            torch.compile(model.forward, backend="eager")(_inputs(2).cpu())


def test_experts_interface_refuses_an_own_gating_none_of_the_kernels():
    model = _mellum_gating_its_own_way(limit=2.0, clamp_at=7.0)
    model.set_experts_implementation("experts_int8")
    with pytest.raises(ValueError, match=r"on float weights: .*computes its own gating"):
        with torch.no_grad():
            model(_inputs(2).cpu())


def test_nan_in_checkpoint_names_the_tensor(tmp_path):
    model = tiny_model("mixtral", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    (path,) = glob.glob(str(tmp_path / "*.safetensors"))
    sd = load_file(path)
    bad = "model.layers.1.block_sparse_moe.experts.3.w3.weight"
    assert bad in sd
    sd[bad][2, 5] = float("nan")
    save_file(sd, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"experts\.3\.w3\.weight"):
        AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16)


def test_loading_finite_experts_makes_no_isfinite_pass_over_them(tmp_path, monkeypatch):
    # quantize_rows sees a NaN or Inf in a row's extremes; a pass of its own over every value of every expert
    # (two, with the loader's) took longer than the quantization on the CPU
    model = tiny_model("mixtral", dtype=torch.bfloat16)
    model.save_pretrained(tmp_path)
    sizes, real = [], torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: (sizes.append(t.numel()), real(t))[1])
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config(),
                                                  dtype=torch.bfloat16)
    # (row vectors and the scales are checked; no [N, K] expert matrix is)
    expert = min(t[0].numel() for _, m in find_experts(loaded) for t in (m.gate_up_proj, m.down_proj))
    assert sizes and max(sizes) < expert, (sizes, expert)


def test_nan_in_memory_leaves_model_unchanged():
    model = tiny_model("qwen3_moe", dtype=torch.float32)
    experts = find_experts(model)
    experts[-1][1].down_proj.data[2, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.down_proj\[expert 2\]"):
        quantize_(model)
    assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model))  # nothing half-converted


def test_bad_biases_and_float64_range_leave_model_unchanged():
    """NaN in a GPT-OSS expert bias (of the last experts module), float64 weights past float32's range: refused
    by the check that runs before anything is replaced, naming the tensor and the expert."""
    model = tiny_model("gpt_oss", dtype=torch.float32)
    name, last = find_experts(model)[-1]
    last.down_proj_bias.data[1, 3] = float("nan")
    with pytest.raises(ValueError, match=rf"{name}\.down_proj_bias\[expert 1\] contains NaN or Inf"):
        quantize_(model)
    assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model))
    model = tiny_model("qwen3_moe", dtype=torch.float64)
    name, last = find_experts(model)[-1]
    last.down_proj.data[0, 0, 0] = 1e300
    with pytest.raises(ValueError, match=rf"{name}\.down_proj\[expert 0\] has values beyond float32's range"):
        quantize_(model)
    assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model))
    w13, w2 = torch.randn(2, 8, 4), torch.randn(2, 4, 4)
    with pytest.raises(ValueError, match="gate_up_proj_bias contains NaN or Inf"):
        Int8Experts.from_float(w13, w2, activation="swiglu_oai", gate_up_proj_bias=torch.full((2, 8), float("nan")),
                               down_proj_bias=torch.zeros(2, 4))


@pytest.mark.parametrize("damage", ["missing", "misshaped", "int32"])
def test_int8_checkpoint_with_bad_scales_names_the_key(damage, int8_models, tmp_path):
    int8_models("mixtral").save_pretrained(tmp_path)
    (path,) = glob.glob(str(tmp_path / "*.safetensors"))
    sd = load_file(path)
    key = "model.layers.1.block_sparse_moe.experts.down_proj_scale"
    assert key in sd
    if damage == "missing":
        del sd[key]
    elif damage == "int32":  # (scales are float: integer ones are named, not loaded)
        sd[key] = sd[key].to(torch.int32)
    else:
        sd[key] = sd[key][:, :7].contiguous()
    save_file(sd, path, metadata={"format": "pt"})
    # The file's key, as a user would look for it (the model renames block_sparse_moe to mlp).
    expected = {"missing": re.escape(f"{key} (the model's model.layers.1.mlp.experts.down_proj_scale): not found"),
                "int32": re.escape(f"{key}: expected F32 [5, 64], got I32 [5, 64]"),
                "misshaped": re.escape(f"{key}: expected F32")}[damage]
    with pytest.raises(ValueError, match=expected):
        AutoModelForCausalLM.from_pretrained(tmp_path)



@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])  # (gpt_oss: expert biases too)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_checkpoint_with_scales_saved_in_the_model_dtype_loads(arch, dtype, tmp_path):
    """Before 4124398 a model cast after quantizing (model.to(torch.bfloat16), .half()) cast its fp32 scales and
    expert biases too, and save_pretrained wrote them so (built here as it was: every float tensor of the file in
    that dtype). It was refused as inconsistent; it loads as the same checkpoint with those values in fp32."""
    model = quantize_(tiny_model(arch))
    for _, m in find_experts(model):  # the values a cast kept, in fp32: the checkpoint to compare with
        for name, b in m.named_buffers():
            if b.is_floating_point():
                b.copy_(b.to(dtype))
    model.save_pretrained(tmp_path / "fp32")
    (path,) = glob.glob(str(tmp_path / "fp32" / "*.safetensors"))
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(path).items()}
    assert any(k.endswith("_scale") for k in sd)
    model.save_pretrained(tmp_path / "old")
    save_file(sd, glob.glob(str(tmp_path / "old" / "*.safetensors"))[0], metadata={"format": "pt"})
    old = AutoModelForCausalLM.from_pretrained(tmp_path / "old", dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", dtype=dtype)
    for (_, a), (_, b) in zip(find_experts(old), find_experts(ref)):
        for name, t in b.state_dict().items():
            assert getattr(a, name).dtype == t.dtype and torch.equal(getattr(a, name), t), name
    x = _inputs(6).cpu()
    with torch.no_grad():
        assert torch.equal(old(x).logits, ref(x).logits)

@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])  # (mixtral: keys transformers renames on load)
def test_int8_checkpoint_tensors_load_in_the_models_dtypes_where_transformers_keeps_the_checkpoints(
        arch, tmp_path, monkeypatch):
    """transformers 5.16-5.21 loads a pre-quantized checkpoint's float tensor whose key it renames (Mixtral's
    block_sparse_moe.*) in the dtype the file holds, not the model's; 5.22 casts it through the quantizer's
    get_new_dtype. Made to load every tensor as stored (get_new_dtype answering None), a bf16 int8 checkpoint
    whose scales and biases are bf16 too (saved from a model cast before 4124398) loads with dtype=float16 as
    the model's dtypes: float16 routers and other weights (the forward failed on mixed dtypes), fp32 scales and
    biases holding the file's values (they were refused as bf16)."""
    from experts_int8.integrations.transformers import ExpertsInt8HfQuantizer

    monkeypatch.setattr(ExpertsInt8HfQuantizer, "get_new_dtype", lambda self, converter, param, dtype: None,
                        raising=False)
    model = quantize_(tiny_model(arch)).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    (path,) = glob.glob(str(tmp_path / "*.safetensors"))
    sd = load_file(path)
    assert any(v.dtype == torch.float32 for v in sd.values())
    save_file({k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in sd.items()}, path,
              metadata={"format": "pt"})
    old = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float16)
    experts = {name for name, _ in find_experts(old)}
    fp32 = [re.compile(k) for k in old._keep_in_fp32_modules or ()]  # (GPT-OSS's norms: upcast in a float16 load)
    for name, t in old.named_parameters():
        if t.is_floating_point() and name.rpartition(".")[0] not in experts:
            assert t.dtype == (torch.float32 if any(k.search(name) for k in fp32) else torch.float16), name
    checked = 0
    for (_, a), (_, b) in zip(find_experts(old), find_experts(model)):
        for name, t in b.named_buffers():
            if t.is_floating_point():
                got = getattr(a, name)
                assert got.dtype == torch.float32 and torch.equal(got, t.to(torch.bfloat16).float()), name
                checked += 1
    assert checked
    with torch.no_grad():
        assert torch.isfinite(old(_inputs(6).cpu()).logits).all()


@pytest.mark.parametrize("arch", ["gpt_oss", "afmoe"])
def test_int8_load_keeps_the_models_keep_in_fp32_tensors_in_fp32(arch, tmp_path):
    """A float16 load upcasts what the model's _keep_in_fp32_modules name (GPT-OSS's and AFMoE's norms, routers):
    after a pre-quantized load each float tensor went back to the dtype the model was built in, float16 for those,
    unlike a load of the float checkpoint."""
    model = tiny_model(arch, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "float")
    quantize_(model).save_pretrained(tmp_path / "int8")
    float_load = AutoModelForCausalLM.from_pretrained(tmp_path / "float", dtype=torch.float16)
    int8_load = AutoModelForCausalLM.from_pretrained(tmp_path / "int8", dtype=torch.float16)
    experts = {name for name, _ in find_experts(int8_load)}
    want = {n: t.dtype for n, t in (*float_load.named_parameters(), *float_load.named_buffers())}
    got = {n: t.dtype for n, t in (*int8_load.named_parameters(), *int8_load.named_buffers())
           if n.rpartition(".")[0] not in experts}
    assert torch.float32 in {want[n] for n in got} and got == {n: want[n] for n in got}


def test_checkpoint_keys_find_a_renamed_key_only_when_one_matches():
    """A model's name is found under the checkpoint's own module names by its layer indices and last two parts;
    of two candidates (another stack's layer 0, as DeepSeek-V4's draft block mtp.0 beside layers.0) the one whose
    stack is the name's up to a base prefix is taken, else the one sharing the most words with the name; two that
    share as many are ambiguous: none is taken, rather than either one's tensor."""
    from experts_int8.checkpoint import CheckpointKeys, check_int8_checkpoint

    name = "model.layers.0.mlp.experts.down_proj"
    one = CheckpointKeys(["model.layers.0.block_sparse_moe.experts.down_proj", "model.layers.1.mlp.experts.down_proj"])
    assert one.find(name) == "model.layers.0.block_sparse_moe.experts.down_proj"
    assert one.find("model.layers.1.mlp.experts.down_proj") == "model.layers.1.mlp.experts.down_proj"
    assert one.find("model.layers.2.mlp.experts.down_proj") is None
    draft = CheckpointKeys(["layers.0.ffn.experts.down_proj", "mtp.0.ffn.experts.down_proj"])
    assert draft.find(name) == "layers.0.ffn.experts.down_proj"
    # (the stack first: model.mtp.layers shares more words with the name, but is another stack than model.layers)
    nested = CheckpointKeys(["model.layers.0.block_sparse_moe.experts.down_proj",
                             "model.mtp.layers.0.mlp.experts.down_proj"])
    assert nested.find(name) == "model.layers.0.block_sparse_moe.experts.down_proj"
    two = CheckpointKeys(["text.layers.0.moe.experts.down_proj", "mtp.layers.0.moe.experts.down_proj"])
    assert two.find(name) is None
    headers = {"text.layers.0.moe.experts.down_proj": ("I8", (2, 4, 3)),
               "mtp.layers.0.moe.experts.down_proj": ("I8", (2, 4, 3))}
    with pytest.raises(ValueError, match=re.escape(f"{name}: not found in the checkpoint (expected I8 [2, 4, 3])")):
        check_int8_checkpoint(headers, {name: ("I8", (2, 4, 3))})


def test_config_rejects_bad_arguments():
    with pytest.raises(TypeError, match="modules_to_not_convert"):
        ExpertsInt8Config(modules_to_not_convert="lm_head")
    with pytest.raises(ValueError, match="bits"):
        ExpertsInt8Config(bits=4)
    with pytest.raises(TypeError, match="unexpected"):
        ExpertsInt8Config(group_size=128)
    cfg = ExpertsInt8Config(modules_to_not_convert=["layers.0."])
    assert ExpertsInt8Config.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    for method in ("gptq", "bitsandbytes", "fp8"):
        with pytest.raises(ValueError, match=f"quant_method '{method}' is another method's config"):
            ExpertsInt8Config.from_dict({"quant_method": method})
    with pytest.raises(ValueError, match="not a valid pattern"):
        ExpertsInt8Config(modules_to_not_convert=["layers.(0"])


def test_modules_to_not_convert_matches_at_module_boundaries():
    """As transformers' own quantizers match: "layers.1" names layer 1, not layers 10-19; a fragment may sit
    anywhere between dots; regular expressions work; a trailing or leading dot is its own boundary."""
    def skips(pattern, name):
        return ExpertsInt8Config(modules_to_not_convert=[pattern]).skips(name)

    assert skips("layers.1", "model.layers.1.mlp.experts") and not skips("layers.1", "model.layers.11.mlp.experts")
    assert skips("layers.0.", "model.layers.0.mlp.experts") and not skips("layers.0.", "model.layers.10.mlp.experts")
    assert skips("model.layers.3.mlp.experts", "model.layers.3.mlp.experts")
    assert skips(r"layers\.(0|1)\.", "model.layers.1.mlp.experts") and not skips(r"layers\.(0|1)\.", "model.layers.2.x")
    assert skips("model.layers.*.mlp.experts", "model.layers.7.mlp.experts")
    assert not skips("mlp.exp", "model.layers.0.mlp.experts") and not skips("", "model.layers.0.mlp.experts")
    config = ExpertsInt8Config()
    config.update(modules_to_not_convert="layers.0")  # (transformers' update sets it past __init__'s check)
    model = tiny_model("mixtral")
    with pytest.raises(TypeError, match="modules_to_not_convert must be a list of str, got 'layers.0'"):
        quantize_(model, config)  # (it matched each character as a pattern, and converted nothing)
    assert not any(isinstance(m, Int8Experts) for m in model.modules())


def test_contradicting_configs_are_refused(checkpoints, tmp_path, caplog):
    """quantize_ with a config that would leave an already-int8 module float, and an int8 checkpoint whose config
    says a module it holds int8 tensors for is float: each refused naming the module, not a crash at forward.
    An entry that names no experts module is warned about."""
    model = tiny_model("mixtral")
    quantize_(model)
    before = model.config.quantization_config.to_dict()
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts is already int8"):
        quantize_(model, ExpertsInt8Config(modules_to_not_convert=["layers.0."]))
    assert model.config.quantization_config.to_dict() == before
    model.save_pretrained(tmp_path / "int8")
    cfg = json.loads((tmp_path / "int8" / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = ["layers.0."]
    (tmp_path / "int8" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts is left float .* config does not match"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "int8")
    with caplog.at_level("WARNING"):
        AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"),
                                             quantization_config=ExpertsInt8Config(modules_to_not_convert=["lm_hed"]))
    assert "['lm_hed'] name no routed experts module" in caplog.text


def test_a_pattern_of_nested_repetition_is_refused_in_time(tmp_path, monkeypatch):
    """A checkpoint's config may carry a pattern whose match takes exponential time in the module name's length
    (Python's re: 0.5 s at 23 characters, hours at a real model's names): it is refused with a message naming it
    once a match passes the time limit, and the load stops there."""
    from experts_int8.integrations import transformers as integration

    monkeypatch.setattr(integration, "MATCH_TIMEOUT_S", 0.05)
    hostile = r"(?:[\w.]|[\w.])*\d\d\d"
    with pytest.raises(ValueError, match=r"modules_to_not_convert entry .* took over 0.05 s to match the module name"):
        ExpertsInt8Config(modules_to_not_convert=[hostile]).skips("model.layers.1.mlp.expe")
    model = tiny_model("mixtral")
    quantize_(model)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = [hostile]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    started = time.perf_counter()
    with pytest.raises(ValueError, match="nested repetition"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize("entry, kept", [("layers.1", (1, 10)), ("layers.1.", (1,))])
def test_checkpoint_from_plain_text_modules_to_not_convert_loads(tmp_path, entry, kept):
    """Before 398edb9 modules_to_not_convert entries matched as plain text: "layers.1" kept layers 1 and 10 float,
    "layers.1." layer 1 alone; the current rule reads those the other way round. A checkpoint written then (built
    here as it was: the experts it kept float, the entry in its config) loads as it was written, its tensors
    deciding the modules the rules disagree on, and a save of it reloads the same."""
    names = [f"model.layers.{i}.mlp.experts" for i in kept]
    model = tiny_model("mixtral", num_hidden_layers=11)
    quantize_(model, ExpertsInt8Config(modules_to_not_convert=[re.escape(n) for n in names]))
    kinds = {n: type(m).__name__ for n, m in find_experts(model)}
    assert [n for n, k in kinds.items() if k != "Int8Experts"] == names
    model.save_pretrained(tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = [entry]
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "old")
    assert {n: type(m).__name__ for n, m in find_experts(loaded)} == kinds
    x = _inputs(6).cpu()
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)
    loaded.save_pretrained(tmp_path / "resaved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved")
    assert {n: type(m).__name__ for n, m in find_experts(again)} == kinds


def test_disk_offload_of_experts_is_refused_up_front(checkpoints, tmp_path):
    """An explicit map, and device_map="auto" whose memory limits send experts to disk (transformers resolves
    "auto" after the quantizer's first look): refused before anything is read or written to the offload folder."""
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    with pytest.raises(ValueError, match=r"offloads model\.layers\.1\.mlp\.experts to disk"):
        AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config(),
                                             device_map=device_map, offload_folder=str(tmp_path / "off"))
    with pytest.raises(ValueError, match=r"offloads model\.layers\.\d\.mlp\.experts to disk.*raise max_memory"):
        AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16, device_map="auto", max_memory={"cpu": 172529},
                                             offload_folder=str(tmp_path / "auto"))
    assert not any((tmp_path / "auto").rglob("*.dat"))


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_experts_offloaded_by_accelerate_check_and_run(checkpoints, offload_buffers):
    """Experts accelerate offloads (their tensors on the meta device, the hook's copy brought in for each
    forward: what transformers' loader does to CPU entries of a GPU model's map) pass the int8 check and give the
    same logits; offload_buffers too (a None buffer broke it)."""
    from accelerate import cpu_offload

    model = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config(),
                                                 dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    layer = model.model.layers[1]
    cpu_offload(layer, execution_device=torch.device("cpu"), offload_buffers=offload_buffers)
    assert layer.mlp.experts.down_proj.device.type == "meta"
    assert verify_int8_model(model) == 2
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss"])
def test_quantize_refuses_experts_accelerate_offloads_naming_the_offload(arch):
    """quantize_ of a float model a layer of which accelerate offloads (its experts on the meta device, the hook's
    copy brought in for each forward) said "load the weights first" of weights that are loaded: it names the offload
    and the ways that work now, and leaves the model unchanged (float, unmarked, the same logits)."""
    from accelerate import cpu_offload

    model = tiny_model(arch, dtype=torch.bfloat16)
    cpu_offload(model.model.layers[1], execution_device=torch.device("cpu"))
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts is offloaded by accelerate.*"
                                         r"quantize_ the model before dispatching it"):
        quantize_(model)
    assert len(_float_experts(model)) == 2 and not getattr(model, "is_quantized", False)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_generate_and_evaluate_a_model_whose_embedding_accelerate_offloads():
    """experts_int8.run.generate, routing_quality and compare_models sent the input ids to the device of the model's
    first parameter: for a model accelerate offloads from the embedding on (its tensors on the meta device until a
    forward brings them in), the meta device, where generate failed on .item() and the others could not copy the
    logits out. They go where the embedding's hook runs it now, and give the whole model's results."""
    from accelerate import cpu_offload

    from experts_int8.evaluate import compare_models
    from experts_int8.run import generate

    float_model = tiny_model("mixtral", dtype=torch.bfloat16)
    whole = quantize_(copy.deepcopy(float_model))
    offloaded = copy.deepcopy(whole)
    cpu_offload(offloaded, execution_device=torch.device("cpu"))
    assert offloaded.model.embed_tokens.weight.device.type == "meta"
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(generate(offloaded, ids, 4, stop_at_eos=False).ids,
                       generate(whole, ids, 4, stop_at_eos=False).ids)
    assert routing_quality(float_model, offloaded, ids) == routing_quality(float_model, whole, ids)
    tokens = ids.flatten()
    assert (compare_models(float_model, offloaded, tokens, window=8, stride=4)
            == compare_models(float_model, whole, tokens, window=8, stride=4))


def test_quantize_keeps_accelerates_placement_hook_on_the_experts():
    """A device map that names an experts module (over two GPUs: {"model.layers.1.mlp.experts": 1, ...}) gives it
    accelerate's hook, which brings each input to its GPU. quantize_ put the int8 module in its place without it (the
    kernel then got the hidden states of the GPU before and refused mixed devices), while dequantize() carries it: the
    int8 module keeps it now, and runs through it."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    class Counting(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Counting.calls += 1
            return args, kwargs

    model = tiny_model("mixtral", dtype=torch.bfloat16)
    whole = quantize_(copy.deepcopy(model))
    hook = Counting()
    add_hook_to_module(model.model.layers[1].mlp.experts, hook)
    quantize_(model)
    experts = model.model.layers[1].mlp.experts
    assert isinstance(experts, Int8Experts) and experts._hf_hook is hook
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, whole(ids).logits)
    assert Counting.calls == 1
    model.dequantize()
    assert model.model.layers[1].mlp.experts._hf_hook is hook


def test_dtype_restore_reaches_a_layer_accelerate_offloads():
    """transformers before 5.22 loads a bf16 int8 checkpoint's renamed keys (Mixtral's routers) in bf16 under
    dtype=float16, and the load's dtype restore casts them after. In a layer accelerate offloads (a GPU map's CPU
    entry), the module's tensors are meta until a forward casts the hook's stored copy to their dtype: the
    restore casts both, so the layer runs in float16 (mixed dtypes failed its router) and passes the int8 check."""
    from accelerate import cpu_offload

    from experts_int8.integrations.transformers import _loaded_dtypes, _restore_float_dtypes, _stored

    whole = quantize_(tiny_model("mixtral")).to(torch.bfloat16)  # (scales stay fp32)
    offloaded = copy.deepcopy(whole)
    layer = offloaded.model.layers[1]
    cpu_offload(layer, execution_device=torch.device("cpu"))
    router = layer.mlp.gate
    assert router.weight.device.type == "meta" and _stored(router, "weight").dtype == torch.bfloat16
    dtypes = _loaded_dtypes(quantize_(tiny_model("mixtral", dtype=torch.float16)))  # the model a float16 load builds
    for model in (whole, offloaded):
        _restore_float_dtypes(model, dtypes)
    assert router.weight.dtype == _stored(router, "weight").dtype == torch.float16
    assert verify_int8_model(offloaded) == 2
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(offloaded(ids).logits, whole(ids).logits)



def test_inputs_go_to_the_input_embeddings_device_not_the_first_parameters():
    """A VLM's first parameter is its vision tower's: with that tower elsewhere (here on the meta device), the
    token ids went there."""
    from experts_int8.evaluate import input_device

    model = tiny_model("qwen3_vl_moe")
    model.model.visual.to("meta")
    assert next(model.parameters()).device.type == "meta"
    assert input_device(model) == torch.device("cpu")
    assert input_device(torch.nn.Sequential(torch.nn.Linear(2, 2))) == torch.device("cpu")  # (no input embedding: the first)


def test_offload_seen_through_a_chain_of_accelerate_hooks():
    """accelerate chains a module's hooks into a SequentialHook (add_hook_to_module(..., append=True)): cpu_offload of
    a module with tensors of its own gives it its device hook and its offload hook so. Its offload was not seen
    through the chain: quantize_ said "load the weights first" of loaded weights, the inputs of a model whose
    embedding is offloaded so went to the meta device, and the dtype restore left the hook's copy alone."""
    from accelerate import cpu_offload
    from accelerate.hooks import SequentialHook

    from experts_int8.evaluate import input_device
    from experts_int8.integrations.transformers import _restore_float_dtypes, _stored

    cpu = torch.device("cpu")
    model = tiny_model("mixtral", dtype=torch.bfloat16)
    cpu_offload(model.model.layers[1].mlp.experts, execution_device=cpu)
    assert isinstance(model.model.layers[1].mlp.experts._hf_hook, SequentialHook)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts is offloaded by accelerate"):
        quantize_(model)
    whole = quantize_(tiny_model("mixtral")).to(torch.bfloat16)
    offloaded = copy.deepcopy(whole)
    cpu_offload(offloaded.model.embed_tokens, execution_device=cpu)
    router = offloaded.model.layers[0].mlp.gate
    cpu_offload(router, execution_device=cpu)
    assert input_device(offloaded) == cpu
    _restore_float_dtypes(offloaded, {"model.layers.0.mlp.gate.weight": torch.float16})
    assert router.weight.dtype == _stored(router, "weight").dtype == torch.float16
    assert _stored(router, "weight").device == cpu

# ---------------------------------------------------------------------------------------------------
# GPU: generation goes through the fused Triton kernel; loading keeps device memory low
# ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("source", ["float", "int8"])
def test_gpu_model_with_a_layer_offloaded_to_the_cpu(checkpoints, source, dtype, tmp_path):
    """A GPU map with one layer on the CPU (accelerate offloads it: its int8 experts come to the GPU for each
    forward) loads, from a float or an int8 checkpoint, and gives the whole-GPU model's logits; in float16 from
    a bf16 checkpoint too (transformers before 5.22 loads renamed keys in the file's dtype, and the offloaded
    layer's tensors are the hook's stored copies, which the load's dtype restore does not reach)."""
    path = checkpoints("mixtral")
    if source == "int8":
        AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16).save_pretrained(tmp_path / "int8")
        path = tmp_path / "int8"
    kwargs = {} if source == "int8" else {"quantization_config": ExpertsInt8Config()}
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
                  "model.rotary_emb": 0, "lm_head": 0}
    offloaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map, **kwargs)
    whole = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="cuda", **kwargs)
    assert offloaded.model.layers[1].mlp.experts.down_proj.device.type in ("meta", "cpu")
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        assert torch.equal(offloaded(ids).logits, whole(ids).logits)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_gpu_model_spread_over_two_gpus(checkpoints):
    """device_map puts layer 1 on the second GPU while the first stays current: its kernels run there (Triton
    launches on the current device), the logits are the one-GPU model's, and the current device is unchanged."""
    kwargs = dict(quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 0,
                  "model.rotary_emb": 0, "lm_head": 0}
    torch.cuda.set_device(0)
    spread = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), device_map=device_map, **kwargs)
    whole = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), device_map="cuda:0", **kwargs)
    assert spread.model.layers[1].mlp.experts.down_proj.device == torch.device("cuda", 1)
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        torch.testing.assert_close(spread(ids).logits.cpu(), whole(ids).logits.cpu())
    assert torch.cuda.current_device() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3", "jamba", "gpt_oss"])
def test_gpu_generation_uses_triton_kernel(arch, int8_models, monkeypatch):
    import experts_int8.ops as ops

    calls = []
    orig = ops._fused_experts_triton

    def counting(*args, **kwargs):
        calls.append(args[1].dtype)
        return orig(*args, **kwargs)

    monkeypatch.setattr(ops, "_fused_experts_triton", counting)
    model = int8_models(arch)
    assert next(model.parameters()).device.type == "cuda"
    out = model.generate(_inputs(8)[:1, :4], max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert out.shape[1] == 4 + 32
    n_moe = len(find_experts(model))
    assert len(calls) == 32 * n_moe  # prefill + 31 decode steps, one kernel call per MoE layer
    assert set(calls) == {torch.int8}


@pytest.mark.gpu
@pytest.mark.parametrize("arch", CLAMPED_NAMES)
def test_gpu_clamped_swiglu_experts_through_the_triton_kernel(arch, monkeypatch):
    """The clamped-SwiGLU model types on the GPU (fp32, the kernel's clamps in its epilogue): >= 30 dB per MoE
    layer against the float model, every experts call through the Triton op; the float model through
    experts_implementation="experts_int8" gives its own logits."""
    import experts_int8.ops as ops

    calls = []
    orig = ops._fused_experts_triton
    monkeypatch.setattr(ops, "_fused_experts_triton", lambda *a, **kw: calls.append(a[7:]) or orig(*a, **kw))
    model = tiny_model(arch).cuda()
    int8_model = quantize_(copy.deepcopy(model))
    quality = routing_quality(model, int8_model, _inputs())
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality
    form = _CLAMPED_FORMS[arch]
    clamp = (form["swiglu_limit"], form.get("swiglu_alpha"), form.get("limit_after_act", False))
    assert calls and all(c[0] == form["activation"] and c[5:] == clamp for c in calls)
    calls.clear()
    float_kernel = copy.deepcopy(model)
    float_kernel.set_experts_implementation("experts_int8")
    with torch.no_grad():
        torch.testing.assert_close(float_kernel(_inputs()).logits, model(_inputs()).logits, rtol=1e-3, atol=1e-3)
    assert calls and all(c[0] == form["activation"] and c[5:] == clamp for c in calls)


@pytest.mark.gpu
def test_gpu_load_peak_memory_below_int8_plus_one_layer(tmp_path):
    """The measured twin of test_on_the_fly_load_device_memory_bound. Six layers, so that the bf16 experts
    (what 5.17's warm-up used to reserve) exceed int8 + one layer by far more than allocator rounding."""
    import gc

    path = _mixtral_checkpoint(tmp_path / "bf16", hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
                               num_local_experts=8)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no cached-but-unused memory: the warm-up then reserves what it is asked for
    torch.cuda.reset_peak_memory_stats()  # right before loading: the peak is this load's alone
    base = torch.cuda.memory_allocated()
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(),
                                                 dtype=torch.bfloat16, device_map="cuda")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert verify_int8_model(model) == 6
    # The CUDA caching allocator rounds every tensor up to 512 bytes.
    size = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in model.state_dict().values())
    layer_bf16 = max(_w13(m).numel() + m.down_proj.numel() for _, m in find_experts(model)) * 2
    assert peak <= size + layer_bf16, (peak, size, layer_bf16)


def test_expert_converters_merge_on_cpu(checkpoints, monkeypatch):
    """Per-expert float keys are merged on the CPU and quantized expert by expert on the target device,
    so device memory never holds a whole layer of float experts (measured on the GPU by the test below
    and by benchmarks/load_memory.py)."""
    from experts_int8.integrations.transformers import ExpertsInt8HfQuantizer, Int8Quantize

    seen, shapes = [], []
    orig_update = ExpertsInt8HfQuantizer.update_weight_conversions
    orig_quantize = Int8Quantize._quantize

    def update(self, conversions, model=None):
        out = orig_update(self, conversions, model)
        seen.extend(c for c in out if type(c).__name__ == "WeightConverter")
        return out

    def quantize(self, key, w, *args):
        shapes.append((key, tuple(w.shape), w.device.type))
        return orig_quantize(self, key, w, *args)

    monkeypatch.setattr(ExpertsInt8HfQuantizer, "update_weight_conversions", update)
    monkeypatch.setattr(Int8Quantize, "_quantize", quantize)
    model = AutoModelForCausalLM.from_pretrained(checkpoints("mixtral"), quantization_config=ExpertsInt8Config(),
                                                 dtype=torch.bfloat16)
    expert_converters = [c for c in seen if any("experts" in t for t in c.target_patterns)]
    assert expert_converters and all(c.force_cpu for c in expert_converters)
    n_moe = len(find_experts(model))
    assert len(shapes) == 2 * n_moe and {d for _, _, d in shapes} == {"cpu"}
    assert all(len(s) == 3 for _, s, _ in shapes)


# ---------------------------------------------------------------------------------------------------
# Device memory while quantizing on the fly, modelled on the CPU
# ---------------------------------------------------------------------------------------------------
def _mixtral_checkpoint(path, **sizes):
    """A random bf16 Mixtral checkpoint with per-expert keys; ``sizes`` override the tiny config."""
    from transformers import MixtralConfig

    torch.manual_seed(0)
    cfg = MixtralConfig(**{**COMMON, "intermediate_size": 48, "num_hidden_layers": 4, "num_local_experts": 5,
                           "num_experts_per_tok": 2, **sizes})
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    return str(path)


class _DeviceExpertBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Expert tensors a GPU load would hold on the device, counted on the CPU.

    Every storage created by an op is attributed by where the loader is when it is created:
      * inside ``Int8Quantize._quantize``: device (the op allocates int8, scales and the per-expert float
        copy on the target device);
      * inside the convert step of a mapping with a quantization op: host when the mapping has
        ``force_cpu`` (transformers materializes and merges it on the CPU), device otherwise;
      * anything else (non-expert weights): not counted.
    A storage counts until it is freed (a finalizer on the storage object, which torch keeps alive as
    long as any tensor or Parameter uses it). ``peak()``: most device bytes at once; ``peak_transient()``:
    most bytes at once of the storages freed before loading ended (the float copies and temporaries).
    """

    def __init__(self):
        super().__init__()
        self.where = None  # None | "host" | "device"
        self.live = {}  # id(storage) -> (serial, bytes)
        self.events = []  # (serial, +bytes | -bytes) in time order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.where == "device":
            inputs = {id(t.untyped_storage()) for t in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor) and t.device.type != "meta"}
            for t in torch.utils._pytree.tree_leaves(out):
                # Only new storages: a view or an in-place result is memory that already exists.
                if isinstance(t, torch.Tensor) and t.device.type != "meta" and id(t.untyped_storage()) not in inputs:
                    self._count(t.untyped_storage())
        return out

    def _count(self, storage):
        if id(storage) not in self.live:  # id() of a live object is unique; events get a serial number
            self.live[id(storage)] = (len(self.events), storage.nbytes())
            self.events.append((len(self.events), storage.nbytes()))
            weakref.finalize(storage, self._release, id(storage))

    def _release(self, key):
        serial, nbytes = self.live.pop(key)
        self.events.append((serial, -nbytes))

    def _peak(self, keys=None):
        current = peak = 0
        for key, delta in self.events:
            if keys is None or key in keys:
                current += delta
                peak = max(peak, current)
        return peak

    def peak(self):
        return self._peak()

    def peak_transient(self):
        return self._peak({key for key, delta in self.events if delta < 0})


def _load_tracking_device_memory(path, monkeypatch, force_cpu=True):
    """from_pretrained(device_map="cpu") of a bf16 checkpoint with ExpertsInt8Config, returning the model,
    the bytes transformers' caching-allocator warm-up would reserve on an accelerator, and the peak bytes of
    expert tensors that would be on the device at once (see _DeviceExpertBytes)."""
    import transformers.core_model_loading as cml
    import transformers.modeling_utils as mu

    from experts_int8.integrations.transformers import ExpertsInt8HfQuantizer, Int8Quantize

    mode, warmup = _DeviceExpertBytes(), []
    orig_warmup = mu.caching_allocator_warmup

    def record_warmup(model, expanded_device_map, hf_quantizer):
        # What the warm-up would ask for if every tensor went to cuda:0 (on CPU it returns early).
        on_gpu = {name: torch.device("cuda", 0) for name in expanded_device_map}
        warmup.append(sum(mu.get_total_byte_count(model, on_gpu, hf_quantizer).values()))
        return orig_warmup(model, expanded_device_map, hf_quantizer)

    def attributed(orig, where):
        def wrapper(self, *args, **kwargs):
            before = mode.where
            mode.where = where(self)
            try:
                return orig(self, *args, **kwargs)
            finally:
                mode.where = before
        return wrapper

    def mapping_place(mapping):
        if getattr(mapping, "quantization_operation", None) is None:
            return None
        return "host" if getattr(mapping, "force_cpu", False) else "device"

    monkeypatch.setattr(mu, "caching_allocator_warmup", record_warmup)
    for cls in (cml.WeightConverter, cml.WeightRenaming):
        monkeypatch.setattr(cls, "convert", attributed(cls.convert, mapping_place))
    monkeypatch.setattr(Int8Quantize, "_quantize", attributed(Int8Quantize._quantize, lambda _: "device"))
    if not force_cpu:  # negative control: the loader merges the float experts on the device
        orig_update = ExpertsInt8HfQuantizer.update_weight_conversions

        def update(self, conversions, model=None):
            out = orig_update(self, conversions, model)
            for c in out:
                if hasattr(c, "force_cpu"):
                    c.force_cpu = False
            return out

        monkeypatch.setattr(ExpertsInt8HfQuantizer, "update_weight_conversions", update)
    with mode:
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(),
                                                     dtype=torch.bfloat16, device_map="cpu")
    return model, warmup, mode


def _sizes(model):
    int8_size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    experts = [m for _, m in find_experts(model)]
    int8_experts = sum(t.numel() * t.element_size() for m in experts for t in m.state_dict().values())
    layer_bf16 = max(_w13(m).numel() + m.down_proj.numel() for m in experts) * 2
    return int8_size, int8_experts, layer_bf16


@pytest.fixture(scope="module")
def mixtral_4_layers(tmp_path_factory):
    return _mixtral_checkpoint(tmp_path_factory.mktemp("mixtral4") / "bf16")


def test_on_the_fly_load_device_memory_bound(mixtral_4_layers, monkeypatch):
    """Peak device memory of a bf16 -> int8 load <= int8 model + one layer's bf16 experts, on the CPU.

    On the GPU the peak is the larger of (a) transformers' caching-allocator warm-up, one allocation of
    what the quantizer reports as the model's size, and (b) the model's tensors as they load plus the
    expert tensors being quantized. (a) must be the int8 size: with 5.17 it was the bf16 size (the
    meta placeholders are bf16), which alone made the H200 peak 3.40 GiB = the bf16 model.
    (b): the expert tensors on the device at once must stay within their int8 size + one layer of bf16.
    """
    pytest.importorskip("accelerate")
    model, warmup, device = _load_tracking_device_memory(mixtral_4_layers, monkeypatch)
    assert verify_int8_model(model) == 4
    int8_size, int8_experts, layer_bf16 = _sizes(model)
    assert len(warmup) == 1
    assert warmup[0] <= int8_size, (warmup[0], int8_size)  # reserves the int8 model, not the bf16 one
    assert device.peak() <= int8_experts + layer_bf16, (device.peak(), int8_experts, layer_bf16)
    # What is converted on the device is one expert at a time: far below a layer.
    assert 0 < device.peak_transient() <= layer_bf16 // 2, (device.peak_transient(), layer_bf16)


def test_device_memory_tracker_sees_a_device_merge(mixtral_4_layers, monkeypatch):
    """Negative control for the test above: without force_cpu, transformers merges each layer's float
    experts on the device, and the tracker reports more than one layer of bf16 in flight."""
    pytest.importorskip("accelerate")
    model, _, device = _load_tracking_device_memory(mixtral_4_layers, monkeypatch, force_cpu=False)
    _, _, layer_bf16 = _sizes(model)
    assert device.peak_transient() > layer_bf16, (device.peak_transient(), layer_bf16)


def test_load_memory_quality_separates_routing_flips_from_int8_error(tmp_path):
    """benchmarks/load_memory.py's quality measure (``evaluate.routing_quality``) on a small version of its
    random Mixtral: the int8 experts are >= 30 dB with the bf16 model's routing, while near-tied random
    routers flip some tokens' top-k, which is what pulls the free-running logits SNR of a random model down."""
    import argparse
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "load_memory.py")
    spec = importlib.util.spec_from_file_location("load_memory", path)
    load_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load_memory)
    args = argparse.Namespace(vocab=2000, hidden=256, intermediate=512, layers=4, experts=8)
    load_memory.build_checkpoint(str(tmp_path), args)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    q = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config(),
                                             dtype=torch.bfloat16)
    x = torch.randint(0, args.vocab, (2, 64), generator=torch.Generator().manual_seed(0))
    quality = routing_quality(ref, q, x)
    assert len(quality["moe_layer_snr_db_reference_routing"]) == args.layers
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 30.0, quality
    assert quality["logits_snr_db_reference_routing"] >= 30.0, quality
    assert max(quality["tokens_with_changed_topk_per_layer"]) > 0, quality  # flips happen in a random model
    assert quality["logits_snr_db_free_running"] < quality["logits_snr_db_reference_routing"], quality


def test_a_float_state_dict_is_refused_by_int8_experts_before_anything_is_copied():
    """Copied into the int8 tensors, float weights truncated to integers (almost all zeros) beside the old scales:
    strict=False raised nothing and the model ran on them; strict=True raised about the scales, after the copy."""
    float_sd = tiny_model("mixtral", seed=0).state_dict()
    model = quantize_(tiny_model("mixtral", seed=1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for strict in (False, True):
        with pytest.raises(RuntimeError, match=r"experts\.gate_up_proj: torch\.\w+ weights for int8 experts \(they "
                                               r"would be truncated to integers\); load them into the float model"):
            model.load_state_dict(float_sd, strict=strict)
        after = model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in before.items() if ".experts." in k)
    fresh = quantize_(tiny_model("mixtral", seed=1))
    fresh.load_state_dict(quantize_(tiny_model("mixtral", seed=0)).state_dict())  # int8 into int8: loads
    x = _inputs(3).cpu()
    with torch.no_grad():
        assert torch.equal(fresh(x).logits, quantize_(tiny_model("mixtral", seed=0))(x).logits)


def test_requires_grad_as_the_readme_says():
    model = quantize_(tiny_model("mixtral", dtype=torch.float32))
    model.requires_grad_(False)
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype can require gradients"):
        model.requires_grad_(True)
    for p in model.parameters():
        p.requires_grad_(p.is_floating_point())
    assert model.lm_head.weight.requires_grad and model.model.embed_tokens.weight.requires_grad
    model(_inputs(3).cpu()).logits.sum().backward()
    assert model.lm_head.weight.grad is not None


def test_a_transformers_too_old_for_the_integration_says_which_is_needed():
    """Older 5.x releases lack what the loader hooks into; naming ExpertsInt8Config says so, in one line."""
    import subprocess
    import sys

    code = ("import transformers; transformers.__version__ = '5.15.1'\n"
            "import experts_int8\n"  # (registering with transformers stays quiet: the kernels alone still work)
            "try:\n    experts_int8.ExpertsInt8Config\nexcept ImportError as e:\n    print('REFUSED:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "REFUSED: experts_int8 needs transformers>=5.16, found 5.15.1" in done.stdout


@pytest.mark.parametrize("first", ["experts_int8", "transformers"])
def test_the_integration_is_named_from_a_fresh_process_whichever_is_imported_first(first):
    import subprocess
    import sys

    code = (f"import {first}\nfrom experts_int8 import ExpertsInt8Config, quantize_\n"
            "print(ExpertsInt8Config.__module__, quantize_.__module__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["experts_int8.integrations.transformers"] * 2


def test_every_exported_name_is_bound_where_type_checkers_look():
    """A name of ``__all__`` that only ``__getattr__`` gives (imported on first use) is invisible to a type checker,
    which typed it as whatever ``__getattr__`` returns: pyright read ``ExpertsInt8Config()`` and ``quantize_(model)``
    of the README as calls of ``Int8Experts`` (arguments missing). Each is imported under ``TYPE_CHECKING`` too."""
    import ast

    import experts_int8

    tree = ast.parse(Path(experts_int8.__file__).read_text())
    bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names}
    bound |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}
    bound |= {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert sorted(set(experts_int8.__all__) - bound) == []


def test_the_package_is_marked_typed():
    """Without ``py.typed`` mypy skips the package (``import-untyped``: an error on every user's import of it) and
    its annotations go unused; setuptools ships the marker as package data by itself."""
    from importlib.resources import files

    assert files("experts_int8").joinpath("py.typed").is_file()


def test_quantize_refuses_a_wrong_config_and_weights_it_cannot_read():
    from experts_int8.integrations.transformers import find_experts

    with pytest.raises(TypeError, match="config must be an ExpertsInt8Config, got dict"):
        quantize_(tiny_model("mixtral"), {"quant_method": "experts_int8"})
    with pytest.raises(TypeError, match="allow_no_experts must be a bool, got 'yes'"):
        ExpertsInt8Config(allow_no_experts="yes")
    model = tiny_model("mixtral")
    name, experts = find_experts(model)[-1]
    experts.down_proj = torch.nn.Parameter(experts.down_proj.detach().to(torch.int32), requires_grad=False)
    with pytest.raises(TypeError, match=f"{name}.down_proj: expected float weights, got torch.int32"):
        quantize_(model)
    experts.down_proj = torch.nn.Parameter(torch.empty(experts.down_proj.shape, device="meta"))
    with pytest.raises(ValueError, match=f"{name}.down_proj is on the meta device; load the weights first"):
        quantize_(model)
    assert not any(isinstance(m, Int8Experts) for _, m in find_experts(model))  # (left unchanged)


def test_device_for_reads_each_kind_of_device_map():
    from experts_int8.integrations.transformers import _device_for

    name = "model.layers.0.mlp.experts"
    assert _device_for(None, name) is None
    assert _device_for({"model.layers.1": "cpu"}, name) is None
    assert _device_for({"model.layers.0": 1, "": "cpu"}, name) == torch.device("cuda", 1)
    assert _device_for({"model": "disk"}, name) == torch.device("cpu")
    assert _device_for("auto", name) == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert _device_for("meta", name) == torch.device("meta")
    assert _device_for("not-a-device", name) is None
