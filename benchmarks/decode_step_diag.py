"""Where a decode step's time goes: transformers' generate() vs a compiled greedy loop (int8 Mixtral-8x7B
architecture with random weights, batch 1, 1024 prompt tokens).

Reports generate's time per token, the inductor cudagraph counters, a profiler table of one short
generate (host-side and GPU-side time), and the same model driven by ``bench_e2e.greedy_decode``
(CUDA-graphed step, no host sync per token). ``results/decode_step_diag_H200.json`` came from the
first version of this script (commit fb8c6f9, same measurements, its own copy of the loop).

    PYTHONPATH=src python3 benchmarks/decode_step_diag.py --layers 32 --out benchmarks/results
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from experts_int8.bench import library_commit  # noqa: E402
from experts_int8.bench_e2e import compiled_step, greedy_decode, random_model  # noqa: E402
from experts_int8.integrations.transformers import quantize_  # noqa: E402


def wall(fn, reps=3):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    P, N = args.prompt_len, args.new_tokens
    res = dict(layers=args.layers, prompt_len=P, new_tokens=N, commit=library_commit()[0],
               gpu=torch.cuda.get_device_name(), command=" ".join(sys.argv))
    model = random_model("mixtral-8x7b", "cuda", overrides=dict(num_hidden_layers=args.layers))
    quantize_(model)
    ids = torch.randint(0, model.config.vocab_size, (1, P), device="cuda")
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=N, min_new_tokens=N, **kw)  # compiles the decode step
        e2e = wall(lambda: model.generate(ids, max_new_tokens=N, min_new_tokens=N, **kw))
        prefill = wall(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw))
        res.update(generate_e2e_s=e2e, generate_prefill_s=prefill, generate_step_ms=(e2e - prefill) / (N - 1) * 1e3,
                   inductor_cudagraph_counters={k: v for k, v in counters["inductor"].items() if "cudagraph" in k})
        print(res, flush=True)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(ids, max_new_tokens=9, min_new_tokens=9, **kw)
        events = prof.key_averages()
        print(events.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
        print(events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))

        torch._dynamo.reset()
        step = compiled_step(model, "cuda")
        for _ in range(2):
            greedy_decode(model, ids, min(8, N), step)  # compiles and records the graph
        e2e = wall(lambda: greedy_decode(model, ids, N, step))
        prefill = wall(lambda: greedy_decode(model, ids, 1, step))
        res.update(loop_e2e_s=e2e, loop_prefill_s=prefill, loop_step_ms=(e2e - prefill) / (N - 1) * 1e3)
        # random weights: near-tied logits can flip between two differently fused bf16 graphs
        ref = model.generate(ids, max_new_tokens=16, min_new_tokens=16, **kw)[0, P:]
        got = greedy_decode(model, ids, 16, step)[0]
        same = (ref == got).int().cumprod(0).sum().item()
        res["loop_tokens_equal_to_generate_before_first_difference"] = f"{same}/16"
    print(json.dumps(res, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_step_diag.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
