"""A decode layer's two GEMMs in one launch (probe only; benchmarks/NOTES.md item 119).

Item 117: at decode the down launch is bound by its programs' own chain (expert id, weight loads,
compute, stores, the sum), not by where its bytes come from, and it starts only once every gate_up
program has drained. Here both GEMMs are one grid of PAIRS programs: the first ``G`` compute gate_up
tiles (as the library's kernel does for one pair) and each counts its tile done on its pair's counter
(release); the other programs are down tiles, dispatched after every gate_up program (lower program
ids go first), which resolve their expert, ask the copy engine for their weight rows in L2 (sm_90),
then wait on their pair's counter (acquire) and run the library's down tile. Its rows of ``y`` are
then added by the library's sum launch; the counters are a zeroed buffer (one memset).

Prints µs per layer for the library's shipped entry and the one-launch layer on the small-expert
shapes (and 8x7b) at M = 1, 2, 4, and writes one_launch_probe.json to --out.

    PYTHONPATH=src python3 benchmarks/one_launch_probe.py --out /tmp/r
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from experts_int8 import bench, ops, tune  # noqa: E402
from experts_int8.kernels import fused_moe  # noqa: E402
from experts_int8.kernels.fused_moe import _activate, _dot_operand, _down_tile  # noqa: E402

# One L2 prefetch of $2 bytes from $1 when $3 is nonzero (sm_90's copy engine); $0 a dummy result.
PREFETCH_L2 = tl.constexpr("""{
        .reg .pred p;
        setp.ne.b32 p, $3, 0;
        @p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.b32 $0, 0;
        }""")


@triton.jit
def decode_layer_kernel(x_ptr, w13_ptr, s13_ptr, w2_ptr, s2_ptr, h_ptr, y_ptr, topk_weights_ptr, pair_experts_ptr,
                        ready_ptr, num_pairs, H, I, stride_xm, stride_w13e, stride_w13n, stride_s13e, stride_w2e,
                        stride_w2n, stride_s2e, TOP_K: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr,
                        BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr, ROWS2: tl.constexpr, ON_GPU: tl.constexpr):
    BLOCK_M: tl.constexpr = 16
    pid = tl.program_id(0)
    tiles1 = tl.cdiv(I, BLOCK_N1)
    first_down = num_pairs * tiles1
    lane0 = tl.arange(0, BLOCK_M) == 0
    if pid < first_down:  # gate_up tile: pair pid // tiles1, columns n0 .. n0 + BLOCK_N1 of I
        pair = pid // tiles1
        n0 = (pid % tiles1) * BLOCK_N1
        expert = tl.load(pair_experts_ptr + pair).to(tl.int64)
        offs_n = n0 + tl.arange(0, BLOCK_N1)
        offs_wn = offs_n % I
        offs_k = tl.arange(0, BLOCK_K1)
        a_ptrs = x_ptr + (pair // TOP_K) * stride_xm + offs_k[None, :] + tl.zeros((BLOCK_M, 1), tl.int64)
        g_ptrs = w13_ptr + expert * stride_w13e + offs_wn[None, :] * stride_w13n + offs_k[:, None]
        u_ptrs = g_ptrs + I * stride_w13n
        acc_g = tl.zeros((BLOCK_M, BLOCK_N1), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N1), dtype=tl.float32)
        for kb in range(0, tl.cdiv(H, BLOCK_K1)):
            k_left = H - kb * BLOCK_K1
            g = tl.load(g_ptrs, mask=offs_k[:, None] < k_left, other=0)
            u = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0)
            a = tl.load(a_ptrs, mask=lane0[:, None] & (offs_k[None, :] < k_left), other=0.0)
            acc_g = tl.dot(a, _dot_operand(g, a, ON_GPU), acc_g)
            acc_u = tl.dot(a, _dot_operand(u, a, ON_GPU), acc_u)
            a_ptrs += BLOCK_K1
            g_ptrs += BLOCK_K1
            u_ptrs += BLOCK_K1
        acc_g *= tl.load(s13_ptr + expert * stride_s13e + offs_wn)[None, :]
        acc_u *= tl.load(s13_ptr + expert * stride_s13e + offs_wn + I)[None, :]
        h = _activate(acc_g, acc_u, 0, None, None, False, True)  # (silu, no clamp, gated)
        rows = tl.where(lane0, pair, 0).to(tl.int64)
        tl.store(h_ptr + rows[:, None] * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=lane0[:, None] & (offs_n[None, :] < I))
        tl.debug_barrier()  # every thread's store before the release below
        tl.atomic_add(ready_ptr + pair, 1, sem="release", scope="gpu")
    else:  # down tile: pair q % num_pairs (pairs as the fast index), rows n0 .. n0 + BLOCK_N2 of H
        q = pid - first_down
        pair = q % num_pairs
        n0 = (q // num_pairs) * BLOCK_N2
        expert = tl.load(pair_experts_ptr + pair).to(tl.int64)
        offs_wn = (n0 + tl.arange(0, BLOCK_N2)) % H
        if ON_GPU:  # the tile's weight rows into L2 while gate_up runs
            r = tl.arange(0, ROWS2)
            ptrs = w2_ptr + expert * stride_w2e + (n0 + r).to(tl.int64) * stride_w2n
            tl.inline_asm_elementwise(PREFETCH_L2, "=r,l,r,r", [ptrs, I + r * 0, (r < BLOCK_N2).to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=1)
        while tl.atomic_add(ready_ptr + pair, 0, sem="acquire", scope="gpu") < tiles1:
            pass
        rows = tl.where(lane0, pair, num_pairs).to(tl.int64)
        acc = _down_tile(h_ptr, w2_ptr, None, s2_ptr, s2_ptr, topk_weights_ptr, rows, lane0, expert, n0, offs_wn,
                         H, I, I, stride_w2e, stride_w2n, stride_s2e, 0, 0, tl.cdiv(I, BLOCK_K2), True, False, True,
                         "tf32", BLOCK_M, BLOCK_N2, BLOCK_K2, False, 1, False, ON_GPU, False, 0, 1)
        offs_n = n0 + tl.arange(0, BLOCK_N2)
        tl.store(y_ptr + rows[:, None] * H + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=lane0[:, None] & (offs_n[None, :] < H))


def one_launch_layer(x, layer, weights, ids, blocks=(64, 256, 64, 128), num_warps=4, num_stages=3):
    """The layer (int8 experts, silu, routing weights on the output) with both GEMMs in one launch,
    then the library's top-k sum."""
    m, top_k = ids.shape
    num_experts, hidden, inter = layer.w2.shape
    pairs = ids.reshape(-1).to(torch.int32)
    num_pairs = pairs.numel()
    bn1, bk1, bn2, bk2 = blocks
    ready = torch.zeros(num_pairs, dtype=torch.int32, device=x.device)
    h = x.new_empty((num_pairs, inter))
    y = x.new_empty((num_pairs, hidden))
    grid = (num_pairs * triton.cdiv(inter, bn1) + num_pairs * triton.cdiv(hidden, bn2),)
    on_gpu = x.device.type == "cuda"
    decode_layer_kernel[grid](
        x, layer.w13, layer.w13_scale, layer.w2, layer.w2_scale, h, y, weights.reshape(-1), pairs, ready, num_pairs,
        hidden, inter, x.stride(0), layer.w13.stride(0), layer.w13.stride(1), layer.w13_scale.stride(0),
        layer.w2.stride(0), layer.w2.stride(1), layer.w2_scale.stride(0), TOP_K=top_k, BLOCK_N1=bn1, BLOCK_K1=bk1,
        BLOCK_N2=bn2, BLOCK_K2=bk2, ROWS2=max(triton.next_power_of_2(bn2), 32 * num_warps), ON_GPU=on_gpu,
        num_warps=num_warps, num_stages=num_stages)
    return fused_moe.invoke_sum(y.unsqueeze(0), x.new_empty((m, hidden)), top_k)


BLOCKS = {  # (gate_up N, gate_up K, down N, down K), stages
    "a": ((64, 256, 64, 128), 3),
    "b": ((32, 256, 32, 128), 4),
    "c": ((64, 256, 128, 128), 3),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"])
    ap.add_argument("--m", default="1,2,4")
    args = ap.parse_args()
    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    rows = []
    for name in args.shapes:
        (e, hidden, inter, k), layers = bench.layer_pool(name, "int8", l2)
        n = len(layers)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, hidden, dtype=torch.bfloat16, device="cuda")
            routing = [bench.routing_draws(m, e, k)[0]] * n  # (one draw for every layer, as this probe's runs)
            row = dict(shape=name, M=m)
            seconds, _ = bench.time_calls(x, layers, routing, max(n, 4), reps=10, warmup=2)
            row["library_us"] = seconds * 1e6
            layer, (weights, ids) = layers[0], routing[0]
            expected = ops.fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                                         w2_scale=layer.w2_scale, backend="torch")
            for key, (blocks, stages) in BLOCKS.items():
                try:
                    tune.check_output(one_launch_layer(x, layer, weights, ids, blocks, num_stages=stages), expected)
                except Exception as err:  # noqa: BLE001 - a wrong result or a failed compile: report, go on
                    row[f"{key}_wrong"] = str(err)[:300]
                    continue

                def run(blocks=blocks, stages=stages, layers=layers):
                    for c in range(max(n, 4)):
                        lay, (w, i) = layers[c % n], routing[c % n]
                        one_launch_layer(x, lay, w, i, blocks, num_stages=stages)

                seconds, _ = bench.time_run(run, max(n, 4), reps=10, warmup=2)
                row[f"{key}_us"] = seconds * 1e6
            rows.append(row)
            cells = "  ".join(f"{k2} {v:7.1f}" if isinstance(v, float) else f"{k2} {v[:60]}" for k2, v in row.items()
                              if k2 not in ("shape", "M"))
            print(f"{name:16s} M={m:<3d} {cells}", flush=True)
        del layers
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "one_launch_probe.json"), "w") as f:
        json.dump(dict(benchmark="one_launch_probe", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       command=" ".join(sys.argv), blocks={k: v for k, v in BLOCKS.items()}, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
