"""Tiny random-weight MoE models, one per supported architecture, built from transformers configs.

Each is small enough to run on CPU in well under a second, yet keeps every structural feature that
matters: several MoE layers, real per-expert checkpoint keys once saved with ``save_pretrained``,
shared experts, grouped / biased routing, hybrid attention + Mamba layers.
"""

from __future__ import annotations

import torch

COMMON = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, tie_word_embeddings=False,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


# arch -> (transformers config class, its tiny settings). Classes are looked up by name, so an older
# transformers without one skips that architecture's tests instead of failing the import.
_LINEAR_ATTN = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4,
                    layer_types=["linear_attention", "full_attention"])
_MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
# MLA whose attention still repeats keys num_attention_heads // num_key_value_heads times (DeepSeek-V3.2, GLM-5,
# Mistral 4): as many key-value heads as heads, as their configs have
_MLA_HEADS = dict(_MLA, num_key_value_heads=COMMON["num_attention_heads"])
_CONFIGS = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=48, num_hidden_layers=2, num_local_experts=5,
                                      num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, num_hidden_layers=2, num_experts=6,
                                         num_experts_per_tok=2, decoder_sparse_step=1)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                         num_hidden_layers=2, num_experts=6, num_experts_per_tok=2,
                                         norm_topk_prob=True)),
    "qwen3_next": ("Qwen3NextConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, num_hidden_layers=2, num_experts=6,
                                           num_experts_per_tok=2, norm_topk_prob=True, **_LINEAR_ATTN)),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", dict(head_dim=16, moe_intermediate_size=32,
                                                      shared_expert_intermediate_size=48, num_hidden_layers=2,
                                                      num_experts=6, num_experts_per_tok=2, **_LINEAR_ATTN)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=32, num_hidden_layers=2, num_experts=6, num_experts_per_tok=2)),
    "deepseek_v2": ("DeepseekV2Config", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                             first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                             num_experts_per_tok=2, n_group=4, topk_group=2,
                                             topk_method="group_limited_greedy", routed_scaling_factor=1.5,
                                             q_lora_rank=None, **_MLA)),
    "deepseek_v3": ("DeepseekV3Config", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                             first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                             num_experts_per_tok=2, n_group=4, topk_group=2,
                                             routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24,
                                             **_MLA)),
    "glm4_moe": ("Glm4MoeConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                       num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
                                       n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                                       routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True)),
    "glm4_moe_lite": ("Glm4MoeLiteConfig", dict(intermediate_size=96, moe_intermediate_size=32,
                                                num_hidden_layers=2, mlp_layer_types=["dense", "sparse"],
                                                n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                                n_group=1, topk_group=1, routed_scaling_factor=1.8,
                                                norm_topk_prob=True, q_lora_rank=24, **_MLA)),
    "dots1": ("Dots1Config", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                  first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                  num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                  norm_topk_prob=True)),
    "exaone_moe": ("ExaoneMoeConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                           num_hidden_layers=2, first_k_dense_replace=1, num_experts=8,
                                           num_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                                           routed_scaling_factor=2.5)),
    "kimi_linear": ("KimiLinearConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                             num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                             mlp_layer_types=["sparse", "sparse"], num_experts=8,
                                             num_experts_per_token=2, num_shared_experts=1, num_expert_group=2,
                                             topk_group=1, routed_scaling_factor=2.0, q_lora_rank=None,
                                             linear_head_dim=16, linear_num_heads=4, **_MLA)),
    "minimax": ("MiniMaxConfig", dict(head_dim=16, intermediate_size=32, num_hidden_layers=2, num_local_experts=6,
                                      num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"])),
    "lfm2_moe": ("Lfm2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                       num_dense_layers=0, num_experts=6, num_experts_per_tok=2,
                                       routed_scaling_factor=1.5, layer_types=["conv", "full_attention"])),
    "minimax_m2": ("MiniMaxM2Config", dict(head_dim=16, intermediate_size=32, num_hidden_layers=2,
                                           num_local_experts=6, num_experts_per_tok=2)),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                                moe_num_experts=6, moe_k=2, moe_num_shared_experts=1,
                                                moe_layer_start_index=0, moe_layer_end_index=1)),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", dict(head_dim=16, intermediate_size=32, num_hidden_layers=2,
                                                  num_experts=6, moe_topk=2, use_qk_norm=True)),
    "jamba": ("JambaConfig", dict(intermediate_size=48, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
                                  expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
                                  attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                                  mamba_dt_rank=8, use_mamba_kernels=False)),
    "granitemoe": ("GraniteMoeConfig", dict(intermediate_size=32, num_hidden_layers=2, num_local_experts=6,
                                            num_experts_per_tok=2)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(intermediate_size=32, shared_intermediate_size=48,
                                                        num_hidden_layers=2, num_local_experts=6, num_experts_per_tok=2,
                                                        layer_types=["linear_attention", "full_attention"],
                                                        mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8,
                                                        mamba_chunk_size=16)),
    "phimoe": ("PhimoeConfig", dict(intermediate_size=32, num_hidden_layers=2, num_local_experts=6,
                                    num_experts_per_tok=2)),
    "deepseek_v32": ("DeepseekV32Config", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                               first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
                                               num_experts_per_tok=2, n_group=4, topk_group=2,
                                               routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24,
                                               index_head_dim=16, index_n_heads=2, **_MLA_HEADS)),
    "glm_moe_dsa": ("GlmMoeDsaConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                            mlp_layer_types=["dense", "sparse"], n_routed_experts=8,
                                            n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                            routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=24,
                                            index_head_dim=16, index_n_heads=2, **_MLA_HEADS)),
    "mimo_v2_flash": ("MiMoV2FlashConfig", dict(head_dim=16, v_head_dim=16, intermediate_size=96,
                                                moe_intermediate_size=32, num_hidden_layers=2,
                                                mlp_layer_types=["dense", "sparse"], n_routed_experts=8,
                                                num_experts_per_tok=2, n_group=1, topk_group=1, sliding_window=8,
                                                layer_types=["full_attention", "sliding_attention"])),
    "flex_olmo": ("FlexOlmoConfig", dict(intermediate_size=32, num_hidden_layers=2, num_experts=6,
                                         num_experts_per_tok=2, norm_topk_prob=True)),
    "granitemoeshared": ("GraniteMoeSharedConfig", dict(intermediate_size=32, shared_intermediate_size=48,
                                                        num_hidden_layers=2, num_local_experts=6,
                                                        num_experts_per_tok=2)),
    "solar_open": ("SolarOpenConfig", dict(head_dim=16, moe_intermediate_size=32, num_hidden_layers=2,
                                           n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                                           topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=True)),
    "beam": ("BeamConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                layer_types=["sliding_attention", "full_attention"],
                                mlp_layer_types=["dense", "sparse"],
                                num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                                routed_scaling_factor=2.5, norm_topk_prob=True)),
    "afmoe": ("AfmoeConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                  num_dense_layers=1, num_experts=6, num_experts_per_tok=2, num_shared_experts=1,
                                  route_scale=2.0, global_attn_every_n_layers=2, sliding_window=8)),
    "cohere2_moe": ("Cohere2MoeConfig", dict(head_dim=16, intermediate_size=32, prefix_dense_intermediate_size=96,
                                             num_hidden_layers=2, first_k_dense_replace=1, num_experts=6,
                                             num_experts_per_tok=2, num_shared_experts=1, sliding_window=8,
                                             sliding_window_pattern=2)),
    # experts without a gate (ReLU² of up_proj), on a latent width smaller than the model's
    # (attention first: transformers 5.25 asks layer 0 of the cache for its length, and a MoE layer holds none)
    "nemotron_h": ("NemotronHConfig", dict(layers_block_type=["full_attention", "moe", "moe"], num_hidden_layers=3,
                                           head_dim=16, n_routed_experts=8, n_shared_experts=1,
                                           moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                                           num_experts_per_tok=2, n_group=2, topk_group=1,
                                           routed_scaling_factor=2.5, norm_topk_prob=True, moe_latent_size=48)),
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, intermediate_size=32, num_hidden_layers=2, num_local_experts=6,
                                     num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"], rope_scaling=None)),
}

# Vision-language models whose text model is an MoE: wrapper model_type -> (config class, text settings).
# Their rows in ARCHITECTURES are the text model's type; they load with AutoModelForImageTextToText.
_VISION = dict(depth=1, num_hidden_layers=1, hidden_size=32, intermediate_size=32, num_heads=2, num_attention_heads=2,
               head_dim=16, out_hidden_size=COMMON["hidden_size"], deepstack_visual_indexes=[])
_VISION_LANGUAGE = {
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", _CONFIGS["qwen3_moe"][1]),
    "qwen3_5_moe": ("Qwen3_5MoeConfig", _CONFIGS["qwen3_5_moe_text"][1]),
    "glm4v_moe": ("Glm4vMoeConfig", {**{k: v for k, v in _CONFIGS["glm4_moe"][1].items() if k != "use_qk_norm"},
                                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]}}),
    # Mistral Small 4: a Pixtral vision model on a Mistral 4 (MLA, grouped softmax routing) text model
    "mistral3": ("Mistral3Config", dict(model_type="mistral4", intermediate_size=96, moe_intermediate_size=32,
                                        num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
                                        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                                        routed_scaling_factor=1.5, norm_topk_prob=True, q_lora_rank=24,
                                        **_MLA_HEADS)),
    # (Aria's routed experts are transposed, [E, H, 2I] and [E, I, H], and SiLU whatever hidden_act says)
    "aria": ("AriaConfig", dict(intermediate_size=48, num_hidden_layers=2, moe_num_experts=6, moe_topk=2,
                                moe_num_shared_experts=1, hidden_act="gelu_pytorch_tanh")),
}


# Model types outside the table: standard experts (Mellum: quantized with a warning).
_UNLISTED = {
    "mellum": ("MellumConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                    num_experts=4, num_experts_per_tok=2)),
}

# Model types whose fused experts clamp their SwiGLU in a `_apply_gate` of their own (limits small enough that the
# tiny weights cross them). step3p7 and glm5_next have no causal LM for their text configs: settings of the text
# config inside the wrapper, loaded with AutoModelForImageTextToText; MiniMax-M3's text config has one.
# (DeepSeek-V4's layer 0 is hash-routed: its `tid2eid` stays zero, so every token goes to expert 0 twice.)
_CLAMPED = {
    "deepseek_v4": ("DeepseekV4Config", dict(num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.5,
                                             moe_intermediate_size=32, num_hidden_layers=2,
                                             mlp_layer_types=["hash_moe", "moe"], n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2, routed_scaling_factor=1.5,
                                             q_lora_rank=24, o_groups=2, o_lora_rank=16, sliding_window=8,
                                             layer_types=["compressed_sparse_attention",
                                                          "heavily_compressed_attention"],
                                             compress_rates={"compressed_sparse_attention": 4,
                                                             "heavily_compressed_attention": 8},
                                             index_n_heads=2, index_head_dim=16, index_topk=2, hc_mult=2,
                                             hc_sinkhorn_iters=4, swiglu_limit=1.0)),
    "hy_v4": ("HYV4Config", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                 mlp_layer_types=["dense", "sparse"], n_routed_experts=8, n_shared_experts=1,
                                 num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                                 q_lora_rank=24, index_topk=4, index_head_dim=16, index_n_heads=2, hc_mult=2,
                                 swiglu_limit=1.0, **_MLA_HEADS)),
    "step3p7": ("Step3p7Config", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                      share_expert_dim=48, num_hidden_layers=2, mlp_layer_types=["dense", "sparse"],
                                      n_routed_experts=8, num_experts_per_tok=2, moe_router_scaling_factor=2.0,
                                      layer_types=["full_attention", "sliding_attention"], sliding_window=8,
                                      num_sliding_attention_heads=2, swiglu_limits=[0.0, 0.5],
                                      swiglu_limits_shared=[0.0, 1.0])),
    "glm5_next": ("Glm5NextConfig", dict(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                                         mlp_layer_types=["dense", "sparse"],
                                         layer_types=["linear_attention", "indexed_attention"], n_routed_experts=8,
                                         n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                         routed_scaling_factor=2.5, q_lora_rank=24, kv_lora_rank=16,
                                         qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
                                         num_key_value_heads=COMMON["num_attention_heads"], index_topk=8,
                                         index_kpool=4, index_head_dim=16, index_n_heads=2, linear_head_dim=16,
                                         linear_num_heads=4, hc_mult=2, hc_sinkhorn_iters=4, swiglu_limit=1.0)),
    "minimax_m3_vl_text": ("MiniMaxM3VLTextConfig", dict(head_dim=16, rotary_dim=8, intermediate_size=32,
                                                         dense_intermediate_size=96, shared_intermediate_size=48,
                                                         num_hidden_layers=2, mlp_layer_types=["dense", "sparse"],
                                                         layer_types=["full_attention", "minimax_m3_sparse"],
                                                         num_local_experts=8, num_experts_per_tok=2,
                                                         routed_scaling_factor=2.0, index_n_heads=2,
                                                         index_head_dim=16, index_block_size=4, index_topk_blocks=2,
                                                         swiglu_limit=1.0)),
    "bailing_hybrid": ("BailingHybridConfig", dict(head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                                                   num_hidden_layers=2, first_k_dense_replace=1, layer_group_size=2,
                                                   num_experts=8, num_shared_experts=1, num_experts_per_token=2,
                                                   n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                   q_lora_rank=None, swiglu_limits=[0, 0.5],
                                                   swiglu_limits_shared=[0, 1.0], **_MLA_HEADS)),
}
_CLAMPED_WRAPPED = ("step3p7", "glm5_next")
_WRAPPED = (*_VISION_LANGUAGE, *_CLAMPED_WRAPPED)  # text settings inside a vision-language config

ARCH_NAMES = tuple(_CONFIGS)
SELECTION_BIASES = ("e_score_correction_bias", "expert_bias")  # (LFM2's is expert_bias)
VISION_LANGUAGE_NAMES = tuple(_VISION_LANGUAGE)
CLAMPED_NAMES = tuple(_CLAMPED)
# their text models' types: their rows in ARCHITECTURES (Step-3.7's text config keeps Step-3.5's type)
CLAMPED_TEXT_TYPES = {**{arch: arch for arch in _CLAMPED}, "step3p7": "step3p5", "glm5_next": "glm5_next_text"}


def tiny_config(arch: str, **overrides):
    """``arch``'s tiny config; ``overrides``: settings of its (text) config to change."""
    import pytest
    import transformers

    name, settings = {**_CONFIGS, **_VISION_LANGUAGE, **_UNLISTED, **_CLAMPED}[arch]
    settings = {**settings, **overrides}
    config_class = getattr(transformers, name, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    if arch in _CLAMPED:  # (types newer than the oldest transformers tested: their configs took other settings)
        try:
            return _build_config(arch, config_class, settings)
        except Exception as e:  # (TypeError, ValueError, huggingface_hub's StrictDataclassClassValidationError)
            pytest.skip(f"transformers {transformers.__version__}'s {name} refuses the tiny settings: {e}")
    return _build_config(arch, config_class, settings)


def _build_config(arch: str, config_class, settings: dict):
    if arch in _WRAPPED:
        # Sub-configs as objects (5.17's AriaConfig keeps a dict without a model_type as it is), or a dict
        # that names its type (Mistral3Config's text model is Mistral by default)
        default = config_class()
        text = {**COMMON, **settings}
        text = text if "model_type" in text else type(default.text_config)(**text)
        vision = {k: v for k, v in _VISION.items() if hasattr(default.vision_config, k)}
        return config_class(text_config=text, vision_config=type(default.vision_config)(**vision),
                            tie_word_embeddings=False)
    return config_class(**{**COMMON, **settings})


def auto_class(arch: str):
    """The transformers Auto class that loads ``arch``'s checkpoints."""
    import transformers

    return transformers.AutoModelForImageTextToText if arch in _WRAPPED else transformers.AutoModelForCausalLM


def tiny_model(arch: str, dtype=torch.float32, seed: int = 0, config=None, **overrides):
    """A random-weight model of ``arch`` (``auto_class``; ``config``: one of ``tiny_config``'s, changed); weights
    are scaled so logits are not degenerate."""
    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides) if config is None else config
    model = auto_class(arch).from_config(config, dtype=dtype)
    # (the clamped types' experts became standard modules later than their configs appeared: 5.17's Step-3.5)
    odd = [type(m).__name__ for n, m in model.named_modules()
           if n.endswith(".experts") and not hasattr(m, "is_concatenated" if arch in _CLAMPED else "_apply_gate")]
    if odd:  # (5.17's Aria: fc1 / fc2 grouped GEMMs, transformers' standard experts module only later)
        import pytest
        import transformers

        pytest.skip(f"transformers {transformers.__version__}'s {odd[0]} is not its standard experts module")
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith(SELECTION_BIASES):  # make the selection-only bias matter
                b.copy_(torch.randn_like(b) * 0.05)
        for name, p in model.named_parameters():
            if name.endswith(SELECTION_BIASES):  # (a parameter in some architectures)
                p.copy_(torch.randn_like(p) * 0.05)
            elif name.endswith("_proj_bias") and ".experts." in name:  # GPT-OSS expert biases
                p.copy_(torch.randn_like(p) * 0.1)
            elif p.dim() >= 2:
                p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5) * (4 if "embed" in name else 1))
    return model.eval()


# ---------------------------------------------------------------------------------------------------
# Image and video inputs for the vision-language models, built as their processors build them
# ---------------------------------------------------------------------------------------------------
_MM_IDS = dict(image=90, video=91, start=92, end=93, video_start=94, video_end=95)  # (inside the tiny vocab)
_GRID_VL = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe")  # patches + a (t, h, w) grid per image, M-RoPE
VIDEO_NAMES = _GRID_VL


def tiny_image_config(arch: str):
    """``tiny_config(arch)`` with its image (video) tokens inside the tiny vocab and, for Aria, a projector that
    takes the tiny vision tower's 7 x 7 patches."""
    config = tiny_config(arch)
    if arch in _GRID_VL:
        config.image_token_id, config.video_token_id = _MM_IDS["image"], _MM_IDS["video"]
        starts = ("image_start_token_id", "image_end_token_id") if arch == "glm4v_moe" else (
            "vision_start_token_id", "vision_end_token_id")
        setattr(config, starts[0], _MM_IDS["start"])
        setattr(config, starts[1], _MM_IDS["end"])
        config.video_start_token_id, config.video_end_token_id = _MM_IDS["video_start"], _MM_IDS["video_end"]
    elif arch == "aria":
        patches = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
        config.projector_patch_to_query_dict = {patches: 8}
        config.max_value_projector_patch_to_query_dict = 8
    return config


def image_inputs(arch: str, config, video: bool = False, seed: int = 0) -> dict:
    """A batch of two prompts, each with one image (``video``: a two-frame video) of its own size where the model
    allows it, left-padded: ``input_ids`` with as many placeholder tokens as the vision tower gives features,
    ``attention_mask`` and the pixel tensors (and grids, token types) the model's processor would give."""
    g = torch.Generator().manual_seed(seed)

    def text(n):
        return torch.randint(3, 80, (n,), generator=g)

    def ids(*parts):
        return torch.cat([p if isinstance(p, torch.Tensor) else torch.tensor(p) for p in parts])

    v, rows, extra = config.vision_config, [], {}
    if arch in _GRID_VL:
        p, t, m = v.patch_size, v.temporal_patch_size, v.spatial_merge_size
        grids = [(2, 4, 4), (2, 4, 6)] if video else [(1, 4, 6), (1, 4, 4)]
        glm = arch == "glm4v_moe"
        token = config.image_token_id if glm or not video else config.video_token_id  # (GLM's frames: image tokens)
        start, end = (config.image_start_token_id, config.image_end_token_id) if glm else (
            config.vision_start_token_id, config.vision_end_token_id)
        for frames, h, w in grids:
            n = h * w // (m * m)  # tokens a frame (temporal patches, each of t frames)
            if not video:
                rows.append(ids(text(3), [start] + [token] * n + [end], text(5)))
            elif glm:  # video_start, then image_start frame image_end and its time stamp, per frame; video_end
                per_frame = [ids([start] + [token] * n + [end], text(2)) for _ in range(frames)]
                rows.append(ids(text(3), [config.video_start_token_id], *per_frame, [config.video_end_token_id],
                                text(4)))
            else:  # Qwen: a time stamp, then vision_start frame vision_end, per frame
                per_frame = [ids(text(2), [start] + [token] * n + [end]) for _ in range(frames)]
                rows.append(ids(text(3), *per_frame, text(4)))
        pixels = torch.randn(sum(a * b * c for a, b, c in grids), 3 * t * p * p, generator=g)
        extra = {"pixel_values_videos" if video else "pixel_values": pixels,
                 "video_grid_thw" if video else "image_grid_thw": torch.tensor(grids)}
    elif arch == "mistral3":  # Pixtral: images of their own sizes, zero-padded; merged patches
        sizes, step = [(64, 96), (64, 64)], v.patch_size * config.spatial_merge_size
        pixels = torch.zeros(len(sizes), 3, max(h for h, _ in sizes), max(w for _, w in sizes))
        for i, (h, w) in enumerate(sizes):
            pixels[i, :, :h, :w] = torch.randn(3, h, w, generator=g)
            rows.append(ids(text(3), [config.image_token_id] * ((h // step) * (w // step)), text(5)))
        extra = {"pixel_values": pixels, "image_sizes": torch.tensor(sizes)}
    elif arch == "aria":  # one image of the vision tower's size; the projector's queries a image
        s, (queries,) = v.image_size, config.projector_patch_to_query_dict.values()
        rows = [ids(text(3), [config.image_token_id] * queries, text(5)) for _ in range(2)]
        extra = {"pixel_values": torch.randn(2, 3, s, s, generator=g),
                 "pixel_mask": torch.ones(2, s, s, dtype=torch.bool)}
    else:
        raise ValueError(f"no image inputs for {arch!r}")
    length = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r):], attention_mask[i, length - len(r):] = r, 1
    if arch in _GRID_VL:  # text 0, image 1, video 2 (M-RoPE)
        vision = (input_ids == config.image_token_id) | (input_ids == config.video_token_id)
        extra["mm_token_type_ids"] = vision.long() * (2 if video else 1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, **extra}
