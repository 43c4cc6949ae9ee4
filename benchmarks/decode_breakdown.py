"""Where a decode-size MoE layer's time goes, launch by launch: the benchmark's CUDA-graph sweep over
distinct layers (as ``bench_kernel`` times it, the shipped int8 tables), profiled, and each layer's
kernels taken apart: how long each launch runs, how much of that is weight bytes at what rate, and the
idle gaps between the launches of a layer and between layers (benchmarks/NOTES.md item 53: at M=1 the
small-expert shapes pay ~13 µs beyond their weight bytes).

Prints a table per shape and M and writes ``decode_breakdown.json`` to --out.

    PYTHONPATH=src python3 benchmarks/decode_breakdown.py --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b
"""
import argparse
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
os.environ.setdefault("TEARDOWN_CUPTI", "0")  # one profiler session per row, CUDA graphs alive between them
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from experts_int8 import bench  # noqa: E402

def kernel_spans(prof) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every GPU kernel the profiler saw, in start order."""
    spans = [(evt.name, evt.time_range.start, evt.time_range.end) for evt in prof.events()
             if evt.device_type == torch.autograd.DeviceType.CUDA and evt.time_range.end > evt.time_range.start]
    return sorted(spans, key=lambda s: s[1])


def split_layers(spans, num_calls: int):
    """The kernels grouped per layer call (every call launches the same kernels)."""
    if not spans or len(spans) % num_calls:
        raise RuntimeError(f"{len(spans)} kernels seen for {num_calls} layer calls: the profiler missed some "
                           f"(is CUPTI tracing CUDA-graph kernels here?)")
    per = len(spans) // num_calls
    return [spans[j:j + per] for j in range(0, len(spans), per)]


def short_name(name: str) -> str:
    for key in ("align", "gate_up", "down", "sum", "dequantize", "gluon"):
        if key in name:
            return key
    return name[:24]


def breakdown(layers) -> dict:
    """Medians over layers: each launch's time, the gaps inside a layer, the period from one layer's
    first launch to the next one's."""
    launches = collections.defaultdict(list)
    gaps = collections.defaultdict(list)
    periods = []
    for a, b in zip(layers, layers[1:]):
        periods.append(b[0][1] - a[0][1])
    for layer in layers:
        for j, (name, start, end) in enumerate(layer):
            launches[f"{j}:{short_name(name)}"].append(end - start)
            if j:
                gaps[f"{j - 1}->{j}"].append(start - layer[j - 1][2])
    med = lambda v: round(statistics.median(v), 2)  # noqa: E731
    return dict(period_us=med(periods) if periods else None,
                launch_us={k: med(v) for k, v in launches.items()},
                gap_us={k: med(v) for k, v in gaps.items()},
                busy_us=round(sum(med(v) for v in launches.values()), 2), layers_seen=len(layers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"])
    ap.add_argument("--m", default="1,2,4,8")
    ap.add_argument("--dtype", default="int8", choices=["int8", "bf16"])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--variant", help="NAME=VALUE: a variant_ab.py variant on top of the shipped entries "
                                      "(e.g. waves=2); the JSON is then decode_breakdown_NAME_VALUE.json")
    args = ap.parse_args()
    if args.variant:
        import variant_ab
        from experts_int8 import ops
        from experts_int8.kernels import configs
        name, value = args.variant.split("=")
        apply = variant_ab.VARIANTS[name][0]
        ops.get_config = lambda *a, **kw: apply(configs.get_config(*a, **kw), int(value), *a, *kw.values())
    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    copy_bps = bench.measure_copy_bandwidth()
    rows = []
    for name in args.shapes:
        (e, h, i, k), layers = bench.layer_pool(name, args.dtype, l2)
        n = len(layers)
        wbytes = 1 if args.dtype == "int8" else 2
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, h, dtype=torch.bfloat16, device="cuda")
            routing = [bench.routing_draws(m, e, k)[0]] * n  # (one draw for every layer, as this probe's runs)
            try:
                row = profile_row(x, layers, routing, n, copy_bps, 3 * h * i * wbytes)
            except Exception as exc:  # noqa: BLE001 - one row's failure (a profiler miss) keeps the others
                row = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                print(f"{name:16s} M={m:<3d} failed: {row['error']}", flush=True)
            else:
                launches = "  ".join(f"{key} {us:.1f}" for key, us in row["launch_us"].items())
                gap_text = "  ".join(f"{key} {us:.1f}" for key, us in row["gap_us"].items())
                print(f"{name:16s} M={m:<3d} layer {row['layer_us']:7.1f} us (copy floor {row['copy_floor_us']:6.1f}; "
                      f"period {row['period_us']}) | launches: {launches} | gaps: {gap_text}", flush=True)
            rows.append(dict(shape=name, M=m, dtype=args.dtype, **row))
            save(args.out, copy_bps, rows, args.variant)  # after every row: a crash later keeps what was measured
        del layers
        torch.cuda.empty_cache()


def profile_row(x, layers, routing, n, copy_bps, expert_bytes) -> dict:
    """One (shape, M): the layer time as the benchmark measures it, then three profiled replays of the
    same graph taken apart per layer call."""
    seconds, _ = bench.time_calls(x, layers, routing, n, reps=10, warmup=2)
    run = bench._layer_calls(x, layers, routing, n)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    replays = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    del graph
    parts = breakdown(split_layers(kernel_spans(prof), replays * n))
    distinct = statistics.mean(len(torch.unique(ids)) for _, ids in routing)
    return dict(layer_us=round(seconds * 1e6, 2), copy_floor_us=round(distinct * expert_bytes / copy_bps * 1e6, 2),
                **parts)


def save(out_dir: str, copy_bps: float, rows: list, variant: str | None = None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    suffix = "_" + variant.replace("=", "_") if variant else ""  # (no "=" in a file name the device returns)
    with open(os.path.join(out_dir, f"decode_breakdown{suffix}.json"), "w") as f:
        json.dump(dict(benchmark="decode_breakdown", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       copy_GBps=copy_bps / 1e9, command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
