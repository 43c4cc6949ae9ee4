"""A/B of the rules that pick a tuned table entry for an M that was not tuned, in one process.

Rules: ``linear`` (nearest M), ``log`` (nearest M on a log scale, ties to the larger) and ``table_key``
(the library's: the tuned M at or below, stepping up when its BLOCK_SIZE_M is shorter than the rows per
expert). Quick kernel bench on the two shapes with tables at the M between tuned entries; prints
microseconds per rule and writes lookup_ab.json to --out.

    PYTHONPATH=src python3 benchmarks/lookup_ab.py --out benchmarks/results
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from experts_int8 import bench  # noqa: E402
from experts_int8.kernels import configs  # noqa: E402

RULES = {
    "linear": lambda table, m, e, k: min(table, key=lambda key: abs(key - m)),
    "log": lambda table, m, e, k: min(table, key=lambda key: (abs(math.log2(key) - math.log2(max(m, 1))), -key)),
    "table_key": configs.table_key,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--m", default="64,128,256,512")
    args = ap.parse_args()
    ms = [int(m) for m in args.m.split(",")]
    times = {}
    for name, rule in RULES.items():
        configs.table_key = rule
        result = bench.run_benchmark(bench.Settings.quick(shapes=["mixtral-8x7b", "qwen3-30b-a3b"], ms=ms,
                                                          out_dir=args.out, plot=False), log=lambda s: None)
        times[name] = {f"{r['shape']} M={r['M']} {r['dtype']}": round(r["time_us"], 1) for r in result["rows"]}
    configs.table_key = RULES["table_key"]
    print(f"{'row':32s}" + "".join(f"{name:>11s}" for name in RULES))
    for row in times["linear"]:
        print(f"{row:32s}" + "".join(f"{times[name][row]:11.1f}" for name in RULES))
    commit = bench.library_commit()[0]
    with open(os.path.join(args.out, "lookup_ab.json"), "w") as f:
        json.dump(dict(benchmark="lookup_ab", gpu=bench.environment().get("gpu"), commit=commit,
                       command=" ".join(sys.argv), **times), f, indent=1)


if __name__ == "__main__":
    main()
