"""A/B of the down GEMM's SPLIT_K at decode sizes: the shipped/heuristic config with down SPLIT_K 1, 2, 4.

Same weights, routing and CUDA-graph timing as bench_kernel; prints microseconds per MoE layer per
SPLIT_K and writes split_k_ab.json to --out.

    PYTHONPATH=src python3 benchmarks/split_k_ab.py --out benchmarks/results
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8 import bench, ops  # noqa: E402
from experts_int8.kernels import configs  # noqa: E402

SPLITS = (1, 2, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--shapes", nargs="+", default=["mixtral-8x7b", "mixtral-8x22b", "jamba-1.5-mini", "qwen3-30b-a3b"])
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--dtype", default="int8", choices=["int8", "bf16"])
    args = ap.parse_args()
    ms = [int(m) for m in args.m.split(",")]
    base_get_config = configs.get_config
    split = {"k": 1}

    def with_split(*a, **kw):
        cfg = base_get_config(*a, **kw)
        if split["k"] > 1:
            cfg = dict(cfg, down={**cfg.get("down", {}), "SPLIT_K": split["k"]})
        return cfg

    ops.get_config = with_split
    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    rows = []
    for name in args.shapes:
        _, (e, h, i, k) = bench.parse_shape(name)
        n = bench.layers_for_pool(e, h, i, k, args.dtype, l2_bytes=l2, budget_bytes=4e9)
        layers = bench.make_layers(n, e, h, i, args.dtype)
        for m in ms:
            x = torch.randn(m, h, dtype=torch.bfloat16, device="cuda")
            routing = bench.make_routing(m, e, k, n)
            row = dict(shape=name, M=m, dtype=args.dtype)
            for s in SPLITS:
                split["k"] = s
                seconds, _ = bench.time_calls(x, layers, routing, max(n, 8), reps=20, warmup=2)
                row[f"split{s}_us"] = seconds * 1e6
            rows.append(row)
            print(f"{name:16s} M={m:<3d} " + "  ".join(f"split {s}: {row[f'split{s}_us']:7.1f} us" for s in SPLITS),
                  flush=True)
        del layers
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "split_k_ab.json"), "w") as f:
        json.dump(dict(benchmark="split_k_ab", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
