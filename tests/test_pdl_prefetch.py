"""The down GEMM's PDL_PREFETCH compiled for sm_90 without a GPU (fused_moe.sm90_compile): its programs load
their expert, scales and routing weights and ask L2 for their first K tiles of weights before they wait for
gate_up (``griddepcontrol.wait``), and touch gate_up's output only after it; and the config rules."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experts_int8.kernels.configs import check_config

ROOT = Path(__file__).parent.parent
# qwen3 M=1's entry: PAIRS, the down GEMM's split-K partials summed by its last program
ENTRY = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=5, PAIRS=1,
             PDL=2, TILE_N=48, down=dict(BLOCK_SIZE_K=128, num_stages=3, SPLIT_K=2, SUM_LAST=1))

COMPILE = """
import json, sys
from experts_int8.kernels import fused_moe
out = {}
for tiles in (0, 2):
    entry = json.loads(sys.argv[1])
    if tiles:
        entry["down"]["PDL_PREFETCH"] = tiles
    out[str(tiles)] = fused_moe.sm90_compile("down", entry, top_k=8, num_pairs=8).asm["ptx"]
sys.stdout.write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx():
    """PTX of ENTRY's down GEMM without and with PDL_PREFETCH, compiled in a process without TRITON_INTERPRET."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(ENTRY)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def first(lines: list[str], pattern: str) -> int:
    return next(i for i, line in enumerate(lines) if pattern in line)


def test_the_wait_follows_the_loads_and_prefetches_and_precedes_gate_ups_output(ptx):
    lines = ptx["2"].splitlines()
    wait = first(lines, "griddepcontrol.wait")
    prefetches = [i for i, line in enumerate(lines) if "prefetch.global.L2" in line]
    assert prefetches and max(prefetches) < wait
    loads = [i for i, line in enumerate(lines) if "ld.global" in line and ".cg" not in line]
    assert loads and max(loads) < wait  # expert id, row scales, routing weights: all before it
    assert wait < first(lines, "cp.async")  # h (gate_up's output) and the weights' ring after it
    assert first(lines, "st.global") > wait and first(lines, "atom.global") > wait


def test_without_it_the_wait_comes_first(ptx):
    lines = ptx["0"].splitlines()
    wait = first(lines, "griddepcontrol.wait")
    assert "prefetch.global.L2" not in ptx["0"]
    assert wait < first(lines, "ld.global") and wait < first(lines, "cp.async")


def test_config_rules():
    assert check_config(ENTRY | dict(down=dict(ENTRY["down"], PDL_PREFETCH=4)))["down"]["PDL_PREFETCH"] == 4
    for bad in (dict(ENTRY, PDL=0, down=dict(PDL_PREFETCH=2)), dict(ENTRY, down=dict(PDL_PREFETCH=17)),
                dict(ENTRY, down=dict(PDL_PREFETCH=0)), dict(ENTRY, PDL_PREFETCH=2)):
        with pytest.raises(ValueError):
            check_config(bad)


def test_prefetch_only_for_a_programmatic_dependent_launch_without_sum_topk():
    from experts_int8.kernels.fused_moe import _down_meta

    down = dict(ENTRY["down"], BLOCK_SIZE_K=128, PDL_PREFETCH=2)
    assert _down_meta(down, 1, pdl=True)["PREFETCH_TILES"] == 2
    assert _down_meta(down, 1, pdl=True)["PREFETCH_LINES"] == 4  # 256 bytes a row: 2 lines, 1 more, to a power of 2
    assert _down_meta(down, 1, pdl=False)["PREFETCH_TILES"] == 0  # no PDL here (the interpreter, pre-Hopper)
    assert _down_meta(dict(down, SUM_TOPK=1), 1, pdl=True)["PREFETCH_TILES"] == 0  # SUM_TOPK's programs wait first
