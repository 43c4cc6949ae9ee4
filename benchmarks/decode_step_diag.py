"""Where a decode step's time goes: transformers' generate() vs a plain compiled decode loop (int8 Mixtral-8x7B, batch 1).

    PYTHONPATH=src python3 benchmarks/decode_step_diag.py [LAYERS] [OUT_DIR]
"""
import sys, time, json, os, torch
sys.path.insert(0, "src")
from experts_int8.bench_e2e import random_model
from experts_int8.integrations.transformers import quantize_
from transformers import StaticCache
from torch._dynamo.utils import counters

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
res = dict(layers=layers)
m = random_model("mixtral-8x7b", "cuda", overrides=dict(num_hidden_layers=layers))
quantize_(m)
P, N = 1024, 128
ids = torch.randint(0, 32000, (1, P), device="cuda")
kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, cache_implementation="static")

def wall(fn, reps=3):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); s = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - s)
    return min(ts)

with torch.inference_mode():
    m.generate(ids, max_new_tokens=N, min_new_tokens=N, **kw)
    a = wall(lambda: m.generate(ids, max_new_tokens=N, min_new_tokens=N, **kw))
    b = wall(lambda: m.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw))
    res.update(generate_e2e_s=a, generate_prefill_s=b, generate_step_ms=(a - b) / (N - 1) * 1e3,
               cudagraph_skips=dict(counters["inductor"]).get("cudagraph_skips", 0),
               inductor_counters={k: v for k, v in counters["inductor"].items() if "cudagraph" in k})
    print(res, flush=True)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        m.generate(ids, max_new_tokens=9, min_new_tokens=9, **kw)
    ev = p.key_averages()
    print(ev.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
    print(ev.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))

    # plain loop: prefill eager, decode step compiled (reduce-overhead = CUDA graphs), no host sync per step
    torch._dynamo.reset()
    step = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
    def loop(n):
        cache = StaticCache(config=m.config, max_cache_len=P + N)
        out = m(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=torch.arange(P, device="cuda"))
        tok = out.logits[:, -1:].argmax(-1)
        pos = torch.full((1,), P, device="cuda", dtype=torch.long)
        toks = [tok]
        for i in range(n - 1):
            out = step(input_ids=tok, past_key_values=cache, cache_position=pos, position_ids=pos[None], use_cache=True)
            tok = out.logits[:, -1:].argmax(-1).clone()
            pos = pos + 1
            toks.append(tok)
        return torch.cat(toks, 1)
    for _ in range(2):
        loop(min(8, N))
    la = wall(lambda: loop(N)); lb = wall(lambda: loop(1))
    res.update(loop_e2e_s=la, loop_prefill_s=lb, loop_step_ms=(la - lb) / (N - 1) * 1e3)
    g = m.generate(ids, max_new_tokens=min(16, N), min_new_tokens=min(16, N), **kw)[:, P:]
    res["loop_matches_generate"] = bool((loop(min(16, N)) == g).all())
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(sys.argv[2] if len(sys.argv) > 2 else "/tmp/res", "diag.json"), "w"), indent=1)
