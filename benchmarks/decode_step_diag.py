"""Where a decode step's time goes: the compiled greedy loop (``bench_e2e.greedy_decode``) of the Mixtral-8x7B
architecture with random weights, batch 1, profiled kernel by kernel.

Prints and writes (``decode_step_diag_<column>_<mode>.json``) the loop's time per token and, per step, the
GPU time and launch count of each kernel group: our experts kernels, the dense GEMMs (projections,
router, lm_head), attention, and everything else (norms, rotary, cache writes, top-k, casts). The step
outside the experts is common to bf16 and int8 experts and caps their end-to-end ratio
(benchmarks/NOTES.md item 30). ``results/decode_step_diag_H200.json`` came from an earlier version
that profiled ``model.generate`` (commit fb8c6f9).

    PYTHONPATH=src python3 benchmarks/decode_step_diag.py --compile-mode max-autotune --out benchmarks/results
"""
import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8.bench import library_commit  # noqa: E402
from experts_int8.bench_e2e import COMPILE_MODES, compiled_step, greedy_decode, random_model  # noqa: E402
from experts_int8.integrations.transformers import quantize_  # noqa: E402

# Kernel name -> group; first match wins. Our kernels are named moe_* / _align_* in kernels/.
GROUPS = [
    ("experts", re.compile(r"moe_|align", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient", re.I)),
    ("gemm", re.compile(r"gemm|gemv|triton_mm|decompose_k|cutlass|xmma|sm90_|splitk|matmul", re.I)),
]


def group_of(name: str) -> str:
    return next((g for g, pattern in GROUPS if pattern.search(name)), "other")


def kernel_table(prof, steps: int) -> dict:
    """Per decode step: GPU microseconds and launches of each group, and the five longest kernels."""
    per_group = collections.defaultdict(lambda: [0.0, 0])
    kernels = []
    for evt in prof.key_averages():
        if evt.device_type != torch.autograd.DeviceType.CUDA or not evt.count:
            continue
        us = evt.self_device_time_total
        per_group[group_of(evt.key)][0] += us / steps
        per_group[group_of(evt.key)][1] += evt.count / steps
        kernels.append((us / steps, evt.count / steps, evt.key[:90]))
    kernels.sort(reverse=True)
    return dict(groups={g: dict(us_per_step=round(us, 1), launches_per_step=round(n, 1))
                        for g, (us, n) in sorted(per_group.items())},
                top_kernels=[dict(us_per_step=round(us, 1), launches_per_step=round(n, 1), name=name)
                             for us, n, name in kernels[:8]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--column", choices=["ours-bf16", "ours-int8"], default="ours-int8")
    ap.add_argument("--compile-mode", choices=COMPILE_MODES, default="reduce-overhead")
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    P, N, S = args.prompt_len, args.new_tokens, args.profile_steps
    if N < 2 or S < 1:
        ap.error("--new-tokens must be >= 2 and --profile-steps >= 1")
    res = dict(layers=args.layers, prompt_len=P, new_tokens=N, column=args.column, compile_mode=args.compile_mode,
               commit=library_commit()[0], gpu=torch.cuda.get_device_name(), command=" ".join(sys.argv))
    model = random_model("mixtral-8x7b", "cuda", overrides=dict(num_hidden_layers=args.layers))
    model.set_experts_implementation("experts_int8")
    if args.column == "ours-int8":
        quantize_(model)
    ids = torch.randint(0, model.config.vocab_size, (1, P), device="cuda")
    step = compiled_step(model, "cuda", args.compile_mode)

    def wall(n, reps=3):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            greedy_decode(model, ids, n, step)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.inference_mode():
        for _ in range(2):
            greedy_decode(model, ids, N, step)  # compiles and records the graph
        e2e, prefill = wall(N), wall(1)
        res.update(loop_e2e_s=e2e, loop_prefill_s=prefill, loop_step_ms=(e2e - prefill) / (N - 1) * 1e3)
        from torch.profiler import ProfilerActivity, profile

        for _ in range(2):  # the profiled lengths' caches have other shapes: compile and record them first
            greedy_decode(model, ids, 1 + S, step)
        with profile(activities=[ProfilerActivity.CUDA]) as short:
            greedy_decode(model, ids, 1, step)  # prefill alone, subtracted below
        with profile(activities=[ProfilerActivity.CUDA]) as full:
            greedy_decode(model, ids, 1 + S, step)
    steps, base = kernel_table(full, S), kernel_table(short, S)
    for g, row in steps["groups"].items():  # remove the prefill's kernels from the per-step numbers
        b = base["groups"].get(g, dict(us_per_step=0.0, launches_per_step=0.0))
        row["us_per_step"] = round(row["us_per_step"] - b["us_per_step"], 1)
        row["launches_per_step"] = round(row["launches_per_step"] - b["launches_per_step"], 1)
    res.update(per_step=steps["groups"], top_kernels_incl_prefill=steps["top_kernels"])
    print(json.dumps(res, indent=1))
    print(f"{'group':10} {'us/step':>9} {'launches/step':>14}")
    for g, row in res["per_step"].items():
        print(f"{g:10} {row['us_per_step']:9.1f} {row['launches_per_step']:14.1f}")
    print(f"loop: {res['loop_step_ms']:.2f} ms per token, {e2e:.3f} s end to end")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"decode_step_diag_{args.column}_{args.compile_mode}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
