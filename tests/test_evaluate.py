"""experts_int8.evaluate: dense MLPs as 1-expert int8 MoEs, and the float-vs-int8 quality metrics."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from experts_int8.evaluate import (Int8DenseMLP, _windows, compare_models, dense_mlps_as_int8_experts_,
                                   detect_activation)
from experts_int8.layer import Int8Experts
from conftest import DEVICE

pytest.importorskip("transformers")


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def snr_db(ref, got):
    ref, got = ref.double(), got.double()
    return 10 * math.log10(ref.pow(2).sum().item() / (ref - got).pow(2).sum().item())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_dense_llama_as_int8_experts_keeps_logits(backend):
    import copy

    model = tiny_llama()
    int8 = copy.deepcopy(model)
    assert dense_mlps_as_int8_experts_(int8, backend=backend) == 2
    for layer in int8.model.layers:
        assert isinstance(layer.mlp, Int8DenseMLP)
        assert isinstance(layer.mlp.experts, Int8Experts)
        assert layer.mlp.experts.gate_up_proj.dtype == torch.int8
        assert tuple(layer.mlp.experts.gate_up_proj.shape) == (1, 160, 64)
        assert tuple(layer.mlp.experts.down_proj.shape) == (1, 64, 80)
        assert layer.mlp.experts.activation == "silu"
    ids = torch.randint(0, 96, (2, 17))
    if backend == "triton":  # interpreted on CPU, compiled on a GPU
        model, int8, ids = model.to(DEVICE), int8.to(DEVICE), ids.to(DEVICE)
    with torch.no_grad():
        ref, got = model(ids).logits, int8(ids).logits
    assert got.shape == ref.shape
    assert snr_db(ref, got) >= 30


def test_converted_mlp_matches_its_float_mlp_exactly_on_dequantized_weights():
    # The 1-expert path must compute down(silu(gate(x)) * up(x)) itself, not an approximation of it.
    from experts_int8.quant import dequantize_weights

    mlp = tiny_llama().model.layers[0].mlp
    conv = Int8DenseMLP.from_linears(mlp.gate_proj, mlp.up_proj, mlp.down_proj, activation="silu")
    e = conv.experts
    w13 = dequantize_weights(e.gate_up_proj[0], e.gate_up_proj_scale[0]).double()
    w2 = dequantize_weights(e.down_proj[0], e.down_proj_scale[0]).double()
    x = torch.randn(3, 5, 64)
    gate, up = (x.double() @ w13.t()).chunk(2, dim=-1)
    expect = (torch.nn.functional.silu(gate) * up) @ w2.t()
    torch.testing.assert_close(conv(x).double(), expect, rtol=1e-4, atol=1e-5)


def test_hooks_on_a_dense_mlp_move_to_its_int8_replacement():
    model = tiny_llama()
    seen = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
    dense_mlps_as_int8_experts_(model, backend="torch")
    ids = torch.randint(0, 96, (1, 5))
    with torch.no_grad():
        model(ids)
        handle.remove()  # (the handle the user holds still removes it)
        model(ids)
    assert seen == ["Int8DenseMLP"]


def test_no_gated_mlp_raises():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    with pytest.raises(ValueError, match="no dense gated MLP"):
        dense_mlps_as_int8_experts_(model)


def test_gated_mlp_with_bias_is_not_converted():
    class BiasedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 12), nn.Linear(8, 12)
            self.down_proj = nn.Linear(12, 8)
            self.act_fn = nn.SiLU()

    with pytest.raises(ValueError, match="no dense gated MLP"):
        dense_mlps_as_int8_experts_(nn.Sequential(BiasedMLP()))


@pytest.mark.parametrize("act, name", [(nn.SiLU(), "silu"), (nn.GELU(), "gelu"),
                                       (nn.GELU(approximate="tanh"), "gelu_tanh"),
                                       (lambda x: torch.relu(x).square(), "relu2")])
def test_detect_activation(act, name):
    assert detect_activation(act) == name


def test_detect_activation_rejects_unsupported():
    with pytest.raises(ValueError, match="none of the kernel's activations"):
        detect_activation(nn.ReLU())


class FixedLM(nn.Module):
    """A 'causal LM' predicting the same next-token distribution ``softmax(logits)`` everywhere."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(torch.as_tensor(logits, dtype=torch.float32), requires_grad=False)

    def forward(self, input_ids):
        b, t = input_ids.shape
        return SimpleNamespace(logits=self.logits.expand(b, t, -1))


def test_identical_models_give_equal_ppl_full_agreement_zero_kl():
    model = tiny_llama()
    ids = torch.randint(0, 96, (50,))
    r = compare_models(model, model, ids, window=16, stride=8)
    assert r["ppl_float"] == r["ppl_int8"]
    assert r["ppl_rel_diff"] == 0.0
    assert r["top1_agreement"] == 1.0
    assert r["mean_kl"] == pytest.approx(0.0, abs=1e-7)
    assert r["tokens"] == 49


def test_metrics_on_hand_checkable_distributions():
    # float: p = (1/2, 1/4, 1/4), argmax 0; int8: q = (1/4, 1/2, 1/4), argmax 1.
    p, q = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.25, 0.5, 0.25])
    ids = torch.tensor([0, 1, 2, 0, 0, 1, 2])  # targets: 1, 2, 0, 0, 1, 2
    r = compare_models(FixedLM(p.log()), FixedLM(q.log()), ids, window=4, stride=2)
    targets = ids[1:]
    assert r["tokens"] == 6
    assert r["ppl_float"] == pytest.approx(math.exp(-p[targets].log().mean().item()), rel=1e-6)
    assert r["ppl_int8"] == pytest.approx(math.exp(-q[targets].log().mean().item()), rel=1e-6)
    # both have 2 targets at prob 1/2 and 4 at 1/4 -> equal perplexity 2^(5/3)
    assert r["ppl_float"] == pytest.approx(2 ** (5 / 3), rel=1e-6)
    assert r["ppl_rel_diff"] == pytest.approx(0.0, abs=1e-6)
    assert r["top1_agreement"] == 0.0
    assert r["top1_acc_float"] == pytest.approx(2 / 6)  # targets equal to 0
    assert r["top1_acc_int8"] == pytest.approx(2 / 6)  # targets equal to 1
    assert r["mean_kl"] == pytest.approx((p * (p / q).log()).sum().item(), rel=1e-5)  # 0.25 ln 2
    # every target 0: the float model gives it 1/2 (perplexity 2), the int8 one 1/4 (perplexity 4): int8 is +100%
    r = compare_models(FixedLM(p.log()), FixedLM(q.log()), torch.zeros(5, dtype=torch.long), window=4, stride=2)
    assert (r["ppl_float"], r["ppl_int8"]) == (pytest.approx(2.0), pytest.approx(4.0))
    assert r["ppl_rel_diff"] == pytest.approx(1.0)


class DropoutLM(FixedLM):
    """FixedLM behind dropout: random logits in training mode."""

    def __init__(self, logits):
        super().__init__(logits)
        self.drop = nn.Dropout(0.5)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.drop(super().forward(input_ids).logits))


def test_compare_models_scores_in_eval_mode_and_puts_the_modes_back():
    """Models left in training mode (dropout, PhiMoE's sampled routing) gave other metrics each call."""
    logits = torch.randn(96)
    float_model, int8_model = DropoutLM(logits).train(), DropoutLM(logits + 0.1 * torch.randn(96)).train()
    int8_model.drop.eval()  # (a submodule's own mode is put back as it was)
    ids = torch.randint(0, 96, (40,))
    results = [compare_models(float_model, int8_model, ids, window=16, stride=8) for _ in range(2)]
    assert results[0] == results[1]
    assert float_model.training and float_model.drop.training and int8_model.training and not int8_model.drop.training
    assert results[0] == compare_models(float_model.eval(), int8_model.eval(), ids, window=16, stride=8)


@pytest.mark.parametrize("n, window, stride", [(2, 4, 2), (10, 4, 2), (11, 4, 3), (12, 2, 1), (9, 9, 3), (100, 16, 5)])
def test_windows_score_every_target_once_with_enough_context(n, window, stride):
    seen = []
    for i, (begin, end, first) in enumerate(_windows(n, window, stride)):
        assert 0 <= begin < first <= end <= n and end - begin <= window
        if i > 0:
            assert first - begin >= window - stride
        seen.extend(range(first, end))
    assert seen == list(range(1, n))


def test_compare_models_rejects_bad_arguments():
    m = FixedLM(torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        compare_models(m, m, [1])
    with pytest.raises(ValueError, match="stride"):
        compare_models(m, m, [1, 2, 0], window=4, stride=5)
    with pytest.raises(ValueError, match="stride"):
        compare_models(m, m, [1, 2, 0], window=4, stride=4)


def test_failed_conversion_leaves_model_untouched():
    model = tiny_llama()
    model.model.layers[1].mlp.act_fn = nn.ReLU()  # layer 0 is convertible, layer 1 is not
    with pytest.raises(ValueError, match="none of the kernel's activations"):
        dense_mlps_as_int8_experts_(model)
    assert not any(isinstance(m, Int8DenseMLP) for m in model.modules())
    with pytest.raises(ValueError, match="backend"):
        dense_mlps_as_int8_experts_(tiny_llama(), backend="cuda")


def test_dense_conversion_refuses_what_it_cannot_convert():
    class MLP(nn.Module):  # a gated MLP without an act_fn child
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 12, bias=False), nn.Linear(8, 12, bias=False)
            self.down_proj = nn.Linear(12, 8, bias=False)

    with pytest.raises(ValueError, match="activation must be one of"):
        dense_mlps_as_int8_experts_(nn.Sequential(MLP()), activation="tanh")
    with pytest.raises(ValueError, match="the model itself is a gated MLP"):
        dense_mlps_as_int8_experts_(MLP(), activation="silu")
    with pytest.raises(ValueError, match="0: no act_fn module"):
        dense_mlps_as_int8_experts_(nn.Sequential(MLP()))
    model = nn.Sequential(MLP())
    model[0].up_proj = nn.Linear(8, 10, bias=False)  # shapes that do not fit together: not a gated MLP
    with pytest.raises(ValueError, match="no dense gated MLP"):
        dense_mlps_as_int8_experts_(model, activation="silu")
    model = nn.Sequential(MLP())
    assert dense_mlps_as_int8_experts_(model, activation="silu", backend="torch") == 1
    assert isinstance(model[0], Int8DenseMLP) and model[0].experts.activation == "silu"


def test_int8_dense_mlp_needs_one_expert():
    experts = Int8Experts.from_float(torch.randn(2, 8, 4), torch.randn(2, 4, 4), backend="torch")
    with pytest.raises(ValueError, match="1-expert Int8Experts, got 2 experts"):
        Int8DenseMLP(experts)


def test_compare_models_takes_one_sequence_as_a_batch_of_one():
    a, b = FixedLM(torch.tensor([0.0, 1.0, 2.0])), FixedLM(torch.tensor([0.0, 1.0, 3.0]))
    ids = [0, 2, 1, 2, 2]
    assert compare_models(a, b, torch.tensor([ids]), window=4, stride=2) == compare_models(a, b, ids, window=4,
                                                                                           stride=2)
    with pytest.raises(ValueError, match=r"one sequence .* shape \(2, 5\)"):
        compare_models(a, b, torch.tensor([ids, ids]), window=4, stride=2)


def test_a_dense_mlp_that_clamps_in_its_own_forward_is_refused():
    """Step-3.7's shared expert clamps its SwiGLU in its forward (at swiglu_limits_shared): converted from its
    Linear children alone, the clamp would be dropped."""
    from models import tiny_model

    model = tiny_model("step3p7")
    with pytest.raises(ValueError, match=r"layers.1.mlp.shared_experts: Step3p7MLP's forward computes more than down"):
        dense_mlps_as_int8_experts_(model, backend="torch")
    assert not any(isinstance(m, Int8DenseMLP) for m in model.modules())
    for name, module in model.named_modules():  # without the clamp the same modules convert
        if name.endswith("shared_experts"):
            module.limit = None
    assert dense_mlps_as_int8_experts_(model, backend="torch") == 2
