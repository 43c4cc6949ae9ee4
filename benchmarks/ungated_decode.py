"""Experts without a gate (NemotronH: relu2(up)) on the GPU: int8 against bf16 through ``fused_experts``, on
Nemotron 3 Nano's experts shape (E=128, H=2688, I=1856, k=6), with the gated form of the same shape beside it.

Timed as ``experts-int8 bench`` times (CUDA-graph replays, medians, routing from seeded random logits, the same
for both formats); the weight bandwidth counts the distinct experts hit x (rows of w13 + H) x I x bytes.

    python benchmarks/ungated_decode.py --out benchmarks/results/sNN/ungated.json
"""

from __future__ import annotations

import argparse
import json

import torch

from experts_int8 import bench, fused_experts
from experts_int8.bench import Layer

SHAPE = {"e": 128, "h": 2688, "i": 1856, "k": 6}  # Nemotron 3 Nano 30B-A3B's routed experts
MS = (1, 2, 4, 8, 16, 64, 256, 512, 1024, 2048, 4096, 8192)


def layers(n: int, e: int, h: int, i: int, fmt: str, gated: bool) -> list[Layer]:
    rows = (2 if gated else 1) * i
    out = []
    for _ in range(n):
        if fmt == "bf16":
            out.append(Layer(torch.randn(e, rows, h, dtype=torch.bfloat16, device="cuda").mul_(0.02),
                             torch.randn(e, h, i, dtype=torch.bfloat16, device="cuda").mul_(0.02), None, None))
        else:
            out.append(Layer(torch.randint(-127, 128, (e, rows, h), dtype=torch.int8, device="cuda"),
                             torch.randint(-127, 128, (e, h, i), dtype=torch.int8, device="cuda"),
                             torch.rand(e, rows, device="cuda").mul_(2e-4).add_(1e-4),
                             torch.rand(e, h, device="cuda").mul_(2e-4).add_(1e-4)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    e, h, i, k = SHAPE["e"], SHAPE["h"], SHAPE["i"], SHAPE["k"]
    copy = bench.measure_copy_bandwidth()
    rows = []
    for gated in (False, True):
        for fmt in ("bf16", "int8"):
            pool = layers(2, e, h, i, fmt, gated)  # one layer is >1 GB: every replay reads HBM
            for m in MS:
                routing = [bench.routing_draws(m, e, k)[0]] * len(pool)  # (one draw, as this probe's runs)
                x = torch.randn(m, h, dtype=torch.bfloat16, device="cuda")
                # the activation as the model runs it: relu2 without a gate, silu with one
                act = "silu" if gated else "relu2"

                def run(pool=pool, x=x, routing=routing, act=act):
                    for layer, (w, ids) in zip(pool, routing):
                        fused_experts(x, layer.w13, layer.w2, w, ids, w13_scale=layer.w13_scale,
                                      w2_scale=layer.w2_scale, activation=act)
                t, method = bench.time_run(run, 2, reps=args.reps, warmup=3)
                hit = bench.distinct_experts(routing[0][1])
                nbytes = hit * ((2 if gated else 1) * i + h) * i * (1 if fmt == "int8" else 2)
                rows.append({"gated": gated, "fmt": fmt, "m": m, "us": t * 1e6, "method": method,
                                 "bw_frac": nbytes / t / copy, "experts_hit": hit})
            del pool
            torch.cuda.empty_cache()
    by = {(r["gated"], r["fmt"], r["m"]): r for r in rows}
    for r in rows:
        if r["fmt"] == "int8":
            r["speedup"] = by[r["gated"], "bf16", r["m"]]["us"] / r["us"]
    result = {"shape": SHAPE, "copy_bandwidth_gbs": copy / 1e9, "environment": bench.environment(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"copy bandwidth {copy / 1e9:.0f} GB/s; E={e} H={h} I={i} k={k}")
    print(f"{'form':<8} {'M':>5} {'bf16 us':>9} {'int8 us':>9} {'int8/bf16':>9} {'bf16 %copy':>10} {'int8 %copy':>10}")
    for gated in (False, True):
        for m in MS:
            b, q = by[gated, "bf16", m], by[gated, "int8", m]
            print(f"{'gated' if gated else 'ungated':<8} {m:>5} {b['us']:>9.1f} {q['us']:>9.1f} {q['speedup']:>9.2f} "
                  f"{100 * b['bw_frac']:>10.1f} {100 * q['bw_frac']:>10.1f}")


if __name__ == "__main__":
    main()
