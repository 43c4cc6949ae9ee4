"""What an expert's few last rows cost a prefill layer, and what a second pass over them would cost.

The align step pads each expert's rows to whole blocks of the entry's tile (T = 64, 128 or 256 rows).
Where an expert holds a few rows past a multiple of T (0 < count % T <= TAIL), its last block streams
and converts the expert's whole weight slice for those few rows. On the bench's routing this times:

  full   the layer as shipped;
  main   the same layer with those tail pairs routed to an absent expert (``expert_map`` -1: the
         kernels write zeros for them, no weight work): the big-tile launches without the tails;
  tail   the tail pairs alone (one pair a row, top_k 1) under small-M entries of the table (the
         best of them): a second pair of launches over the tails.

``main + tail`` against ``full`` says whether sending the tails to a small-tile pass is worth building
(benchmarks/NOTES.md item 103). The two parts' outputs add up to the full layer's (checked per row).

    PYTHONPATH=src python3 benchmarks/tail_probe.py --m 1024,2048,4096,8192 --tails 16,32,64
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from experts_int8 import bench, ops, tune
from experts_int8.kernels import configs

SMALL_MS = (32, 64, 128, 256)  # table entries tried for the tail pass
DECODE_ONLY = ("PAIRS", "DEDUP_PAIRS", "SUM_LAST", "SUM_TOPK")


def tile_rows(config: dict) -> int:
    """The row block an entry pads each expert to."""
    return config.get("WSRR_ROWS", 256) if config.get("WSRR") else config["BLOCK_SIZE_M"]


def tail_pairs(topk_ids: torch.Tensor, num_experts: int, rows: int, tail: int) -> torch.Tensor:
    """Mask of the flat pairs that are their expert's last ``count % rows`` (in pair order) where that
    is 1..``tail``: the rows an expert's last, mostly padding, block holds."""
    flat = topk_ids.reshape(-1).long()
    counts = torch.bincount(flat, minlength=num_experts)
    left = counts % rows
    tail_rows = torch.where((left > 0) & (left <= tail), left, 0)
    order = torch.sort(flat, stable=True).indices
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - (counts.cumsum(0) - counts)[flat[order]]
    return rank >= (counts - tail_rows)[flat]


def layer_run(x, layers, weights, ids, num_calls, expert_map=None, config=None):
    """``num_calls`` layer calls cycling over ``layers`` (under ``config`` if given)."""
    def calls():
        for c in range(num_calls):
            layer = layers[c % len(layers)]
            ops.fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                              w2_scale=layer.w2_scale, expert_map=expert_map)

    def run():
        if config is None:
            return calls()
        with configs.override_config(config):
            return calls()
    return run


def time_us(run, num_calls) -> float:
    return bench.time_run(run, num_calls, reps=10, warmup=2)[0] * 1e6


def probe_row(name, e, k, layers, m, tails, device) -> dict:
    n = max(len(layers), 4)
    x = torch.randn(m, layers[0].w2.shape[1], dtype=torch.bfloat16, device=device)
    weights, ids = bench.routing_draws(m, e, k, device=device)[0]
    inter = layers[0].w2.shape[2]
    entry = configs.get_config(m, e, inter, k, torch.int8, x.device)
    rows = tile_rows(entry)
    row = dict(shape=name, M=m, tile=rows, full_us=time_us(layer_run(x, layers, weights, ids, n), n))
    absent = torch.cat([torch.arange(e, device=device), torch.tensor([-1], device=device)]).to(torch.int32)
    layer = layers[0]
    full_out = ops.fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                                 w2_scale=layer.w2_scale).float()
    for tail in tails:
        mask = tail_pairs(ids, e, rows, tail).view(ids.shape)
        if not mask.any():
            row[f"tail{tail}"] = dict(pairs=0)
            continue
        main_ids = torch.where(mask, torch.full_like(ids, e), ids)
        tokens = mask.reshape(-1).nonzero().squeeze(1)
        x_tail = x[tokens // k].contiguous()
        ids_tail = ids.reshape(-1)[tokens].view(-1, 1).contiguous()
        w_tail = weights.reshape(-1)[tokens].view(-1, 1).contiguous()
        # the two parts add up to the layer (main's tail pairs are zeros; the tail's rows are pairs)
        main_out = ops.fused_experts(x, layer.w13, layer.w2, weights, main_ids, w13_scale=layer.w13_scale,
                                     w2_scale=layer.w2_scale, expert_map=absent).float()
        part = dict(pairs=int(mask.sum()), experts=int(torch.unique(ids_tail).numel()),
                    main_us=time_us(layer_run(x, layers, weights, main_ids, n, expert_map=absent), n))
        for small_m in SMALL_MS:
            small = configs.without(configs.get_config(small_m, e, inter, k, torch.int8, x.device), *DECODE_ONLY)
            try:
                with configs.override_config(small):
                    tail_out = ops.fused_experts(x_tail, layer.w13, layer.w2, w_tail, ids_tail,
                                                 w13_scale=layer.w13_scale, w2_scale=layer.w2_scale).float()
                tune.check_output(main_out.index_add(0, tokens // k, tail_out), full_out)
            except Exception as err:  # noqa: BLE001 - record it, go on with the next entry
                if tune._is_fatal(err):
                    raise
                part[f"m{small_m}_wrong"] = str(err)[:200]
                continue
            part[f"m{small_m}_us"] = time_us(layer_run(x_tail, layers, w_tail, ids_tail, n, config=small), n)
        times = [v for key, v in part.items() if key.startswith("m") and key.endswith("_us") and key != "main_us"]
        part["split_us"] = part["main_us"] + min(times) if times else None
        row[f"tail{tail}"] = part
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(bench.SHAPES))
    ap.add_argument("--m", default="1024,2048,4096,8192")
    ap.add_argument("--tails", default="16,32,64")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    tails = [int(t) for t in args.tails.split(",")]
    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    rows = []
    for name in args.shapes:
        (e, _, _, k), layers = bench.layer_pool(name, "int8", l2)
        for m in (int(v) for v in args.m.split(",")):
            row = probe_row(name, e, k, layers, m, tails, "cuda")
            rows.append(row)
            cells = [f"{name:16s} M={m:<5d} T={row['tile']:<3d} full {row['full_us']:8.1f}"]
            for tail in tails:
                part = row[f"tail{tail}"]
                if part.get("split_us"):
                    cells.append(f"<={tail}: {part['pairs']:4d} pairs main {part['main_us']:8.1f} "
                                 f"split {part['split_us']:8.1f} ({part['split_us'] / row['full_us']:.3f})")
            print("  ".join(cells), flush=True)
        del layers
        torch.cuda.empty_cache()
    path = os.path.join(args.out, "tail_probe_H200.json")
    with open(path, "w") as f:
        json.dump(dict(benchmark="tail_probe", gpu=torch.cuda.get_device_name(), commit=bench.library_commit()[0],
                       command=" ".join(sys.argv), rows=rows), f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
