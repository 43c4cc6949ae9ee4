"""A training step through the int8 experts: forward (the kernel) and backward (the reference path, one expert
at a time), timed with the reference's walk over the experts as shipped (the routing read on the host once) and as
it was (one nonzero() per expert, each a wait for the device: NOTES item 226's prediction).

Prints ms per step for each shape and M, both walks, and writes backward_time.json to --out.

    PYTHONPATH=src python3 benchmarks/backward_time.py --out /tmp/r
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8 import bench, fused_experts, reference, select_experts  # noqa: E402


def per_expert_nonzero(topk_ids, expert_map):
    """The walk as it was: one host read of the routing per expert the routing hits."""
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    for e in torch.unique(ids).tolist():
        if e >= 0:
            yield (e, *(ids == e).nonzero(as_tuple=True))


def step_ms(layer, m, top_k, reps=10):
    e, hidden = layer.w2.shape[0], layer.w2.shape[1]
    x = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    logits = torch.randn(m, e, device="cuda", requires_grad=True)
    probe = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda")
    times = []
    for r in range(reps + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        weights, ids = select_experts(logits, top_k)
        out = fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale, w2_scale=layer.w2_scale)
        (out * probe).sum().backward()
        end.record()
        torch.cuda.synchronize()
        if r >= 2:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"])
    ap.add_argument("--m", default="512,2048")
    args = ap.parse_args()
    shipped = reference._expert_pairs
    rows = []
    for name in args.shapes:
        _, (e, hidden, inter, k) = bench.parse_shape(name)
        (layer,) = bench.make_layers(1, e, hidden, inter, "int8")
        for m in (int(v) for v in args.m.split(",")):
            row = dict(shape=name, M=m)
            for walk, fn in (("once", shipped), ("per_expert", per_expert_nonzero)):
                reference._expert_pairs = fn
                row[f"{walk}_ms"] = step_ms(layer, m, k)
            reference._expert_pairs = shipped
            row["speedup"] = row["per_expert_ms"] / row["once_ms"]
            rows.append(row)
            print(f"{name:16s} M={m:<5d} once {row['once_ms']:8.2f} ms  per expert {row['per_expert_ms']:8.2f} ms  "
                  f"{row['speedup']:.2f}x", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "backward_time.json"), "w") as f:
        json.dump(dict(benchmark="backward_time", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
