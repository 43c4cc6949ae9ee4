"""Where the tiny models' int8 error comes from on one device (NOTES item 181).

Per architecture (tiny random models, tests/models.py): SNR of the int8 model (Triton kernel on CUDA)
against transformers' bf16 model, the bf16 model against the fp32 one, the int8 model in fp32 against the
fp32 one (quantization error alone), and the kernel against the torch reference path on the same int8
weights (fp32 and bf16). Then quantize_weights on CPU against CUDA (same bf16 input), and the int8 values
of a fused-key and a per-expert float checkpoint loaded on each device.
Usage: PYTHONPATH=src python3 benchmarks/gpu_session/model_err.py [--device cuda]"""
import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from models import ARCH_NAMES, COMMON, tiny_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from experts_int8 import ExpertsInt8Config  # noqa: E402
from experts_int8.evaluate import snr_db as _snr_db  # noqa: E402
from experts_int8.integrations.transformers import find_experts  # noqa: E402
from experts_int8.quant import quantize_weights  # noqa: E402


def snr_db(ref, out):
    return round(_snr_db(ref, out), 1)


def load(path, device, dtype, quantize):
    kw = dict(quantization_config=ExpertsInt8Config()) if quantize else {}
    kw.update(device_map=device) if device != "cpu" else None
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).eval()


def logits(model, x, backend=None):
    if backend:
        for _, m in find_experts(model):
            m.backend = backend
    with torch.no_grad():
        return model(x.to(model.device)).logits.float().cpu()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--archs", default=",".join(ARCH_NAMES))
    args = p.parse_args()
    dev = args.device
    x = torch.randint(3, COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    rows = []
    for arch in args.archs.split(","):
        d = tempfile.mkdtemp()
        tiny_model(arch, dtype=torch.bfloat16).save_pretrained(d)
        ref16, ref32 = logits(load(d, dev, torch.bfloat16, False), x), logits(load(d, dev, torch.float32, False), x)
        q16m, q32m = load(d, dev, torch.bfloat16, True), load(d, dev, torch.float32, True)
        q16, q32 = logits(q16m, x), logits(q32m, x)
        q16t, q32t = logits(q16m, x, "torch"), logits(q32m, x, "torch")
        rows.append(dict(arch=arch, int8_vs_bf16=snr_db(ref16, q16), bf16_vs_fp32=snr_db(ref32, ref16),
                         int8fp32_vs_fp32=snr_db(ref32, q32), kernel_vs_torch_fp32=snr_db(q32t, q32),
                         kernel_vs_torch_bf16=snr_db(q16t, q16),
                         top1_int8_vs_bf16=round(float((q16.argmax(-1) == ref16.argmax(-1)).float().mean()), 3)))
        print(rows[-1], flush=True)
    # quantize_weights: CPU against the device, same bf16 input
    w = torch.randn(8, 512, 384, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    qc, sc = quantize_weights(w)
    qd, sd = quantize_weights(w.to(dev))
    diff = (qc.int() - qd.cpu().int()).abs()
    quant = dict(q_mismatch=int((diff > 0).sum()), q_max_diff=int(diff.max()), of=w.numel(),
                 scale_equal=bool(torch.equal(sc, sd.cpu())))
    # the test's case: qwen3_moe, a fused-key float checkpoint and a per-expert one, each device
    d1, d2 = tempfile.mkdtemp(), tempfile.mkdtemp()
    m = tiny_model("qwen3_moe", dtype=torch.bfloat16)
    m.save_pretrained(d1, save_original_format=False)
    m.save_pretrained(d2)
    loads = {}
    for name, path in (("fused", d1), ("per_expert", d2)):
        for device in ("cpu", dev):
            loads[f"{name}/{device}"] = [e.gate_up_proj.detach().cpu() for _, e in find_experts(
                load(path, device, torch.bfloat16, True))]
    base = loads["per_expert/cpu"]
    quant["loads_mismatch_vs_per_expert_cpu"] = {k: sum(int((a != b).sum()) for a, b in zip(v, base))
                                                 for k, v in loads.items()}
    print(quant)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "model_err.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name() if dev == "cuda" else "cpu", rows=rows, quant=quant), f,
                  indent=1)


if __name__ == "__main__":
    main()
