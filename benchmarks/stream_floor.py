"""How fast can any kernel read a decode layer's weight bytes? The benchmark's "% of copy" compares a
layer against the copy rate of a 1 GiB buffer; a decode layer reads far less (qwen3-30b-a3b at M=1:
38 MB), and a short stream pays its launch, its ramp and its tail. This times pure reads of exactly the
bytes the int8 layer reads at M=1..16, from HBM (buffers cycled past L2, in one CUDA graph):

- ``copy``:   one ``copy_`` moving the bytes (read + written), the ceiling's own kernel at this size;
- ``read1``:  one launch of a plain streaming read (the best of a few grids and block sizes);
- ``read2``:  two dependent launches reading 2/3 then 1/3 of the bytes, the layer's gate_up and down
  shares: the floor of any two-launch decode layer.

Each as a fraction of the 1 GiB copy rate, the number the benchmark's targets use. Writes
``stream_floor.json`` to --out.

    PYTHONPATH=src python3 benchmarks/stream_floor.py --out /tmp/r
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from experts_int8 import bench  # noqa: E402

GRIDS = (132, 264, 528, 1056, 2112)        # programs: 1-16 per SM on an H200
BLOCKS = ((4096, 4), (8192, 8), (16384, 8))  # int32 elements per iteration, warps: 8-16 x 16 B per thread


@triton.jit
def stream_read_kernel(src_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr):
    """Program p reads src[p * chunk : (p + 1) * chunk] and stores one sum (so the loads stay live)."""
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(0, chunk, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + idx, mask=idx < n, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def stream_read(src: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int) -> None:
    """Sum of ``src`` (int32) per contiguous chunk, one chunk per program, into ``out[:programs]``."""
    n = src.numel()
    chunk = triton.cdiv(triton.cdiv(n, programs), block) * block
    stream_read_kernel[(programs,)](src, out, n, chunk, BLOCK=block, num_warps=warps)


def graph_time(op, num_calls: int, reps: int = 20) -> float:
    """Median seconds per call of ``op(c)`` for c = 0..num_calls-1, captured in one CUDA graph."""
    for c in range(num_calls):  # compile and warm outside the capture
        op(c)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in range(num_calls):
            op(c)
    seconds = bench._median_event_time(graph.replay, reps=reps, warmup=2)
    del graph
    return seconds / num_calls


def layer_bytes_int8(name: str, m: int) -> float:
    """Weight bytes the int8 layer reads at M (the benchmark's routing, its distinct experts)."""
    _, (e, h, i, k) = bench.parse_shape(name)
    routing = bench.routing_draws(m, e, k, device="cpu")
    return bench.weight_bytes_read(statistics.mean(bench.distinct_experts(ids) for _, ids in routing), h, i, "int8")


def buffers(nbytes: int, pool_bytes: float) -> list[torch.Tensor]:
    """Enough int32 buffers of ``nbytes`` to cycle through ``pool_bytes`` (at least two)."""
    count = max(2, min(64, int(pool_bytes // max(nbytes, 1))))
    numel = max(nbytes // 4, 1)
    return [torch.randint(-2**20, 2**20, (numel,), dtype=torch.int32, device="cuda") for _ in range(count)]


def best_read(parts: list[int], pool_bytes: float) -> tuple[float, dict]:
    """Fastest time for reading ``parts`` bytes in that many dependent launches, each launch with its
    own best grid and block."""
    total, picks = 0.0, []
    for nbytes in parts:
        bufs = buffers(nbytes, pool_bytes)
        out = torch.empty(max(GRIDS), dtype=torch.int32, device="cuda")
        timed = {}
        for programs in GRIDS:
            for block, warps in BLOCKS:
                op = lambda c: stream_read(bufs[c % len(bufs)], out, programs, block, warps)  # noqa: E731
                timed[(programs, block, warps)] = graph_time(op, len(bufs))
        pick = min(timed, key=timed.get)
        total += timed[pick]
        picks.append(dict(bytes=nbytes, programs=pick[0], block=pick[1], warps=pick[2], us=round(timed[pick] * 1e6, 2)))
        del bufs
    return total, dict(launches=picks)


def copy_time(nbytes: int, pool_bytes: float) -> float:
    """One ``copy_`` moving ``nbytes`` in all (half read, half written)."""
    src = buffers(nbytes // 2, pool_bytes)
    dst = [torch.empty_like(s) for s in src]
    return graph_time(lambda c: dst[c % len(dst)].copy_(src[c % len(src)]), len(src))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=[s for s in bench.SHAPES])
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--pool-gb", type=float, default=1.0, help="bytes cycled per timed graph (past L2)")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    copy_bps = bench.measure_copy_bandwidth()
    pool = args.pool_gb * 1e9
    rows = []
    print(f"copy (1 GiB): {copy_bps / 1e9:.0f} GB/s; fractions below are of that rate")
    print(f"{'shape':18s} {'M':>3s} {'MB':>8s} | {'copy':>6s} {'read1':>6s} {'read2':>6s} | read2 µs (floor µs)")
    for name in args.shapes:
        for m in (int(v) for v in args.m.split(",")):
            nbytes = int(layer_bytes_int8(name, m))
            floor = nbytes / copy_bps
            t_copy = copy_time(nbytes, pool)
            t_one, one = best_read([nbytes], pool)
            t_two, two = best_read([nbytes * 2 // 3, nbytes - nbytes * 2 // 3], pool)
            row = dict(shape=name, M=m, bytes=nbytes, floor_us=round(floor * 1e6, 2),
                       copy_frac=floor / t_copy, read1_frac=floor / t_one, read2_frac=floor / t_two,
                       copy_us=round(t_copy * 1e6, 2), read1=one | dict(us=round(t_one * 1e6, 2)),
                       read2=two | dict(us=round(t_two * 1e6, 2)))
            rows.append(row)
            print(f"{name:18s} {m:3d} {nbytes / 1e6:8.1f} | {row['copy_frac']:6.1%} {row['read1_frac']:6.1%} "
                  f"{row['read2_frac']:6.1%} | {t_two * 1e6:8.1f} ({floor * 1e6:6.1f})", flush=True)
            save(args.out, copy_bps, rows)
        torch.cuda.empty_cache()


def save(out_dir: str, copy_bps: float, rows: list) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "stream_floor.json"), "w") as f:
        json.dump(dict(benchmark="stream_floor", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       copy_GBps=copy_bps / 1e9, command=" ".join(["python3", *sys.argv]), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
