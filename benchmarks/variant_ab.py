"""A/B of kernel variants on top of the shipped (or heuristic) configs, same weights, routing and
CUDA-graph timing as bench_kernel:

  split_k   the down GEMM split over I: SPLIT_K 1 (as shipped), 2, 4            (decode sizes)
  fuse      gate and up as one dot of width 2*BLOCK_N: FUSE_GATE_UP 0 (shipped), 1  (prefill sizes;
            only where the config is unswapped with BLOCK_SIZE_M >= 64)
  pairs     no align step, one block per (token, slot) pair: PAIRS 0 (shipped), 1    (M = 1, 2)
  pdl       programmatic dependent launch of the GEMMs: off, next kernel at a program's start, after its K loop
  sum_topk  the down GEMM summing each token's k experts: off, on (both PAIRS, no SPLIT_K) (M = 1, 2)
  dedup     no align step, one program per pair, the first pair of each expert takes all its rows:
            the shipped config (align or PAIRS), with PAIRS + DEDUP_PAIRS, that with PDL form 2, form 1
                                                                                          (M = 2..64)
  dequant   int8 experts dequantized once per call, then the float GEMMs with the bf16 table's
            blocks (DEQUANT_ONCE): the shipped int8 config, the dequantize-once path, the same with
            TMA weight tiles in both float GEMMs                                          (M >= 1024)
  sum_last  PAIRS with the down GEMM's last program per token tile adding up the split-K partials and
            the token's k experts (down SUM_LAST), no sum launch: the shipped config, then that, then
            with DEDUP_PAIRS too (no align launch either, each expert read once), then on the align
            path itself (align-path entries as shipped, then split in two along I)       (M <= 16)
  gluon     int8 prefill on the hand-pipelined Gluon wgmma kernels (kernels/gluon_moe.py) with the
            shipped config's blocks (a DEQUANT_ONCE entry keeps its float-table blocks): off, on,
            on with 3 stages in both GEMMs, then 3 stages with 8 warps on 128x128 (down 128x256) and
            on 256x64 (down 256x128) blocks, then the 128x128 tiles with 4 stages  (prefill sizes)
  decode_tile  int8 decode with more warps or longer K tiles than the tuner's space holds (it prunes 8
            warps below 4096 accumulator elements and stops BLOCK_SIZE_K at 256): the shipped config,
            8 warps, 8 warps with BLOCK_SIZE_K 512, BLOCK_SIZE_K 512 (stages cut to fit)   (M <= 16)
  down_tile the down GEMM's own column tile at decode (the tuner gives it gate_up's unless a variant
            overrides it, though its N is H and its K is I): the shipped config, down BLOCK_SIZE_N 64,
            128, 256, and 128 with BLOCK_SIZE_K 256                                      (M <= 16)
  down_pipe the down GEMM's own software pipeline at decode (it takes gate_up's unless the entry sets
            one, though its K is I): the shipped config, down num_stages 2, 3, 4, 5 (the values), down
            BLOCK_SIZE_K 64, 128, 256 (the values)                                        (M <= 16)
  pdl_prefetch  the down GEMM waits for gate_up only before its K loop, after loading its expert and
            epilogue operands and asking L2 for its first 1, 2, 4 or 16 K tiles of weights (the values;
            down PDL_PREFETCH), PDL form 2 added where the entry has none; 101 and 201 one tile in PDL
            form 1 or 2                                                                  (M <= 16)
  wide      wider gate_up tiles at decode (the down GEMM keeps its own): the shipped config, BLOCK_SIZE_N
            128, 128 with BLOCK_SIZE_K 128 and 5 stages, 256 with BLOCK_SIZE_K 128 and 3 stages  (M <= 16)
  pairs_group  PAIRS with the pairs as the fast index of the grid (GROUP_SIZE_M >= M*k): the programs
            of every pair on one column tile run together, so pairs that share an expert read its
            tile while it is in L2 (no align launch, no re-read from HBM): the shipped config, then
            PAIRS + grouping + SUM_LAST, the same without SUM_LAST, PAIRS + SUM_LAST ungrouped (M 2..8)
  narrow    decode tiles 16 columns wide (the tuner starts at 32): the shipped config, BLOCK_SIZE_N 16
            in gate_up only, in down only, in both (stages cut to fit)                     (M <= 16)
  tma       weight tiles by tensor-descriptor copies (TMA) instead of per-thread pointer loads: the
            shipped config, TMA in both GEMMs, in gate_up only, in down only                   (any M)
  fp16_dot  gate_up's dot in fp16 on power-of-two-scaled rows of x (FP16_DOT: int8 -> fp16 in 1.25
            instructions a weight, against 2 for bf16): the shipped config, then FP16_DOT       (any M)
  deep      decode with FP16_DOT and deeper gate_up pipelines (item 78: the decode loop is limited by its
            conversion and its bytes in flight together): the shipped config, FP16_DOT, FP16_DOT with
            BLOCK_SIZE_K 128 and 4 stages, with 128 and 6, with 4 stages, with BLOCK_SIZE_N 32 and 5
            stages (stages cut to fit; the down GEMM keeps its own tiles)              (M <= 16)
  fused_tiles  Gluon tiles with gate and up as one wgmma (FUSE_GATE_UP): the shipped config, then
            variant_ab.FUSED_TILES: 8 warps on 128x(2x128) with 3 and 4 stages, one warpgroup on
            128x(2x64) with 3 and 4 stages (two programs a SM), 8 warps on 256x(2x64) with 3 and 4
            stages                                                                        (prefill sizes)
  down_gluon  the Gluon down GEMM's own tile on GLUON entries (gate_up as shipped): the shipped config,
            then variant_ab.DOWN_GLUON_TILES: 128 wide with 4 warps and 3 stages (two programs a SM),
            128 wide with 8 warps, 64 wide with 4 warps, 256 wide with 8 warps and 4 stages  (prefill sizes)
  untrim    the Gluon kernels without TRIM_TAIL (an expert's last row block whose lower half is all
            padding runs on half the rows): the shipped config (trimmed where it applies), then
            TRIM_TAIL 0                                                                  (prefill sizes)
  wsrr      both GEMMs on the warp-specialized register-form kernels (kernels/gluon_wsrr.py): the shipped
            config, with WSRR (256-row tiles), without WSRR, with WSRR on 128-row tiles    (prefill sizes)
  tail      an expert's last 1..TAIL_ROWS rows past a whole row block in a second pass on the small-M entry
            (configs.tail_config) instead of a block of their own: the shipped config, then TAIL_ROWS 16,
            32, 64 (prefill entries on the align path)                                    (prefill sizes)
  wsrr_tail the register-form kernels with a tail pass: the shipped config, WSRR 256 with TAIL_ROWS 32,
            with 64, WSRR 128 with TAIL_ROWS 32, WSRR 256 with TAIL_ROWS 192 on the entry for 128 rows an
            expert (TAIL_ENTRY_ROWS)                                                      (prefill sizes)
  wsrr_stages  the register-form kernels' ring depth (WSRR_STAGES; the tile's own unless set): the shipped
            config, WSRR entries with 3 stages, with 5, every prefill entry with 5 (entries not on WSRR
            first take WSRR 256 with TAIL_ROWS 32), every prefill entry on the 128-row tile with 5, WSRR
            entries on their tile's own ring                                              (prefill sizes)
  waves     gate_up programs narrower than their dot's tile (TILE_N), so the grid fills whole waves of 1, 2,
            3, 4 or 6 resident programs a SM: the shipped config, then those, then 128-wide dots of K 128
            with 4 stages filling waves of 2 (value 12), then waves of 2 with the down GEMM's SUM_LAST on
            PAIRS entries (value 22)                                                       (M <= 16)
  late_epilogue  the Triton GEMMs' epilogue loads (scales, biases, routing weights) after the K loop
            (LATE_EPILOGUE): the shipped config, both GEMMs late, gate_up only, down only      (any M)
  float_entry  int8 weights on the bf16 table's entry for the same shape and M (the Triton GEMMs with its
            blocks, TMA where it has it): the shipped config, that entry, with FP16_DOT, with
            DEQUANT_ONCE (NOTES item 164)                                              (prefill sizes)
  retuned   a fresh tune's entry: the shipped config, then the entry `experts-int8 tune --out-dir`
            wrote for that M into the folder $RETUNED_TABLES (the shipped one where it wrote none) (any M)
  mma_v2    Hopper's warp-level mma.sync instead of wgmma (Triton's DISABLE_MMA_V3, read at compile
            time; the kernels are recompiled on each switch): wgmma with the shipped config, mma.sync
            with it, mma.sync with 8 warps in both GEMMs                               (prefill sizes)

Prints microseconds per MoE layer per variant and writes variant_ab_<variant>.json to --out. With
--rounds N every value is timed N times, the values' order alternating between rounds, and the median
counts (one run's noise is up to ~7% at some rows: NOTES item 111).

    PYTHONPATH=src python3 benchmarks/variant_ab.py split_k --m 1,2,4,8,16
    PYTHONPATH=src python3 benchmarks/variant_ab.py fuse --m 256,1024,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py pairs --m 1,2 --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b
    PYTHONPATH=src python3 benchmarks/variant_ab.py pdl --m 1,2,4,16,256
    PYTHONPATH=src python3 benchmarks/variant_ab.py sum_topk --m 1,2 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite
    PYTHONPATH=src python3 benchmarks/variant_ab.py dedup --m 2,4,8,16,32 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite
    PYTHONPATH=src python3 benchmarks/variant_ab.py dequant --m 1024,2048,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py mma_v2 --m 256,512,1024,2048
    PYTHONPATH=src python3 benchmarks/variant_ab.py gluon --m 256,512,1024,2048,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py sum_last --m 1,2,4,8
    PYTHONPATH=src python3 benchmarks/variant_ab.py decode_tile --m 1,2,4,16
    PYTHONPATH=src python3 benchmarks/variant_ab.py down_tile --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite
    PYTHONPATH=src python3 benchmarks/variant_ab.py wide --m 1,2,4 --shapes mixtral-8x7b jamba-1.5-mini
    PYTHONPATH=src python3 benchmarks/variant_ab.py pairs_group --m 2,4,8 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite
    PYTHONPATH=src python3 benchmarks/variant_ab.py narrow --m 1,2,4,8 --shapes qwen3-30b-a3b deepseek-v2-lite
    PYTHONPATH=src python3 benchmarks/variant_ab.py tma --m 1,2,4,8,16,256,1024,4096
    PYTHONPATH=src python3 benchmarks/variant_ab.py fp16_dot --m 1,2,4,8,16,256
    PYTHONPATH=src python3 benchmarks/variant_ab.py deep --m 1,2,4 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b
    PYTHONPATH=src python3 benchmarks/variant_ab.py fused_tiles --m 512,1024,2048,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py down_gluon --m 512,1024,2048,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py untrim --m 512,1024,2048,4096,8192
    PYTHONPATH=src python3 benchmarks/variant_ab.py tail --m 512,1024,2048,4096,8192
    PYTHONPATH=src RETUNED_TABLES=/tmp/retuned python3 benchmarks/variant_ab.py retuned --m 128,256,512 --rounds 3
"""
import argparse
import functools
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8 import bench, ops, tune  # noqa: E402
from experts_int8.kernels import configs, fused_moe  # noqa: E402

DTYPES = {"int8": torch.int8, "bf16": torch.bfloat16}


def split_k(cfg: dict, value: int, *lookup) -> dict:
    return configs.with_down(cfg, SPLIT_K=value) if value > 1 else cfg


def fuse(cfg: dict, value: int, *lookup) -> dict:
    if not value or cfg.get("SWAP_AB") or cfg["BLOCK_SIZE_M"] < 64:
        return cfg
    return dict(cfg, FUSE_GATE_UP=1)


def pairs(cfg: dict, value: int, *lookup) -> dict:
    return dict(cfg, PAIRS=1) if value else cfg


def sum_topk(cfg: dict, value: int, *lookup) -> dict:
    # both sides under PAIRS without SPLIT_K (what SUM_TOPK needs), so only the summing differs
    base = dict(configs.without(cfg, "SPLIT_K"), PAIRS=1)
    return configs.with_down(base, SUM_TOPK=1) if value else base


def sum_last(cfg: dict, value: int, *lookup) -> dict:
    # PAIRS (1) or PAIRS + DEDUP_PAIRS (2) with the down GEMM's last program per token tile adding up
    # the partials (no align launch, no sum launch); an align-path entry as it is (3) or split in two
    # along I (4) with that (no sum launch)
    if not value or any(cfg.get(key) for key in ("GLUON", "WSRR")):
        return cfg
    if value >= 3:
        if cfg.get("PAIRS") or cfg.get("TAIL_ROWS"):
            return cfg
        down = {**cfg.get("down", {}), "SUM_LAST": 1, **({"SPLIT_K": 2} if value == 4 else {})}
        return dict(configs.without(cfg, "SUM_TOPK"), down=down)
    plain = dict(configs.without(cfg, "SUM_TOPK", "DEDUP_PAIRS"), PAIRS=1, **({"DEDUP_PAIRS": 1} if value == 2 else {}))
    return configs.with_down(plain, SUM_LAST=1)


def dedup(cfg: dict, value: int, *lookup) -> dict:
    # 1: PAIRS + DEDUP_PAIRS (no align launch); 2, 3: with PDL form 2 or 1, the GEMMs' launches overlapping
    # the kernel before them as well (NOTES item 145)
    if not value:
        return cfg
    out = dict(configs.without(cfg, "SUM_TOPK"), PAIRS=1, DEDUP_PAIRS=1)
    return dict(out, PDL={2: 2, 3: 1}[value]) if value > 1 else out


def dequant(cfg: dict, value: int, m, num_experts, inter, top_k, weight_dtype, device=None) -> dict:
    if not value or weight_dtype != torch.int8:
        return cfg
    out = dict(configs.get_config(m, num_experts, inter, top_k, torch.bfloat16, device), DEQUANT_ONCE=1)
    return configs.with_down(dict(out, TMA=1), TMA=1) if value == 2 else out


def gluon(cfg: dict, value: int, *lookup) -> dict:
    if not value:
        return cfg
    out = dict(configs.without(cfg, "DEQUANT_ONCE"), GLUON=1)
    if value >= 2:  # 3 stages: ~104 KB for 128x64x64, two programs per SM (the probe's best, item 41)
        out = dict(configs.without(out, "num_stages"), num_stages=3)
    if value in (3, 5):  # the tuner's 8-warp tiles: 128x128 (down 128x256), 3 (value 3) or 4 (5) stages
        out = dict(out, **tune.GLUON_TILES[0 if value == 3 else 1])
    if value == 4:  # 256-row blocks: each converted weight tile feeds twice the rows (NOTES item 48)
        out = dict(out, BLOCK_SIZE_M=256, BLOCK_SIZE_N=64,
                   BLOCK_SIZE_K=64, num_warps=8, down=dict(BLOCK_SIZE_N=128))
    return out


FUSED_TILES = {  # gate and up as one Gluon wgmma (FUSE_GATE_UP), per value: gate_up's tile, the down GEMM's
    1: (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_warps=8, num_stages=3), dict(BLOCK_SIZE_N=256)),
    2: (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_warps=8, num_stages=4), dict(BLOCK_SIZE_N=256)),
    # one warpgroup, ~104 KB (3 stages): two programs a SM, each hiding the other's barriers and epilogue
    3: (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, num_warps=4, num_stages=3), dict(BLOCK_SIZE_N=128)),
    4: (dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, num_warps=4, num_stages=4), dict(BLOCK_SIZE_N=128)),
    5: (dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_warps=8, num_stages=3), dict(BLOCK_SIZE_N=128)),
    6: (dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, num_warps=8, num_stages=4), dict(BLOCK_SIZE_N=128)),
}


def fused_tiles(cfg: dict, value: int, *lookup) -> dict:
    # every value a Gluon entry with FUSE_GATE_UP and 64-wide K tiles, the entry's GROUP_SIZE_M
    if not value:
        return cfg
    top, down = FUSED_TILES[value]
    return dict(configs.without(cfg, "DEQUANT_ONCE", "TMA", "SWAP_AB"), **top, BLOCK_SIZE_K=64,
                GLUON=1, FUSE_GATE_UP=1, down=down)


DOWN_GLUON_TILES = {  # the Gluon down GEMM's own tile, per value (gate_up's kept as shipped)
    1: dict(BLOCK_SIZE_N=128, num_warps=4, num_stages=3),  # ~104 KB at 128 rows: two programs a SM
    2: dict(BLOCK_SIZE_N=128, num_warps=8, num_stages=4),
    3: dict(BLOCK_SIZE_N=64, num_warps=4, num_stages=4),
    4: dict(BLOCK_SIZE_N=256, num_warps=8, num_stages=4),
}


def down_gluon(cfg: dict, value: int, *lookup) -> dict:
    if not value or not cfg.get("GLUON"):
        return cfg
    keys = ("BLOCK_SIZE_N", "num_warps", "num_stages")
    kept = {key: v for key, v in cfg.get("down", {}).items() if key not in keys}
    return dict(cfg, down={**kept, **DOWN_GLUON_TILES[value]})


def untrim(cfg: dict, value: int, *lookup) -> dict:
    if not value or not cfg.get("GLUON"):
        return cfg
    return dict(cfg, TRIM_TAIL=0)


def mma_v2(cfg: dict, value: int, *lookup) -> dict:
    # The unswapped int8 wgmma is synchronous (NOTES item 13); mma.sync takes both operands from
    # registers, so the converted weight tile never goes back to shared memory.
    want = "1" if value else "0"
    if os.environ.get("DISABLE_MMA_V3", "0") != want:
        os.environ["DISABLE_MMA_V3"] = want
        for kernel in (fused_moe.moe_gate_up_kernel, fused_moe.moe_down_kernel):
            kernel.device_caches.clear()  # compiled under the other setting
    if value == 2:
        return configs.with_down(dict(cfg, num_warps=8), num_warps=8)
    return cfg


def decode_tile(cfg: dict, value: int, *lookup) -> dict:
    # The same tiles in both GEMMs (a down override of warps or K tile is replaced), stages cut until
    # the gate_up pipeline fits shared memory.
    if not value:
        return cfg
    change = {1: dict(num_warps=8), 2: dict(num_warps=8, BLOCK_SIZE_K=512), 3: dict(BLOCK_SIZE_K=512)}[value]
    out = configs.with_down(dict(cfg, **change), **change)
    return configs.fit_shared_memory(out, 1, tune.DEFAULT_SMEM)


def down_tile(cfg: dict, value: int, *lookup) -> dict:
    if not value or cfg["BLOCK_SIZE_M"] > 32:
        return cfg
    change = {1: dict(BLOCK_SIZE_N=64), 2: dict(BLOCK_SIZE_N=128), 3: dict(BLOCK_SIZE_N=256),
              4: dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=256)}[value]
    return configs.with_down(cfg, **change)


def down_pipe(cfg: dict, value: int, *lookup) -> dict:
    # The down GEMM's own pipeline at decode (tune.down_pipeline_variants): 2-5 its num_stages, else its K tile
    if not value or cfg["BLOCK_SIZE_M"] > 32 or any(cfg.get(key) for key in configs.OTHER_KERNEL_KEYS):
        return cfg
    change = dict(num_stages=value) if value <= 5 else dict(BLOCK_SIZE_K=value)
    return configs.with_down(cfg, **change)


def pdl_prefetch(cfg: dict, value: int, *lookup) -> dict:
    # The down GEMM's wait for gate_up after its own loads and an L2 prefetch of its first K tiles (down
    # PDL_PREFETCH): values 1-16 that many tiles in the entry's PDL form (form 2 where it has none), 101-116
    # and 201-216 (form x 100 + tiles) in form 1 or 2
    if not value or cfg["BLOCK_SIZE_M"] > 32 or any(cfg.get(key) for key in configs.OTHER_KERNEL_KEYS):
        return cfg
    form, tiles = divmod(value, 100)
    return configs.with_down(dict(cfg, PDL=form or cfg.get("PDL") or 2), PDL_PREFETCH=tiles)


def _down_pinned(cfg: dict) -> dict:
    """cfg's down overrides with the down GEMM's tile and stages made explicit, so a variant that
    changes gate_up's leaves the down GEMM as shipped."""
    keys = ("BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_stages")
    return {**cfg.get("down", {}), **{key: cfg.get("down", {}).get(key, cfg[key]) for key in keys}}


def wide(cfg: dict, value: int, *lookup) -> dict:
    if not value or cfg["BLOCK_SIZE_M"] > 32:
        return cfg
    change = {1: dict(BLOCK_SIZE_N=128), 2: dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=5),
              3: dict(BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, num_stages=3)}[value]
    out = dict(cfg, **change, down=_down_pinned(cfg))
    return configs.fit_shared_memory(out, 1, tune.DEFAULT_SMEM)


def pairs_group(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, *rest) -> dict:
    if not value or cfg["BLOCK_SIZE_M"] > 32:
        return cfg
    plain = dict(configs.without(cfg, "SUM_TOPK", "DEDUP_PAIRS", "SUM_LAST"), PAIRS=1,
                 GROUP_SIZE_M=1 if value == 3 else max(16, 1 << (m * top_k - 1).bit_length()))
    if value == 2:
        return plain
    return configs.with_down(plain, SUM_LAST=1)


def narrow(cfg: dict, value: int, *lookup) -> dict:
    # More, smaller programs: 192 gate_up programs of 160 KB at qwen3 M=1 fill 132 SMs in 1.5 waves
    if not value:
        return cfg
    down = {**cfg.get("down", {})}
    down.setdefault("BLOCK_SIZE_N", cfg["BLOCK_SIZE_N"])
    out = dict(cfg)
    if value in (1, 3):
        out["BLOCK_SIZE_N"] = 16
    if value in (2, 3):
        down["BLOCK_SIZE_N"] = 16
    return configs.fit_shared_memory(dict(out, down=down), 1, tune.DEFAULT_SMEM)


def tma(cfg: dict, value: int, *lookup) -> dict:
    # (GLUON entries keep their own kernels: the variant leaves them as shipped)
    if not value or cfg.get("GLUON"):
        return cfg
    top, down = {1: (1, 1), 2: (1, 0), 3: (0, 1)}[value]
    return configs.with_down(dict(cfg, TMA=top), TMA=down)


def fp16_dot(cfg: dict, value: int, *lookup) -> dict:
    # (dequantized float weights do not read the key)
    if not value or cfg.get("DEQUANT_ONCE"):
        return cfg
    return dict(cfg, FP16_DOT=1)


def deep(cfg: dict, value: int, *lookup) -> dict:
    if not value or cfg["BLOCK_SIZE_M"] > 32:
        return cfg
    change = {1: {}, 2: dict(BLOCK_SIZE_K=128, num_stages=4), 3: dict(BLOCK_SIZE_K=128, num_stages=6),
              4: dict(num_stages=4), 5: dict(BLOCK_SIZE_N=32, num_stages=5)}[value]
    out = dict(cfg, **change, FP16_DOT=1, down=_down_pinned(cfg))
    return configs.fit_shared_memory(out, 1, tune.DEFAULT_SMEM)


def wsrr(cfg: dict, value: int, *lookup) -> dict:
    if value in (1, 3) and not cfg.get("PAIRS"):
        return dict(configs.without(cfg, "WSRR_ROWS"), WSRR=1, **({"WSRR_ROWS": 128} if value == 3 else {}))
    return configs.without(cfg, *configs.WSRR_KEYS) if value == 2 else cfg


def tail(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, *rest) -> dict:
    if not value:
        return cfg
    variants = {v["TAIL_ROWS"]: v for v in tune.tail_variants(cfg, m, top_k)}  # where the entry's path takes it
    return variants.get({1: 16, 2: 32, 3: 64}[value], cfg)


def wsrr_tail(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, *rest) -> dict:
    if not value:
        return cfg
    rows, tail_rows = {1: (256, 32), 2: (256, 64), 3: (128, 32), 4: (256, 192)}[value]
    on_tile = configs.without(wsrr(cfg, 1 if rows == 256 else 3), "TAIL_ROWS", "TAIL_ENTRY_ROWS")
    if value == 4:  # rows past a whole 256-row block, up to 192 of them, on the entry for 128 rows an expert
        try:
            return configs.check_config(dict(on_tile, TAIL_ROWS=tail_rows, TAIL_ENTRY_ROWS=128))
        except ValueError:
            return cfg
    variants = {v["TAIL_ROWS"]: v for v in tune.tail_variants(on_tile, m, top_k)}
    return variants.get(tail_rows, cfg)


def wsrr_stages(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, *rest) -> dict:
    from experts_int8.kernels import gluon_wsrr
    if not value:
        return cfg
    if value == 5:  # WSRR entries on their tile's own ring
        return configs.without(cfg, "WSRR_STAGES")
    if value == 3 and not cfg.get("WSRR"):  # a Gluon or Triton prefill entry: WSRR 256 and a tail pass of 32 rows
        cfg = wsrr_tail(cfg, 1, m, num_experts, inter, top_k)
    if value == 4 and m * top_k >= 512:  # any prefill entry on the 128-row tile (its tail pass, if any, kept)
        cfg = configs.without(wsrr(cfg, 3), *(configs.TAIL_KEYS if cfg.get("TAIL_ROWS", 0) >= 128 else ()))
    stages = {1: 3, 2: 5, 3: 5, 4: 5}[value]
    rows = cfg.get("WSRR_ROWS", 256)
    if not cfg.get("WSRR") or gluon_wsrr.TILES[rows].smem_bytes(stages) > tune.DEFAULT_SMEM:
        return cfg
    return dict(cfg, WSRR_STAGES=stages)


def waves(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, *rest) -> dict:
    """Gate_up programs narrowed (TILE_N) to fill whole waves of ``value`` resident programs a SM; on the
    align path the row blocks are estimated as the routing's expected distinct experts (decode blocks)."""
    if not value or cfg["BLOCK_SIZE_M"] > 32 or any(cfg.get(key) for key in (*configs.TILE_N_EXCLUDES, "DEDUP_PAIRS")):
        return cfg
    blocks = m * top_k if cfg.get("PAIRS") else round(tune.expected_distinct_experts(m, num_experts, top_k))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if value == 12:  # 128-wide dots of K 128 and 4 stages (two programs a SM), the down GEMM as shipped
        cfg, value = dict(cfg, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, num_stages=4, down=_down_pinned(cfg)), 2
    if value == 22:  # waves of 2 on a PAIRS entry whose down GEMM adds up its token's tiles itself (SUM_LAST)
        if not cfg.get("PAIRS"):
            return cfg
        cfg, value = sum_last(cfg, 1), 2
    return dict(cfg, TILE_N=tune.wave_tile_n(blocks, inter, cfg["BLOCK_SIZE_N"], value, sms))


def pdl(cfg: dict, value: int, *lookup) -> dict:
    # Programmatic dependent launch of the Triton GEMMs: 1 the next kernel launched at a program's start, 2 after
    # its K loop (NOTES items 28, 145)
    return dict(cfg, PDL=value) if value else configs.without(cfg, "PDL", "PDL_PREFETCH")


def retuned(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, dtype, *rest) -> dict:
    """Value 1: the entry a fresh tune wrote for this M into the folder $RETUNED_TABLES (``experts-int8 tune
    --out-dir``), where it has one; so a re-tune is timed against the shipped entry in interleaved rounds
    and folded by fold_ab.py like any variant (NOTES item 136)."""
    folder = os.environ.get("RETUNED_TABLES")
    if not value or not folder:
        return cfg
    name = configs.table_name(num_experts, inter, configs.device_name(), configs.weight_format(dtype))
    table = _table_in(os.path.join(folder, name))
    return dict(table[m]) if m in table else cfg


def float_entry(cfg: dict, value: int, m: int, num_experts: int, inter: int, top_k: int, dtype, *rest) -> dict:
    """The bf16 baseline's entry for this shape and M run on the int8 weights: value 1 as it is, 2 with
    FP16_DOT, 3 with DEQUANT_ONCE (dequantized float weights, so TMA's view always fits). Whether int8
    prefill on the small-expert shapes has a Triton form as fast as bf16's TMA entries (NOTES item 164)."""
    if not value or dtype != torch.int8:
        return cfg
    entry = configs.get_config(m, num_experts, inter, top_k, torch.bfloat16, *rest)
    return dict(entry, **{2: dict(FP16_DOT=1), 3: dict(DEQUANT_ONCE=1)}.get(value, {}))


@functools.lru_cache(maxsize=None)
def _table_in(path: str) -> dict:
    """A table file's validated entries by M (empty when there is no such file), read once a process."""
    return configs.read_table(path) if os.path.isfile(path) else {}


def late_epilogue(cfg: dict, value: int, *lookup) -> dict:
    # The epilogue's loads after the K loop (NOTES items 131-132): 1 both GEMMs, 2 gate_up only, 3 down only
    if not value:
        return cfg
    top, down = {1: (1, 1), 2: (1, 0), 3: (0, 1)}[value]
    return configs.with_down(dict(cfg, LATE_EPILOGUE=top), LATE_EPILOGUE=down)


VARIANTS = {"split_k": (split_k, (1, 2, 4)), "fuse": (fuse, (0, 1)), "pairs": (pairs, (0, 1)), "pdl": (pdl, (0, 1, 2)),
            "sum_topk": (sum_topk, (0, 1)), "dedup": (dedup, (0, 1, 2, 3)), "dequant": (dequant, (0, 1, 2)),
            "mma_v2": (mma_v2, (0, 1, 2)), "gluon": (gluon, (0, 1, 2, 3, 4, 5)),
            "sum_last": (sum_last, (0, 1, 2, 3, 4)),
            "decode_tile": (decode_tile, (0, 1, 2, 3)), "narrow": (narrow, (0, 1, 2, 3)),
            "down_tile": (down_tile, (0, 1, 2, 3, 4)), "down_pipe": (down_pipe, (0, 2, 3, 4, 5, 64, 128, 256)),
            "pdl_prefetch": (pdl_prefetch, (0, 1, 2, 4, 16, 101, 201)),
            "wide": (wide, (0, 1, 2, 3)),
            "pairs_group": (pairs_group, (0, 1, 2, 3)), "tma": (tma, (0, 1, 2, 3)),
            "fp16_dot": (fp16_dot, (0, 1)), "deep": (deep, (0, 1, 2, 3, 4, 5)),
            "fused_tiles": (fused_tiles, (0, 1, 2, 3, 4, 5, 6)), "down_gluon": (down_gluon, (0, 1, 2, 3, 4)),
            "untrim": (untrim, (0, 1)), "wsrr": (wsrr, (0, 1, 2, 3)), "tail": (tail, (0, 1, 2, 3)),
            "wsrr_tail": (wsrr_tail, (0, 1, 2, 3, 4)), "wsrr_stages": (wsrr_stages, (0, 1, 2, 3, 4, 5)),
            "waves": (waves, (0, 1, 2, 3, 4, 6, 12, 22)), "late_epilogue": (late_epilogue, (0, 1, 2, 3)),
            "retuned": (retuned, (0, 1)), "float_entry": (float_entry, (0, 1, 2, 3))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--shapes", nargs="+", default=["mixtral-8x7b", "mixtral-8x22b", "jamba-1.5-mini", "qwen3-30b-a3b"])
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--dtype", default="int8", choices=["int8", "bf16"])
    ap.add_argument("--values", help="a subset of the variant's values to time, the first the baseline (e.g. 0,3,5)")
    ap.add_argument("--rounds", type=int, default=1, help="time every value this many times, interleaved (medians)")
    ap.add_argument("--settle-s", type=bench.settle_seconds, default=0.5,
                    help="seconds the GPU idles before each timing, so no value is timed under the power cap the "
                         "one before left (NOTES 142)")
    ap.add_argument("--warm-s", type=bench.settle_seconds, default=bench.Settings.warm_s,
                    help="seconds of untimed replays before each timing, as the bench's rows have (NOTES 205-206: "
                         "int8 decode held that long meets the H200's power cap); 0 times a burst")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    ms = [int(m) for m in args.m.split(",")]
    apply, values = VARIANTS[args.variant]
    if args.values:
        chosen = tuple(int(v) for v in args.values.split(","))
        if not set(chosen) <= set(values) or len(chosen) < 2:
            ap.error(f"--values: two or more of {values} for {args.variant}")
        values = chosen
    base_get_config = configs.get_config
    current = {"value": values[0]}
    served = {}  # the last config the patched lookup gave (recorded per value, for fold_ab.py to write)

    def get_config(*a, **kw):
        served["config"] = apply(base_get_config(*a, **kw), current["value"], *a, *kw.values())
        return served["config"]

    ops.get_config = get_config

    launches = []  # Gluon gate_up launches while the current variant is timed (eager warm-up included)
    gluon_variant = args.variant in ("gluon", "fused_tiles", "down_gluon", "untrim")
    if gluon_variant:
        real = ops.gluon_moe.invoke_gate_up
        ops.gluon_moe.invoke_gate_up = lambda *a: launches.append(1) or real(*a)

    l2 = bench.environment().get("l2_bytes") or bench.DEFAULT_L2_BYTES
    # the bench's ceilings, for its calls per graph replay (launch gaps and PDL's overlap between calls as in
    # the bench's rows, whose tables a fold changes)
    copy_bps, matmul_fps = bench.measure_copy_bandwidth(), bench.measure_matmul_rate()
    rows = []
    for name in args.shapes:
        (e, h, i, k), layers = bench.layer_pool(name, args.dtype, l2)
        n = len(layers)
        for m in ms:
            x = torch.randn(m, h, dtype=torch.bfloat16, device="cuda")
            routing = bench.routing_draws(m, e, k)
            _, calls = bench.row_plan(routing, n, m=m, hidden=h, inter=i, top_k=k, dtype=args.dtype,
                                      copy_bytes_per_s=copy_bps, matmul_flops_per_s=matmul_fps)
            # the entry the A/B starts from: fold_ab.py folds a winner only onto this same entry
            row = dict(shape=name, M=m, dtype=args.dtype, calls_per_replay=calls,
                       base_config=base_get_config(m, e, i, k, DTYPES[args.dtype]))
            layer, (weights, ids) = layers[0], routing[0]
            first_layer = lambda backend="auto": ops.fused_experts(  # noqa: E731
                x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale, w2_scale=layer.w2_scale,
                backend=backend)
            expected = first_layer("torch")
            correct = []
            for value in values:
                current["value"] = value
                try:  # as the tuner does: a variant is timed only once it computes the layer correctly
                    served.clear()
                    tune.check_output(first_layer(), expected)
                    correct.append(value)
                    if "config" in served:  # the entry this value ran: what a fold writes, never re-derived
                        row[f"{args.variant}={value}_config"] = served["config"]
                except Exception as err:  # a wrong result, or blocks that do not compile
                    if tune._is_fatal(err):  # a CUDA fault poisons the context: stop
                        raise
                    row[f"{args.variant}={value}_wrong"] = str(err)
                    print(f"{name} M={m} {args.variant}={value}: {str(err)[:300]}", flush=True)
            # rounds over the values, in alternating order, so that a drift of the machine over the row
            # (clocks, temperature) does not favour the value timed first; the median per value counts
            samples = {value: [] for value in correct}
            for r in range(args.rounds):
                for value in correct if r % 2 == 0 else correct[::-1]:
                    current["value"] = value
                    launches.clear()
                    bench.settle(args.settle_s)
                    seconds, _ = bench.time_calls(x, layers, routing, calls, reps=10, warmup=2,
                                                  warm_s=args.warm_s)
                    samples[value].append(seconds * 1e6)
                    if gluon_variant:  # a GLUON entry the Gluon kernels cannot take runs Triton's
                        row[f"{args.variant}={value}_ran"] = bool(launches)
            for value, us in samples.items():
                row[f"{args.variant}={value}_us"] = statistics.median(us)
                if args.rounds > 1:
                    row[f"{args.variant}={value}_us_rounds"] = us
            rows.append(row)
            cells = "  ".join(f"{args.variant}={v}: {row.get(f'{args.variant}={v}_us', float('nan')):8.1f} us"
                              + (f" ({min(samples[v]):.0f}-{max(samples[v]):.0f})" if args.rounds > 1 and v in samples
                                 else "") for v in values)
            print(f"{name:16s} M={m:<5d} {cells}", flush=True)
        del layers
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, f"variant_ab_{args.variant}.json"), "w") as f:
        json.dump(dict(benchmark="variant_ab", variant=args.variant, values=values, rounds=args.rounds,
                       gpu=torch.cuda.get_device_name(),
                       commit=bench.library_commit()[0], command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
