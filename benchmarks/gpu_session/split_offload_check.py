"""Does split_while_loading with a GPU map that puts an experts layer on the CPU fail without its refusal
(88d9542, reasoned from transformers' load order on CPU)? One gloo rank on the GPU: the load and a forward with the
refusal disabled, then with it. Prints one line each.

    PYTHONPATH=src:tests python3 benchmarks/gpu_session/split_offload_check.py
"""
import os
import tempfile

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import experts_int8.integrations.transformers as integration
from experts_int8 import quantize_
from experts_int8.parallel import split_while_loading
from models import tiny_model

MAP = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
       "model.rotary_emb": 0, "lm_head": 0}


def attempt(path) -> str:
    try:
        with split_while_loading("tp"):
            model = AutoModelForCausalLM.from_pretrained(path, device_map=MAP)
        with torch.no_grad():
            logits = model(torch.randint(3, 96, (2, 9), device="cuda")).logits
        return f"loaded and ran (finite logits: {bool(torch.isfinite(logits).all())})"
    except Exception as e:  # noqa: BLE001 - the outcome is what is printed
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("gloo", rank=0, world_size=1)
with tempfile.TemporaryDirectory() as d:
    quantize_(tiny_model("mixtral")).save_pretrained(d)
    refuse = integration._refuse_split_offload
    integration._refuse_split_offload = lambda *a, **k: None
    print("without the refusal:", attempt(d))
    integration._refuse_split_offload = refuse
    print("with the refusal:   ", attempt(d))
dist.destroy_process_group()
