"""Probe (not used by the library): decode GEMMs as plain streaming GEMVs, against the library's layer.

benchmarks/NOTES.md item 59: a pure read of a decode layer's int8 weight bytes in two dependent
launches reaches ~100% of the copy rate on the large-expert shapes at M=1, where the library's gate_up
and down GEMMs lose 14-16% to it. The read that wins holds 64 KB per program per loop step in
registers (16-byte loads, 8 warps) and needs no pipelining; the library's decode kernels stream
16 KB stages through shared memory into mma tiles of 16 token rows of which one is real. This probe
is the read with the arithmetic added: per (token, slot) pair and tile of rows, the int8 rows are
loaded in wide register tiles, converted exactly to fp32 (the integer-add trick of ``_to_float``, or
plain I2F conversions: both timed), multiplied by the token's activations and summed along K in fp32,
the per-row scales applied at the end (gate_up: SiLU(gate) * up; down: times the routing weight, split
over I where the rows are few). No tensor cores, no shared-memory staging.

Prints per shape (M=1, 2): the library's layer (the shipped tables, as bench_kernel times it), the
probe's layer (gate_up + down + the top-k sum) at its best tiles (gate_up's tiles timed with down's
first, then down's with gate_up's best), and the probe's error against the library's output.

    PYTHONPATH=src python3 benchmarks/gemv_decode_probe.py --out benchmarks/results
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from experts_int8 import bench  # noqa: E402


@triton.jit
def _to_float(w, BIT_TRICK: tl.constexpr):
    """int8 -> fp32, exactly. Plain conversion is an I2F per value, a quarter-rate pipe on recent GPUs;
    the trick puts w + 128 in the mantissa of 2^23 (one integer add on the sign-extended byte) and
    subtracts 2^23 + 128 (one float add): full-rate instructions only."""
    if BIT_TRICK:
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    return w.to(tl.float32)


@triton.jit
def gemv_gate_up_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, pair_experts_ptr, I, H, stride_we,
                        TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        BIT_TRICK: tl.constexpr):
    """out[pair, n] = SiLU(gate_n . x_t) * (up_n . x_t) for BLOCK_N rows n of pair's expert."""
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < I
    expert = tl.load(pair_experts_ptr + pair).to(tl.int64)
    token = (pair // TOP_K).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    gate_ptrs = w_ptr + expert * stride_we + rows[:, None].to(tl.int64) * H + ks[None, :]
    up_ptrs = gate_ptrs + I.to(tl.int64) * H
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        k_mask = (k + ks) < H
        x = tl.load(x_ptr + token * H + k + ks, mask=k_mask, other=0.0).to(tl.float32)
        mask = row_mask[:, None] & k_mask[None, :]
        g = _to_float(tl.load(gate_ptrs + k, mask=mask, other=0), BIT_TRICK)
        u = _to_float(tl.load(up_ptrs + k, mask=mask, other=0), BIT_TRICK)
        acc_g += tl.sum(g * x[None, :], axis=1)
        acc_u += tl.sum(u * x[None, :], axis=1)
    acc_g *= tl.load(scale_ptr + expert * 2 * I + rows, mask=row_mask, other=0.0)
    acc_u *= tl.load(scale_ptr + expert * 2 * I + I + rows, mask=row_mask, other=0.0)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(out_ptr + pair.to(tl.int64) * I + rows, h.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def gemv_down_kernel(h_ptr, w_ptr, scale_ptr, out_ptr, pair_experts_ptr, weights_ptr, num_pairs, I, H, stride_we,
                     SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BIT_TRICK: tl.constexpr):
    """out[split, pair, n] = weight_pair * (down_n . h_pair) over split's share of I."""
    pair = tl.program_id(0)
    split = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < H
    expert = tl.load(pair_experts_ptr + pair).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + expert * stride_we + rows[:, None].to(tl.int64) * I + ks[None, :]
    share = tl.cdiv(tl.cdiv(I, SPLIT), BLOCK_K) * BLOCK_K
    k_end = tl.minimum(I, (split + 1) * share)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k in range(split * share, k_end, BLOCK_K):
        k_mask = (k + ks) < k_end
        a = tl.load(h_ptr + pair.to(tl.int64) * I + k + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = _to_float(tl.load(w_ptrs + k, mask=row_mask[:, None] & k_mask[None, :], other=0), BIT_TRICK)
        acc += tl.sum(w * a[None, :], axis=1)
    acc *= tl.load(scale_ptr + expert * H + rows, mask=row_mask, other=0.0) * tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + (split * num_pairs + pair).to(tl.int64) * H + rows, acc, mask=row_mask)


def gemv_layer(x, layer, weights, ids, tiles, bit_trick=True):
    """The layer through the two GEMV launches and a sum over splits and the k experts: [M, H]."""
    (bn1, bk1, w1), (bn2, bk2, w2, split) = tiles
    m, top_k = ids.shape
    num_experts, hidden, inter = layer.w2.shape
    pairs = ids.reshape(-1).to(torch.int32)
    h = x.new_empty(m * top_k, inter)
    gemv_gate_up_kernel[(m * top_k, triton.cdiv(inter, bn1))](
        x, layer.w13, layer.w13_scale, h, pairs, inter, hidden, layer.w13.stride(0),
        TOP_K=top_k, BLOCK_N=bn1, BLOCK_K=bk1, BIT_TRICK=bit_trick, num_warps=w1)
    y = torch.empty(split, m * top_k, hidden, dtype=torch.float32, device=x.device)
    gemv_down_kernel[(m * top_k, triton.cdiv(hidden, bn2), split)](
        h, layer.w2, layer.w2_scale, y, pairs, weights.reshape(-1), m * top_k, inter, hidden, layer.w2.stride(0),
        SPLIT=split, BLOCK_N=bn2, BLOCK_K=bk2, BIT_TRICK=bit_trick, num_warps=w2)
    return y.view(split, m, top_k, hidden).sum((0, 2)).to(x.dtype)


GATE_UP_TILES = ((32, 512, 8), (64, 512, 8), (16, 1024, 8), (32, 256, 4), (64, 256, 8))
DOWN_TILES = ((16, 1024, 8, 1), (16, 1024, 8, 2), (32, 512, 8, 2), (32, 512, 8, 4), (16, 512, 4, 4))


def main() -> None:
    from experts_int8.ops import fused_experts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(bench.SHAPES))
    ap.add_argument("--m", default="1,2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    copy_bps = bench.measure_copy_bandwidth()
    rows = []
    for name in args.shapes:
        (e, hdim, idim, k), layers = bench.layer_pool(name, "int8", l2)
        n = len(layers)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, hdim, dtype=torch.bfloat16, device="cuda")
            routing = [bench.routing_draws(m, e, k)[0]] * n  # (one draw for every layer, as this probe's runs)
            distinct = bench.distinct_experts(routing[0][1])
            floor_us = bench.weight_bytes_read(distinct, hdim, idim, "int8") / copy_bps * 1e6
            lib_s, _ = bench.time_calls(x, layers, routing, n, reps=10, warmup=2)
            weights, ids = routing[0]
            ref = fused_experts(x, layers[0].w13, layers[0].w2, weights, ids, w13_scale=layers[0].w13_scale,
                                w2_scale=layers[0].w2_scale).float()
            row = dict(shape=name, M=m, floor_us=floor_us, library_us=lib_s * 1e6)
            best = {}
            for part, tiles in (("gate_up", GATE_UP_TILES), ("down", DOWN_TILES)):
                for tile in tiles:  # each part timed with the other at its first tile
                    pick = (tile, DOWN_TILES[0]) if part == "gate_up" else (best.get("gate_up", GATE_UP_TILES[0]), tile)
                    try:
                        out = gemv_layer(x, layers[0], weights, ids, pick).float()
                        err = ((out - ref).norm() / ref.norm()).item()
                        if not err < 2e-2:
                            raise ValueError(f"error {err:.2e} against the library")
                        seconds = layer_time(x, layers, routing, pick)
                    except Exception as exc:  # a tile that does not compile or is wrong: noted, not timed
                        row[f"{part}_{tile}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                        continue
                    row[f"{part}_{tile}_us"] = seconds * 1e6
                    if part not in best or seconds < row[f"{part}_best_us"] / 1e6:
                        best[part], row[f"{part}_best_us"], row["err"] = tile, seconds * 1e6, err
            row["tiles"] = [best.get("gate_up"), best.get("down")]
            if None not in row["tiles"]:  # the same tiles with plain I2F conversions
                row["i2f_us"] = layer_time(x, layers, routing, row["tiles"], bit_trick=False) * 1e6
            rows.append(row)
            probe = row.get("down_best_us", float("nan"))
            print(f"{name:16s} M={m} floor {floor_us:7.1f} us | library {row['library_us']:7.1f} "
                  f"({floor_us / row['library_us']:.1%}) | gemv layer {probe:7.1f} ({floor_us / probe:.1%}) "
                  f"I2F {row.get('i2f_us', float('nan')):7.1f} tiles {row['tiles']} "
                  f"err {row.get('err', float('nan')):.1e}",
                  flush=True)
            if args.out:
                with open(os.path.join(args.out, "gemv_decode_probe.json"), "w") as f:
                    json.dump(dict(benchmark="gemv_decode_probe", gpu=torch.cuda.get_device_name(),
                                   commit=bench.library_commit()[0], copy_GBps=copy_bps / 1e9,
                                   command=" ".join(["python3", *sys.argv]), rows=rows), f, indent=1, default=str)
        del layers
        torch.cuda.empty_cache()


def layer_time(x, layers, routing, tiles, bit_trick=True) -> float:
    """Seconds per probe layer, the layers cycled in one CUDA graph (weights from HBM)."""
    def run():
        for layer, (weights, ids) in zip(layers, routing):
            gemv_layer(x, layer, weights, ids, tiles, bit_trick)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    seconds = bench._median_event_time(graph.replay, reps=10, warmup=2)
    del graph
    return seconds / len(layers)


if __name__ == "__main__":
    main()
