import pytest
import torch

from experts_int8 import dequantize_weights, quantize_weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 33), (3, 17, 40), (2, 3, 8, 16)])
def test_round_trip_error_within_half_step(dtype, shape):
    w = (torch.randn(shape) * torch.rand(shape[:-1] + (1,)) * 3).to(dtype)
    q, scale = quantize_weights(w)
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == w.shape[:-1]
    assert int(q.abs().max()) <= 127
    err = (w.float() - dequantize_weights(q, scale)).abs()
    # Rounding error at most half a step, plus the float32 rounding of w / scale.
    assert torch.all(err <= scale.unsqueeze(-1) * (0.5 + 1e-5))
    # The largest element of every row hits +-127 exactly.
    assert torch.all(q.abs().amax(-1) == 127)


def test_scale_is_row_amax_over_127():
    w = torch.randn(4, 6, 10)
    _, scale = quantize_weights(w)
    torch.testing.assert_close(scale, w.abs().amax(-1) / 127)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_quantization_is_correctly_rounded_on_every_device(device):
    """Scales and values are the correctly rounded fp32 results (fp64 then fp32 is, for one division), so a
    checkpoint quantized on a GPU is the one quantized on a CPU, bit for bit. (CUDA's division by a Python
    number multiplies by its reciprocal and moved 101 of 1.6M values by one.)"""
    w = torch.randn(8, 512, 384, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, scale = quantize_weights(w.to(device))
    amax = w.float().abs().amax(-1)
    want_scale = (amax.double() / 127).float()
    assert torch.equal(scale.cpu(), want_scale)
    want_q = (w.double() / want_scale.double().unsqueeze(-1)).float().round().clamp(-127, 127).to(torch.int8)
    assert torch.equal(q.cpu(), want_q)


def test_zero_rows_get_finite_scale_and_zero_q():
    w = torch.randn(3, 8, 12)
    w[1, 2] = 0
    w[2] = 0
    q, scale = quantize_weights(w)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    assert (q[1, 2] == 0).all() and (q[2] == 0).all()
    deq = dequantize_weights(q, scale)
    assert (deq[2] == 0).all() and torch.isfinite(deq).all()


def test_rows_whose_scale_underflows_are_zero_rows():
    """max|row| / 127 below float32's smallest subnormal rounds to 0: such a row quantizes as an all-zero row
    (scale 1, q 0), never 0/0."""
    w = torch.zeros(2, 4)
    w[0, 0] = 1e-44
    w[1] = torch.tensor([1.0, -0.5, 0.25, 0.0])
    q, scale = quantize_weights(w)
    assert scale[0] == 1 and (q[0] == 0).all() and torch.isfinite(dequantize_weights(q, scale)).all()
    assert scale[1] == torch.tensor(1.0) / 127 and q[1].tolist() == [127, -64, 32, 0]


def test_float64_values_past_float32_range_are_an_error():
    w = torch.zeros(2, 3, 4, dtype=torch.float64)
    w[1, 0, 0] = 1e300
    with pytest.raises(ValueError, match=r"w2\[expert 1\] has values beyond float32's range"):
        quantize_weights(w, name="w2")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_an_error_naming_the_tensor(bad):
    w = torch.randn(2, 4, 8)
    w[1, 3, 5] = bad
    with pytest.raises(ValueError, match=r"layers\.0\.w1\[expert 1\]"):
        quantize_weights(w, name="layers.0.w1")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_values_are_checked_only_when_a_row_extreme_is_not_finite(monkeypatch, dtype, bad):
    # The rows' min and max show a NaN or Inf anywhere in the row: finite weights need no pass of their own over
    # every value (on the CPU a bf16 isfinite took longer than the whole quantization); others are still refused
    import experts_int8.quant as quant

    calls = []
    real = quant.check_weights
    monkeypatch.setattr(quant, "check_weights", lambda w, name: (calls.append(name), real(w, name)))
    w = torch.randn(3, 5, 37).to(dtype)
    if bad is None:
        quantize_weights(w, name="w1")
        assert calls == []
        return
    w[2, 4, 36 - int(bad != bad)] = bad  # (a vectorized chunk's tail and its body)
    with pytest.raises(ValueError, match=r"w1\[expert 2\] contains NaN or Inf"):
        quantize_weights(w, name="w1")
    assert calls == ["w1[expert 2]"]


def test_bad_input_types():
    with pytest.raises(TypeError, match="float"):
        quantize_weights(torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        quantize_weights(torch.ones(4))
    with pytest.raises(TypeError, match="int8"):
        dequantize_weights(torch.ones(3, 4), torch.ones(3))
    with pytest.raises(ValueError, match="scale shape"):
        dequantize_weights(torch.ones(3, 4, dtype=torch.int8), torch.ones(4))


def test_dequantize_dtype():
    q, s = quantize_weights(torch.randn(3, 5))
    assert dequantize_weights(q, s, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_empty_and_meta_tensors():
    """No rows or rows of no values quantize to empty q with scale 1 (all-zero rows); meta tensors (shape only)
    quantize without reading values; dequantization names non-tensors and a non-float target."""
    for shape in ((3, 0, 4), (3, 4, 0), (0, 4, 4)):
        q, scale = quantize_weights(torch.randn(shape))
        assert q.shape == shape and q.dtype == torch.int8 and scale.shape == shape[:-1] and (scale == 1).all()
    q, scale = quantize_weights(torch.empty(2, 3, 4, device="meta"))
    assert q.device.type == scale.device.type == "meta" and q.shape == (2, 3, 4) and scale.shape == (2, 3)
    q, scale = quantize_weights(torch.randn(2, 3))
    with pytest.raises(TypeError, match="expects tensors"):
        dequantize_weights(q.tolist(), scale)
    with pytest.raises(TypeError, match="returns a float dtype"):
        dequantize_weights(q, scale, torch.int8)


def test_dequantize_of_stacked_experts_equals_the_formula_expert_by_expert():
    """A layer's experts are dequantized one [N, K] matrix at a time (the fp32 product of the whole layer was twice a
    bf16 result's size on top of it): the values are the formula's."""
    q, s = quantize_weights(torch.randn(2, 3, 5, 7))
    for dtype in (torch.bfloat16, torch.float32):
        out = dequantize_weights(q, s, dtype)
        assert out.dtype == dtype and out.shape == q.shape
        assert torch.equal(out, (q.float() * s.unsqueeze(-1)).to(dtype))


def test_quantize_weights_takes_a_tensor_only():
    with pytest.raises(TypeError, match="expects a torch.Tensor, got list"):
        quantize_weights([[1.0, 2.0]])
