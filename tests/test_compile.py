"""The Triton path is one custom op with a fake implementation: torch.compile traces it without breaks."""

import torch

from conftest import DEVICE
from experts_int8 import fused_experts, quantize_weights, select_experts


def test_fullgraph_compile_matches_eager():
    q13, s13 = quantize_weights(torch.randn(4, 64, 32, device=DEVICE))
    q2, s2 = quantize_weights(torch.randn(4, 32, 32, device=DEVICE))
    x = torch.randn(5, 32, device=DEVICE)
    logits = torch.randn(5, 4, device=DEVICE)

    def layer(x, logits):
        w, ids = select_experts(logits, 2)
        return fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, backend="triton")

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, logits), layer(x, logits))


def test_op_is_registered_with_fake_impl():
    op = torch.ops.experts_int8.fused_experts.default
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(7, 32)
        out = op(x, torch.empty(4, 64, 32, dtype=torch.int8), torch.empty(4, 32, 32, dtype=torch.int8),
                 torch.empty(7, 2), torch.empty(7, 2, dtype=torch.int32), torch.empty(4, 64), torch.empty(4, 32),
                 "silu", False, None)
        assert out.shape == (7, 32) and out.dtype == x.dtype


def test_fullgraph_compiled_backward_matches_eager():
    """A compiled training step through the op: its backward is an op of its own, so the reference path's
    data-dependent loop over experts stays out of the traced graph."""
    q13, s13 = quantize_weights(torch.randn(4, 64, 32, device=DEVICE))
    q2, s2 = quantize_weights(torch.randn(4, 32, 32, device=DEVICE))
    logits = torch.randn(5, 4, device=DEVICE)

    def step(x, logits):
        w, ids = select_experts(logits, 2)
        return fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, backend="triton").square().sum()

    x0 = torch.randn(5, 32, device=DEVICE)
    grads = []
    for fn in (torch.compile(step, fullgraph=True, backend="aot_eager"), step):
        x, lg = x0.clone().requires_grad_(), logits.clone().requires_grad_()
        fn(x, lg).backward()
        grads.append((x.grad, lg.grad))
    (gx, gl), (ex, el) = grads
    assert gx.abs().sum() > 0 and gl.abs().sum() > 0  # through the experts and the routing weights
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gl, el)


def test_torch_path_compiles_fullgraph_forward_and_backward():
    """The torch path loops over the experts the routing hits (a loop over the ids' values): under torch.compile
    it is one op of its own, so a model on the CPU compiles with fullgraph=True as on the GPU (it broke the
    graph at `torch.unique(ids).tolist()`, and transformers' compiled generate with fullgraph failed)."""
    q13, s13 = quantize_weights(torch.randn(4, 64, 32, device=DEVICE))
    q2, s2 = quantize_weights(torch.randn(4, 32, 32, device=DEVICE))
    x0, logits = torch.randn(5, 32, device=DEVICE), torch.randn(5, 4, device=DEVICE)

    def layer(x, logits):
        w, ids = select_experts(logits, 2)
        return fused_experts(x, q13, q2, w, ids, w13_scale=s13, w2_scale=s2, backend="torch")

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (compiled, layer):
        x, lg = x0.clone().requires_grad_(), logits.clone().requires_grad_()
        out = fn(x, lg)
        out.square().sum().backward()
        results.append((out.detach(), x.grad, lg.grad))
    (out, gx, gl), (want, ex, el) = results
    assert gx.abs().sum() > 0 and gl.abs().sum() > 0
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gl, el)


def test_quantized_model_on_the_torch_path_compiles_fullgraph():
    from models import tiny_model

    from experts_int8 import quantize_

    model = quantize_(tiny_model("mixtral", seed=0)).eval()
    tokens = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(tokens).logits
        got = torch.compile(model.forward, fullgraph=True, backend="aot_eager")(tokens).logits
    torch.testing.assert_close(got, want)


def test_the_ops_that_read_the_ids_on_the_host_stay_out_of_cuda_graphs():
    """The torch path's op (and the backward's) loop over the experts the routing hits, reading the ids' values
    on the host: a CUDA graph capture cannot, so inductor's CUDA graphs (mode="reduce-overhead", transformers'
    compiled generate with a static cache) must leave them out, as they leave out aten's syncing ops."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    from experts_int8 import ops

    q13, s13 = quantize_weights(torch.randn(4, 64, 32))
    q2, s2 = quantize_weights(torch.randn(4, 32, 32))
    w, ids = select_experts(torch.randn(5, 4), 2)
    inputs = (torch.randn(5, 32), q13, q2, w, ids, s13, s2)
    graphs = {
        "forward": lambda x, q13, q2, w, ids, s13, s2: ops._fused_experts_reference(
            x, q13, q2, w, ids, s13, s2, "silu", False, None),
        "backward": lambda x, q13, q2, w, ids, s13, s2: ops._fused_experts_backward(
            x, x, q13, q2, w, ids, s13, s2, "silu", False, None, None, None, None, None, False, [0])[0],
    }
    for name, fn in graphs.items():
        node = get_first_incompatible_cudagraph_node(make_fx(fn, tracing_mode="fake")(*inputs))
        assert node is not None and "experts_int8" in str(node.target), name
