"""One MoE layer called a few times, eagerly: the program Nsight Compute profiles kernel by kernel
(``benchmarks/gpu_session/ncu.sh``). ncu flushes the caches before each replay of a kernel, so the
weights come from HBM as in the benchmark's sweep over many layers; the first call compiles.

    ncu --clock-control none -k regex:moe_ --launch-skip 2 --launch-count 2 \\
        python3 benchmarks/ncu_layer.py --shape mixtral-8x7b --m 1 --dtype int8

``--override FILE`` runs the layer under the config in that JSON file instead of the table's entry.
"""
import argparse
import contextlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8 import bench, ops  # noqa: E402
from experts_int8.kernels import configs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="mixtral-8x7b")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--dtype", default="int8", choices=["int8", "bf16"])
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--override", help="a JSON file holding the config to force (default: the table's entry)")
    args = ap.parse_args()
    forced = json.load(open(args.override)) if args.override else None
    _, (e, h, i, k) = bench.parse_shape(args.shape)
    (layer,) = bench.make_layers(1, e, h, i, args.dtype)
    x = torch.randn(args.m, h, dtype=torch.bfloat16, device="cuda")
    weights, ids = bench.routing_draws(args.m, e, k)[0]
    with configs.override_config(forced) if forced else contextlib.nullcontext():
        for _ in range(args.calls):
            ops.fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                              w2_scale=layer.w2_scale)
        torch.cuda.synchronize()
        print(f"{args.shape} M={args.m} {args.dtype}: {args.calls} calls, config "
              f"{ops.get_config(args.m, e, i, k, torch.int8 if args.dtype == 'int8' else torch.bfloat16, x.device)}")


if __name__ == "__main__":
    main()
