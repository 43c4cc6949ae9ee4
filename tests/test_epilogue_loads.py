"""The Triton GEMMs compiled for sm_90 without a GPU (fused_moe.sm90_compile, benchmarks/occupancy.py):
the epilogue's global loads sit before the K loop, or after it with LATE_EPILOGUE, in the SASS of both
GEMMs (NOTES items 131-133); and the programs-a-SM count the occupancy tool makes from registers and
shared memory."""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# qwen3 M=4's entry before item 133: PAIRS, a 32-wide gate_up tile, the down GEMM's SUM_LAST
ENTRY = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4, num_stages=3, PAIRS=1,
             down=dict(SUM_LAST=1, BLOCK_SIZE_N=128))

COMPILE = """
import json, os, subprocess, sys, tempfile
import triton.backends.nvidia as nv
from experts_int8.kernels import fused_moe
cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
entry = json.loads(sys.argv[1])
out = {}
for late in (0, 1):
    for which in ("gate_up", "down"):
        compiled = fused_moe.sm90_compile(which, dict(entry, LATE_EPILOGUE=late), top_k=8, num_pairs=32)
        path = os.path.join(sys.argv[2], f"{which}_{late}.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        out[f"{which} {late}"] = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True,
                                                check=True).stdout
path = os.path.join(sys.argv[2], "gate_up_tma.cubin")  # an entry whose weights come by TMA (a descriptor)
with open(path, "wb") as f:
    f.write(fused_moe.sm90_compile("gate_up", dict(entry, TMA=1), top_k=8, num_pairs=32).asm["cubin"])
out["gate_up tma"] = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=True).stdout
path = os.path.join(sys.argv[2], "gate_up_ungated.cubin")  # the same entry on experts without a gate
with open(path, "wb") as f:
    f.write(fused_moe.sm90_compile("gate_up", dict(entry, TMA=1), top_k=8, num_pairs=32, gated=False).asm["cubin"])
out["gate_up ungated"] = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True,
                                        check=True).stdout
sys.stdout.write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    """SASS of both GEMMs of ENTRY, loads early and late, compiled in a process without TRITON_INTERPRET."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(ENTRY), str(tmp_path_factory.mktemp("cubin"))],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def plain_global_loads_after_the_last_mma(sass: str) -> int:
    """LDG instructions after the kernel's last HMMA, but for the SUM_LAST sum's reads of the other
    programs' partials (the .cg loads, LDG.E.128.STRONG.GPU)."""
    lines = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,5}\*/", line)]
    last_mma = max(i for i, line in enumerate(lines) if "HMMA" in line)
    return sum(1 for line in lines[last_mma:] if re.search(r"\bLDG\.E(\.\d+|\.64|\.128)?\s", line))


@pytest.mark.parametrize("which", ["gate_up", "down"])
def test_epilogue_loads_move_across_the_k_loop(sass, which):
    early, late = sass[f"{which} 0"], sass[f"{which} 1"]
    assert plain_global_loads_after_the_last_mma(early) == 0
    assert plain_global_loads_after_the_last_mma(late) >= 1  # the row scales (and down's routing weights)


def test_tma_entries_compile_with_their_descriptor(sass):
    assert "UTMALDG" in sass["gate_up tma"] and "UTMALDG" not in sass["gate_up 0"]


def test_ungated_gate_up_runs_one_dot(sass):
    """Experts without a gate: the gate_up kernel's K loop holds half the MMAs and TMA copies of the gated one
    (no up tile, no second dot)."""
    def count(text, op):
        return sum(1 for line in sass[text].splitlines() if re.search(rf"\b{op}\b", line))

    for op in ("UTMALDG", "HMMA"):
        assert 2 * count("gate_up ungated", op) == count("gate_up tma", op) > 0, op


def test_programs_per_sm_from_registers_and_shared_memory():
    occupancy = runpy.run_path(str(ROOT / "benchmarks" / "occupancy.py"), run_name="occupancy")
    per_sm = occupancy["programs_per_sm"]
    # qwen3 M=4's gate_up (4 warps, 24 KB): 82 registers a thread are allocated as 88 -> 5 a SM; 76 as 80 -> 6
    assert per_sm(82, 24 * 1024, 4) == 5 and per_sm(76, 24 * 1024, 4) == 6
    assert per_sm(168, 160 * 1024, 4) == 1  # shared memory: 160 KB + 1 KB reserved, once in 228 KB
    assert per_sm(64, 16 * 1024, 8) == 4  # registers: 64 x 32 x 8 = 16K of the 64K
    assert per_sm(32, 0, 1) == 32  # the cap on programs
