"""``Int8Experts``: gated experts (``gate_up_proj``) and experts without a gate (``up_proj``), on the torch path."""

import pytest
import torch

from experts_int8 import Int8Experts, dequantize_weights, reference, select_experts

E, H, I = 5, 32, 24


def _float_experts(gated: bool):
    torch.manual_seed(0)
    return torch.randn(E, (2 if gated else 1) * I, H) / H**0.5, torch.randn(E, H, I) / I**0.5


@pytest.mark.parametrize("gated, activation", [(True, "silu"), (True, "relu2"), (False, "relu2"), (False, "gelu")])
def test_experts_compute_their_form_on_their_own_tensors(gated, activation):
    w13, w2 = _float_experts(gated)
    module = Int8Experts.from_float(w13, w2, activation=activation, backend="torch")
    name = "gate_up_proj" if gated else "up_proj"
    assert module.has_gate == gated and module.w13_name == name
    assert set(module.state_dict()) == {name, f"{name}_scale", "down_proj", "down_proj_scale"}
    x = torch.randn(7, H)
    w, ids = select_experts(torch.randn(7, E), 2)
    q13, s13 = getattr(module, name), getattr(module, f"{name}_scale")
    want = reference.fused_experts(x.double(), dequantize_weights(q13, s13, torch.float64),
                                   dequantize_weights(module.down_proj, module.down_proj_scale, torch.float64), w, ids,
                                   activation=activation)
    torch.testing.assert_close(module(x, ids, w).double(), want, rtol=1e-5, atol=1e-6)
    # the expert's own formula, on the float weights: act(gate) * up, or act(up)
    h = x[:1] @ w13[ids[0, 0]].t()
    h = reference.act_and_mul(h, activation) if gated else (torch.relu(h).square() if activation == "relu2"
                                                           else torch.nn.functional.gelu(h))
    one = Int8Experts.from_float(w13, w2, activation=activation, backend="torch")(x[:1], ids[:1, :1], torch.ones(1, 1))
    torch.testing.assert_close(one, h @ w2[ids[0, 0]].t(), rtol=0.05, atol=0.02)


def test_experts_without_a_gate_refuse_what_needs_one():
    w13, w2 = _float_experts(gated=False)
    with pytest.raises(ValueError, match="'swiglu_oai' needs gate and up rows"):
        Int8Experts.from_float(w13, w2, activation="swiglu_oai")
    with pytest.raises(ValueError, match=r"expected \(5, 48, 32\), or \(5, 24, 32\) without a gate"):
        Int8Experts.from_float(w13[:, :-1], w2)
    module = Int8Experts.from_float(w13, w2)
    with pytest.raises(ValueError, match=r"up_proj must be torch.int8 \(5, 24, 32\)"):
        module.load_quantized(torch.zeros(E, 2 * I, H, dtype=torch.int8), torch.ones(E, 2 * I),
                              module.down_proj, module.down_proj_scale)


def test_dtype_casts_keep_the_scales_and_biases_fp32():
    """model.to(torch.bfloat16) / .half() after quantizing: int8 weights untouched, scales and biases stay
    fp32 and exact (the output is unchanged), and a meta move still moves them."""
    w13, w2 = _float_experts(gated=True)
    module = Int8Experts.from_float(w13, w2, activation="swiglu_oai", gate_up_proj_bias=torch.randn(E, 2 * I),
                                    down_proj_bias=torch.randn(E, H), backend="torch")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.randn(4, H, dtype=torch.bfloat16)
    w, ids = select_experts(torch.randn(4, E), 2)
    want = module(x, ids, w)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.to(torch.float64)):
        cast(module)
        assert {k: v.dtype for k, v in module.state_dict().items()} == {k: v.dtype for k, v in before.items()}
        assert all(torch.equal(module.state_dict()[k], v) for k, v in before.items())
    assert torch.equal(module(x, ids, w), want)
    assert module.to("meta").down_proj_scale.device.type == "meta"
    with pytest.raises(ValueError, match="backend must be one of"):
        Int8Experts(E, H, I, backend="cuda")
    with pytest.raises(ValueError, match="num_experts must be a positive int, got True"):
        Int8Experts(True, H, I)  # (a bool is an int to isinstance; it passed into torch's own error)


def test_type_casts_keep_the_int8_weights_and_fp32_scales():
    """nn.Module.type() casts every tensor, integers too: float copies of the int8 values ran without their
    scales (outputs 1e9 off, or NaN in fp16), and a checkpoint saved from them did not load."""
    module = Int8Experts.from_float(torch.randn(4, 16, 16) * 0.05, torch.randn(4, 16, 8) * 0.05)
    x, ids, w = torch.randn(3, 16), torch.randint(0, 4, (3, 2)), torch.rand(3, 2)
    want = module(x, ids, w)
    for dtype in (torch.float32, torch.float16, torch.float64):
        module.type(dtype)
        assert module.gate_up_proj.dtype == module.down_proj.dtype == torch.int8
        assert module.gate_up_proj_scale.dtype == module.down_proj_scale.dtype == torch.float32
        assert torch.equal(module(x, ids, w), want)


def test_a_forward_on_weights_that_are_not_int8_is_refused():
    module = Int8Experts.from_float(torch.randn(4, 16, 16) * 0.05, torch.randn(4, 16, 8) * 0.05)
    module.down_proj = torch.nn.Parameter(module.down_proj.float(), requires_grad=False)
    with pytest.raises(TypeError, match="down_proj of Int8Experts is torch.float32, not int8"):
        module(torch.randn(3, 16), torch.randint(0, 4, (3, 2)), torch.rand(3, 2))


def test_scales_left_out_of_a_load_are_nan_and_other_float_dtypes_load_as_fp32():
    full = Int8Experts.from_float(torch.randn(4, 16, 16) * 0.05, torch.randn(4, 16, 8) * 0.05)
    partial = Int8Experts(4, 16, 8)
    state = {k: v for k, v in full.state_dict().items() if k != "down_proj_scale"}
    assert partial.load_state_dict(state, strict=False).missing_keys == ["down_proj_scale"]
    assert partial(torch.randn(3, 16), torch.randint(0, 4, (3, 2)), torch.rand(3, 2)).isnan().all()
    assigned = Int8Experts(4, 16, 8)
    state = {k: (v.bfloat16() if k.endswith("_scale") else v) for k, v in full.state_dict().items()}
    assigned.load_state_dict(state, assign=True)
    assert assigned.gate_up_proj_scale.dtype == assigned.down_proj_scale.dtype == torch.float32
    assert state["down_proj_scale"].dtype == torch.bfloat16  # (the caller's dict is left as given)


def test_scales_in_another_float_dtype_run_as_fp32():
    """Scales that reach the forward in bf16 (assigned as such) are read as fp32 values, not refused by the
    kernel's fp32 check; the module's own casts keep them fp32."""
    w13, w2 = _float_experts(gated=True)
    module = Int8Experts.from_float(w13, w2, backend="torch")
    x = torch.randn(6, H)
    w, ids = select_experts(torch.randn(6, E), 2)
    assert module.to(torch.bfloat16).down_proj_scale.dtype == torch.float32
    module.gate_up_proj_scale = module.gate_up_proj_scale.to(torch.bfloat16)
    module.down_proj_scale = module.down_proj_scale.to(torch.bfloat16)
    want = Int8Experts.from_float(w13, w2, backend="torch")
    want.load_quantized(module.gate_up_proj, module.gate_up_proj_scale.float(), module.down_proj,
                        module.down_proj_scale.float())
    assert torch.equal(module(x, ids, w), want(x, ids, w))


def test_load_quantized_refuses_tensors_of_another_dtype():
    """Float weights or scales of another dtype are refused naming the tensor, before anything is installed."""
    w13, w2 = _float_experts(gated=True)
    module = Int8Experts.from_float(w13, w2, backend="torch")
    q13, s13, q2, s2 = module.gate_up_proj, module.gate_up_proj_scale, module.down_proj, module.down_proj_scale
    with pytest.raises(ValueError, match=r"gate_up_proj must be torch.int8 \(5, 48, 32\), got torch.float32"):
        module.load_quantized(w13, s13, q2, s2)
    with pytest.raises(ValueError, match=r"down_proj_scale must be torch.float32 \(5, 32\), got torch.bfloat16"):
        module.load_quantized(q13, s13, q2, s2.to(torch.bfloat16))
    assert module.gate_up_proj is q13 and module.down_proj_scale is s2
