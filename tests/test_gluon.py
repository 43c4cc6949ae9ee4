"""The GLUON config option: when the Gluon (wgmma) kernels apply, that they compile for sm_90 with the
intended pipelining, and that everywhere else a GLUON entry runs the Triton kernels with its blocks.
(Gluon kernels do not run under Triton's interpreter; tests/test_gpu.py runs them against the oracle.)"""

import json
import os
import subprocess
import sys

import pytest
import torch

from experts_int8.kernels.configs import check_config, override_config

gluon_moe = pytest.importorskip("experts_int8.kernels.gluon_moe", reason="this Triton has no Gluon")

PREFILL = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)


def test_config_key():
    assert check_config(dict(PREFILL, GLUON=1))["GLUON"] == 1
    with pytest.raises(ValueError, match="0 or 1"):
        check_config(dict(PREFILL, GLUON=2))
    with pytest.raises(ValueError, match="exclude each other"):
        check_config(dict(PREFILL, GLUON=1, DEQUANT_ONCE=1))


@pytest.mark.parametrize("change, ok", [
    ({}, True),
    (dict(num_warps=8, BLOCK_SIZE_N=128, num_stages=3), True),
    (dict(down=dict(BLOCK_SIZE_N=128, num_stages=3)), True),
    (dict(BLOCK_SIZE_M=32), False),  # 4 warps of wgmma need 64 rows
    (dict(BLOCK_SIZE_K=16), False),
    (dict(num_stages=1), False),
    (dict(PAIRS=1), False),
    (dict(SWAP_AB=1), False),
    (dict(FUSE_GATE_UP=1), True),  # gate and up as one wgmma of 128 columns
    (dict(num_warps=8, BLOCK_SIZE_N=128, num_stages=3, FUSE_GATE_UP=1), True),  # ... of 256
    (dict(down=dict(SPLIT_K=2)), False),
    (dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=128), False),  # 4 x 64 KB ring + 2 x 64 KB slots: past 227 KB
    (dict(BLOCK_SIZE_N=128), False),  # gate and up accumulators: 256 registers a thread with 4 warps
])
def test_blocks_ok(change, ok):
    assert gluon_moe.blocks_ok(dict(PREFILL, **change)) is ok


@pytest.mark.parametrize("change, gated, ok", [
    (dict(BLOCK_SIZE_N=128), True, False),  # gate and up accumulators: 256 registers a thread on 4 warps
    (dict(BLOCK_SIZE_N=128), False, True),  # up alone: 128
    (dict(BLOCK_SIZE_N=256, num_warps=8), False, True),  # ... also 128 on 8 warps
    (dict(BLOCK_SIZE_N=256), False, False),  # 256 on 4 warps
    (dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=3), True, False),  # 3 x 64 KB + 2 x 64 KB: past 227 KB
    (dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=3), False, True),  # 3 x 48 KB + 2 x 32 KB
])
def test_blocks_ok_without_a_gate(change, gated, ok):
    """Experts without a gate have one weight tile and one accumulator a K step: wider blocks fit."""
    assert gluon_moe.blocks_ok(dict(PREFILL, **change), gated=gated) is ok


@pytest.mark.parametrize("config, cols, trimmed", [
    (PREFILL, 64, True),  # 128 rows on one warpgroup: the half block is 64 rows on the same warps
    (dict(PREFILL, TRIM_TAIL=0), 64, False),
    (dict(PREFILL, BLOCK_SIZE_M=64), 64, False),  # 32 rows: not a warpgroup's wgmma
    (dict(PREFILL, BLOCK_SIZE_M=128, num_warps=8), 128, True),  # 64 rows on 8 warps: 2 x 64 columns
    (dict(PREFILL, BLOCK_SIZE_M=128, num_warps=8), 24, False),  # ... 2 x 12 columns: not a wgmma width
    (dict(PREFILL, BLOCK_SIZE_M=256, num_warps=8), 8, True),  # 128 rows on 8 warps: stacked along M
])
def test_trim_tail_rule(config, cols, trimmed):
    assert gluon_moe.trim_tail(config, cols) is trimmed


def test_shared_memory_count():
    # gate_up, 128x64x64, 4 stages: 4 x (16 KB of x + 8 KB of gate and up int8) + 2 x 16 KB converted
    assert gluon_moe.smem_bytes(PREFILL, 2) == 4 * (128 * 64 * 2 + 2 * 64 * 64) + 2 * 2 * 64 * 64 * 2 == 131072


def test_biases_compile_to_loads_and_adds():
    """With expert biases (HAS_BIAS) each epilogue loads them (gate_up: gate's and up's, down: one row) and
    adds them in fp32; without, no load of them at all (the unbiased kernels are those run on the H200)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import json, sys, torch; from experts_int8.kernels import gluon_moe; sys.stdout.write(json.dumps("
            f"[gluon_moe.sm90_ptx(w, {PREFILL!r}, torch.bfloat16, 'swiglu_oai', biased=b) "
            "for w in ('gate_up', 'down') for b in (False, True)]))")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    gate_up, gate_up_biased, down, down_biased = (ptx.count("ld.global") for ptx in json.loads(run.stdout))
    assert gate_up_biased > gate_up and down_biased > down


def test_not_supported_off_cuda():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w13, w2 = torch.zeros(2, 64, 64, dtype=torch.int8), torch.zeros(2, 64, 32, dtype=torch.int8)
    assert not gluon_moe.supported(PREFILL, x, w13, torch.ones(2, 64), w2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gluon_entry_runs_the_triton_kernels_where_it_does_not_apply(dtype, monkeypatch):
    from test_fused_experts import check

    def must_not_run(*args, **kwargs):
        raise AssertionError("the Gluon kernels ran where they do not apply")

    monkeypatch.setattr(gluon_moe, "invoke_gate_up", must_not_run)
    monkeypatch.setattr(gluon_moe, "invoke_down", must_not_run)
    cfg = dict(PREFILL, BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, num_stages=2, GLUON=1)
    with override_config(cfg):
        check(37, 4, 64, 48, 2, dtype, "triton")


WIDE = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
# (kernel, blocks, activation dtype, wgmmas left in flight in the loop, experts with a gate, expert biases)
COMPILED = [("gate_up", PREFILL, "bfloat16", 2, True, False), ("down", PREFILL, "bfloat16", 1, True, False),
            ("gate_up", WIDE, "float16", 2, True, False),
            ("gate_up", dict(WIDE, FUSE_GATE_UP=1), "bfloat16", 1, True, False),
            ("gate_up", dict(WIDE, FUSE_GATE_UP=1, TRIM_TAIL=0), "bfloat16", 1, True, False),
            # without a gate: one weight tile a K step (FUSE_GATE_UP dropped), in both activation dtypes
            ("gate_up", PREFILL, "bfloat16", 1, False, False),
            ("gate_up", dict(WIDE, FUSE_GATE_UP=1), "float16", 1, False, False),
            # expert biases (GPT-OSS) in both epilogues
            ("gate_up", dict(WIDE, FUSE_GATE_UP=1), "bfloat16", 1, True, True), ("down", WIDE, "bfloat16", 1, True, True)]


@pytest.fixture(scope="module")
def sm90_ptx():
    """PTX of the kernels in COMPILED for sm_90, compiled in a fresh process (the interpreter that runs
    the other tests patches Triton's language in this one)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import json, sys, torch; from experts_int8.kernels import gluon_moe; sys.stdout.write(json.dumps("
            f"[gluon_moe.sm90_ptx(w, c, getattr(torch, d), gated=g, biased=b) for w, c, d, _, g, b in {COMPILED!r}]))")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _first(lines, text, start=0):
    return next(i for i in range(start, len(lines)) if text in lines[i])


@pytest.mark.parametrize("case", range(len(COMPILED)), ids=[
    f"{w}{'' if g else '-ungated'}{'-biased' if b else ''}-{c['num_warps']}w-{d}-{n}" for w, c, d, n, g, b in COMPILED])
def test_kernels_compile_for_sm90_with_a_wgmma_in_flight(sm90_ptx, case):
    """The point of these kernels: the wgmma is asynchronous and the K loop waits only for the previous
    tile's (gate_up: two wgmmas per tile, so two stay in flight, or one with FUSE_GATE_UP; down: one),
    never for all of them as Triton's own int8 pipeline does (benchmarks/NOTES.md item 13); and the
    order that makes it safe: converted tile stored, proxy fence, barrier, wgmma; after the wait, a
    barrier before the previous tile's ring slot is refilled."""
    which, config, dtype, in_flight, _, _ = COMPILED[case]
    lines = sm90_ptx[case].splitlines()
    waits = sorted({line.split()[-1].rstrip(";") for line in lines if "wgmma.wait_group" in line})
    assert waits == ["0", str(in_flight)], waits  # in the loop: the previous tile's; after it: all
    mma = _first(lines, "wgmma.mma_async")
    assert {"bf16": "bfloat16", "f16": "float16"}[lines[mma].split()[0].split(".")[-1]] == dtype
    store = max(i for i in range(mma) if "st.shared" in lines[i])  # the converted tile (the loop's next one)
    fence = _first(lines, "fence.proxy.async", store)
    assert fence < mma, "no proxy fence between the converted tile's store and the wgmma"
    assert any("bar.sync" in line for line in lines[fence:mma]), "no barrier between the proxy fence and the wgmma"
    wait = _first(lines, f"wgmma.wait_group.sync.aligned {in_flight}")
    refill = _first(lines, "cp.async.cg", wait)
    assert any("bar.sync" in line for line in lines[wait:refill]), "ring slot refilled without a barrier"


def test_half_blocks_compile_beside_the_full_ones(sm90_ptx):
    """TRIM_TAIL (on unless turned off): the 128x(2x128) fused gate_up on 8 warps holds a second K loop
    for an expert's half-empty last block, 64 rows on two warpgroups of 128 columns each, in the same
    shared memory; with TRIM_TAIL 0 only the full block's loop."""
    def shapes(ptx):
        return sorted({line.split()[0].split(".")[4] for line in ptx.splitlines() if "wgmma.mma_async" in line})

    trimmed, untrimmed = sm90_ptx[3], sm90_ptx[4]
    assert shapes(trimmed) == ["m64n128k16", "m64n256k16"]
    assert shapes(untrimmed) == ["m64n256k16"]


def test_relu2_compiles_to_its_own_branch():
    """Activation code 4 (relu2) has its own branch in the gate_up kernel: relu(gate)^2, no sigmoid (whose
    ex2 the swiglu_oai form, the last branch, holds)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import json, sys, torch; from experts_int8.kernels import gluon_moe; sys.stdout.write(json.dumps("
            f"[gluon_moe.sm90_ptx('gate_up', {PREFILL!r}, torch.bfloat16, a) for a in ('relu2', 'swiglu_oai')]))")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    relu2, swiglu_oai = json.loads(run.stdout)
    assert "ex2" not in relu2 and "max.f32" in relu2 and "ex2" in swiglu_oai
