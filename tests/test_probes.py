"""Probes kept as records, checked without a GPU so that they keep running against the library's kernels.

The one-launch decode layer (benchmarks/one_launch_probe.py, NOTES item 119) matches the reference path
under Triton's interpreter. The dense register-form probe (benchmarks/gluon_w8a16_probe.py, NOTES item 94)
compiled for sm_90: in its K loop no instruction rewrites the register operand of a wgmma still in flight,
nor touches its accumulator (ptxas does not guard either), as benchmarks/wgmma_operand_check.py reads
it from the SASS; and the check itself catches a wait that retires too late. (The library's MoE form
is checked the same way in test_wsrr.py; the probe runs on a GPU from gpu_session/wsrr_probe.sh.)"""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

from experts_int8 import ops
from experts_int8.bench import make_layers
from experts_int8.routing import select_experts

BENCH = Path(__file__).parent.parent / "benchmarks"
# (kernel, module, tokens x rows x K tile x stages x consumer warps, loader registers)
CASES = {
    "dense": ("w8a16_gemm_wsrr_kernel", "gluon_w8a16_probe", (256, 128, 64, 4, 8), 72),
}
POINTERS = {"x_ptr": "*bf16", "a_ptr": "*bf16", "w_ptr": "*i8", "scale_ptr": "*fp32", "y_ptr": "*bf16",
            "out_ptr": "*bf16", "topk_weights_ptr": "*fp32", "sorted_token_ids_ptr": "*i32",
            "block_expert_ids_ptr": "*i32", "num_tokens_post_padded_ptr": "*i32"}

COMPILE = """
import json, subprocess, sys, os
sys.path.insert(0, {bench!r})
import importlib, triton
import triton.backends.nvidia as nv
from triton.experimental.gluon import language as gl
from gluon_w8a16_probe import sm90_cubin
cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
out = {{}}
for name, (kernel, module, (bm, bn, bk, stages, warps), loader_regs) in {cases!r}.items():
    k = getattr(importlib.import_module(module), kernel)
    cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, LOADER_REGS=loader_regs,
              X_SMEM=gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16))
    if "GROUP_M" in k.arg_names:
        cx["GROUP_M"] = 8
    path = os.path.join({tmp!r}, name + ".cubin")
    with open(path, "wb") as f:
        f.write(sm90_cubin(k, cx, {{n: t for n, t in {pointers!r}.items() if n in k.arg_names}}, warps))
    out[name] = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
sys.stdout.write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    """SASS of each case, compiled in a fresh process without TRITON_INTERPRET."""
    pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent / "src"), env.get("PYTHONPATH", "")])
    code = COMPILE.format(bench=str(BENCH), cases=CASES, tmp=str(tmp_path_factory.mktemp("cubin")), pointers=POINTERS)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def check():
    return runpy.run_path(str(BENCH / "wgmma_operand_check.py"))["analyze"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_register_operands_stay_intact_while_their_wgmma_runs(sass, check, case):
    result = check(sass[case])
    groups = result["groups"]
    # two operands in turn, each group a K tile's wgmmas
    assert len(groups) == 2, groups
    assert all(len(a) == 16 for _, a, _ in groups)  # 64 weight rows x 64 K bf16: 16 registers a thread
    assert result["disjoint"]
    assert result["hazards"] == []
    # one K tile's wgmmas left in flight in the loop, none after it
    assert {d.split()[-1] for d in result["depbars"]} == {"0x1"}
    assert result["exit_depbar"].endswith("0x0")


def test_the_check_flags_a_wait_that_retires_too_late(sass, check):
    late = sass["dense"].replace("WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x3")
    assert any(kind == "writes A" for kind, *_ in check(late)["hazards"])


def test_one_launch_layer_matches_the_reference():
    probe = runpy.run_path(str(BENCH / "one_launch_probe.py"))
    torch.manual_seed(0)
    (layer,) = make_layers(1, 8, 64, 48, "int8", device=DEVICE)  # (the interpreter runs CPU tensors only)
    x = torch.randn(3, 64, dtype=torch.float16, device=DEVICE)
    weights, ids = select_experts(torch.randn(3, 8, device=DEVICE), 2)
    expected = ops.fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                                 w2_scale=layer.w2_scale, backend="torch")
    got = probe["one_launch_layer"](x, layer, weights, ids, blocks=(16, 32, 16, 32))
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
