"""Bad input is rejected before any kernel launch with a message saying what was expected and given."""

import pytest
import torch
from conftest import DEVICE

from experts_int8 import Int8Experts, fused_experts, fused_moe, quantize_weights, select_experts

E, H, I, M, K = 4, 32, 16, 3, 2


def good():
    q13, s13 = quantize_weights(torch.randn(E, 2 * I, H))
    q2, s2 = quantize_weights(torch.randn(E, H, I))
    return dict(x=torch.randn(M, H), w13=q13, w2=q2, topk_weights=torch.rand(M, K),
                topk_ids=torch.randint(0, E, (M, K), dtype=torch.int32), w13_scale=s13, w2_scale=s2)


def with_(**changes):
    args = good()
    args.update(changes)
    return args


def ungated(**changes):
    """Experts without a gate: w13 [E, I, H] (up rows) with scales [E, I]."""
    q13, s13 = quantize_weights(torch.randn(E, I, H))
    return with_(**{"w13": q13, "w13_scale": s13, **changes})


CASES = [
    ("x rank", lambda: with_(x=torch.randn(M, H, 1)), ValueError, "x must be 2-D"),
    ("x dtype", lambda: with_(x=torch.randn(M, H).double()), TypeError, "bfloat16, float16 or float32"),
    ("x int", lambda: with_(x=torch.ones(M, H, dtype=torch.int32)), TypeError, "x must be"),
    ("w13 rank", lambda: with_(w13=torch.zeros(2 * I, H, dtype=torch.int8)), ValueError, "w13 must be 3-D"),
    ("w dtype", lambda: with_(w2=torch.zeros(E, H, I, dtype=torch.int32)), TypeError, "w2 must be int8"),
    ("mixed formats", lambda: with_(w2=torch.randn(E, H, I), w2_scale=None), TypeError, "both be int8"),
    ("H mismatch x", lambda: with_(x=torch.randn(M, H + 1)), ValueError, "hidden size"),
    ("I mismatch", lambda: with_(w2=torch.zeros(E, H, I + 1, dtype=torch.int8)), ValueError, r"w13 \[E, 2I, H\]"),
    ("E mismatch", lambda: with_(w2=torch.zeros(E + 1, H, I, dtype=torch.int8)), ValueError, "same E"),
    ("int8 without scales", lambda: with_(w13_scale=None), ValueError, "need w13_scale"),
    ("float with scales", lambda: with_(w13=torch.randn(E, 2 * I, H), w2=torch.randn(E, H, I)), ValueError,
     "drop the scales"),
    ("scale shape", lambda: with_(w2_scale=torch.ones(E, H + 1)), ValueError, r"w2_scale must have shape \(4, 32\)"),
    ("scale dtype", lambda: with_(w2_scale=torch.ones(E, H, dtype=torch.float16)), TypeError, "float32"),
    ("topk shape", lambda: with_(topk_weights=torch.rand(M, K + 1)), ValueError, "topk_weights and topk_ids"),
    ("topk rows", lambda: with_(topk_weights=torch.rand(M + 1, K),
                                topk_ids=torch.zeros(M + 1, K, dtype=torch.int32)), ValueError, "M=3"),
    ("ids dtype", lambda: with_(topk_ids=torch.zeros(M, K)), TypeError, "topk_ids must be int32 or int64"),
    ("top_k > E", lambda: with_(topk_weights=torch.rand(M, E + 1),
                                topk_ids=torch.zeros(M, E + 1, dtype=torch.int32)), ValueError, "exceeds"),
    ("ids out of range", lambda: with_(topk_ids=torch.full((M, K), E, dtype=torch.int32)), ValueError,
     r"\[0, 4\)"),
    ("negative ids", lambda: with_(topk_ids=torch.full((M, K), -1, dtype=torch.int32)), ValueError, r"\[0, 4\)"),
    ("activation", lambda: with_(activation="relu"), ValueError, "activation must be one of"),
    ("backend", lambda: with_(backend="cuda"), ValueError, "backend must be one of"),
    ("non-contiguous x", lambda: with_(x=torch.randn(H, M).t()), ValueError, "contiguous"),
    ("non-contiguous w13", lambda: with_(w13=quantize_weights(torch.randn(E, H, 2 * I))[0].transpose(1, 2)),
     ValueError, "w13 must be contiguous"),
    ("expert_map length", lambda: with_(expert_map=torch.arange(E), global_num_experts=E + 2), ValueError,
     "expert_map has 4 entries"),
    ("global without map", lambda: with_(global_num_experts=8), ValueError, "pass expert_map"),
    ("expert_map values", lambda: with_(expert_map=torch.tensor([0, 1, 2, 9])), ValueError, "expert_map entries"),
    ("not a tensor", lambda: with_(x=[[1.0] * H] * M), TypeError, "x must be a torch.Tensor"),
    ("w13 rows neither I nor 2I", lambda: with_(w13=torch.zeros(E, 3 * I, H, dtype=torch.int8),
                                                w13_scale=torch.ones(E, 3 * I)), ValueError,
     r"\[E, I, H\] for experts without a gate"),
    ("gated scale of I rows", lambda: with_(w13_scale=torch.ones(E, I)), ValueError,
     r"w13_scale must have shape \(4, 32\)"),
    ("ungated scale of 2I rows", lambda: ungated(w13_scale=torch.ones(E, 2 * I)), ValueError,
     r"w13_scale must have shape \(4, 16\)"),
    ("ungated bias of 2I rows", lambda: ungated(w13_bias=torch.zeros(E, 2 * I)), ValueError,
     r"w13_bias must have shape \(4, 16\)"),
    ("swiglu_oai without a gate", lambda: ungated(activation="swiglu_oai"), ValueError, "needs gate and up rows"),
    ("global_num_experts 0", lambda: with_(global_num_experts=0), ValueError, "global_num_experts must be a positive"),
    ("global_num_experts bool", lambda: with_(global_num_experts=True, w13=good()["w13"][:1], w2=good()["w2"][:1],
                                              w13_scale=good()["w13_scale"][:1], w2_scale=good()["w2_scale"][:1],
                                              topk_ids=torch.zeros(M, 1, dtype=torch.int32),
                                              topk_weights=torch.rand(M, 1)),
     ValueError, r"global_num_experts must be a positive int \(or None\), got True"),
    ("float weights of another dtype", lambda: with_(w13=torch.randn(E, 2 * I, H), w2=torch.randn(E, H, I).half(),
                                                     w13_scale=None, w2_scale=None),
     TypeError, r"float weights must have x's dtype \(torch.float32\), got w13 torch.float32 and w2 torch.float16"),
]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("make, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected(make, exc, match, backend):
    args = make()
    args.setdefault("backend", backend)
    with pytest.raises(exc, match=match):
        fused_experts(**args)


@pytest.mark.parametrize("call, match", [
    (lambda a: fused_experts(**{**a, "w1_scale": a.pop("w13_scale")}), r"'w1_scale' is w13_scale here"),
    (lambda a: fused_experts(**a, inplace=True), r"'inplace' is not supported"),
    (lambda a: fused_experts(**a, typo=1), r"fused_experts\(\) got unexpected keyword arguments \['typo'\]$"),
    (lambda a: fused_moe(a["x"], torch.randn(M, E), a["w13"], a["w2"], K, w13_scale=a["w13_scale"],
                         w2_scale=a["w2_scale"], use_int8_w8a16=True), r"'use_int8_w8a16' is implied"),
    (lambda a: fused_moe(a["x"], torch.randn(M, E), a["w13"], a["w2"], K, w13_scale=a["w13_scale"],
                         w2_scale=a["w2_scale"], scoring_func="sigmoid"), r"'scoring_func' is scoring here"),
    (lambda a: select_experts(torch.randn(M, E), K, e_score_correction_bias=torch.zeros(E)),
     r"select_experts\(\) .*'e_score_correction_bias' is correction_bias here"),
])
def test_other_projects_argument_names_say_ours(call, match):
    """A call written for vLLM's or SGLang's fused MoE is refused with what each of its arguments is here."""
    with pytest.raises(TypeError, match=match):
        call(good())


def test_fused_moe_in_vllms_argument_order_says_ours():
    a = good()
    with pytest.raises(ValueError, match=r"router_logits \[M, E\] comes second"):
        fused_moe(a["x"], a["w13"], a["w2"], torch.randn(M, E), K, w13_scale=a["w13_scale"], w2_scale=a["w2_scale"])


def test_fused_moe_on_batched_x_says_x_must_be_2d():
    a = good()
    with pytest.raises(ValueError, match=r"x must be 2-D, got shape \(1, 3, 32\)"):
        fused_moe(a["x"][None], torch.randn(M, E), a["w13"], a["w2"], K, w13_scale=a["w13_scale"],
                  w2_scale=a["w2_scale"])


@pytest.mark.parametrize("name, ours", [("swigluoai", "swiglu_oai"), ("SiLU", "silu"), ("gelu_pytorch_tanh", "gelu_tanh")])
def test_an_activation_spelled_as_elsewhere_names_ours(name, ours):
    with pytest.raises(ValueError, match=f"got '{name}' \\(experts_int8 calls it '{ours}'\\)"):
        fused_experts(**good(), activation=name, backend="torch")
    with pytest.raises(ValueError, match=f"experts_int8 calls it '{ours}'"):
        Int8Experts(E, H, I, activation=name)


def test_good_args_pass():
    assert fused_experts(**good(), backend="torch").shape == (M, H)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("activation", ["relu2", "silu", "gelu"])
def test_experts_without_a_gate_pass(backend, activation):
    """w13 [E, I, H] with w13_scale [E, I] (and w13_bias [E, I]): experts without a gate, any activation
    but swiglu_oai."""
    args = {k: v.to(DEVICE) for k, v in ungated(w13_bias=torch.zeros(E, I)).items()}  # (the GPU where there is one)
    out = fused_experts(**args, activation=activation, backend=backend)
    assert out.shape == (M, H) and torch.isfinite(out).all()


def test_old_gpu_falls_back_to_torch_with_one_warning(monkeypatch):
    """On a GPU older than Ampere, backend='auto' warns once and uses the torch path."""
    from experts_int8 import ops

    ops._capability_ok.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.warns(UserWarning, match=r"Tesla T4 \(compute capability 7\.5\).*torch path"):
        assert ops.kernel_supported(torch.device("cuda", 0)) is False
    assert ops.kernel_supported(torch.device("cuda", 0)) is False  # cached: no second warning
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ops._capability_ok.cache_clear()
    assert ops.kernel_supported(torch.device("cuda", 0)) is True
    ops._capability_ok.cache_clear()


def test_the_old_gpu_warning_points_at_the_callers_line_however_deep_the_call(monkeypatch):
    """Through fused_moe -> fused_experts -> kernel_supported, or a layer's forward, the warning names the user's
    line, not one inside the library (a package frame is stood in for by code compiled with a package path)."""
    import os
    import warnings

    from experts_int8 import ops

    ops._capability_ok.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    inside = {"kernel_supported": ops.kernel_supported, "torch": torch}
    source = ("class Layer(torch.nn.Module):\n    def forward(self):\n        return deeper()\n"
              "def deeper():\n    return kernel_supported(torch.device('cuda', 0))\n")
    exec(compile(source, os.path.join(os.path.dirname(ops.__file__), "stand_in.py"), "exec"), inside)
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        assert inside["Layer"]()() is False  # (through nn.Module's __call__: torch's frames lie between too)
    ops._capability_ok.cache_clear()
    assert [w.filename for w in raised] == [__file__]


def test_kernel_support_check_traces_without_graph_break(monkeypatch):
    from experts_int8 import ops

    def capability(device=None):
        return (9, 0)

    ops._capability_ok.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)

    def f(x):
        return x + 1 if ops.kernel_supported(torch.device("cuda", 0)) else x - 1

    assert torch.equal(torch.compile(f, fullgraph=True, backend="eager")(torch.ones(2)), torch.full((2,), 2.0))
    ops._capability_ok.cache_clear()


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_meta_inputs_give_a_meta_output_and_no_hidden_size_gives_an_empty_one(backend):
    """Meta tensors (shape inference) pass the checks without reading values; H = 0 is an empty [M, 0]."""
    meta = {k: v.to("meta") for k, v in good().items()}
    out = fused_experts(**meta, backend=backend)
    assert out.shape == (M, H) and out.device.type == "meta"
    w13, w2 = torch.randn(E, 2 * I, 0), torch.randn(E, 0, I)
    out = fused_experts(torch.randn(M, 0), w13, w2, torch.rand(M, K), torch.randint(0, E, (M, K)), backend=backend)
    assert out.shape == (M, 0)


@pytest.mark.skipif(DEVICE != "cpu", reason="Triton's interpreter runs on CPU tensors only")
def test_triton_on_cpu_refuses_bfloat16():
    """The interpreter's bf16 dots are wrong by orders of magnitude with no error of its own: refused, not run."""
    args = {k: (v.bfloat16() if k == "x" else v) for k, v in good().items()}
    with pytest.raises(TypeError, match="wrong results in bfloat16"):
        fused_experts(**args, backend="triton")
    assert fused_experts(**args, backend="torch").dtype == torch.bfloat16


NO_TRITON = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):  # as on macOS and Windows, where Triton has no wheels
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] != "triton" else self.missing(name)
    def missing(self, name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTriton())
import torch, warnings
from experts_int8 import fused_moe, quantize_weights, reference
from experts_int8.layer import Int8Experts
q13, s13 = quantize_weights(torch.randn(4, 32, 16))
q2, s2 = quantize_weights(torch.randn(4, 16, 16))
x, logits = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 4)
out = fused_moe(x, logits, q13, q2, 2, w13_scale=s13, w2_scale=s2)
assert torch.equal(out, fused_moe(x, logits, q13, q2, 2, w13_scale=s13, w2_scale=s2, backend="torch"))
try:
    fused_moe(x, logits, q13, q2, 2, w13_scale=s13, w2_scale=s2, backend="triton")
except RuntimeError as e:
    print("REFUSED:", e)
assert "triton" not in sys.modules
"""


def test_without_triton_the_torch_path_runs_and_the_triton_backend_says_why_not():
    """Triton has wheels for Linux only: without it the library imports and runs its torch path."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", NO_TRITON], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "REFUSED: Triton is not installed" in done.stdout and "backend='torch'" in done.stdout
