"""fused_experts against the fp64 reference: the Triton kernels (interpreted on CPU) and the torch path."""

import functools
import inspect

import pytest
import torch
import triton
import triton.language as tl

from conftest import DEVICE
from experts_int8 import dequantize_weights, fused_experts, fused_moe, quantize_weights, reference, select_experts
from experts_int8.kernels.align import align_block_size
from experts_int8.layer import Int8Experts
from experts_int8.kernels.fused_moe import _dedup_pair_rows, _weight_tile

DTYPES = [torch.float16, torch.float32] if DEVICE == "cpu" else [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
BACKENDS = ["triton", "torch"]


def make_experts(e, h, i, quantized=True, dtype=torch.float32, gated=True):
    """Random experts: ``w13 [E, 2I, H]`` (gate, up rows), or ``[E, I, H]`` (up rows) without ``gated``."""
    w13 = torch.randn(e, (2 if gated else 1) * i, h, device=DEVICE) / h**0.5
    w2 = torch.randn(e, h, i, device=DEVICE) / i**0.5
    if not quantized:
        return dict(w13=w13.to(dtype), w2=w2.to(dtype), w13_scale=None, w2_scale=None)
    q13, s13 = quantize_weights(w13)
    q2, s2 = quantize_weights(w2)
    return dict(w13=q13, w2=q2, w13_scale=s13, w2_scale=s2)


def oracle(x, experts, topk_weights, topk_ids, **kw):
    """fp64 reference on the dequantized weights."""
    def deq(w, s):
        return w.double() if s is None else dequantize_weights(w, s, torch.float64)

    return reference.fused_experts(
        x.double(), deq(experts["w13"], experts["w13_scale"]), deq(experts["w2"], experts["w2_scale"]),
        topk_weights, topk_ids, **kw,
    )


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(m, e, h, i, k, dtype, backend, topk_ids=None, quantized=True, weight_dtype=None, gated=True, **kw):
    experts = make_experts(e, h, i, quantized, weight_dtype or dtype, gated)
    x = torch.randn(m, h, device=DEVICE, dtype=dtype)
    n_global = kw.get("global_num_experts") or e
    topk_weights, ids = select_experts(torch.randn(m, n_global, device=DEVICE), k)
    if kw.get("apply_router_weight_on_input"):  # renormalized top-1 weights are all 1.0: make them count
        topk_weights = topk_weights * (0.25 + torch.rand_like(topk_weights))
    if topk_ids is not None:
        ids = topk_ids.to(DEVICE)
    out = fused_experts(x, **experts, topk_weights=topk_weights, topk_ids=ids, backend=backend, **kw)
    assert out.shape == (m, h) and out.dtype == dtype
    assert torch.isfinite(out).all()
    kw.pop("global_num_experts", None)
    ref = oracle(x, experts, topk_weights, ids, **kw)
    if m:
        assert rel_err(out, ref) < TOL[dtype], rel_err(out, ref)
    return out, ref


SHAPES = [  # (case, m, e, h, i, k)
    ("M=1", 1, 4, 64, 32, 2),
    ("M<BLOCK_M", 3, 4, 64, 32, 2),
    ("M>BLOCK_M", 37, 4, 64, 32, 2),
    ("odd H and I", 5, 4, 67, 45, 2),
    ("prime E", 6, 7, 32, 48, 3),
    ("k=1", 9, 5, 48, 32, 1),
    ("k=E", 4, 3, 32, 32, 3),
    ("experts with no token", 2, 16, 32, 32, 2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, m, e, h, i, k", SHAPES)
def test_matches_reference(backend, dtype, case, m, e, h, i, k):
    check(m, e, h, i, k, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_tokens_on_one_expert(backend, dtype):
    m, k = 20, 2
    ids = torch.stack([torch.full((m,), 2), torch.full((m,), 0)], dim=1).int()
    check(m, 4, 32, 32, k, dtype, backend, topk_ids=ids)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh", "relu2"])
def test_activations(backend, activation, gated):
    check(7, 4, 48, 32, 2, torch.float32, backend, activation=activation, gated=gated)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gated", [True, False])
def test_router_weight_on_input(backend, gated):
    check(6, 4, 32, 32, 1, torch.float32, backend, apply_router_weight_on_input=True, gated=gated)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weight_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("gated", [True, False])
def test_float_weights_unquantized(backend, weight_dtype, gated):
    check(5, 4, 32, 48, 2, torch.float32 if weight_dtype == torch.float32 else torch.float16, backend,
          quantized=False, weight_dtype=weight_dtype, gated=gated, activation="silu" if gated else "relu2")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [True, False])
def test_expert_map_with_absent_experts(backend, dtype, gated):
    # 6 global experts; this rank holds global experts 1, 4 and 5 as local 0, 1, 2.
    expert_map = torch.tensor([-1, 0, -1, -1, 1, 2], device=DEVICE)
    m, k = 11, 2
    out, _ = check(m, 3, 32, 32, k, dtype, backend, expert_map=expert_map, global_num_experts=6, gated=gated)
    # A token routed only to absent experts gets exactly zero.
    experts = make_experts(3, 32, 32, gated=gated)
    x = torch.randn(2, 32, device=DEVICE, dtype=dtype)
    ids = torch.tensor([[0, 2], [3, 2]], device=DEVICE, dtype=torch.int32)
    w = torch.rand(2, 2, device=DEVICE)
    out = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, expert_map=expert_map,
                        global_num_experts=6, backend=backend)
    assert torch.all(out == 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m", [3, 40])
def test_strided_ids_weights_and_map_read_as_their_values(backend, m):
    """topk_ids, topk_weights and expert_map as views with uniform strides (a column of a wider tensor, which
    reshape(-1) keeps as a view): the kernels read them by pointer, so they must see the values, not memory."""
    experts = make_experts(4, 32, 16)
    x = torch.randn(m, 32, device=DEVICE)
    w, ids = select_experts(torch.randn(m, 6, device=DEVICE), 2)
    wide_ids = torch.stack([ids, torch.zeros_like(ids)], -1)[..., 0]
    wide_w = torch.stack([w, torch.zeros_like(w)], -1)[..., 0]
    expert_map = torch.tensor([[0, 9], [-1, 9], [1, 9], [2, 9], [-1, 9], [3, 9]], device=DEVICE,
                              dtype=torch.int32)[:, 0]
    assert wide_ids.stride() == (4, 2) and expert_map.stride() == (2,)
    kw = dict(global_num_experts=6, backend=backend)
    out = fused_experts(x, **experts, topk_weights=wide_w, topk_ids=wide_ids, expert_map=expert_map, **kw)
    ref = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, expert_map=expert_map.contiguous(), **kw)
    assert torch.allclose(out, ref, atol=1e-6, rtol=1e-5)
    assert rel_err(out, oracle(x, experts, w, ids, expert_map=expert_map.contiguous())) < TOL[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend):
    out, _ = check(0, 4, 32, 32, 2, torch.float32, backend)
    assert out.shape == (0, 32)


def test_fused_moe_is_select_then_fused():
    experts = make_experts(8, 32, 32)
    x = torch.randn(5, 32, device=DEVICE)
    logits = torch.randn(5, 8, device=DEVICE)
    out = fused_moe(x, logits, **experts, top_k=2, scoring="sigmoid", routed_scaling_factor=1.5, backend="torch")
    w, ids = select_experts(logits, 2, scoring="sigmoid", routed_scaling_factor=1.5)
    torch.testing.assert_close(out, fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch"))
    for cols, kw in ((2, {}), (16, {}), (8, dict(global_num_experts=16)), (4, dict(expert_map=torch.arange(8)))):
        with pytest.raises(ValueError, match=f"router_logits has {cols} columns but there are"):
            fused_moe(x, torch.randn(5, cols, device=DEVICE), **experts, top_k=2, backend="torch", **kw)


def test_triton_and_torch_backends_agree():
    experts = make_experts(6, 64, 48)
    x = torch.randn(13, 64, device=DEVICE, dtype=torch.float32)
    w, ids = select_experts(torch.randn(13, 6, device=DEVICE), 2)
    a = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="triton")
    b = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block_m", [16, 32])
def test_align_block_size_invariants(block_m):
    e, m, k = 5, 23, 2
    ids = torch.randint(0, e, (m, k), dtype=torch.int32)
    ids[0, 0] = -1  # out of range -> absent group
    sorted_ids, block_expert, num_post = align_block_size(ids, block_m, e)
    n = int(num_post)
    assert n % block_m == 0 and n <= sorted_ids.numel()
    flat = ids.reshape(-1)
    real = sorted_ids[:n][sorted_ids[:n] < m * k].long()
    assert sorted(real.tolist()) == list(range(m * k))  # every pair exactly once
    assert torch.all(sorted_ids[n:] == m * k)
    for b in range(n // block_m):
        rows = sorted_ids[b * block_m:(b + 1) * block_m]
        rows = rows[rows < m * k].long()
        expect = -1 if flat[rows[0]] < 0 else int(flat[rows[0]])
        assert int(block_expert[b]) == expect
        assert all((-1 if flat[r] < 0 else int(flat[r])) == expect for r in rows)


@pytest.mark.parametrize("trial", range(12))
def test_single_program_align_matches_torch_align(trial, monkeypatch):
    from experts_int8.kernels import align

    e = int(torch.randint(1, 40, ()))
    m = int(torch.randint(0, 60, ()))
    k = int(torch.randint(1, min(e, 6) + 1, ()))
    block_m = [16, 32, 64][trial % 3]
    ids = torch.randint(-1, e + 1, (m, k), dtype=torch.int32 if trial % 2 else torch.int64, device=DEVICE)
    expert_map = None
    if trial % 4 == 0:
        expert_map = torch.randint(-1, e, (e + 3,), dtype=torch.int32, device=DEVICE)
        ids = torch.randint(0, e + 3, (m, k), device=DEVICE)
    fast = align._align_single_program(ids, block_m, e, expert_map)
    assert_equals_torch_align(fast, ids, block_m, e, expert_map, monkeypatch)


def assert_equals_torch_align(got, ids, block_m, e, expert_map, monkeypatch):
    """``got`` (a Triton align path's output) equals the torch stable sort's, padding included."""
    from experts_int8.kernels import align

    monkeypatch.setattr(align, "SINGLE_PROGRAM_MAX_PAIRS", -1)
    monkeypatch.setattr(align, "_interpreting", lambda: False)  # CPU tensors: the torch sort path
    slow = align.align_block_size(ids.cpu(), block_m, e, None if expert_map is None else expert_map.cpu())
    n = int(slow[2])
    assert int(got[2]) == n
    assert torch.equal(got[0].cpu(), slow[0])
    assert torch.equal(got[1][: n // block_m].cpu(), slow[1][: n // block_m])
    assert torch.all(got[1][n // block_m:] == -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap_gate_up, swap_down", [(0, 1), (1, 0), (1, 1)])
def test_swapped_operand_orientation_and_per_gemm_configs(dtype, swap_gate_up, swap_down):
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=2,
               SWAP_AB=swap_gate_up, down=dict(BLOCK_SIZE_N=16, BLOCK_SIZE_K=64, SWAP_AB=swap_down))
    with override_config(cfg):
        check(29, 5, 67, 45, 2, dtype, "triton")


@pytest.mark.parametrize("pairs", [0, 1])
def test_pdl_prefetch_entries_run_where_pdl_does_not(pairs):
    """An entry with PDL and the down GEMM's PDL_PREFETCH where no launch is a programmatic dependent (the
    interpreter, pre-Hopper GPUs): the plain kernels, same results (the GPU test times the early wait)."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, PDL=2,
               PAIRS=pairs, down=dict(SPLIT_K=2, SUM_LAST=pairs, PDL_PREFETCH=4))
    with override_config(cfg):
        check(3, 5, 67, 45, 2, torch.float32, "triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k, swap_down", [(2, 0), (3, 1), (8, 0)])
def test_split_k_down_partials_add_up(dtype, split_k, swap_down):
    """SPLIT_K slices I over programs (fp32 partials); uneven slices and empty last slices included."""
    from experts_int8.kernels.configs import override_config

    # I=45 with BLOCK_SIZE_K=16: 3 K-blocks, so split 2 -> [2, 1] and split 8 -> [1, 1, 1, 0, ...]
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               down=dict(BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, SWAP_AB=swap_down, SPLIT_K=split_k))
    with override_config(cfg):
        check(1, 5, 67, 45, 2, dtype, "triton")
        check(7, 5, 67, 45, 3, dtype, "triton", apply_router_weight_on_input=False)
        check(3, 4, 32, 45, 1, dtype, "triton")  # k=1: the partials are the whole sum
        check(3, 8, 32, 45, 2, dtype, "triton", quantized=False)
        # expert parallelism: absent experts' blocks write zeros into every partial
        expert_map = torch.tensor([0, -1, 1, -1, 2, 3], dtype=torch.int32, device=DEVICE)
        out, ref = check(6, 4, 32, 45, 2, dtype, "triton", expert_map=expert_map, global_num_experts=6)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_sum_is_one_sum_launch(k, monkeypatch):
    """Without split-K the token's k expert rows are added by the library's sum kernel too (one launch,
    fp32 accumulation, one cast), not by a torch reduction; with k = 1 there is nothing to add."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    real_sum = ops.invoke_sum
    calls = []
    monkeypatch.setattr(ops, "invoke_sum", lambda *a, **kw: calls.append(a[0].shape) or real_sum(*a, **kw))
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    with override_config(cfg):
        check(5, 6, 67, 45, k, torch.float16, "triton")
    assert calls == ([] if k == 1 else [(1, 5 * k, 67)])


@pytest.mark.parametrize("split_k, k, hidden", [(1, 2, 67), (4, 2, 1500), (3, 8, 33)])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_sum_kernel_adds_partials_and_experts(split_k, k, hidden, out_dtype):
    """The one-launch sum over split-K partials and a token's k experts equals torch's sum, cast last."""
    from experts_int8.kernels.fused_moe import invoke_sum

    m = 5
    y = torch.randn(split_k, m * k, hidden, device=DEVICE)
    out = invoke_sum(y, torch.empty(m, hidden, device=DEVICE, dtype=out_dtype), k)
    want = y.double().view(split_k, m, k, hidden).sum(dim=(0, 2)).to(out_dtype)
    torch.testing.assert_close(out, want, rtol=1e-3 if out_dtype == torch.float16 else 1e-6, atol=1e-3)
    with pytest.raises(ValueError, match="do not match"):
        invoke_sum(y, torch.empty(m + 1, hidden, device=DEVICE), k)


@pytest.mark.parametrize("weights_dtype", [torch.float16, torch.float64])
def test_routing_weights_in_any_float_dtype(weights_dtype):
    """The kernels read the routing weights in their own dtype (no cast launch): same result as fp32."""
    experts = make_experts(6, 32, 48)
    x = torch.randn(4, 32, device=DEVICE, dtype=torch.float32)
    topk_weights, ids = select_experts(torch.randn(4, 6, device=DEVICE), 2)
    topk_weights = topk_weights.to(weights_dtype)
    for on_input in (False, True):
        out = fused_experts(x, **experts, topk_weights=topk_weights, topk_ids=ids, backend="triton",
                            apply_router_weight_on_input=on_input)
        ref = fused_experts(x, **experts, topk_weights=topk_weights.float(), topk_ids=ids, backend="triton",
                            apply_router_weight_on_input=on_input)
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_dequantize_kernel_matches_torch(out_dtype):
    from experts_int8.kernels.fused_moe import invoke_dequantize

    w = torch.randn(3, 40, 1100, device=DEVICE)
    q, s = quantize_weights(w)
    q, s = q[:, 5:37], s[:, 5:37]  # a slice: rows strided, as a view of a larger tensor would be
    got = invoke_dequantize(q, s, out_dtype)
    assert got.shape == (3, 32, 1100) and got.dtype == out_dtype and got.is_contiguous()
    torch.testing.assert_close(got, dequantize_weights(q, s, out_dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [True, False])
def test_dequant_once_matches(dtype, gated, monkeypatch):
    """DEQUANT_ONCE: int8 experts dequantized in one pass, then the float GEMMs (this entry's blocks); with
    experts without a gate too (w13's I rows dequantized)."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    calls = []
    real = ops.invoke_dequantize
    monkeypatch.setattr(ops, "invoke_dequantize", lambda *a: calls.append(a[2]) or real(*a))
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               DEQUANT_ONCE=1)
    with override_config(cfg):
        check(37, 4, 64, 48, 2, dtype, "triton", gated=gated)
        # fp32 activations keep the int8 path: the entry's blocks are sized for 16-bit weights
        assert calls == ([] if dtype == torch.float32 else [dtype, dtype])
        check(9, 4, 32, 48, 2, dtype, "triton", quantized=False, gated=gated)  # float weights: nothing to dequantize
        assert len(calls) == (0 if dtype == torch.float32 else 2)
        # no room for the float copy: the int8 path, same result
        monkeypatch.setattr(ops, "_transient_fits", lambda nbytes, device: False)
        check(37, 4, 64, 48, 2, dtype, "triton", gated=gated)
        assert len(calls) == (0 if dtype == torch.float32 else 2)


def test_transient_fits_counts_free_and_cached_memory(monkeypatch):
    from experts_int8 import ops

    assert ops._transient_fits(1 << 60, torch.device("cpu"))  # no query off CUDA
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 10 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 9 << 30)
    assert ops._transient_fits(4 << 30, cuda)  # 3 GiB free on the device + 1 GiB cached by torch
    assert not ops._transient_fits((4 << 30) + 1, cuda)


def test_split_k_is_a_down_only_key():
    from experts_int8.kernels.configs import check_config

    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert check_config(dict(base, down=dict(SPLIT_K=4)))["down"]["SPLIT_K"] == 4
    with pytest.raises(ValueError, match="keys"):
        check_config(dict(base, SPLIT_K=4))
    with pytest.raises(ValueError, match="positive int"):
        check_config(dict(base, down=dict(SPLIT_K=0)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quantized", [True, False])
def test_fused_gate_up_dot_matches(dtype, quantized):
    """FUSE_GATE_UP: gate and up tiles joined into one dot of width 2*BLOCK_N, split after the K loop."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32, GROUP_SIZE_M=2, num_warps=4, num_stages=2,
               FUSE_GATE_UP=1, down=dict(BLOCK_SIZE_N=32))
    with override_config(cfg):
        check(29, 5, 67, 45, 2, dtype, "triton", quantized=quantized)  # odd I: the last N tile is partial
        check(3, 4, 64, 32, 2, dtype, "triton", quantized=quantized, activation="gelu_tanh")
        check(7, 4, 64, 32, 1, dtype, "triton", quantized=quantized, apply_router_weight_on_input=True)


def test_fused_gate_up_excludes_swap_ab():
    from experts_int8.kernels.configs import check_config

    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert check_config(dict(base, FUSE_GATE_UP=1))["FUSE_GATE_UP"] == 1
    with pytest.raises(ValueError, match="FUSE_GATE_UP"):
        check_config(dict(base, FUSE_GATE_UP=1, SWAP_AB=1))
    with pytest.raises(ValueError, match="keys"):
        check_config(dict(base, down=dict(FUSE_GATE_UP=1)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap, split_k, sum_topk, sum_last, group", [
    (0, 1, 0, 0, 1), (1, 1, 0, 0, 1), (0, 2, 0, 0, 1), (0, 1, 1, 0, 1), (1, 1, 1, 0, 1), (0, 1, 0, 1, 1),
    (1, 3, 0, 1, 1), (0, 2, 0, 1, 4)])
def test_pairs_mode_skips_align(dtype, swap, split_k, sum_topk, sum_last, group, monkeypatch):
    """PAIRS: every (token, slot) pair is its own block, experts read straight from top-k ids; with
    the down GEMM's SUM_TOPK one block per token adds up its k experts (no separate sum); with
    SUM_LAST the last program to store a partial of a token's column tile adds up all of them."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    def no_align(*args, **kwargs):
        raise AssertionError("PAIRS must not run the align step")

    def no_sum(*args, **kwargs):
        raise AssertionError("SUM_LAST must not launch the sum")

    monkeypatch.setattr(ops, "align_block_size", no_align)
    if sum_last:
        monkeypatch.setattr(ops, "invoke_sum", no_sum)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=group, num_warps=4, num_stages=2,
               SWAP_AB=swap, PAIRS=1, down=dict(BLOCK_SIZE_N=16, SPLIT_K=split_k, SUM_TOPK=sum_topk,
                                                 SUM_LAST=sum_last))
    with override_config(cfg):
        check(1, 6, 67, 45, 2, dtype, "triton")
        check(5, 6, 67, 45, 2, dtype, "triton")  # (with GROUP_SIZE_M 4: programs out of column order)
        check(3, 4, 64, 32, 3, dtype, "triton", quantized=False)  # tokens sharing experts
        check(2, 4, 64, 32, 1, dtype, "triton", apply_router_weight_on_input=True)
        expert_map = torch.tensor([0, -1, 1, -1, 2, 3], dtype=torch.int32, device=DEVICE)
        check(2, 4, 32, 45, 2, dtype, "triton", expert_map=expert_map, global_num_experts=6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap, split_k, group", [(0, 1, 1), (1, 2, 1), (0, 3, 4)])
def test_sum_last_on_the_align_path(dtype, swap, split_k, group, monkeypatch):
    """SUM_LAST on the align path: each block counts an arrival per pair row it stored (blocks of
    experts absent from this rank store zeros and count too), and the program storing a token's last
    partial adds up its k experts (and splits); no sum launch. Tokens sharing experts, several blocks
    an expert, repeated ids within a token, weights on the input, expert parallelism."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    def no_sum(*args, **kwargs):
        raise AssertionError("SUM_LAST must not launch the sum")

    monkeypatch.setattr(ops, "invoke_sum", no_sum)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=group, num_warps=4, num_stages=2,
               SWAP_AB=swap, down=dict(BLOCK_SIZE_N=16, SPLIT_K=split_k, SUM_LAST=1))
    with override_config(cfg):
        check_gathered_routings(dtype)
        check(2, 4, 32, 45, 1, dtype, "triton", topk_ids=torch.tensor([[1], [3]]), expert_map=EXPERT_MAP,
              global_num_experts=6)  # no expert on this rank: zeros, summed once


EXPERT_MAP = torch.tensor([0, -1, 1, -1, 2, 3], dtype=torch.int32, device=DEVICE)  # 6 global experts, 4 here


def check_gathered_routings(dtype):
    """The routings a program that gathers several pairs' rows must handle, against the oracle: one
    token, tokens sharing experts, ~27 pairs an expert (two blocks or leaders each), repeated ids within
    a token, routing weights on the input, experts on another rank."""
    check(1, 6, 67, 45, 2, dtype, "triton")
    check(7, 4, 64, 32, 3, dtype, "triton", quantized=False)
    check(40, 3, 32, 45, 2, dtype, "triton")
    check(9, 5, 32, 32, 3, dtype, "triton", topk_ids=torch.randint(0, 5, (9, 3)))
    check(3, 4, 64, 32, 1, dtype, "triton", apply_router_weight_on_input=True)
    check(7, 4, 32, 45, 2, dtype, "triton", expert_map=EXPERT_MAP, global_num_experts=6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swap, split_k, sum_last", [(0, 1, 0), (1, 2, 0), (0, 1, 1), (1, 3, 1)])
def test_dedup_pairs_reads_each_expert_once(dtype, swap, split_k, sum_last, monkeypatch):
    """DEDUP_PAIRS: one program per pair, but only the first (and every BLOCK_M-th) pair of an expert
    computes, taking the rows of the pairs routed to it. Experts shared by many tokens (more pairs than
    BLOCK_M), repeated ids within a token, absent experts and the fallback past DEDUP_MAX_PAIRS. With
    SUM_LAST a leader counts an arrival per row and adds up each token whose last partial it stored
    (no sum launch; past DEDUP_MAX_PAIRS the align path sums in its own launch)."""
    from experts_int8 import ops
    from experts_int8.kernels import fused_moe
    from experts_int8.kernels.configs import override_config

    real_align = ops.align_block_size
    align_calls = []
    monkeypatch.setattr(ops, "align_block_size", lambda *a, **k: align_calls.append(1) or real_align(*a, **k))
    real_sum = ops.invoke_sum
    sum_calls = []
    monkeypatch.setattr(ops, "invoke_sum", lambda *a, **k: sum_calls.append(1) or real_sum(*a, **k))
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               SWAP_AB=swap, PAIRS=1, DEDUP_PAIRS=1,
               down=dict(BLOCK_SIZE_N=16, SPLIT_K=split_k, **({"SUM_LAST": 1} if sum_last else {})))
    with override_config(cfg):
        check_gathered_routings(dtype)
        assert not align_calls and not (sum_last and sum_calls)
        monkeypatch.setattr(fused_moe, "DEDUP_MAX_PAIRS", 8)
        monkeypatch.setattr(ops, "DEDUP_MAX_PAIRS", 8)
        check(5, 4, 32, 32, 2, dtype, "triton")  # 10 pairs > 8: the align path
        assert align_calls == [1]


@triton.jit
def _dedup_rows_kernel(experts_ptr, out_ptr, num_valid, BLOCK_M: tl.constexpr, PAIRS_P2: tl.constexpr):
    pid = tl.program_id(0)
    rows, leads = _dedup_pair_rows(pid, experts_ptr, num_valid, BLOCK_M, PAIRS_P2)
    tl.store(out_ptr + pid * BLOCK_M + tl.arange(0, BLOCK_M), tl.where(leads, rows, -1))


def test_dedup_pair_rows_cover_every_pair_once():
    """The leaders' rows partition the pairs: each pair is computed by exactly one program."""
    for experts in ([3, 3, 1, 3, 0, 1, 3], [2] * 37, list(torch.randint(-1, 4, (50,)))):
        ids = torch.tensor(experts, dtype=torch.int32, device=DEVICE)
        n, block_m = len(experts), 16
        out = torch.empty(n, block_m, dtype=torch.int64, device=DEVICE)
        _dedup_rows_kernel[(n,)](ids, out, n, BLOCK_M=block_m, PAIRS_P2=triton.next_power_of_2(max(n, 16)))
        taken = out[out >= 0]
        taken = taken[taken < n]
        assert sorted(taken.tolist()) == list(range(n))
        for row in out[(out >= 0).any(1)]:  # a leader's rows share its expert, in pair order
            real = row[row < n]
            assert len(set(ids[real].tolist())) == 1 and real.tolist() == sorted(real.tolist())


def test_pairs_is_a_top_level_flag():
    from experts_int8.kernels.configs import check_config

    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert check_config(dict(base, PAIRS=1))["PAIRS"] == 1
    with pytest.raises(ValueError, match="0 or 1"):
        check_config(dict(base, PAIRS=2))
    with pytest.raises(ValueError, match="keys"):
        check_config(dict(base, down=dict(PAIRS=1)))
    assert check_config(dict(base, PAIRS=1, down=dict(SUM_TOPK=1)))["down"] == {"SUM_TOPK": 1}
    with pytest.raises(ValueError, match="SUM_TOPK .* needs PAIRS"):
        check_config(dict(base, down=dict(SUM_TOPK=1)))
    with pytest.raises(ValueError, match="SUM_TOPK .* needs PAIRS and no SPLIT_K"):
        check_config(dict(base, PAIRS=1, down=dict(SUM_TOPK=1, SPLIT_K=2)))
    assert check_config(dict(base, PAIRS=1, down=dict(SUM_LAST=1, SPLIT_K=2)))["down"] == {"SUM_LAST": 1, "SPLIT_K": 2}
    assert check_config(dict(base, PAIRS=1, DEDUP_PAIRS=1, down=dict(SUM_LAST=1)))["DEDUP_PAIRS"] == 1
    assert check_config(dict(base, down=dict(SUM_LAST=1, SPLIT_K=2)))["down"] == {"SUM_LAST": 1, "SPLIT_K": 2}
    for bad in (dict(base, PAIRS=1, down=dict(SUM_LAST=1, SUM_TOPK=1)), dict(base, GLUON=1, down=dict(SUM_LAST=1)),
                dict(base, WSRR=1, down=dict(SUM_LAST=1))):
        with pytest.raises(ValueError, match="SUM_LAST .* Triton kernels: without SUM_TOPK, and on the align path"):
            check_config(bad)
    # the Gluon kernels refuse PAIRS, so such an entry runs the Triton kernels: SUM_LAST applies
    assert check_config(dict(base, PAIRS=1, GLUON=1, down=dict(SUM_LAST=1)))["GLUON"] == 1
    assert check_config(dict(base, PAIRS=1, DEDUP_PAIRS=1))["DEDUP_PAIRS"] == 1
    with pytest.raises(ValueError, match="DEDUP_PAIRS refines PAIRS"):
        check_config(dict(base, DEDUP_PAIRS=1))
    with pytest.raises(ValueError, match="DEDUP_PAIRS refines PAIRS"):
        check_config(dict(base, PAIRS=1, DEDUP_PAIRS=1, down=dict(SUM_TOPK=1)))


@pytest.mark.parametrize("trial", range(8))
def test_chunked_align_matches_torch_align(trial, monkeypatch):
    """The three-launch align (any number of pairs) equals the stable torch sort, chunk borders included."""
    from experts_int8.kernels import align

    e = [3, 8, 40, 128][trial % 4]
    k = min(e, [2, 8][trial % 2])
    m = int(torch.randint(1, 300, ()))
    block_m = [16, 64][trial % 2]
    ids = torch.randint(-1, e + 1, (m, k), dtype=torch.int32 if trial % 2 else torch.int64, device=DEVICE)
    expert_map = None
    if trial % 3 == 0:
        expert_map = torch.randint(-1, e, (e + 3,), dtype=torch.int32, device=DEVICE)
        ids = torch.randint(0, e + 3, (m, k), device=DEVICE)
    chunked = align._align_chunked(ids, block_m, e, expert_map, chunk=16 if trial < 4 else 64)
    assert_equals_torch_align(chunked, ids, block_m, e, expert_map, monkeypatch)


def tail_case(trial):
    """Routing whose experts hold a few rows past a multiple of the block (and some that do not)."""
    e = [5, 16, 40][trial % 3]
    block_m, tail_rows, tail_block = [(64, 16, 16), (32, 8, 16), (128, 40, 32)][trial % 3]
    counts = torch.randint(0, 3 * block_m, (e,))
    counts[::2] = counts[::2] // block_m * block_m + torch.randint(1, tail_rows + 1, (len(counts[::2]),))
    flat = torch.repeat_interleave(torch.arange(e), counts)
    flat = flat[torch.randperm(flat.numel())]
    k = 2
    flat = torch.cat([flat, torch.full(((-flat.numel()) % k,), -1, dtype=torch.long)])  # absent pairs pad to k
    return flat.view(-1, k).to(torch.int32 if trial % 2 else torch.int64).to(DEVICE), e, block_m, tail_rows, tail_block


@pytest.mark.parametrize("trial", range(6))
def test_align_with_tail_regions(trial):
    """Each expert's last count % block_m rows, where that is 1..tail_rows, are the tail region's
    (in pair order, blocks of tail_block); the rest are grouped and padded as without a tail."""
    from experts_int8.kernels import align

    ids, e, block_m, tail_rows, tail_block = tail_case(trial)
    (main_ids, main_blocks, main_n), (tail_ids, tail_blocks, tail_n) = align.align_with_tail(
        ids.cpu(), block_m, e, None, tail_rows, tail_block)
    flat, numel = ids.reshape(-1).long().cpu(), ids.numel()
    counts = torch.bincount(flat[flat >= 0], minlength=e)
    left = counts % block_m
    tails = torch.where((left > 0) & (left <= tail_rows), left, 0)
    assert int(tails.sum()) > 0
    for region, blocks, n, block in ((main_ids, main_blocks, int(main_n), block_m),
                                     (tail_ids, tail_blocks, int(tail_n), tail_block)):
        assert n % block == 0 and torch.all(region[n:] == numel)
        for b in range(n // block):
            rows = region[b * block:(b + 1) * block]
            rows = rows[rows < numel].long()
            assert rows.numel() and all(max(int(flat[r]), -1) == int(blocks[b]) for r in rows)
    got_tail = tail_ids[tail_ids < numel].long()
    got_main = main_ids[main_ids < numel].long()
    assert sorted(torch.cat([got_main, got_tail]).tolist()) == list(range(numel))  # every pair once
    for x in range(e):
        mine = (flat == x).nonzero().squeeze(1)  # pair order
        want_tail = mine[mine.numel() - int(tails[x]):] if tails[x] else mine[:0]
        assert got_tail[flat[got_tail] == x].tolist() == want_tail.tolist()
        assert got_main[flat[got_main] == x].tolist() == mine[:mine.numel() - int(tails[x])].tolist()


@pytest.mark.parametrize("trial", range(6))
@pytest.mark.parametrize("path", ["single", "chunked"])
def test_kernel_align_with_tail_matches_torch(trial, path):
    from experts_int8.kernels import align

    ids, e, block_m, tail_rows, tail_block = tail_case(trial)
    if path == "single":
        got = align._align_single_program(ids, block_m, e, None, tail_rows, tail_block)
    else:
        got = align._align_chunked(ids, block_m, e, None, chunk=64, tail_rows=tail_rows, tail_block=tail_block)
    want = align._align_torch(ids.cpu(), block_m, e, None, tail_rows, tail_block)
    main_len = align.max_sorted_len(ids.numel(), e, block_m)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[2].cpu(), want[2])
    for start, end, block, n in ((0, main_len, block_m, int(want[2][0])),
                                 (main_len, want[0].numel(), tail_block, int(want[2][1]))):
        b0 = 0 if start == 0 else main_len // block_m
        assert torch.equal(got[1][b0:b0 + n // block].cpu(), want[1][b0:b0 + n // block])


def routing_with_tails(e, k, block_m, tail_rows):
    """``topk_ids [M, k]`` (distinct experts per token) where every other expert holds 1..tail_rows rows
    past a multiple of ``block_m``."""
    counts = torch.randint(block_m // 2, 3 * block_m, (e,))
    counts[::2] = counts[::2] // block_m * block_m + torch.randint(1, tail_rows + 1, (len(counts[::2]),))
    counts[-1] += (-int(counts.sum())) % k
    flat = torch.repeat_interleave(torch.arange(e), counts)
    ids = flat.view(k, -1).T  # token j: the j-th, (j + M)-th, ... of the sorted pairs: distinct experts
    return ids[torch.randperm(ids.shape[0])].contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tails, gated", [(True, True), (False, True), (True, False)])
def test_layer_with_a_tail_pass(dtype, tails, gated, monkeypatch):
    """TAIL_ROWS: the experts' few last rows run in a second pass (its own block size) and the layer
    equals the reference; without such rows the second pass has nothing to do. Experts without a gate
    (relu2) too."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    e, k, block_m, tail_rows = 6, 2, 32, 8
    ids = routing_with_tails(e, k, block_m, tail_rows) if tails else None
    launches = []
    real = ops.invoke_gate_up
    monkeypatch.setattr(ops, "invoke_gate_up", lambda *a, **kw: launches.append(a[11]["BLOCK_SIZE_M"]) or real(*a, **kw))
    small = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    monkeypatch.setattr(ops, "tail_config", lambda *a: small)
    cfg = dict(BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=4, num_warps=4, num_stages=2,
               TAIL_ROWS=tail_rows)
    with override_config(cfg):
        check(ids.shape[0] if tails else 40, e, 64, 32, k, dtype, "triton", topk_ids=ids, gated=gated,
              activation="silu" if gated else "relu2")
    assert launches == [block_m, 16]


def test_tail_rows_config_checks():
    from experts_int8.kernels.configs import check_config

    base = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert check_config(dict(base, TAIL_ROWS=32))["TAIL_ROWS"] == 32
    assert check_config(dict(base, WSRR=1, TAIL_ROWS=160, TAIL_ENTRY_ROWS=128))["TAIL_ROWS"] == 160  # 256-row tile
    for bad in (dict(TAIL_ROWS=64), dict(TAIL_ROWS=0), dict(TAIL_ROWS=8, PAIRS=1), dict(TAIL_ROWS=8, DEQUANT_ONCE=1),
                dict(TAIL_ROWS=8, down=dict(SPLIT_K=2)), dict(WSRR=1, WSRR_ROWS=128, TAIL_ROWS=128),
                dict(TAIL_ENTRY_ROWS=16)):
        with pytest.raises(ValueError, match="TAIL_ROWS"):
            check_config(dict(base, **bad))


def test_many_pairs_use_the_chunked_align(monkeypatch):
    """Above SINGLE_PROGRAM_MAX_PAIRS, with CHUNKED_ALIGN, the layer runs on the three-launch align."""
    from experts_int8.kernels import align
    from experts_int8.kernels.configs import override_config

    monkeypatch.setattr(align, "CHUNKED_ALIGN", True)
    calls = []
    real = align._align_chunked
    monkeypatch.setattr(align, "_align_chunked", lambda *a, **k: calls.append(1) or real(*a, **k))

    m, k = align.SINGLE_PROGRAM_MAX_PAIRS // 4 + 37, 4
    cfg = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=4, num_warps=4, num_stages=2)
    with override_config(cfg):
        check(m, 8, 32, 32, k, torch.float32, "triton")
    assert calls == [1]


def _biases(e, h, i, scale=4.0, dtype=torch.float32, gated=True):
    """Expert biases large enough that swiglu_oai's clamps at +-7 engage (w13's for I rows without ``gated``)."""
    return dict(w13_bias=(torch.randn(e, (2 if gated else 1) * i, device=DEVICE) * scale).to(dtype),
                w2_bias=(torch.randn(e, h, device=DEVICE) * 0.5).to(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["swiglu_oai", "silu"])
def test_expert_biases(backend, dtype, activation):
    torch.manual_seed(3)
    out, _ = check(9, 5, 48, 40, 2, dtype, backend, activation=activation, **_biases(5, 48, 40, dtype=dtype))
    out_q, _ = check(4, 4, 32, 32, 3, dtype, backend, quantized=False, activation=activation, **_biases(4, 32, 32))


def test_swiglu_oai_clamps_engage():
    """The test biases push gate/up past +-7, so a kernel without the clamps would fail the oracle."""
    from experts_int8.reference import act_and_mul

    g = torch.tensor([[-9.0, 0.5, 9.0, 3.0, -9.0, 9.0]])  # gate = first 3, up = last 3
    out = act_and_mul(g, "swiglu_oai")[0]
    sig = torch.sigmoid
    assert torch.allclose(out, torch.stack([-9 * sig(torch.tensor(-9 * 1.702)) * (3 + 1),
                                            0.5 * sig(torch.tensor(0.5 * 1.702)) * (-7 + 1),
                                            7 * sig(torch.tensor(7 * 1.702)) * (7 + 1)]))


# The clamped SwiGLUs: before the activation (DeepSeek-V4), after it (Step-3.7), another activation, and
# swiglu_oai at another limit and slope (MiniMax-M3). Limits below the gate values' spread, so the clamps engage.
CLAMPS = {"before": dict(activation="silu", swiglu_limit=0.6),
          "after": dict(activation="silu", swiglu_limit=0.4, limit_after_act=True),
          "gelu_tanh": dict(activation="gelu_tanh", swiglu_limit=0.8),
          "oai": dict(activation="swiglu_oai", swiglu_limit=1.0, swiglu_alpha=1.2)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clamp", sorted(CLAMPS))
def test_clamped_swiglu(backend, dtype, clamp):
    torch.manual_seed(5)
    out, ref = check(9, 5, 48, 40, 2, dtype, backend, **CLAMPS[clamp])
    unclamped = dict(CLAMPS[clamp], swiglu_limit=None, limit_after_act=False)
    if clamp == "oai":  # (its defaults: GPT-OSS's limit 7 and slope 1.702)
        unclamped.pop("swiglu_alpha")
    torch.manual_seed(5)
    _, loose = check(9, 5, 48, 40, 2, dtype, "torch", **unclamped)
    assert rel_err(out, loose) > 0.05  # the clamp changed the result: a kernel without it would fail the oracle


def test_clamped_swiglu_reference_formulas():
    from experts_int8.reference import act_and_mul, clamp_of

    g = torch.tensor([[-3.0, 0.2, 2.0, 3.0, -3.0, 0.5]])  # gate = first 3, up = last 3
    gate, up = g[0, :3], g[0, 3:]
    silu = torch.nn.functional.silu
    assert torch.equal(act_and_mul(g, "silu", clamp_of("silu", 1.0))[0], silu(gate.clamp(max=1.0)) * up.clamp(-1, 1))
    assert torch.equal(act_and_mul(g, "silu", clamp_of("silu", 0.1, limit_after_act=True))[0],
                       silu(gate).clamp(max=0.1) * up.clamp(-0.1, 0.1))
    g2 = gate.clamp(max=1.5)
    assert torch.allclose(act_and_mul(g, "swiglu_oai", clamp_of("swiglu_oai", 1.5, 1.1))[0],
                          g2 * torch.sigmoid(1.1 * g2) * (up.clamp(-1.5, 1.5) + 1))
    assert clamp_of("swiglu_oai") == clamp_of("swiglu_oai", 7.0, 1.702)  # GPT-OSS's, as before these options


@pytest.mark.parametrize("options, match", [
    (dict(swiglu_alpha=1.0), "swiglu_alpha is swiglu_oai's sigmoid slope"),
    (dict(limit_after_act=True), "limit_after_act needs swiglu_limit"),
    (dict(activation="swiglu_oai", swiglu_limit=2.0, limit_after_act=True), "does not apply to swiglu_oai"),
    (dict(swiglu_limit=0.0), "swiglu_limit must be a positive finite number"),
    (dict(swiglu_limit=float("inf")), "swiglu_limit must be a positive finite number"),
    (dict(swiglu_limit=True), "swiglu_limit must be a positive finite number"),
    (dict(limit_after_act=1, swiglu_limit=1.0), "limit_after_act must be a bool"),
])
def test_clamped_swiglu_options_that_do_not_apply_are_refused(options, match):
    experts = make_experts(2, 16, 8)
    x = torch.randn(3, 16, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 2, device=DEVICE), 1)
    with pytest.raises((ValueError, TypeError), match=match):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, **options)


def test_clamped_swiglu_options_take_any_real_number():
    """numpy's float32 and int64 are positive finite numbers as much as numpy's float64 (a float subclass) is."""
    import numpy as np

    torch.manual_seed(3)
    experts = make_experts(2, 16, 8)
    x = torch.randn(3, 16, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 2, device=DEVICE), 1)
    expected = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch", swiglu_limit=0.5)
    for limit in (np.float32(0.5), np.float64(0.5)):
        out = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch", swiglu_limit=limit)
        assert torch.equal(out, expected)
    module = Int8Experts(2, 16, 8, activation="swiglu_oai", swiglu_limit=np.int64(3), swiglu_alpha=np.float32(1.5))
    assert module.swiglu_options == dict(swiglu_limit=3.0, swiglu_alpha=1.5)
    assert all(type(v) is float for v in module.swiglu_options.values())


def test_a_clamp_needs_a_gate():
    experts = make_experts(2, 16, 8, gated=False)
    x = torch.randn(3, 16, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 2, device=DEVICE), 1)
    with pytest.raises(ValueError, match="swiglu_limit clamps gate and up rows"):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, activation="relu2", swiglu_limit=1.0)
    from experts_int8 import Int8Experts

    with pytest.raises(ValueError, match="swiglu_limit clamps gate and up rows"):
        Int8Experts(2, 16, 8, activation="relu2", gated=False, swiglu_limit=1.0)


def test_clamped_swiglu_gradients_match_autograd_through_the_reference():
    torch.manual_seed(2)
    experts = make_experts(3, 16, 8, quantized=False)
    x = torch.randn(5, 16, device=DEVICE, requires_grad=True)
    w, ids = select_experts(torch.randn(5, 3, device=DEVICE), 2)
    out = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch", **CLAMPS["after"])
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    x2 = x.detach().clone().requires_grad_()
    ref = reference._fused_experts(x2, experts["w13"], experts["w2"], w, ids, None, None, "silu", False, None, None,
                                   None, reference.clamp_of(**CLAMPS["after"]))
    (expected,) = torch.autograd.grad(ref.square().sum(), x2)
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_biases_with_kernel_variants(dtype):
    from experts_int8.kernels.configs import override_config

    for cfg in (dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
                     FUSE_GATE_UP=1, down=dict(SPLIT_K=3, BLOCK_SIZE_K=16)),
                dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
                     SWAP_AB=1, PAIRS=1, down=dict(SWAP_AB=1, SPLIT_K=2)),
                dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
                     PAIRS=1, down=dict(SUM_TOPK=1))):
        with override_config(cfg):
            check(2, 6, 67, 45, 2, dtype, "triton", activation="swiglu_oai", **_biases(6, 67, 45, dtype=dtype))
            check(2, 6, 67, 45, 2, dtype, "triton", **CLAMPS["after"])


def test_bias_errors():
    experts = make_experts(4, 32, 8)
    x = torch.randn(3, 32, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 4, device=DEVICE), 1)
    good = _biases(4, 32, 8)
    with pytest.raises(ValueError, match=r"w13_bias must have shape \(4, 16\)"):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, w13_bias=good["w2_bias"])
    with pytest.raises(TypeError, match="w2_bias must be a float tensor"):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, w2_bias=good["w2_bias"].to(torch.int32))
    with pytest.raises(ValueError, match="apply_router_weight_on_input=False"):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, apply_router_weight_on_input=True, **good)


def test_sum_of_more_partials_than_it_unrolls():
    """invoke_sum over 10 split partials x k=2 (past the 8 it unrolls: a loop) against torch."""
    from experts_int8.kernels.fused_moe import invoke_sum

    y = torch.randn(10, 3 * 2, 40, device=DEVICE)
    out = invoke_sum(y, torch.empty(3, 40, device=DEVICE), top_k=2)
    torch.testing.assert_close(out, y.sum(0).view(3, 2, 40).sum(1), rtol=1e-5, atol=1e-5)


def test_gate_up_launch_zeroes_the_sum_last_counters():
    """SUM_LAST counts arrivals in counters the gate_up launch zeroes (more than one 1024-wide chunk
    here): whatever the buffer held before, the down GEMM starts from zero."""
    from experts_int8.kernels.fused_moe import invoke_gate_up

    experts = make_experts(4, 32, 16)
    x = torch.randn(3, 32, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 4, device=DEVICE), 2)
    pairs = ids.reshape(-1).to(torch.int32)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, PAIRS=1)
    counts = torch.full((2500,), 7, dtype=torch.int32, device=DEVICE)
    h = torch.empty(6, 16, device=DEVICE)
    invoke_gate_up(x, experts["w13"], experts["w13_scale"], h, w.reshape(-1), pairs, pairs, pairs, 2, "silu", False,
                   cfg, counts=counts)
    assert int(counts.count_nonzero()) == 0


def test_gluon_entry_in_pairs_mode_runs_the_triton_kernels():
    """The Gluon kernels refuse PAIRS (and run only on sm_90): such an entry, SUM_LAST included, runs
    the Triton kernels with the same blocks."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               PAIRS=1, GLUON=1, down=dict(SUM_LAST=1, SPLIT_K=2))
    with override_config(cfg):
        check(2, 4, 64, 32, 2, torch.float32, "triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("extra, down", [
    ({}, {}), (dict(SWAP_AB=1), dict(SWAP_AB=0)), (dict(FUSE_GATE_UP=1), dict(SWAP_AB=1)),
    (dict(PAIRS=1), dict(SPLIT_K=2, SUM_LAST=1)), ({}, dict(TMA=0)), (dict(TMA=0), dict(TMA=1))])
def test_tma_weight_tiles_match(dtype, extra, down):
    """TMA: weight tiles by tensor-descriptor copies of the (E*N, K) weight view. Tails along K and N
    (H=80, I=48 with 32-wide tiles: the descriptor's zero fill and rows running into the next
    expert), swapped operands, the fused gate/up dot, PAIRS with split-K partials, and absent experts."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               **{"TMA": 1, **extra}, down=dict(BLOCK_SIZE_N=32, **down))
    with override_config(cfg):
        check(3, 5, 80, 48, 2, dtype, "triton")
        check(2, 4, 64, 32, 2, dtype, "triton", quantized=False)
        expert_map = torch.tensor([0, -1, 1, -1, 2, 3], dtype=torch.int32, device=DEVICE)
        check(4, 4, 80, 48, 2, dtype, "triton", expert_map=expert_map, global_num_experts=6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("extra, tile_n", [
    (dict(PAIRS=1), 24), (dict(PAIRS=1, SWAP_AB=1), 8), (dict(FUSE_GATE_UP=1), 17), (dict(SWAP_AB=1), 24),
    (dict(PAIRS=1, down=dict(SPLIT_K=2, SUM_LAST=1)), 16)])
def test_narrow_gate_up_programs_match(dtype, extra, tile_n):
    """TILE_N: each gate_up program computes TILE_N columns of I on its BLOCK_SIZE_N-wide dot (the grid
    counts cdiv(I, TILE_N) programs a row block): I=45 on 32-wide tiles, so programs end mid-tile, past I,
    and at widths that are not multiples of 8; PAIRS and the align path, swapped and fused operands."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2,
               TILE_N=tile_n, **extra)
    with override_config(cfg):
        check(3, 5, 80, 45, 2, dtype, "triton")
        check(2, 4, 64, 45, 2, dtype, "triton", quantized=False)
        expert_map = torch.tensor([0, -1, 1, -1, 2, 3], dtype=torch.int32, device=DEVICE)
        check(4, 4, 80, 45, 2, dtype, "triton", expert_map=expert_map, global_num_experts=6)


@pytest.mark.parametrize("swap", [False, True])
def test_weight_tile_loads_only_its_columns(swap):
    """MASK_N: the columns of a weight tile past a program's own come back as zeros (they are not read)."""
    @triton.jit
    def tile_kernel(w_ptr, out_ptr, n, K: tl.constexpr, N: tl.constexpr, SWAP: tl.constexpr):
        offs_k, offs_n = tl.arange(0, K), tl.arange(0, N)
        cols = offs_n < n
        if SWAP:
            ptrs = w_ptr + offs_n[:, None] * K + offs_k[None, :]
            out = out_ptr + offs_n[:, None] * K + offs_k[None, :]
        else:
            ptrs = w_ptr + offs_n[None, :] * K + offs_k[:, None]
            out = out_ptr + offs_n[None, :] * K + offs_k[:, None]
        tl.store(out, _weight_tile(ptrs, None, 0, 0, K, offs_k, cols, K, SWAP, False, True))

    w = torch.randint(1, 100, (32, 16), dtype=torch.int8, device=DEVICE)  # (N, K), no zeros
    out = torch.full_like(w, -1)
    tile_kernel[(1,)](w, out, 20, K=16, N=32, SWAP=swap)
    assert torch.equal(out[:20], w[:20]) and not out[20:].any()


@pytest.mark.parametrize("extra", [dict(PAIRS=1, down=dict(SPLIT_K=2, SUM_LAST=1)), dict(SWAP_AB=1),
                                   dict(FUSE_GATE_UP=1, down=dict(SPLIT_K=3))])
def test_late_epilogue_moves_loads_not_results(extra):
    """LATE_EPILOGUE only moves the epilogue's loads (scales, biases, routing weights) from before the K
    loop to after it: the outputs are bit-identical with it in both GEMMs, in gate_up alone and in down
    alone, and match the oracle; quantized and float weights, biases, weights on the input."""
    from experts_int8.kernels.configs import override_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, **extra)
    down = cfg.pop("down", {})
    forms = [dict(cfg, down=down), dict(cfg, LATE_EPILOGUE=1, down=down),
             dict(cfg, LATE_EPILOGUE=1, down=dict(down, LATE_EPILOGUE=0)), dict(cfg, down=dict(down, LATE_EPILOGUE=1))]
    cases = [lambda: check(5, 4, 64, 45, 2, torch.float32, "triton"),
             lambda: check(3, 6, 67, 45, 2, torch.float16, "triton", activation="swiglu_oai", **_biases(6, 67, 45)),
             lambda: check(4, 4, 32, 32, 1, torch.float32, "triton", quantized=False, apply_router_weight_on_input=True)]
    for j, case in enumerate(cases):
        outs = []
        for form in forms:
            torch.manual_seed(100 + j)  # the same inputs for every form
            with override_config(form):
                outs.append(case()[0])
        assert all(torch.equal(outs[0], out) for out in outs[1:]), j


def test_tile_n_config_checks():
    from experts_int8.kernels.configs import check_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    assert check_config(dict(cfg, TILE_N=56))["TILE_N"] == 56
    for bad in (dict(TILE_N=72), dict(TILE_N=0), dict(TILE_N=56, TMA=1), dict(TILE_N=56, GLUON=1)):
        with pytest.raises(ValueError):
            check_config(dict(cfg, **bad))
    with pytest.raises(ValueError, match="keys"):  # gate_up's key: not a down override
        check_config(dict(cfg, down=dict(TILE_N=56)))


def test_late_epilogue_config_checks():
    from experts_int8.kernels.configs import check_config, split_config

    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    both = check_config(dict(cfg, LATE_EPILOGUE=1, down=dict(LATE_EPILOGUE=0)))
    gate_up, down = split_config(both)
    assert (gate_up["LATE_EPILOGUE"], down["LATE_EPILOGUE"]) == (1, 0)  # a top-level key, overridden for down
    for bad in (dict(LATE_EPILOGUE=2), dict(down=dict(LATE_EPILOGUE=-1))):
        with pytest.raises(ValueError, match="LATE_EPILOGUE"):
            check_config(dict(cfg, **bad))


def test_tma_needs_aligned_contiguous_weights():
    from experts_int8.kernels.configs import check_config
    from experts_int8.kernels.fused_moe import weight_descriptor

    cfg = check_config(dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4,
                            num_stages=2, TMA=1, down=dict(TMA=0)))
    w = torch.zeros(4, 64, 80, dtype=torch.int8, device=DEVICE)
    assert weight_descriptor(w, cfg).shape == [256, 80]
    assert weight_descriptor(w, dict(cfg, TMA=0)) is None
    with pytest.raises(ValueError, match="16-byte aligned rows"):  # 67-byte rows
        weight_descriptor(torch.zeros(4, 64, 67, dtype=torch.int8, device=DEVICE), cfg)
    with pytest.raises(ValueError, match="contiguous over"):  # half of each expert's rows: not one (E*N, K) view
        weight_descriptor(torch.zeros(4, 128, 80, dtype=torch.int8, device=DEVICE)[:, :64], cfg)
    with pytest.raises(ValueError, match="0 or 1"):
        check_config(dict(cfg, TMA=2))


def test_a_table_entry_with_tma_drops_it_for_weights_no_descriptor_can_take():
    """Shipped and tuned tables carry TMA entries (the H200 bf16 tables on most rows): weights that are no
    (E*N, K) view (a slice here) must run the entry's blocks with per-thread loads, GEMM by GEMM, not fail;
    under override_config the forced TMA stays (and weight_descriptor says what is wrong)."""
    from experts_int8.kernels.configs import override_config, split_config
    from experts_int8.ops import _tma_where_it_fits

    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, TMA=1)
    w13, w2 = torch.zeros(4, 128, 80, dtype=torch.int8), torch.zeros(4, 80, 64, dtype=torch.int8)
    assert _tma_where_it_fits(entry, w13, w2) == entry  # both fit: the entry as it is
    assert _tma_where_it_fits(dict(entry, TMA=0), w13[:, :64], w2) == dict(entry, TMA=0)  # no TMA asked
    gate_up, down = split_config(_tma_where_it_fits(entry, w13[:, :64], w2))  # w13 a slice of each expert's rows
    assert (gate_up["TMA"], down["TMA"]) == (0, 1)
    gate_up, down = split_config(_tma_where_it_fits(entry, w13, torch.zeros(4, 80, 67, dtype=torch.int8)))
    assert (gate_up["TMA"], down["TMA"]) == (1, 0)  # 67-byte rows of w2
    with override_config(entry):
        assert _tma_where_it_fits(entry, w13[:, :64], w2) == entry


def test_a_table_entry_with_tma_runs_on_odd_rows(monkeypatch):
    """End to end: a TMA entry from the table (not forced) on H=67 int8 weights, whose 67-byte w13 rows no
    descriptor takes: gate_up runs with per-thread loads, down (48-byte rows) keeps TMA, and the layer
    matches the oracle where it used to raise."""
    from experts_int8 import ops

    entry = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, TMA=1)
    monkeypatch.setattr(ops, "get_config", lambda *args, **kw: dict(entry))
    check(3, 4, 67, 48, 2, torch.float16, "triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp16_rows_scale_each_row_by_a_power_of_two(dtype):
    """FP16_DOT's activations: every row times the power of two that puts its largest magnitude in
    [2^14, 2^15) (so fp16 holds it with no overflow), a zero row times 2^14; bf16 rows come back exact."""
    from experts_int8.kernels.fused_moe import invoke_fp16_rows

    x = (torch.randn(6, 300, device=DEVICE) * torch.tensor([1, 1e-30, 1e-3, 1, 3e4, 1e30], device=DEVICE)[:, None])
    x = x.to(dtype)
    x[0] = 0
    out, inv = invoke_fp16_rows(x)
    assert out.dtype == torch.float16 and inv.shape == (6,) and torch.isfinite(out).all()
    mantissa, _ = torch.frexp(inv)
    assert torch.all(mantissa == 0.5)  # powers of two
    biggest = out.float().abs().amax(1)
    assert biggest[0] == 0 and inv[0] == 2.0**-14
    assert torch.all((biggest[1:] >= 2**14) & (biggest[1:] < 2**15))
    back = out.double() * inv.double()[:, None]
    if dtype == torch.bfloat16:
        assert torch.equal(back, x.double())
    else:  # fp16's 11 significant bits
        assert ((back - x.double()).abs() <= 2**-11 * x.double().abs().amax(1, keepdim=True)).all()


@pytest.mark.parametrize("gated", [True, False])
def test_fp16_dot_gate_up_undoes_the_row_scales(gated):
    """FP16_DOT: gate_up on bf16 x runs its dot in fp16 on the scaled rows (a launch of
    invoke_fp16_rows first) and multiplies each row's accumulators back, before bias and activation:
    rows of very different magnitudes come out as the float reference says. (fp32 output: the
    interpreter stores no bf16.) Experts without a gate: silu of the up rows."""
    from experts_int8.kernels.fused_moe import invoke_gate_up

    experts = make_experts(4, 64, 32, gated=gated)
    x = (torch.randn(3, 64, device=DEVICE) * torch.tensor([1e-4, 1.0, 1e4], device=DEVICE)[:, None]).to(torch.bfloat16)
    w, ids = select_experts(torch.randn(3, 4, device=DEVICE), 2)
    pairs = ids.reshape(-1).to(torch.int32)
    cfg = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2, PAIRS=1,
               FP16_DOT=1)
    h = torch.empty(6, 32, device=DEVICE)
    invoke_gate_up(x, experts["w13"], experts["w13_scale"], h, w.reshape(-1), pairs, pairs, pairs, 2, "silu", False, cfg)
    w13 = dequantize_weights(experts["w13"], experts["w13_scale"], torch.float64)
    gu = torch.einsum("th,tnh->tn", x.double().repeat_interleave(2, 0), w13[ids.reshape(-1)])
    ref = torch.nn.functional.silu(gu[:, :32]) * gu[:, 32:] if gated else torch.nn.functional.silu(gu)
    err = (h.double() - ref).norm(dim=1) / ref.norm(dim=1)
    assert (err < 2e-3).all(), err


# Experts without a gate (NemotronH): w13 [E, I, H] holds up rows only and the expert computes act(up)

UNGATED_BASE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 2}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["relu2", "silu"])
@pytest.mark.parametrize("case, m, e, h, i, k", [
    s for s in SHAPES if s[0] in ("M=1", "M>BLOCK_M", "odd H and I", "k=1", "experts with no token")])
def test_ungated_matches_reference(backend, dtype, activation, case, m, e, h, i, k):
    check(m, e, h, i, k, dtype, backend, gated=False, activation=activation)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["relu2", "silu"])
def test_ungated_expert_biases(backend, dtype, activation):
    check(9, 5, 48, 40, 2, dtype, backend, gated=False, activation=activation,
          **_biases(5, 48, 40, dtype=dtype, gated=False))
    check(4, 4, 32, 32, 3, dtype, backend, quantized=False, gated=False, activation=activation,
          **_biases(4, 32, 32, gated=False))


@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_oai_needs_a_gate(backend):
    """swiglu_oai reads the up rows beside the gate's: experts without a gate are refused (by the
    validation, and by the gate_up launcher called directly)."""
    from experts_int8.kernels.fused_moe import invoke_gate_up

    experts = make_experts(4, 32, 16, gated=False)
    x = torch.randn(3, 32, device=DEVICE)
    w, ids = select_experts(torch.randn(3, 4, device=DEVICE), 2)
    with pytest.raises(ValueError, match="needs gate and up rows"):
        fused_experts(x, **experts, topk_weights=w, topk_ids=ids, activation="swiglu_oai", backend=backend)
    pairs = ids.reshape(-1).to(torch.int32)
    cfg = dict(UNGATED_BASE, BLOCK_SIZE_N=16, PAIRS=1)
    h = torch.empty(6, 16, device=DEVICE)
    with pytest.raises(ValueError, match="needs gate and up rows"):
        invoke_gate_up(x, experts["w13"], experts["w13_scale"], h, w.reshape(-1), pairs, pairs, pairs, 2, "swiglu_oai",
                       False, cfg)
    with pytest.raises(ValueError, match="neither 2I nor I rows"):  # out's width is I
        invoke_gate_up(x, experts["w13"], experts["w13_scale"], torch.empty(6, 12, device=DEVICE), w.reshape(-1),
                       pairs, pairs, pairs, 2, "silu", False, cfg)


def test_fuse_gate_up_is_dropped_without_a_gate():
    """FUSE_GATE_UP joins the gate and up tiles: experts without a gate have one, so the launch runs the
    plain dot (the gated launch keeps the key)."""
    from experts_int8.kernels.fused_moe import _gate_up_meta

    cfg = dict(UNGATED_BASE, BLOCK_SIZE_M=64, FUSE_GATE_UP=1)
    assert _gate_up_meta(cfg)["FUSE_GATE_UP"] and _gate_up_meta(cfg)["GATED"]
    assert _gate_up_meta(cfg, gated=False) == {"FUSE_GATE_UP": False, "GATED": False, "TILE_N": 32}


UNGATED_VARIANTS = {  # the gated tests' config options, on experts without a gate
    "plain": {},
    "swap_ab": {"SWAP_AB": 1, "down": {"BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 64, "SWAP_AB": 1}},
    "swap_gate_up": {"SWAP_AB": 1, "GROUP_SIZE_M": 2, "down": {"SWAP_AB": 0}},
    "fuse_gate_up": {"BLOCK_SIZE_N": 16, "FUSE_GATE_UP": 1,
                     "down": {"BLOCK_SIZE_N": 32, "SPLIT_K": 3, "BLOCK_SIZE_K": 16}},
    "split_k": {"down": {"BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "SWAP_AB": 1, "SPLIT_K": 3}},
    "pairs": {"PAIRS": 1, "GROUP_SIZE_M": 4, "down": {"BLOCK_SIZE_N": 16, "SPLIT_K": 2}},
    "pairs_swap_ab": {"PAIRS": 1, "SWAP_AB": 1, "down": {"SWAP_AB": 1, "SPLIT_K": 2}},
    "sum_topk": {"PAIRS": 1, "SWAP_AB": 1, "down": {"SUM_TOPK": 1}},
    "sum_last": {"PAIRS": 1, "down": {"BLOCK_SIZE_N": 16, "SPLIT_K": 3, "SUM_LAST": 1}},
    "sum_last_align": {"SWAP_AB": 1, "GROUP_SIZE_M": 4, "down": {"BLOCK_SIZE_N": 16, "SPLIT_K": 2, "SUM_LAST": 1}},
    "dedup_pairs": {"PAIRS": 1, "DEDUP_PAIRS": 1, "SWAP_AB": 1,
                    "down": {"BLOCK_SIZE_N": 16, "SPLIT_K": 2, "SUM_LAST": 1}},
    "tma": {"TMA": 1, "down": {"BLOCK_SIZE_N": 32}},
    "tma_swap_ab": {"TMA": 1, "SWAP_AB": 1, "down": {"SWAP_AB": 0}},
    "tma_fuse_gate_up": {"TMA": 1, "FUSE_GATE_UP": 1, "down": {"TMA": 0, "SWAP_AB": 1}},
    "tma_pairs": {"TMA": 1, "PAIRS": 1, "down": {"SPLIT_K": 2, "SUM_LAST": 1}},
    "tile_n_pairs": {"PAIRS": 1, "TILE_N": 24, "down": {"SPLIT_K": 2, "SUM_LAST": 1}},
    "tile_n_swap_ab": {"SWAP_AB": 1, "TILE_N": 8},
    "late_epilogue": {"PAIRS": 1, "LATE_EPILOGUE": 1, "down": {"SPLIT_K": 2, "SUM_LAST": 1}},
    "late_epilogue_gate_up": {"SWAP_AB": 1, "LATE_EPILOGUE": 1, "down": {"LATE_EPILOGUE": 0}},
    "pdl_prefetch": {"PDL": 2, "PAIRS": 1, "down": {"SPLIT_K": 2, "SUM_LAST": 1, "PDL_PREFETCH": 4}},
    "gluon": {"GLUON": 1, "FUSE_GATE_UP": 1},
    "gluon_pairs": {"PAIRS": 1, "GLUON": 1, "down": {"SUM_LAST": 1, "SPLIT_K": 2}},
    "wsrr": {"WSRR": 1, "WSRR_ROWS": 128, "TAIL_ROWS": 8},
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(UNGATED_VARIANTS))
def test_ungated_kernel_variants(dtype, variant, monkeypatch):
    """Experts without a gate through every config option the gated tests cover (odd H and I, or TMA's
    aligned rows whose tiles run into the next expert's): one token, tokens sharing experts, float
    weights, absent experts, biases, routing weights on the input; relu2 and silu. GLUON and WSRR
    entries run the Triton kernels here (CPU tensors; H and I that the Hopper kernels do not read: they run
    on the GPU in tests/test_gpu.py), FUSE_GATE_UP their plain form."""
    from experts_int8 import ops
    from experts_int8.kernels.configs import override_config

    def must_not_run(*args, **kwargs):
        raise AssertionError("the Gluon kernels ran where they do not apply")

    for module, names in ((ops.gluon_moe, ("invoke_gate_up", "invoke_down")), (ops.gluon_wsrr, ("expert_outputs",))):
        for name in names if module is not None else ():
            monkeypatch.setattr(module, name, must_not_run)
    monkeypatch.setattr(ops, "tail_config", lambda *a: UNGATED_BASE)
    cfg = dict(UNGATED_BASE, **UNGATED_VARIANTS[variant])
    h, i = (80, 48) if cfg.get("TMA") else (67, 45)
    with override_config(cfg):
        check(1, 6, h, i, 2, dtype, "triton", gated=False, activation="relu2")
        check(7, 4, h, i, 3, dtype, "triton", gated=False)  # tokens sharing experts
        check(3, 4, h, i, 2, dtype, "triton", gated=False, quantized=False, activation="relu2")
        check(5, 4, h, i, 2, dtype, "triton", gated=False, activation="relu2", expert_map=EXPERT_MAP,
              global_num_experts=6)
        biases = _biases(6, h, i, dtype=dtype, gated=False)
        check(2, 6, h, i, 2, dtype, "triton", gated=False, activation="relu2", **biases)
        check(3, 4, h, i, 1, dtype, "triton", gated=False, apply_router_weight_on_input=True)


@pytest.mark.parametrize("extra", [{"FUSE_GATE_UP": 1, "TMA": 1}, {"GLUON": 1, "FUSE_GATE_UP": 1}, {"WSRR": 1},
                                   {"PAIRS": 1, "DEDUP_PAIRS": 1, "down": {"SUM_LAST": 1, "SPLIT_K": 2}}])
def test_gated_table_entries_serve_experts_without_a_gate(extra, monkeypatch):
    """The tables are keyed by (E, I): an entry tuned on gated experts (FUSE_GATE_UP, TMA, GLUON, WSRR,
    a decode mode) serves experts without a gate of the same I: its blocks on the Triton kernels' plain
    form (the 67-byte rows of w13 take no TMA descriptor: per-thread loads)."""
    from experts_int8 import ops

    entry = dict(UNGATED_BASE, **extra)
    monkeypatch.setattr(ops, "get_config", lambda *args, **kw: dict(entry))
    check(3, 4, 67, 48, 2, torch.float16, "triton", gated=False, activation="relu2")
    check(5, 4, 64, 48, 2, torch.float32, "triton", gated=False)


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("on_input", [False, True])
def test_gradients_match_the_reference_path(quantized, gated, on_input):
    """Adapters trained around frozen int8 experts need the gradient through them (and the router's): both paths
    give autograd's through the reference itself, for x, the routing weights, float weights and expert biases."""
    torch.manual_seed(0)
    m, e, h, i, k = 7, 5, 32, 16, 2
    experts = make_experts(e, h, i, quantized, torch.float32, gated)
    x = torch.randn(m, h, device=DEVICE)
    topk_weights, ids = select_experts(torch.randn(m, e + 1, device=DEVICE), k)
    topk_weights = topk_weights * (0.25 + torch.rand_like(topk_weights))
    expert_map = torch.tensor([0, 1, -1, 2, 3, 4], dtype=torch.int32, device=DEVICE)  # one expert held elsewhere
    rows = (2 if gated else 1) * i
    biases = {} if on_input else dict(w13_bias=torch.randn(e, rows, device=DEVICE),  # (biases: on the output)
                                      w2_bias=torch.randn(e, h, device=DEVICE))
    probe = torch.randn(m, h, device=DEVICE)

    def grads(backend):
        leaves = {"x": x, "topk_weights": topk_weights, **biases}
        if not quantized:
            leaves |= {"w13": experts["w13"], "w2": experts["w2"]}
        leaves = {n: t.clone().requires_grad_() for n, t in leaves.items()}
        args = {**experts, **biases, **leaves}
        run = reference.fused_experts if backend == "autograd" else functools.partial(fused_experts, backend=backend)
        out = run(args.pop("x"), args.pop("w13"), args.pop("w2"), topk_ids=ids, expert_map=expert_map,
                  apply_router_weight_on_input=on_input, **args)
        assert out.requires_grad
        (out * probe).sum().backward()
        return {n: t.grad for n, t in leaves.items()}

    reference_grads = grads("autograd")  # (autograd through the reference's loop itself)
    for backend in BACKENDS:
        ours = grads(backend)
        assert ours.keys() == reference_grads.keys()
        for name, g in ours.items():
            assert g is not None and g.abs().sum() > 0, name
            assert torch.allclose(g, reference_grads[name], rtol=1e-5, atol=1e-6), (backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backward_holds_one_experts_float_weights_at_a_time(backend):
    """Training keeps the experts int8: the forward saves no float copy of them for the backward (the torch
    path's autograd kept an fp32 copy of every expert hit, in every layer, until the backward), and the backward
    recomputes and differentiates the experts one at a time (it differentiated the whole loop at once, holding an
    fp32 copy of every expert hit). Measured by saved-tensor hooks, which the backward runs under, as
    torch.autograd.graph.save_on_cpu around a training step has it (torch.func refused to run there)."""
    e, h, i, m = 8, 64, 64, 16
    experts = make_experts(e, h, i)
    x = torch.randn(m, h, device=DEVICE, requires_grad=True)
    rows = torch.arange(m, device=DEVICE)
    ids = torch.stack([rows % e, (rows + 3) % e], dim=1)  # every expert hit
    topk_weights = torch.rand(m, 2, device=DEVICE, requires_grad=True)
    probe = torch.randn(m, h, device=DEVICE)
    alive, peak = [0], [0]

    class Saved:
        def __init__(self, t):
            self.t, self.nbytes = t, t.numel() * t.element_size() if t.is_floating_point() else 0
            alive[0] += self.nbytes
            peak[0] = max(peak[0], alive[0])

        def __del__(self):
            alive[0] -= self.nbytes

    with torch.autograd.graph.saved_tensors_hooks(Saved, lambda saved: saved.t):
        out = fused_experts(x, **experts, topk_weights=topk_weights, topk_ids=ids, backend=backend)
        (out * probe).sum().backward()
    one_expert = (2 * i * h + h * i) * 4  # an expert's weights in fp32
    assert peak[0] < 2 * one_expert, (peak[0], one_expert)
    want = [t.detach().clone().requires_grad_() for t in (x, topk_weights)]
    (reference.fused_experts(want[0], **experts, topk_weights=want[1], topk_ids=ids) * probe).sum().backward()
    torch.testing.assert_close(x.grad, want[0].grad)
    torch.testing.assert_close(topk_weights.grad, want[1].grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_order_gradients_through_the_experts(backend):
    """A backward with create_graph=True (a gradient penalty, a Hessian-vector product) gives gradients that are
    differentiable in turn, as autograd through the reference gives them (the kernel's op had no formula for it)."""
    experts = make_experts(4, 32, 16)
    x0 = torch.randn(5, 32, device=DEVICE)
    w0, ids = select_experts(torch.randn(5, 4, device=DEVICE), 2)
    results = []
    for run in (functools.partial(fused_experts, backend=backend), reference.fused_experts):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = run(x, **experts, topk_weights=w, topk_ids=ids)
        gx, gw = torch.autograd.grad(out.square().sum(), (x, w), create_graph=True)
        results.append(torch.autograd.grad(gx.square().sum() + gw.sin().sum(), (x, w)))
    (ggx, ggw), (want_x, want_w) = results
    assert ggx.abs().sum() > 0 and ggw.abs().sum() > 0
    torch.testing.assert_close(ggx, want_x, rtol=1e-4, atol=1e-4)  # (the kernel's output: its own sum order)
    torch.testing.assert_close(ggw, want_w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_leaves_the_precision_alone(backend):
    """The kernel's op keeps its own precision under autocast; the torch path (which also gives the op's
    gradients) must too, or Trainer(bf16=True) would compute different losses on the two paths."""
    torch.manual_seed(0)
    experts = make_experts(4, 32, 16)
    x = torch.randn(6, 32, device=DEVICE, requires_grad=True)
    w, ids = select_experts(torch.randn(6, 4, device=DEVICE), 2)
    plain = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend=backend)
    (grad_plain,) = torch.autograd.grad(plain.square().sum(), x)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        cast = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend=backend)
        loss = cast.square().sum()
    (grad_cast,) = torch.autograd.grad(loss, x)  # (backward outside autocast, as torch advises)
    assert cast.dtype == torch.float32 and torch.equal(cast, plain)
    assert torch.equal(grad_cast, grad_plain)
    if backend == "triton":  # the op's own backward keeps its precision even when called inside autocast
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            cast = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend=backend)
            (grad_inside,) = torch.autograd.grad(cast.square().sum(), x)
        assert torch.equal(grad_inside, grad_plain)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_without_local_experts_adds_zeros(backend):
    """Every pair on another rank (E=0 local experts, the map all -1): zeros, as the torch path gives (the Triton
    path divided by E while choosing its config)."""
    w13, s13 = quantize_weights(torch.randn(0, 64, 32, device=DEVICE))
    w2, s2 = quantize_weights(torch.randn(0, 32, 32, device=DEVICE))
    x = torch.randn(3, 32, device=DEVICE)
    weights, ids = select_experts(torch.randn(3, 4, device=DEVICE), 2)
    out = fused_experts(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2, backend=backend,
                        expert_map=torch.full((4,), -1, dtype=torch.int32, device=DEVICE))
    assert torch.equal(out, torch.zeros_like(x))


def test_the_op_makes_its_tensors_gpu_current_only_where_it_is_another(monkeypatch):
    """Triton launches on the current CUDA device: a layer whose tensors sit on another GPU (a model spread by
    device_map) switches to theirs for its launches, and only then (test_gpu.py runs it on two GPUs)."""
    import contextlib

    from experts_int8 import ops

    switched = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: switched.append(d) or contextlib.nullcontext())
    for device in ("cpu", "meta", "cuda", "cuda:0", "cuda:1"):
        with ops.on_device(torch.device(device)):
            pass
    assert switched == [torch.device("cuda", 1)]
    entered = []  # and the Triton op's launches run inside it, on x's device
    monkeypatch.setattr(ops, "on_device", lambda d: entered.append(d) or contextlib.nullcontext())
    w, ids = select_experts(torch.randn(3, 4, device=DEVICE), 2)
    fused_experts(torch.randn(3, 32, device=DEVICE), **make_experts(4, 32, 16), topk_weights=w, topk_ids=ids,
                  backend="triton")
    assert entered == [torch.device(DEVICE)]


def test_torch_path_rounds_the_intermediate_to_x_dtype_as_the_kernel_stores_it():
    """The reference (the CPU path) keeps the kernel's numerics: fp32 products times the row scales, the
    activation, then the intermediate stored in x's dtype (bf16 here) before the down product."""
    e, h, i = 3, 64, 48
    experts = make_experts(e, h, i)
    x = torch.randn(5, h, dtype=torch.bfloat16)
    ids = torch.tensor([[1], [0], [1], [2], [1]], dtype=torch.int32)
    weights = torch.rand(5, 1) + 0.5
    out = fused_experts(x, **experts, topk_weights=weights, topk_ids=ids, backend="torch")
    want = torch.empty_like(out)
    for ex in range(e):  # (each expert's tokens in one product, as the path computes them: the same sums)
        tok = (ids[:, 0] == ex).nonzero()[:, 0]
        gate_up = (x[tok].float() @ experts["w13"][ex].float().t()) * experts["w13_scale"][ex]
        act = (torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]).to(torch.bfloat16)
        y = (act.float() @ experts["w2"][ex].float().t()) * experts["w2_scale"][ex]
        want[tok] = (y * weights[tok]).to(torch.bfloat16)
    assert torch.equal(out, want)


@pytest.mark.parametrize("mapped", [False, True])
def test_reference_groups_the_pairs_by_expert_as_the_routing_has_them(mapped):
    """The reference path's (and the backward's) walk over the experts the routing hits: each local expert once,
    with exactly its (token, slot) pairs in row order; duplicate ids within a token and experts held elsewhere
    (-1 in the map) included."""
    e, m, k = 9, 40, 3
    ids = torch.randint(0, e, (m, k), device=DEVICE)
    ids[0] = 4  # one token's k slots on one expert
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3, 4, -1, 5], device=DEVICE) if mapped else None
    local = expert_map[ids] if mapped else ids
    groups = list(reference._expert_pairs(ids.int(), expert_map))
    want = [(x, *(local == x).nonzero(as_tuple=True)) for x in torch.unique(local).tolist() if x >= 0]
    assert [g[0] for g in groups] == [w[0] for w in want]
    for (_, tok, slot), (_, want_tok, want_slot) in zip(groups, want):
        assert torch.equal(tok, want_tok) and torch.equal(slot, want_slot)
    assert list(reference._expert_pairs(ids[:0], expert_map)) == []


@pytest.mark.gpu
def test_reference_reads_the_routing_on_the_host_once_not_once_per_expert():
    """On a GPU each host read of the routing waits for the device: one per expert (a nonzero() each) kept the
    device idle between the experts' launches in the torch path and in every backward."""
    experts = make_experts(64, 64, 32)
    x = torch.randn(256, 64, device="cuda")
    weights, ids = select_experts(torch.randn(256, 64, device="cuda"), 4)
    reference.fused_experts(x, **experts, topk_weights=weights, topk_ids=ids)  # (warm)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            reference.fused_experts(x, **experts, topk_weights=weights, topk_ids=ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in record if "synchroniz" in str(w.message)]
    assert 1 <= len(syncs) <= 3, [str(w.message) for w in syncs]


def test_every_kernel_launch_and_compile_sets_fp_fusion():
    # Triton 3.10 turns FP fusion off by default (3.9 warns once, on the first compile, when a launch leaves it
    # unset): each launch and offline compile of ours names it, so the numerics do not change under a new Triton.
    # (Read from the source: the interpreter these tests run under neither compiles nor warns.)
    import ast
    from pathlib import Path

    import experts_int8.kernels as kernels
    from experts_int8.kernels.fused_moe import compile_for_sm90

    missing = []
    for path in sorted(Path(kernels.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Subscript):  # kernel[grid](...)
                keywords = node.keywords
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "compile" and any(
                    k.arg == "options" for k in node.keywords):  # triton.compile(source, options=dict(...))
                options = next(k.value for k in node.keywords if k.arg == "options")
                keywords = options.keywords if isinstance(options, ast.Call) else []
                if isinstance(options, ast.Name):
                    continue  # (compile_for_sm90's options dict: checked below)
            else:
                continue
            if not any(k.arg == "enable_fp_fusion" for k in keywords):
                missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing
    assert "enable_fp_fusion=True" in inspect.getsource(compile_for_sm90)


def test_decode_converts_the_int8_weights_a_block_at_a_time(monkeypatch):
    """An expert with few rows multiplies its int8 weights converted a block of rows at a time (the block still in
    cache), with the whole copy's results; longer inputs convert once. Gradients go through either."""
    torch.manual_seed(0)  # (on the CPU, also where a GPU is: a GPU converts once, each block would be two launches)
    experts = {k: v.cpu() if torch.is_tensor(v) else v for k, v in make_experts(4, 32, 16).items()}
    x = torch.randn(3, 32, requires_grad=True)
    w, ids = select_experts(torch.randn(3, 4), 2)
    monkeypatch.setattr(reference, "DECODE_ROWS", 0)
    whole = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch")
    (grad_whole,) = torch.autograd.grad(whole.sum(), x)
    monkeypatch.setattr(reference, "DECODE_ROWS", 16)
    monkeypatch.setattr(reference, "BLOCK", 100)  # blocks of 3 rows (K=32), and of 6 rows (K=16)
    converted = []
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: (converted.append(t.shape) if t.dtype == torch.int8
                                                                else None) or real_to(t, *a, **k))
    blocks = fused_experts(x, **experts, topk_weights=w, topk_ids=ids, backend="torch")
    (grad_blocks,) = torch.autograd.grad(blocks.sum(), x)
    assert converted and {s[0] for s in converted} <= {3, 2, 6, 4} and all(s[1] in (32, 16) for s in converted)
    torch.testing.assert_close(blocks, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_blocks, grad_whole, rtol=1e-6, atol=1e-6)
