"""Resident programs a SM of the shipped Triton entries, counted offline (no GPU): every entry of the int8
tables for a device that runs the Triton GEMMs, each GEMM compiled for sm_90 as the entry launches it and
with the epilogue's loads on the other side of the K loop (LATE_EPILOGUE flipped), its registers and
shared memory per program turned into programs a SM (benchmarks/NOTES.md items 131-133: the early loads
cost qwen3 M=4's gate_up one of its six). Rows marked "<-" run fewer programs a SM in the entry's form
than in the other, or spill registers where the other does not: the A/B candidates for
``variant_ab.py late_epilogue``.

    python3 benchmarks/occupancy.py                     # the shipped NVIDIA_H200 tables
    python3 benchmarks/occupancy.py --device NVIDIA_H100_80GB_HBM3 --m 1,2,4,8,16

Run it without TRITON_INTERPRET (the interpreter's patches break compilation). H100/H200 limits: 64K
registers, 228 KB of shared memory (1 KB of it reserved a program), 64 warps and 32 programs a SM.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import triton.backends.nvidia as nv  # noqa: E402

from experts_int8.kernels import configs, fused_moe  # noqa: E402

SM_REGISTERS, SM_SHARED, SM_WARPS, SM_PROGRAMS = 65536, 228 * 1024, 64, 32
RESERVED_SHARED = 1024  # a program's share the hardware keeps for itself


def programs_per_sm(registers: int, shared: int, num_warps: int) -> int:
    """Programs of ``num_warps`` warps that fit on one SM: registers are allocated 8 a thread at a time
    (256 a warp), shared memory per program plus its reserved KB."""
    per_warp = -(-registers // 8) * 8 * 32
    by_registers = SM_REGISTERS // (per_warp * num_warps)
    by_shared = SM_SHARED // (shared + RESERVED_SHARED)
    return min(by_registers, by_shared, SM_WARPS // num_warps, SM_PROGRAMS)


def resources(cubin: bytes) -> tuple[int, bool]:
    """(registers a thread, whether it spills to local memory) of a compiled kernel."""
    cuobjdump = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    spills = int(re.search(r"STACK:(\d+)", usage).group(1)) + int(re.search(r"LOCAL:(\d+)", usage).group(1))
    return int(re.search(r"REG:(\d+)", usage).group(1)), spills > 0


def count(which: str, entry: dict, top_k: int, num_pairs: int) -> tuple[int, int, int, bool]:
    """(registers, shared bytes, programs a SM, spills) of one GEMM of ``entry``."""
    compiled = fused_moe.sm90_compile(which, entry, top_k=top_k, num_pairs=num_pairs)
    (regs, spills), shared = resources(compiled.asm["cubin"]), compiled.metadata.shared
    num_warps = configs.split_config(entry)[0 if which == "gate_up" else 1]["num_warps"]
    return regs, shared, programs_per_sm(regs, shared, num_warps), spills


def flipped(entry: dict, which: str) -> dict:
    """``entry`` with the named GEMM's epilogue loads on the other side of its K loop."""
    gate_up, down = configs.split_config(entry)
    if which == "gate_up":
        return dict(entry, LATE_EPILOGUE=1 - gate_up.get("LATE_EPILOGUE", 0),
                    down={**entry.get("down", {}), "LATE_EPILOGUE": down.get("LATE_EPILOGUE", 0)})
    return dict(entry, down={**entry.get("down", {}), "LATE_EPILOGUE": 1 - down.get("LATE_EPILOGUE", 0)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="NVIDIA_H200", help="the device part of the tables' file names")
    ap.add_argument("--m", help="comma-separated M to count (default: every entry)")
    ap.add_argument("--top-k", type=int, help="top-k for the grid's pair count (default: each shape's from bench)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        ap.error("unset TRITON_INTERPRET: this compiles the kernels for sm_90")
    tables = sorted(glob.glob(os.path.join(configs.PACKAGE_DIR, f"E=*,N=*,device={args.device},dtype=int8_w8a16.json")))
    if not tables:
        ap.error(f"no int8 tables for device {args.device!r} in {configs.PACKAGE_DIR}")
    wanted = {int(m) for m in args.m.split(",")} if args.m else None
    from experts_int8 import bench
    top_ks = {(e, i): k for e, _, i, k in bench.SHAPES.values()}
    print(f"{'table':14s} {'M':>5s} {'GEMM':8s} {'form':5s} {'regs':>9s} {'smem KB':>8s} {'programs/SM':>12s}")
    for path in tables:
        e, n = (int(v) for v in re.search(r"E=(\d+),N=(\d+)", os.path.basename(path)).groups())
        with open(path) as f:
            table = {int(m): entry for m, entry in json.load(f).items()}
        top_k = args.top_k or top_ks.get((e, n), 2)
        for m, entry in sorted(table.items()):
            if (wanted and m not in wanted) or any(entry.get(key) for key in configs.OTHER_KERNEL_KEYS):
                continue
            for which in ("gate_up", "down"):
                kernel_cfg = configs.split_config(entry)[0 if which == "gate_up" else 1]
                form = "late" if kernel_cfg.get("LATE_EPILOGUE") else "early"
                num_pairs = m * top_k
                mine = count(which, entry, top_k, num_pairs)
                other = count(which, flipped(entry, which), top_k, num_pairs)
                mark = ("  <-" if mine[2] < other[2] or (mine[3] and not other[3]) else "") + (
                    "  spills" + ("" if other[3] else " (the other form does not)") if mine[3] else "")
                print(f"E={e},N={n:<6d} {m:5d} {which:8s} {form:5s} {mine[0]:4d}/{other[0]:<4d} {mine[1] / 1024:8.0f} "
                      f"{mine[2]:6d}/{other[2]:<5d}{mark}", flush=True)


if __name__ == "__main__":
    main()
