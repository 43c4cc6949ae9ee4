"""Align step timings: one program vs three chunked launches vs the torch sort, per number of pairs.

CUDA-graph replays timed with events (median of 50); picks SINGLE_PROGRAM_MAX_PAIRS and shows what
the chunked path saves at prefill sizes. Writes align_ab.json to --out.

    PYTHONPATH=src python3 benchmarks/align_ab.py --out benchmarks/results

Set ``align.CHUNKED_ALIGN = True`` (and the threshold) from its numbers.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8.bench import library_commit  # noqa: E402
from experts_int8.kernels import align  # noqa: E402


def graph_time_us(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    rows = []
    for e, k, block_m in ((8, 2, 64), (128, 8, 64)):
        for numel in (256, 512, 1024, 2048, 4096, 8192, 32768, 65536):
            ids = torch.randint(0, e, (numel // k, k), dtype=torch.int32, device="cuda")
            row = dict(E=e, k=k, pairs=numel, block_m=block_m)
            if numel <= 8192:  # one program holds every pair in registers
                row["single_us"] = graph_time_us(lambda: align._align_single_program(ids, block_m, e, None))
            row["chunked_us"] = graph_time_us(lambda: align._align_chunked(ids, block_m, e, None))
            row["torch_us"] = graph_time_us(lambda: align._align_torch(ids, block_m, e, None))
            want = align._align_torch(ids, block_m, e, None)
            got = align._align_chunked(ids, block_m, e, None)
            n = int(want[2])
            row["chunked_equal"] = (int(got[2]) == n and torch.equal(got[0][:n], want[0][:n])
                                    and torch.equal(got[1][: n // block_m], want[1][: n // block_m]))
            rows.append(row)
            print("  ".join(f"{key}={val:.1f}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
                  flush=True)
    with open(os.path.join(args.out, "align_ab.json"), "w") as f:
        json.dump(dict(benchmark="align_ab", gpu=torch.cuda.get_device_name(), commit=library_commit()[0],
                       command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
