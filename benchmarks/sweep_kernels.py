"""Per-GEMM config sweep: times the gate_up and down kernels separately for a list of candidate configs.

Dev tool behind the shipped H200 tables (kernels/configs/*.json): for each shape and M it captures L
layers' launches of one kernel in a CUDA graph (weights rotate across layers so reads come from HBM),
takes the median replay time, and prints the best config per kernel. Results: sweep.json in $OUT
(or the working directory). The candidate lists changed between runs; see benchmarks/NOTES.md.

    python3 benchmarks/sweep_kernels.py
"""
import os, sys, statistics, itertools, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch, triton
from experts_int8 import quantize_weights, select_experts
from experts_int8.kernels import fused_moe as fm
from experts_int8.kernels.align import align_block_size

def graph_time(fn, reps=15):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

src = torch.empty(2**29, dtype=torch.float32, device="cuda"); dst = torch.empty_like(src)
for _ in range(3): t = graph_time(lambda: dst.copy_(src))
BW = 2 * 4 * src.numel() / t / 1e6  # GB/s
del src, dst
print(f"copy bw {BW:.0f} GB/s", flush=True)
res = []
def cfg(bm, bn, bk, w, s, g=8, swap=0):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s, SWAP_AB=swap)
DEC = [cfg(16, bn, bk, w, st, 1, sw) for (bn, bk, w, st) in ((32, 256, 4, 3), (64, 256, 4, 5), (64, 128, 4, 4), (128, 128, 4, 4)) for sw in (0, 1)]
PRE = [cfg(bm, bn, bk, w, st, 8, sw) for (bm, bn, bk, w, st, sw) in ((128,128,64,8,3,0), (128,64,64,4,4,0), (64,128,64,4,4,0),
       (128,128,64,8,3,1), (128,128,64,4,4,1), (64,128,64,4,4,1), (128,64,64,4,4,1), (256,128,64,8,3,1), (128,256,64,8,3,1), (64,256,64,8,3,1), (128,128,128,8,3,1))]
for name, (E, H, I, k, L), Ms in [("mixtral", (8, 4096, 14336, 2, 3), [1, 256, 1024, 4096]), ("qwen3", (128, 2048, 768, 8, 24), [1, 1024])]:
    torch.manual_seed(0)
    lay = {"bf16": [], "int8": []}
    for l in range(L):
        a = torch.randn(E, 2*I, H, device="cuda", dtype=torch.bfloat16) * .02
        b = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) * .02
        lay["int8"].append((quantize_weights(a), quantize_weights(b)))
        lay["bf16"].append(((a, None), (b, None)))
    for M in Ms:
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        w, ids = select_experts(torch.randn(M, E, device="cuda"), k)
        hit = ids.unique().numel()
        wf = w.reshape(-1).contiguous()
        h = torch.empty(M*k, I, device="cuda", dtype=torch.bfloat16); y = torch.empty(M*k, H, device="cuda", dtype=torch.bfloat16)
        for fmt in ("int8",):
            bpw = 1 if fmt == "int8" else 2
            best = {}
            for c in (DEC if M * k / E <= 16 else PRE):
                st, be, nt = align_block_size(ids, c["BLOCK_SIZE_M"], E)
                try:
                    tg = graph_time(lambda: [fm.invoke_gate_up(x, *lay[fmt][l][0], h, wf, st, be, nt, k, "silu", False, c) for l in range(L)]) / L
                    td = graph_time(lambda: [fm.invoke_down(h, *lay[fmt][l][1], y, wf, st, be, nt, True, c) for l in range(L)]) / L
                except Exception as ex:
                    print("fail", c, repr(ex)[:100]); continue
                for kind, t, byt in (("gate_up", tg, hit*2*H*I*bpw), ("down", td, hit*H*I*bpw)):
                    r = dict(shape=name, M=M, fmt=fmt, kind=kind, cfg=c, us=t*1e3, bwfrac=byt/t/1e6/BW, tflops=2*M*k*(2 if kind=="gate_up" else 1)*H*I/t/1e9)
                    res.append(r)
                    if kind not in best or t < best[kind]["us"]/1e3: best[kind] = r
            stt = graph_time(lambda: [align_block_size(ids, 16, E) for _ in range(L)]) / L
            for kind, r in best.items():
                c = r["cfg"]
                print(f"{name:8} M={M:5d} {fmt} {kind:8} best {r['us']:8.1f}us bw {r['bwfrac']:.2f} tflops {r['tflops']:6.1f}  {c['BLOCK_SIZE_M']},{c['BLOCK_SIZE_N']},{c['BLOCK_SIZE_K']},w{c['num_warps']},s{c['num_stages']},swap{c['SWAP_AB']}", flush=True)
        print(f"   align {stt*1e3:.1f}us  hit {hit}", flush=True)
    del lay; torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "sweep.json"), "w"))
