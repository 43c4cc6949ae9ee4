"""Where the chunked align step's single-program launch spends its time (probe; NOTES item 121).

At M=8192 on qwen3 (65536 pairs, 128 experts) the offsets launch took 30 µs for bf16's blocks of 64 and
47 µs for the int8 entry's blocks of 256 with a tail region (item 120's breakdown). It does four
things: the group totals, each chunk's base offsets, the sentinel fill of every sorted row, and each
block's expert (plus the same two for the tail region). Since item 121 the fill runs in the count
launch and the block experts in the scatter launch, spread over their programs. This times the three
launches one at a time, and the count and scatter launches without those shares, in CUDA-graph
replays (medians of 50). Writes align_parts_probe.json to --out.

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
    ends = torch.empty((2, groups), dtype=torch.int32, device="cuda")
    tail = torch.empty((2, groups), dtype=torch.int32, device="cuda") if tail_rows else base
    num_blocks, num_tail_blocks = num_sorted // block_m, tail_len // tail_block
    block_chunk = max(16, 8192 // groups)
    meta = dict(GROUPS=groups, num_warps=4)

    def count(rows=num_sorted + tail_len):
        align.align_count_kernel[(num_chunks,)](ids, ids, counts, sorted_ids, numel, num_experts, 0, rows,
                                                triton.cdiv(rows, num_chunks), HAS_MAP=False, CHUNK=chunk, FILL=1024,
                                                **meta)

    def offsets():
        align.align_offsets_kernel[(1,)](counts, base, tail, ends, num_post, num_chunks, num_experts, num_sorted,
                                         BLOCK_M=block_m, TAIL_ROWS=tail_rows, TAIL_BLOCK=tail_block,
                                         ROWS=max(1, min(64, 8192 // groups)), **meta)

    def scatter(nb=num_blocks, ntb=num_tail_blocks):
        align.align_scatter_kernel[(num_chunks,)](ids, ids, base, tail, ends, sorted_ids, blocks, numel, num_experts,
                                                  0, nb, ntb, triton.cdiv(nb, num_chunks), triton.cdiv(ntb, num_chunks),
                                                  HAS_MAP=False, TAIL_ROWS=tail_rows, CHUNK=chunk, BLOCK_M=block_m,
                                                  TAIL_BLOCK=tail_block, BLOCK_CHUNK=block_chunk, **meta)

    count()
    offsets()
    return dict(pairs=numel, experts=num_experts, block_m=block_m, tail_rows=tail_rows, num_sorted=num_sorted,
                tail_len=tail_len, count_us=graph_time_us(count), count_no_fill_us=graph_time_us(lambda: count(0)),
                offsets_us=graph_time_us(offsets), scatter_us=graph_time_us(scatter),
                scatter_no_blocks_us=graph_time_us(lambda: scatter(0, 0)), whole_us=graph_time_us(
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
