"""configs.pipeline_smem_bytes against the shared memory Triton allocates (``metadata.shared`` of the Triton GEMMs
compiled for sm_90 without a GPU, fused_moe.sm90_compile): never less, and at most a few barriers' bytes more, so
that the tuner prunes only what cannot launch. MEASURED holds compiles by Triton 3.9 and 3.6 (the same bytes), of
which the last test compiles a few again with the Triton installed; BOUNDED those of forms the estimate bounds
from above by design (never less)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experts_int8.kernels import configs

ROOT = Path(__file__).parent.parent
SLACK = 128  # bytes the estimate may count above a compile (barriers: 8 a stage and tile)

# (GEMM, weights, (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps, num_stages), other keys, compiled shared)
MEASURED = [
    # mma.sync (fewer than 64 rows): rings of num_stages - 1 tiles
    ("down", "int8", (16, 256, 256, 4, 4), {}, 221184),  # the 256-wide down tile at decode: 216 KB
    ("gate_up", "int8", (16, 128, 256, 4, 4), {}, 221184),
    ("gate_up", "bf16", (16, 64, 256, 4, 4), {}, 221184),
    ("gate_up", "bf16", (16, 64, 128, 4, 4), {}, 110592),  # the bf16 decode heuristic
    ("down", "bf16", (16, 256, 128, 4, 4), {}, 208896),
    ("gate_up", "int8", (32, 256, 128, 4, 4), {}, 221184),
    ("gate_up", "int8", (16, 64, 256, 4, 4), {"TMA": 1}, 122936),
    # wgmma (64 rows or more, or 64 weight rows under SWAP_AB): shared-memory operands in rings of num_stages
    ("gate_up", "int8", (16, 128, 128, 4, 4), {"SWAP_AB": 1}, 114688),
    ("gate_up", "bf16", (16, 128, 128, 4, 4), {"SWAP_AB": 1}, 278528),
    ("down", "int8", (16, 64, 256, 4, 4), {"SWAP_AB": 1}, 81920),
    ("gate_up", "int8", (64, 128, 64, 4, 4), {}, 98304),  # + the converted weight tile
    ("gate_up", "int8", (64, 32, 256, 4, 5), {}, 245760),
    ("down", "int8", (128, 128, 64, 4, 4), {}, 106496),  # the int8 prefill heuristic's down GEMM
    ("down", "int8", (64, 128, 256, 8, 4), {}, 294912),
    ("gate_up", "int8", (64, 128, 64, 4, 4), {"FUSE_GATE_UP": 1}, 114688),
    ("gate_up", "int8", (128, 64, 64, 4, 4), {"FUSE_GATE_UP": 1}, 106496),
    ("gate_up", "bf16", (128, 128, 64, 8, 3), {}, 147456),
    ("down", "bf16", (64, 256, 64, 8, 5), {}, 204800),
    ("down", "int8", (64, 128, 64, 4, 4), {"TMA": 1}, 73752),
]
COMPILED_HERE = (0, 3, 7, 10, 12)  # rows of MEASURED compiled again by the last test: one of each kind


def kernel_config(blocks: tuple, extra: dict) -> dict:
    bm, bn, bk, warps, stages = blocks
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=1, num_warps=warps,
                num_stages=stages, **extra)


def estimate(which: str, weights: str, config: dict) -> int:
    return configs.pipeline_smem_bytes(config, 1 if weights == "int8" else 2,
                                       weight_tiles=2 if which == "gate_up" else 1)


@pytest.mark.parametrize("row", MEASURED, ids=[f"{w}-{d}-{'x'.join(map(str, b))}{''.join(e)}"
                                                for w, d, b, e, _ in MEASURED])
def test_estimate_matches_the_compiled_shared_memory(row):
    which, weights, blocks, extra, shared = row
    assert 0 <= estimate(which, weights, kernel_config(blocks, extra)) - shared <= SLACK


# Compiles (Triton 3.9, sm_90) of forms MEASURED leaves out, of which the estimate is a bound, not a match: num_stages
# 1 (counted as 2), gate_up without a gate (counted with two weight tiles), a bf16 output tile over K tiles of 16-32
# (counted in fp32), fp16 activations, the down GEMM's partial sums (SPLIT_K, SUM_LAST), PAIRS and TMA under SWAP_AB.
# (GEMM, weights, activations, gated, (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps, num_stages), other keys,
# compiled shared)
BOUNDED = [
    ("gate_up", "int8", "bf16", True, (16, 64, 256, 4, 1), {}, 16384),
    ("down", "bf16", "bf16", True, (64, 128, 64, 4, 1), {}, 24576),
    ("gate_up", "int8", "bf16", False, (128, 256, 32, 8, 3), {}, 57344),
    ("gate_up", "bf16", "fp16", False, (32, 64, 256, 4, 4), {"SWAP_AB": 1, "down": {"SPLIT_K": 2}}, 196608),
    ("gate_up", "int8", "fp16", True, (16, 128, 128, 4, 4), {"PAIRS": 1, "SWAP_AB": 1}, 114688),
    ("down", "int8", "fp16", True, (16, 128, 128, 4, 4), {"PAIRS": 1, "SWAP_AB": 1}, 65536),
    ("down", "int8", "bf16", True, (128, 128, 16, 8, 3), {}, 32768),
    ("down", "int8", "bf16", True, (128, 128, 32, 8, 4), {"down": {"SUM_LAST": 1}}, 65536),
    ("down", "bf16", "bf16", True, (128, 128, 64, 8, 3), {"down": {"SPLIT_K": 2}}, 98304),
    ("down", "int8", "bf16", True, (32, 64, 256, 4, 4), {"SWAP_AB": 1, "down": {"SPLIT_K": 2}}, 114688),
    ("gate_up", "bf16", "fp16", True, (16, 128, 128, 4, 3), {"SWAP_AB": 1, "TMA": 1}, 208920),
    ("down", "int8", "bf16", True, (16, 128, 128, 4, 3), {"SWAP_AB": 1, "TMA": 1}, 45072),
]


@pytest.mark.parametrize("row", BOUNDED, ids=[f"{w}-{d}-{a}-{'gated' if g else 'ungated'}-{'x'.join(map(str, b))}"
                                               f"{''.join(e)}" for w, d, a, g, b, e, _ in BOUNDED])
def test_estimate_is_never_below_a_compile_of_the_other_forms(row):
    """What the estimate admits fits: never less than the compile, in every form a table entry may take."""
    which, weights, _, _, blocks, extra, shared = row
    gate_up, down = configs.split_config(configs.check_config(kernel_config(blocks, extra)))
    assert estimate(which, weights, gate_up if which == "gate_up" else down) >= shared


def test_estimate_counts_the_stages_a_decode_pipeline_holds():
    """The case the old estimate (num_stages full stages) got wrong: a decode block's 4 stages of 72 KB hold 3
    (216 KB, under Hopper's 227 KB), so the tuner offers it; its 5 stages (288 KB) it does not."""
    config = kernel_config((16, 256, 256, 4, 4), {})
    per_stage = 16 * 256 * 2 + 256 * 256
    assert estimate("down", "int8", config) < 232448 < 4 * per_stage
    assert estimate("down", "int8", dict(config, num_stages=5)) > 232448


COMPILE = """
import json, os, sys
try:
    import torch
    import triton.backends.nvidia as nv
    from triton.backends.compiler import GPUTarget  # noqa: F401
except ImportError:
    sys.exit(3)
if not os.path.exists(os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")):
    sys.exit(3)
from experts_int8.kernels import fused_moe
out = []
for which, weights, config in json.loads(sys.argv[1]):
    dtype = torch.int8 if weights == "int8" else torch.bfloat16
    out.append(fused_moe.sm90_compile(which, config, weight_dtype=dtype).metadata.shared)
sys.stdout.write(json.dumps(out))
"""


def test_estimate_against_compiles_for_sm90():
    """A few rows of MEASURED compiled again (in a process without TRITON_INTERPRET), so that a Triton that
    allocates otherwise shows here; skipped where Triton cannot compile for NVIDIA GPUs."""
    jobs = [(MEASURED[i][0], MEASURED[i][1], kernel_config(MEASURED[i][2], MEASURED[i][3])) for i in COMPILED_HERE]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(jobs)], env=env, capture_output=True, text=True,
                         timeout=900)
    if run.returncode == 3:
        pytest.skip("this Triton cannot compile for NVIDIA GPUs here (no NVIDIA backend or ptxas)")
    assert run.returncode == 0, run.stderr[-3000:]
    for (which, weights, config), shared in zip(jobs, json.loads(run.stdout)):
        assert 0 <= estimate(which, weights, config) - shared <= SLACK, (which, weights, config, shared)
