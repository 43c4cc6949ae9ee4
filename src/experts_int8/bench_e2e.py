"""End-to-end generation latency: transformers' own experts vs our kernel in bf16 vs our kernel in int8.

Three columns from one model in one process, in this order (each later one reuses the weights):
  hf-bf16    transformers' default experts implementation (as the model loads), bf16 weights
  ours-bf16  the same bf16 weights through our fused kernel (``set_experts_implementation``)
  ours-int8  the experts quantized in place (``quantize_``: each bf16 expert tensor freed as it goes)
All use transformers' static cache. Two ways to drive the decode steps (``decode``):
  generate   ``model.generate`` (transformers compiles the decode step with CUDA graphs); what users get,
             but its loop waits on the GPU a few times per token (stopping checks), ~1.5 ms per step.
  loop       the same model forward and static cache, the decode step compiled once with CUDA graphs
             (``torch.compile(mode="reduce-overhead", fullgraph=True)``), greedy tokens kept on the GPU:
             no host sync per token. Same tokens as ``generate`` (greedy; checked in the tests).
``compile_mode="max-autotune"`` compiles the decode step of either way with inductor's GEMM autotuning
(the dense projections are most of a batch-1 step's time outside the experts), for all three columns.
For each batch size: end-to-end latency of ``prompt_len`` prompt tokens + ``new_tokens`` generated, the
prefill alone, and decode throughput = batch * (new_tokens - 1) / (end-to-end - prefill).

    experts-int8 bench-e2e --config mixtral-8x7b --random-weights
    torchrun --nproc-per-node 2 --no-python experts-int8 bench-e2e --config mixtral-8x7b --random-weights \\
        --columns ours-int8 --parallel tp       # the int8 experts split over two GPUs

With ``parallel`` (under torchrun, a process group initialized) every rank builds the model, takes rank 0's
weights and prompts, and the int8 column splits its experts over the ranks (``parallel.py``); rank 0 reports.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Callable, Optional

import torch

from .bench import library_commit
from .files import write_atomic

# Full-size architectures for --random-weights (their public configs' shapes).
CONFIGS = {
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
                         rope_theta=1e6, rms_norm_eps=1e-5),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6),
}


def random_model(name: str, device: str, dtype=torch.bfloat16, overrides: Optional[dict] = None, seed: int = 0):
    """A model with random weights drawn from ``seed``, built directly on ``device``: a named architecture
    (``CONFIGS``), or any model's ``config.json`` (the file or its folder), so that no checkpoint is needed."""
    from transformers import AutoModelForCausalLM

    config = model_config(name, overrides)
    # Seeded, so that every run (and every column) times the same weights; the caller's generators untouched
    # (every GPU's, which manual_seed seeds too: named, so that fork_rng does not warn on a host of several).
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def model_config(name: str, overrides: Optional[dict] = None):
    """The transformers config :func:`random_model` builds: a named architecture's or a config.json's, with
    ``overrides`` on its language model's settings."""
    from transformers import AutoConfig

    if name in CONFIGS:
        return AutoConfig.for_model(**dict(CONFIGS[name], **(overrides or {})))
    if config_dir(name) is None:
        raise ValueError(f"unknown config {name!r}; choose one of {sorted(CONFIGS)} or give a model's config.json")
    try:  # (never transformers' prompt on stdin to run the folder's code, as everywhere else in experts_int8)
        config = AutoConfig.from_pretrained(str(config_dir(name)), trust_remote_code=False)
    except (KeyError, ValueError) as e:
        if "trust_remote_code" not in str(e):
            raise
        from .integrations.transformers import remote_code_message

        raise ValueError(remote_code_message(json.loads((config_dir(name) / "config.json").read_text()))) from None
    for key, value in (overrides or {}).items():
        setattr(config.get_text_config(), key, value)
    return config


def check_settings(name: str, prompt_len: int, new_tokens: int, overrides: Optional[dict] = None) -> None:
    """Refuse, before the model is built, more layers than the model has (``--layers`` only takes some away)
    and more positions than its ``max_position_embeddings``."""
    from .run import check_context

    text, overrides = model_config(name).get_text_config().to_dict(), overrides or {}
    have, want = text.get("num_hidden_layers"), overrides.get("num_hidden_layers")
    if isinstance(have, int) and want is not None and want > have:
        raise ValueError(f"--layers {want} is more than the {have} layers of {name}; give at most {have} "
                         f"(it builds fewer layers, never more)")
    check_context({**text, **overrides}, prompt_len + new_tokens,  # (the overrides are the text config's settings)
                  f"--prompt-len {prompt_len} and --new-tokens {new_tokens}")


def check_fits(name: str, device: str, overrides: Optional[dict] = None) -> None:
    """Refuse a model whose bf16 weights alone exceed the device's memory (every rank holds the whole model),
    counted on the meta device, before building it for minutes into an out-of-memory error."""
    need = sum(p.numel() * 2 for p in random_model(name, "meta", overrides=overrides).parameters())
    dev = torch.device(device)
    if dev.type == "cuda":
        have = torch.cuda.get_device_properties(dev).total_memory
    elif dev.type == "cpu" and hasattr(os, "sysconf"):
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        return
    if need > have:
        raise ValueError(f"{name}'s bf16 weights take {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB "
                         f"of {device}: pass --layers N for fewer layers (or a smaller config)")


def config_dir(name: str) -> Optional[Path]:
    """The folder holding ``config.json`` when ``name`` is that file or its folder; else None."""
    path = Path(name)
    if path.name == "config.json" and path.is_file():
        return path.parent
    return path if (path / "config.json").is_file() else None


def _config_name(name: str) -> str:
    """A file-name-safe name for the results file: the preset's, or the config's folder's."""
    return name if name in CONFIGS else re.sub(r"[^A-Za-z0-9._-]+", "_", config_dir(name).resolve().name)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object], device: str, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


COLUMNS = ("hf-bf16", "ours-bf16", "ours-int8")  # in this order: ours-int8 quantizes the model in place
COMPILE_MODES = ("reduce-overhead", "max-autotune")  # both capture CUDA graphs; the second also autotunes GEMMs


def compiled_step(model, device: str, mode: str = "reduce-overhead") -> Callable:
    """The model's forward for one decode step: CUDA-graphed and compiled whole on CUDA, plain elsewhere."""
    if device.startswith("cuda"):
        return torch.compile(model.forward, mode=mode, fullgraph=True)
    return model.forward


def greedy_decode(model, ids: torch.Tensor, new_tokens: int, step: Optional[Callable] = None) -> torch.Tensor:
    """Greedy tokens ``[batch, new_tokens]`` for equal-length prompts ``ids``: eager prefill into a static
    cache, then ``step`` (see :func:`compiled_step`) per token, with nothing read back to the host."""
    from transformers import StaticCache

    step = step or model.forward
    batch, prompt_len = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens)
    # transformers renamed ``past_key_values`` to ``cache`` (5.2x); pass whichever this version takes
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    positions = torch.arange(prompt_len, device=ids.device)
    logits = model(input_ids=ids, cache_position=positions, use_cache=True, logits_to_keep=1,
                   **{cache_kw: cache}).logits
    tokens = [logits[:, -1:].argmax(-1)]
    position = positions[-1:] + 1
    for _ in range(new_tokens - 1):
        logits = step(input_ids=tokens[-1], cache_position=position, position_ids=position.expand(batch, 1),
                      use_cache=True, logits_to_keep=1, **{cache_kw: cache}).logits
        tokens.append(logits[:, -1:].argmax(-1))  # a new tensor: the CUDA graph reuses its output buffer
        position = position + 1
    return torch.cat(tokens, dim=1)


def measure(model, batch: int, prompt_len: int, new_tokens: int, device: str, reps: int,
            cache: str = "static", decode: str = "generate", step: Optional[Callable] = None) -> dict:
    # Prompts seeded by their shape, as bench.py seeds its routing: from the global generator each column (and each
    # run) timed other prompts, which route to other experts
    seed = zlib.crc32(f"{batch},{prompt_len},{model.config.vocab_size}".encode())
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len),
                        generator=torch.Generator().manual_seed(seed)).to(device)
    if torch.distributed.is_initialized():
        torch.distributed.broadcast(ids, 0)  # every rank generates from rank 0's prompts
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, cache_implementation=cache)

    def run(n):
        if decode == "loop":
            return greedy_decode(model, ids, n, step)
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    with torch.inference_mode():
        run(new_tokens)  # warm-up: compiles the decode step for this shape
        total = _timed(lambda: run(new_tokens), device, reps)
        prefill = _timed(lambda: run(1), device, reps)
    decode_s = total - prefill
    # Timing noise can make decode_s <= 0 in tiny runs: then no rate (None, as JSON holds no NaN; see decode_rate)
    return dict(batch=batch, decode=decode, e2e_s=total, prefill_s=prefill,
                decode_tok_s=batch * (new_tokens - 1) / decode_s if decode_s > 0 else None)


UNMEASURED = "the decode time could not be separated from timing noise; give more --new-tokens or --reps"


def decode_rate(row: dict) -> str:
    """A row's decode tokens/s, or why there is none: the prefill alone timed as long as the whole run."""
    if row["decode_tok_s"] is not None:
        return f"{row['decode_tok_s']:.1f} tok/s"
    return (f"n/a (the prefill alone took {row['prefill_s']:.3f} s, no less than the whole run's {row['e2e_s']:.3f} "
            f"s: {UNMEASURED})")


def run(config: str, *, device: str = "cuda", batches=(1, 4, 8), prompt_len: int = 1024, new_tokens: int = 128,
        reps: int = 3, cache: str = "static", decode: str = "generate", overrides: Optional[dict] = None,
        columns=COLUMNS, out: Optional[str] = None,
        compile_mode: str = "reduce-overhead", log: Callable[[str], None] = print,
        parallel: Optional[str] = None) -> dict:
    from transformers import CompileConfig

    from .integrations.transformers import find_experts, quantize_
    from .parallel import MODES, Split, parallelize_experts

    if decode not in ("generate", "loop"):
        raise ValueError(f"decode must be 'generate' or 'loop', got {decode!r}")
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")
    if [c for c in COLUMNS if c in columns] != list(columns) or not columns:
        raise ValueError(f"columns must be a non-empty subset of {COLUMNS} in that order, got {columns!r}")
    if decode == "loop" and cache != "static":
        raise ValueError("decode 'loop' drives a static cache: use cache 'static' (--cache static)")
    world_size = 1
    if parallel is not None:
        if parallel not in MODES:
            raise ValueError(f"parallel must be one of {MODES}, got {parallel!r}")
        if not torch.distributed.is_initialized():
            raise RuntimeError("parallel needs torch.distributed initialized (run under torchrun)")
        world_size = torch.distributed.get_world_size()
        if torch.distributed.get_rank() != 0:
            log, out = (lambda s: None), None  # rank 0 reports
    check_settings(config, prompt_len, new_tokens, overrides)
    check_fits(config, device, overrides)
    model = random_model(config, device, overrides=overrides)
    if not find_experts(model):
        raise ValueError(f"{config} builds a {type(model).__name__} with no routed MoE experts: bench-e2e times "
                         f"MoE models")
    if parallel == "ep":  # refused before the columns that run whole, not after them (E leads every layout)
        fewest = min(m.down_proj.shape[0] for _, m in find_experts(model))
        Split("ep", torch.distributed.get_rank(), world_size).bounds(fewest, 1)
    if parallel is not None:
        with torch.no_grad():  # one model on every rank: rank 0's random weights
            for t in list(model.parameters()) + list(model.buffers()):
                torch.distributed.broadcast(t, 0)
    default_impl = model.config._experts_implementation  # what users get today
    if compile_mode != COMPILE_MODES[0]:  # generate's own compiled step (transformers' default otherwise)
        model.generation_config.compile_config = CompileConfig(mode=compile_mode)
    rows = []
    for column in columns:
        if column == "hf-bf16":
            model.set_experts_implementation(default_impl)
        elif column == "ours-bf16":
            model.set_experts_implementation("experts_int8")
        elif column == "ours-int8":
            quantize_(model)
            if parallel is not None:
                parallelize_experts(model, parallel)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        step = compiled_step(model, device, compile_mode) if decode == "loop" else None
        for batch in batches:
            r = measure(model, batch, prompt_len, new_tokens, device, reps, cache, decode, step)
            r.update(column=column)
            if device.startswith("cuda"):
                r["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            rows.append(r)
            log(f"{column:10s} batch {batch}: e2e {r['e2e_s']:.3f} s, prefill {r['prefill_s']:.3f} s, "
                f"decode {decode_rate(r)}")
        torch._dynamo.reset()  # the next column recompiles against its own experts
    result = dict(benchmark="bench_e2e", config=config, hf_experts_implementation=default_impl,
                  overrides=overrides or {}, device=device,
                  gpu=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                  torch=torch.__version__, prompt_len=prompt_len, new_tokens=new_tokens, cache=cache, decode=decode,
                  compile_mode=compile_mode, parallel=parallel, world_size=world_size,
                  command=" ".join(sys.argv), commit=library_commit()[0], rows=rows)
    log(table(result))
    if out:
        path = write_atomic(Path(out) / f"bench_e2e_{_config_name(config)}_{decode}_{time.strftime('%Y%m%dT%H%M%S')}"
                                          f".json", json.dumps(result, indent=1) + "\n")
        log(f"wrote {path}")
    return result


def table(result: dict) -> str:
    by = {(r["column"], r["batch"]): r for r in result["rows"]}
    columns = list(dict.fromkeys(r["column"] for r in result["rows"]))
    batches = sorted({r["batch"] for r in result["rows"]})
    split = (f"; int8 experts split ({result['parallel']}) over {result['world_size']} ranks"
             if result.get("parallel") else "")
    lines = [f"{result['config']} on {result['gpu']}: {result['prompt_len']} prompt + {result['new_tokens']} new "
             f"tokens, "
             f"decode via {result.get('decode', 'generate')}{split}",
             "batch | " + " | ".join(f"{c} e2e s, tok/s" for c in columns)]
    for b in batches:
        cells = [f"{by[(c, b)]['e2e_s']:.3f}, " + ("n/a" if by[(c, b)]["decode_tok_s"] is None
                                                   else f"{by[(c, b)]['decode_tok_s']:.1f}")
                 for c in columns if (c, b) in by]
        lines.append(f"{b:5d} | " + " | ".join(cells))
    if any(r["decode_tok_s"] is None for r in result["rows"]):
        lines.append(f"n/a: {UNMEASURED}")
    return "\n".join(lines)
