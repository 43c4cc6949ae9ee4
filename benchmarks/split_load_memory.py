"""Per-rank resident memory of loading an int8 checkpoint over two CPU ranks (gloo), NOTES item 180.

Modes: ``none`` (the whole model on every rank), ``whole_then_tp`` (load whole, then parallelize_experts),
``tp`` and ``ep`` (split_while_loading, through load_model(parallel=...)). The model: 4 Mixtral-shaped
layers with 384 MB of int8 experts, random weights, written once to /tmp/split_load_memory.

    python benchmarks/split_load_memory.py none whole_then_tp tp ep
"""

import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PATH = "/tmp/split_load_memory"


def resident_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def rank_main(rank: int, world_size: int, mode: str, port: int) -> None:
    from experts_int8.parallel import parallelize_experts
    from experts_int8.run import load_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    before = resident_mb()
    if mode == "whole_then_tp":
        model, _ = load_model(PATH, dtype=torch.bfloat16)
        parallelize_experts(model, "tp")
    else:
        model, _ = load_model(PATH, dtype=torch.bfloat16, parallel=None if mode == "none" else mode)
    gc.collect()
    loaded = resident_mb() - before
    with torch.no_grad():
        model(torch.randint(0, 1000, (1, 8)))
    experts = sum(t.numel() for n, t in model.state_dict().items() if "experts" in n and t.dtype == torch.int8)
    print(f"{mode:14s} rank {rank}: +{loaded} MB after the load, +{resident_mb() - before} MB after a forward; "
          f"int8 experts here {experts // 2**20} MB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM, MixtralConfig

    from experts_int8 import quantize_

    if not os.path.exists(PATH):
        cfg = MixtralConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=8, vocab_size=1000, num_local_experts=8)
        quantize_(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)).save_pretrained(PATH)
    for i, mode in enumerate(sys.argv[1:]):
        mp.spawn(rank_main, args=(2, mode, 29541 + i), nprocs=2, join=True)
