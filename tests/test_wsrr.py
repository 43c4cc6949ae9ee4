"""The register-form prefill kernels (kernels/gluon_wsrr.py) without a GPU: the K permutation that lets
them read weights as quantized, the WSRR config key, and what ptxas made of their K loops. (They run on
a GPU in tests/test_gpu.py.)"""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")

from experts_int8.kernels import gluon_wsrr  # noqa: E402
from experts_int8.kernels.configs import check_config  # noqa: E402
from conftest import DEVICE  # noqa: E402  (the kernel runs interpreted on CPU, compiled on a GPU)

ENTRY = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)


def test_a_thread_fragment_is_sixteen_contiguous_weight_bytes():
    """wgmma's A fragment gives quad lane c, in each k16 step s, the k pairs 2c, 2c+1 and 2c+8, 2c+9: the
    bytes memory_position puts those 16 logical k at are 16c .. 16c+15 (one 16-byte shared load), and
    over the four lanes every byte of the 64-wide block once."""
    seen = []
    for c in range(4):
        ks = [16 * s + 8 * e1 + 2 * c + e0 for s in range(4) for e1 in range(2) for e0 in range(2)]
        got = sorted(gluon_wsrr.memory_position(k) for k in ks)
        assert got == list(range(16 * c, 16 * c + 16))
        seen += got
    assert sorted(seen) == list(range(64))
    assert gluon_wsrr.memory_position(64 * 3 + 9) == 64 * 3 + gluon_wsrr.memory_position(9)  # per 64 block


def test_permute_k_moves_column_j_from_its_memory_position_and_keeps_the_product():
    x = torch.randn(5, 192, dtype=torch.float64, device=DEVICE)
    w = torch.randn(7, 192, dtype=torch.float64, device=DEVICE)
    xp = gluon_wsrr.permute_k(x)
    for j in range(192):
        assert torch.equal(xp[:, j], x[:, gluon_wsrr.memory_position(j)])
    # the kernel pairs xp's column j with the weight byte at memory_position(j): the same product
    order = torch.tensor([gluon_wsrr.memory_position(j) for j in range(192)], device=DEVICE)
    torch.testing.assert_close(xp @ w[:, order].T, x @ w.T)


@pytest.mark.parametrize("m, k, dtype", [(130, 128, torch.float16), (1, 64, torch.float32), (70, 192, torch.bfloat16)])
def test_permute_k_kernel_equals_the_permuted_view(m, k, dtype):
    """The Triton launch moves exactly what torch's view of the permutation holds, rows strided too."""
    def view(x):
        return x.reshape(x.shape[0], k // 64, 4, 4, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(x.shape[0], k)

    x = torch.randn(m, k, device=DEVICE).to(dtype)
    assert torch.equal(gluon_wsrr.permute_k(x), view(x))
    xt = torch.randn(k, m, device=DEVICE).to(dtype).T  # a column stride of m
    assert torch.equal(gluon_wsrr.permute_k(xt), view(xt.contiguous()))
    assert gluon_wsrr.permute_k(x[:0]).shape == (0, k)


def test_wsrr_config_key():
    assert check_config(dict(ENTRY, WSRR=1))["WSRR"] == 1
    assert check_config(dict(ENTRY, WSRR=1, DEQUANT_ONCE=1))["DEQUANT_ONCE"] == 1  # (where WSRR does not apply)
    assert check_config(dict(ENTRY, WSRR=1, WSRR_ROWS=128))["WSRR_ROWS"] == 128
    assert check_config(dict(ENTRY, WSRR=1, WSRR_STAGES=5))["WSRR_STAGES"] == 5
    for bad in (dict(ENTRY, WSRR=2), dict(ENTRY, WSRR=1, PAIRS=1),
                dict(ENTRY, WSRR=1, WSRR_ROWS=64), dict(ENTRY, WSRR_ROWS=128), dict(ENTRY, WSRR_STAGES=5),
                dict(ENTRY, WSRR=1, WSRR_STAGES=1), dict(ENTRY, WSRR=1, WSRR_STAGES=9)):
        with pytest.raises(ValueError):
            check_config(bad)


def test_not_supported_off_the_gpu():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    w13 = torch.zeros(8, 256, 256, dtype=torch.int8)
    w2 = torch.zeros(8, 256, 128, dtype=torch.int8)
    assert not gluon_wsrr.supported(x, w13, torch.ones(8, 256), w2, False)


def test_intermediate_padded_to_whole_blocks_and_the_down_loop_counts_the_partial_tile():
    """I no multiple of 64, the host side: h holds I's columns in whole 64-wide blocks (the permutation moves
    columns within a block), and the down GEMM's K loop counts a partial last tile (GPT-OSS at TP=2: I = 1440,
    23 tiles, an odd number; at TP=4: 720, 12)."""
    assert [gluon_wsrr.h_columns(i) for i in (64, 720, 1440, 2880, 400)] == [64, 768, 1472, 2880, 448]
    assert [gluon_wsrr._odd_k(k) for k in (1440, 720, 2880, 448, 512)] == [True, False, True, True, False]
    # a column of h's padding holds a real column: the down kernel must read the padding (zero weights past I)
    assert any(gluon_wsrr.memory_position(j) < 1440 for j in range(1440, 1472))
    assert any(gluon_wsrr.memory_position(j) >= 1440 for j in range(1440))


@pytest.mark.parametrize("inter", [1440, 720, 208])
def test_padded_h_and_zero_weight_bytes_past_i_keep_the_down_product(inter):
    """I no multiple of 64 (the kernels' PAD_I), the index algebra in float64: gate/up writes h's column c from
    column memory_position(c) wrapped into I, the down kernel pairs h's column c with the weight byte at
    memory_position(c), and the bytes past I load as zeros; every real column counts once and the padding adds
    nothing."""
    hidden = 16
    pos = torch.tensor([gluon_wsrr.memory_position(c) for c in range(gluon_wsrr.h_columns(inter))])
    h = torch.randn(inter, dtype=torch.float64)
    written = h[pos % inter]
    w2 = torch.randn(hidden, inter, dtype=torch.float64)
    loaded = torch.cat([w2, torch.zeros(hidden, len(pos) - inter, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(loaded[:, pos] @ written, w2 @ h)


def test_ring_bytes_by_depth():
    """The ring's shared memory grows by one slot of x and int8 weight tiles a stage: five fit the 256-row
    tile in a Hopper block's 227 KB, two programs of the 128-row tile fit an SM's 228 KB up to five (its
    own ring)."""
    big, small = gluon_wsrr.TILES[256], gluon_wsrr.TILES[128]
    assert big.smem_bytes() == big.smem_bytes(4) == 4 * (256 * 64 * 2 + 128 * 64) + 1024
    assert small.smem_bytes() == small.smem_bytes(5) == 5 * (128 * 64 * 2 + 64 * 64) + 1024
    assert big.smem_bytes(5) - big.smem_bytes(4) == 256 * 64 * 2 + 128 * 64
    assert big.smem_bytes(5) <= 227 * 1024 < big.smem_bytes(6)
    assert 2 * small.smem_bytes(5) <= 228 * 1024 < 2 * small.smem_bytes(6)


COMPILE = """
import json, os, subprocess, sys, tempfile, torch
import triton.backends.nvidia as nv
from experts_int8.kernels import gluon_wsrr
cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
out = {}
cases = [(w, d, 256, 4, "") for w in ("gate_up", "down") for d in (torch.bfloat16, torch.float16)] + [
    ("gate_up", torch.bfloat16, 128, 4, ""), ("down", torch.bfloat16, 128, 4, ""), ("gate_up", torch.bfloat16, 256, 5, ""),
    ("down", torch.bfloat16, 128, 5, "")] + [  # experts without a gate (ReLU² of up), and down over an odd K
    ("gate_up", torch.bfloat16, rows, 4, "ungated") for rows in (256, 128)] + [("gate_up", torch.bfloat16, 256, 4, "relu2")] + [
    ("down", dtype, rows, 4, "odd_k") for rows, dtype in ((256, torch.bfloat16), (128, torch.float16))] + [
    # GPT-OSS's form (H = I = 2880: 45 K tiles in both GEMMs, 22.5 down programs of 128 columns)
    ("gate_up", torch.bfloat16, rows, 4, "swiglu_oai_biased_odd_k") for rows in (256, 128)] + [
    ("down", torch.bfloat16, 256, 4, "biased_mask_n_odd_k"), ("gate_up", torch.bfloat16, 256, 4, "gelu")] + [
    # GPT-OSS at TP=2 (I = 1440: h padded to whole 64-wide blocks, 23 K tiles in the down GEMM, the last partial)
    ("gate_up", torch.bfloat16, 256, 4, "swiglu_oai_biased_odd_k_pad_i"),
    ("down", torch.bfloat16, 256, 4, "biased_mask_n_odd_k_pad_i")]
for which, dtype, rows, stages, form in cases:
    path = os.path.join(sys.argv[1], f"{which}_{dtype}_{rows}_{stages}_{form}.cubin")
    flags = dict(ungated=dict(gated=False, activation="relu2"), odd_k=dict(odd_k=True),
                 relu2=dict(activation="relu2"), gelu=dict(activation="gelu"),
                 swiglu_oai_biased_odd_k=dict(activation="swiglu_oai", biased=True, odd_k=True),
                 biased_mask_n_odd_k=dict(biased=True, mask_n=True, odd_k=True),
                 swiglu_oai_biased_odd_k_pad_i=dict(activation="swiglu_oai", biased=True, odd_k=True, pad_i=True),
                 biased_mask_n_odd_k_pad_i=dict(biased=True, mask_n=True, odd_k=True, pad_i=True)).get(form, {})
    with open(path, "wb") as f:
        f.write(gluon_wsrr.sm90_cubin(which, dtype, rows, stages, **flags))
    key = f"{which} {dtype} {rows}" + ("" if stages == 4 else f" {stages}") + (f" {form}" if form else "")
    out[key] = [subprocess.run([cuobjdump, flag, path], capture_output=True, text=True, check=True).stdout
                for flag in ("-sass", "-res-usage")]
sys.stdout.write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """SASS and resource usage of both kernels in bf16 and fp16, compiled for sm_90 in a fresh process
    without TRITON_INTERPRET."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent.parent / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path_factory.mktemp("cubin"))], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("kernel", ["gate_up torch.bfloat16 256", "gate_up torch.float16 256",
                                    "down torch.bfloat16 256", "down torch.float16 256",
                                    "gate_up torch.bfloat16 128", "down torch.bfloat16 128",
                                    "gate_up torch.bfloat16 256 5", "down torch.bfloat16 128 5",
                                    "gate_up torch.bfloat16 256 ungated", "gate_up torch.bfloat16 128 ungated",
                                    "gate_up torch.bfloat16 256 relu2",
                                    "down torch.bfloat16 256 odd_k", "down torch.float16 128 odd_k",
                                    "gate_up torch.bfloat16 256 swiglu_oai_biased_odd_k",
                                    "gate_up torch.bfloat16 128 swiglu_oai_biased_odd_k",
                                    "down torch.bfloat16 256 biased_mask_n_odd_k", "gate_up torch.bfloat16 256 gelu",
                                    "gate_up torch.bfloat16 256 swiglu_oai_biased_odd_k_pad_i",
                                    "down torch.bfloat16 256 biased_mask_n_odd_k_pad_i"])
def test_k_loop_keeps_each_operand_until_its_wgmma_retires_and_nothing_spills(compiled, kernel):
    check = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "wgmma_operand_check.py"))["analyze"]
    sass, usage = compiled[kernel]
    result = check(sass)
    # nothing spilled in the K loop (the epilogue may keep a register pair on the stack)
    assert int(re.search(r"STACK:(\d+)", usage).group(1)) <= 16
    lo, hi = (int(a, 16) for a in result["loop"])
    spills = [int(a, 16) for a in re.findall(r"/\*([0-9a-f]{4,})\*/\s+[^;]*\b(?:STL|LDL)\b", sass)]
    assert not [a for a in spills if lo <= a <= hi]
    # two register operands in turn (ODD_K: the tile after the pairs takes the first one's registers)
    assert len({a for _, a, _ in result["groups"]}) == 2 and len(result["groups"]) == (3 if "odd_k" in kernel else 2)
    assert all(len(a) == 16 for _, a, _ in result["groups"])  # 64 weight rows x 64 K: 16 registers a thread
    assert result["disjoint"] and result["hazards"] == []
    assert {d.split()[-1] for d in result["depbars"]} == {"0x1"}  # one K tile's wgmma in flight
    assert result["exit_depbar"].endswith("0x0")
    rows = int(kernel.split()[2])
    assert f"HGMMA.64x{rows}x16.F32" in sass.replace(" ", "")  # the tile's tokens: wgmma's N
    if rows == 128:  # two programs a SM: launched at 128 registers a thread
        assert re.search(r"REG:128\b", usage)
