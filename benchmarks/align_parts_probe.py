"""Where the chunked align step's single-program launch spends its time (probe; NOTES item 121).

At M=8192 on qwen3 (65536 pairs, 128 experts) the offsets launch took 30 µs for bf16's blocks of 64 and
47 µs for the int8 entry's blocks of 256 with a tail region (item 120's breakdown). It does four
things: the group totals, each chunk's base offsets, the sentinel fill of every sorted row, and each
block's expert (plus the same two for the tail region). This times the three launches one at a time,
then the offsets launch told that there are no sorted rows (no fill, no block experts) and without
the tail region, in CUDA-graph replays (medians of 50). Writes align_parts_probe.json to --out.

    PYTHONPATH=src python3 benchmarks/align_parts_probe.py --out /tmp/r
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
import triton  # noqa: E402

from align_ab import graph_time_us  # noqa: E402
from experts_int8.bench import library_commit  # noqa: E402
from experts_int8.kernels import align  # noqa: E402


def parts(numel: int, num_experts: int, block_m: int, tail_rows: int, tail_block: int) -> dict:
    ids = torch.randint(0, num_experts, (numel,), device="cuda", dtype=torch.int32)
    (sorted_ids, blocks, num_post), num_sorted, tail_len, groups = align._kernel_outputs(
        ids, block_m, num_experts, tail_rows, tail_block)
    chunk = 1024
    num_chunks = triton.cdiv(numel, chunk)
    counts = torch.empty((num_chunks, groups), dtype=torch.int32, device="cuda")
    base = torch.empty_like(counts)
    tail = torch.empty((2, groups), dtype=torch.int32, device="cuda") if tail_rows else base
    meta = dict(GROUPS=groups, num_warps=4)

    def count():
        align.align_count_kernel[(num_chunks,)](ids, ids, counts, numel, num_experts, 0, HAS_MAP=False, CHUNK=chunk,
                                                **meta)

    def offsets(rows=num_sorted, tails=tail_rows, tail_rows_len=tail_len):
        align.align_offsets_kernel[(1,)](counts, base, tail, sorted_ids, blocks, num_post, num_chunks, numel,
                                         num_experts, rows, tail_rows_len, BLOCK_M=block_m, TAIL_ROWS=tails,
                                         TAIL_BLOCK=tail_block, ROWS=max(1, min(64, 8192 // groups)), FILL=1024,
                                         BLOCK_CHUNK=max(16, 8192 // groups), **meta)

    def scatter():
        align.align_scatter_kernel[(num_chunks,)](ids, ids, base, tail, sorted_ids, numel, num_experts, 0,
                                                  HAS_MAP=False, TAIL_ROWS=tail_rows, CHUNK=chunk, **meta)

    count()
    return dict(pairs=numel, experts=num_experts, block_m=block_m, tail_rows=tail_rows, num_sorted=num_sorted,
                tail_len=tail_len, count_us=graph_time_us(count), offsets_us=graph_time_us(offsets),
                offsets_no_rows_us=graph_time_us(lambda: offsets(rows=0, tail_rows_len=0)),
                offsets_no_tail_us=graph_time_us(lambda: offsets(tails=0, tail_rows_len=0)),
                scatter_us=graph_time_us(scatter), whole_us=graph_time_us(
                    lambda: align._align(ids.view(-1, 1), block_m, num_experts, None, tail_rows, tail_block)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    rows = []
    for numel, experts, block_m, tail_rows, tail_block in [(65536, 128, 256, 64, 16), (65536, 128, 64, 0, 16),
                                                           (32768, 128, 256, 32, 16), (49152, 64, 256, 32, 16),
                                                           (16384, 8, 256, 32, 16)]:
        row = parts(numel, experts, block_m, tail_rows, tail_block)
        rows.append(row)
        print(" ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    with open(os.path.join(args.out, "align_parts_probe.json"), "w") as f:
        json.dump(dict(benchmark="align_parts_probe", gpu=torch.cuda.get_device_name(), commit=library_commit()[0],
                       command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
