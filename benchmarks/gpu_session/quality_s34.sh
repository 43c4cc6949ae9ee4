#!/bin/bash
# Item 181: the quantization on CUDA against the CPU, and the model test with the reference routing, on the GPU.
PYTHONPATH=src timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quant.py "tests/test_transformers.py::test_int8_model_close_to_bf16" "tests/test_transformers.py::test_fused_float_checkpoint_gives_same_int8" -rfE 2>&1 | tail -4
PYTHONPATH=src timeout 120 python3 - <<'PY'
import sys, torch, tempfile
sys.path.insert(0, "tests")
from transformers import AutoModelForCausalLM
from experts_int8 import ExpertsInt8Config
from experts_int8.evaluate import routing_quality
from models import tiny_model, COMMON
x = torch.randint(3, COMMON["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
d = tempfile.mkdtemp(); tiny_model("gpt_oss", dtype=torch.bfloat16).save_pretrained(d)
ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda")
q = AutoModelForCausalLM.from_pretrained(d, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16, device_map="cuda")
print("gpt_oss cuda", {k: (round(v, 1) if isinstance(v, float) else [round(a, 3) for a in v]) for k, v in routing_quality(ref, q, x).items()})
PY
