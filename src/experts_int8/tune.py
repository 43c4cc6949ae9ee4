"""Tune the MoE block configs of one expert shape on the local GPU and save them as a table.

``tune(E, H, I, k)`` times the whole ``fused_experts`` call (align + both GEMMs + the sum over k)
for each candidate config, forced with :func:`~experts_int8.kernels.configs.override_config`, at a
few token counts M, and writes ``E={E},N={I},device={gpu},dtype={fmt}.json`` (M -> best config)
into the user cache, where ``get_config`` finds it from then on (``configs.table_key`` picks the M).

Search space: BLOCK_SIZE_M 16..128 limited by the rows each expert receives (M * k / E),
BLOCK_SIZE_N 32..256, BLOCK_SIZE_K 64..256, num_warps 4/8, num_stages 2..5, pruned by shared memory
and accumulator registers, then a fixed pseudo-random sample of ``max_candidates`` configs split
over the BLOCK_SIZE_M choices (nested across M, so most compiled kernels are reused from one M to
the next). The winner is then tried with the variants of :mod:`.kernels.fused_moe` that may suit
it (GROUP_SIZE_M 8 and 16, SPLIT_K, the down GEMM's own tile and pipeline at decode, FUSE_GATE_UP,
PAIRS, DEDUP_PAIRS, SUM_TOPK, SWAP_AB, TMA on sm_90+, TILE_N for PAIRS grids that fill whole waves)
and, for int8 at prefill sizes, FP16_DOT and the dequantize-once path (DEQUANT_ONCE). A variant that
wins is refined once more the same way, so two variants that each help can meet in one entry. The
config serving M before the run (the shipped or cached table's) and the heuristic are always the
first candidates, so a table never loses to what it replaces on the tuning inputs. Configs that fail to compile or run
out of resources are skipped. Each candidate is timed as :mod:`experts_int8.bench` times a row: the bench's
calls per replay, cycling over the layers, captured in a CUDA graph, replays between events.

Weights are cycled over a pool of distinct layers, sized as :mod:`experts_int8.bench` sizes its pools
(the device's L2, the same budget), so small-M timings read from HBM, not L2. Most of the cost is Triton
compiling each candidate once (a few seconds for both kernels); Triton's on-disk cache makes a second
run, or another shape with the same k, much faster. ``budget_s`` bounds the whole search: the remaining
time is shared by the remaining (dtype, M) searches, each of which stops early (keeping the best so far)
when its share is spent.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import math
import os
import random
import statistics
import time
import zlib
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from .bench import DEFAULT_MS as BENCH_MS
from .files import check_writable_dir, locked_folder, write_atomic
from .kernels import configs, fused_moe

logger = logging.getLogger(__name__)

BLOCK_M = (16, 32, 64, 128)
BLOCK_N = (32, 64, 128, 256)
BLOCK_K = (64, 128, 256)
GROUP_M = (1, 8, 16)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4, 5)
# The bench's rows, every power of two: the lookup serves an M between tuned ones from the entry below it, which
# on 1, 4, 16, ..., 4096 alone ran some rows up to 25% slower than the heuristic (benchmarks/NOTES.md item 219)
DEFAULT_MS = BENCH_MS
DTYPES = {"int8": torch.int8, "bf16": torch.bfloat16}
DEFAULT_SMEM = 232448  # bytes per block on H100/H200 (opt-in maximum)
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread in GEMM1 (gate and up tiles)


def _next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def rows_per_expert(m: int, num_experts: int, top_k: int) -> float:
    return m * top_k / num_experts


def block_m_choices(m: int, num_experts: int, top_k: int) -> list[int]:
    """BLOCK_SIZE_M values worth trying: at most about twice the rows an expert gets (bigger blocks
    are mostly padding), and no 16 once experts get more than 64 rows."""
    r = rows_per_expert(m, num_experts, top_k)
    return [b for b in BLOCK_M if b <= max(16, 2 * r) and not (b == 16 and r > 64)]


smem_bytes = configs.pipeline_smem_bytes  # shared memory of a GEMM's program (gate_up's by default)


def _plausible(cfg: dict, weight_bytes: int, smem_limit: int) -> bool:
    """Whether a config of the search space may run well: its gate_up program fits ``smem_limit`` bytes of
    shared memory as Triton allocates it (``configs.pipeline_smem_bytes``: on Hopper, rings of num_stages - 1
    tiles for the decode blocks' mma.sync, num_stages for wgmma's), which the down GEMM on the same tile (one
    weight tile, not two) does too; its gate and up accumulators fit MAX_ACC_REGS registers a thread; and 8
    warps have enough of a tile to share."""
    bm, bn, warps = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["num_warps"]
    if smem_bytes(cfg, weight_bytes) > smem_limit:
        return False
    if 2 * bm * bn / (32 * warps) > MAX_ACC_REGS:  # gate + up accumulators would spill
        return False
    if warps == 8 and bm * bn < 4096:  # too little work for 8 warps
        return False
    return True


def _space(bm: int, bns: Sequence[int], bks: Sequence[int], wbytes: int, smem_limit: int) -> list[dict]:
    """Plausible configs of one BLOCK_SIZE_M (GROUP_SIZE_M 1), in a fixed pseudo-random order seeded
    by the arguments, so a prefix of it is a sample and shorter prefixes nest in longer ones."""
    space = []
    for bn in bns:
        for bk in bks:
            for warps in NUM_WARPS:
                for stages in NUM_STAGES:
                    cfg = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=1,
                               num_warps=warps, num_stages=stages)
                    if _plausible(cfg, wbytes, smem_limit):
                        space.append(cfg)
    random.Random(zlib.crc32(repr((bm, list(bns), list(bks), wbytes, smem_limit)).encode())).shuffle(space)
    return space


def candidate_configs(m: int, num_experts: int, hidden: int, inter: int, top_k: int,
                      weight_dtype: torch.dtype = torch.int8, *, smem_limit: int = DEFAULT_SMEM,
                      max_candidates: int = 32, default: Optional[dict] = None) -> list[dict]:
    """First-stage candidates for M tokens: ``default`` (the config serving M now; the heuristic
    when not given), the heuristic, then the pruned space sampled.

    The budget is split evenly over the BLOCK_SIZE_M choices; each takes a prefix of its fixed
    shuffled space (so different M share most candidates and Triton compiles each only once), and
    the prefixes are interleaved so a search cut short by its time budget still covers every
    BLOCK_SIZE_M. GROUP_SIZE_M is 1 here; :func:`group_variants` tries the others on the winner.
    """
    wbytes = torch.empty((), dtype=weight_dtype).element_size()
    bms = block_m_choices(m, num_experts, top_k)
    bns = [b for b in BLOCK_N if b <= max(32, _next_pow2(max(hidden, inter)))]
    bks = [b for b in BLOCK_K if b <= max(64, _next_pow2(min(hidden, inter)))]
    share = max(1, math.ceil(max_candidates / len(bms)))
    prefixes = [_space(bm, bns, bks, wbytes, smem_limit)[:share] for bm in bms]
    # fitted to this device's shared memory as get_config fits it (as it is, bf16 decode's compiles to 108 KB, over the
    # ~99 KB of sm_86/sm_89/sm_120: a candidate that cannot launch)
    heuristic = configs.fit_shared_memory(configs.heuristic_config(m, num_experts, top_k, weight_dtype, "cuda"),
                                          wbytes, smem_limit)
    head = [heuristic] if default is None or default == heuristic else [default, heuristic]
    out = []
    for j in range(share):
        out += [p[j] for p in prefixes if j < len(p) and p[j] not in head]
    return head + out[:max_candidates]


def group_variants(best: dict, m: int, num_experts: int, top_k: int) -> list[dict]:
    """The winner with the other GROUP_SIZE_M values, when an expert's rows span several blocks."""
    if rows_per_expert(m, num_experts, top_k) <= best["BLOCK_SIZE_M"]:
        return []
    return [dict(best, GROUP_SIZE_M=g) for g in GROUP_M if g != best["GROUP_SIZE_M"]]


def swap_variants(best: dict) -> list[dict]:
    """A decode winner (BLOCK_SIZE_M <= 32) with the weight tile on the left of the dot (SWAP_AB),
    for both GEMMs and for gate_up only: the tensor-core tile's wide side then covers weight rows
    instead of a mostly padded token block."""
    if best["BLOCK_SIZE_M"] > 32 or best.get("SWAP_AB") or best.get("FUSE_GATE_UP"):
        return []
    return [dict(best, SWAP_AB=1), configs.with_down(dict(best, SWAP_AB=1), SWAP_AB=0)]


def down_tile_variants(best: dict, weight_bytes: int, smem_limit: int) -> list[dict]:
    """A decode winner (BLOCK_SIZE_M <= 32) with its down GEMM on other column tiles: the down GEMM is
    N=H x K=I, unlike gate_up's N=2I x K=H, yet inherits gate_up's tile (qwen3 at M=4: 128-wide down
    tiles 7% faster than the 32-wide ones of its gate_up, benchmarks/NOTES.md item 69), where the down GEMM's
    program fits ``smem_limit`` bytes of shared memory (the 256-wide tile of 16 x 256 x 256 in 4 stages takes
    216 KB on Hopper: three stages of int8 weights, as configs.pipeline_smem_bytes counts them)."""
    if best["BLOCK_SIZE_M"] > 32:
        return []
    down = configs.split_config(best)[1]
    return [configs.with_down(best, BLOCK_SIZE_N=n) for n in (64, 128, 256)
            if n != down["BLOCK_SIZE_N"]
            and smem_bytes(dict(down, BLOCK_SIZE_N=n), weight_bytes, weight_tiles=1) <= smem_limit]


def down_pipeline_variants(best: dict, weight_bytes: int, smem_limit: int) -> list[dict]:
    """A decode winner (BLOCK_SIZE_M <= 32, the Triton GEMMs) with a software pipeline of the down GEMM's
    own: another depth (NUM_STAGES) or K tile (64, 128, 256). The down GEMM streams K = I where gate_up
    streams K = H, yet takes gate_up's pipeline unless the entry sets its own; its depth also sets how
    many of its programs an SM holds (8x7b M=2: 4 at gate_up's 4 stages, 6 at 3), and a short K = I
    overlaps more in smaller K steps (benchmarks/NOTES.md items 149, 153: deepseek M=8 at 64). Those whose
    down program fits ``smem_limit`` bytes of shared memory (configs.pipeline_smem_bytes: at decode, rings of
    num_stages - 1 tiles)."""
    if best["BLOCK_SIZE_M"] > 32 or any(best.get(key) for key in configs.OTHER_KERNEL_KEYS):
        return []
    down = configs.split_config(best)[1]
    changes = [dict(num_stages=s) for s in NUM_STAGES if s != down["num_stages"]]
    changes += [dict(BLOCK_SIZE_K=k) for k in (64, 128, 256) if k != down["BLOCK_SIZE_K"]]
    return [configs.with_down(best, **c) for c in changes
            if smem_bytes({**down, **c}, weight_bytes, weight_tiles=1) <= smem_limit]


def split_k_variants(best: dict, m: int, num_experts: int, hidden: int, top_k: int, num_sms: int) -> list[dict]:
    """The winner with its down GEMM split over I (SPLIT_K 2 and 4), when that GEMM has too few
    tiles to keep every SM streaming weights (decode: a few experts x H / BLOCK_N tiles)."""
    _, down = configs.split_config(best)
    tiles = min(m * top_k, num_experts) * math.ceil(hidden / down["BLOCK_SIZE_N"])
    if tiles >= 2 * num_sms or down.get("SPLIT_K", 1) > 1 or down.get("SUM_TOPK"):
        return []
    plain = configs.without(best, *configs.TAIL_KEYS)  # (a tail pass needs the down GEMM unsplit)
    return [configs.with_down(plain, SPLIT_K=s) for s in (2, 4)]


def fuse_variants(best: dict, dtype: str) -> list[dict]:
    """The int8 winner with gate and up in one dot (FUSE_GATE_UP), for the unswapped tensor-core path
    (BLOCK_SIZE_M >= 64), where it halves the convert/store/fence steps per K tile."""
    if dtype != "int8" or best.get("SWAP_AB") or best.get("FUSE_GATE_UP") or best["BLOCK_SIZE_M"] < 64:
        return []
    return [dict(best, FUSE_GATE_UP=1)]


def dequant_variants(best: dict, m: int, dtype: str, float_config: dict, tma_ok: bool = False) -> list[dict]:
    """At prefill sizes (M >= 1024) of int8 weights: dequantize the layer's experts once per call and
    run the float GEMMs with ``float_config`` (the float table's or heuristic's blocks for this M),
    also with TMA weight tiles where ``tma_ok``."""
    if dtype != "int8" or m < 1024 or best.get("DEQUANT_ONCE"):
        return []
    plain = dict(float_config, DEQUANT_ONCE=1)
    return [plain] + tma_variants(plain, tma_ok)[:1]


def tma_variants(best: dict, tma_ok: bool) -> list[dict]:
    """On a device with TMA (``tma_ok``: sm_90 and newer): the winner with its weight tiles loaded by
    tensor-descriptor copies in both GEMMs, and in the down GEMM only (on the H200: 3-6% faster at some
    decode and prefill rows, 1-12% slower at others, benchmarks/NOTES.md item 73). Not for the
    kernels that do not read the key (GLUON)."""
    if not tma_ok or any(best.get(key) for key in ("TMA", "GLUON", "TILE_N")):
        return []
    return [dict(best, TMA=1), configs.with_down(best, TMA=1)]


def late_epilogue_variants(best: dict) -> list[dict]:
    """The winner with its epilogue's loads after the K loop, in both Triton GEMMs and in gate_up only: the
    loads before the loop end each short program one memory round trip sooner (1-3% at decode on the H200),
    but the registers that hold them through the loop can cost a resident program a SM (qwen3 M=4: +10%,
    benchmarks/NOTES.md items 131-132). Not for the kernels that do not read the key."""
    if best.get("LATE_EPILOGUE") or any(best.get(key) for key in configs.OTHER_KERNEL_KEYS):
        return []
    return [dict(best, LATE_EPILOGUE=1), configs.with_down(dict(best, LATE_EPILOGUE=1), LATE_EPILOGUE=0)]


def pdl_variants(best: dict, m: int, top_k: int, pdl_ok: bool) -> list[dict]:
    """At decode sizes (up to 128 pairs: M=16 at top-8) on sm_90+: the winner with both Triton GEMMs launched
    as programmatic dependents, the next kernel let in at a program's start (1) or after its K loop (2). Each
    won 1-6% at some H200 decode rows and lost up to 20% at others (benchmarks/NOTES.md items 28, 145): only
    a timing decides. A winner with PDL gets the down GEMM's PDL_PREFETCH of one K tile instead."""
    if not pdl_ok or m * top_k > 128 or any(best.get(key) for key in configs.OTHER_KERNEL_KEYS):
        return []
    if not best.get("PDL"):
        return [dict(best, PDL=1), dict(best, PDL=2)]
    down = best.get("down", {})
    # the down GEMM's wait after its own loads and one K tile asked of L2: -1 to -3% at four H200 rows, more
    # tiles lost everywhere (item 156); SUM_TOPK's programs wait first
    return [] if "PDL_PREFETCH" in down or down.get("SUM_TOPK") else [configs.with_down(best, PDL_PREFETCH=1)]


def fp16_dot_variants(best: dict, m: int, dtype: str, steady: bool = False) -> list[dict]:
    """At prefill sizes (M >= 128) of int8 weights: the winner with gate_up's dot in fp16 on
    power-of-two-scaled rows of x (FP16_DOT; 2-3% faster at some H200 rows: benchmarks/NOTES.md items
    75-76). At decode it ties in the tuner's bursts and wins 1-3% on the large experts only after half a
    second at the H200's power cap (items 210, 233), so it is offered there only to a search that times
    under the cap (``steady``: ``tune --warm-s``); elsewhere those entries come from variant_ab.py's
    steady-state A/B. Not with the kernels that ignore it."""
    if dtype != "int8" or (m < 128 and not steady) or any(best.get(key) for key in ("FP16_DOT", "DEQUANT_ONCE")):
        return []
    return [dict(best, FP16_DOT=1)]


def tail_variants(best: dict, m: int, top_k: int) -> list[dict]:
    """At prefill sizes (M x k >= 512 pairs): the winner with an expert's last 16, 32 or 64 rows past a
    whole row block in a second pass on the small-M entry (TAIL_ROWS; 5-10% on the H200 where experts'
    rows sit just past whole 256-row blocks, nothing on 128-row Gluon blocks: benchmarks/NOTES.md
    items 103-104), where the winner's path takes it."""
    if m * top_k < 512 or best.get("TAIL_ROWS"):
        return []
    out = []
    for rows in (16, 32, 64):
        try:
            out.append(configs.check_config(dict(best, TAIL_ROWS=rows)))
        except ValueError:  # a decode mode, DEQUANT_ONCE, or blocks of 64 rows or fewer
            pass
    return out


def tma_usable(device: torch.device) -> bool:
    """Whether TMA entries can run here (an NVIDIA GPU of compute capability 9.0 or newer)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


GLUON_TILES = (  # gate and up as one wgmma (FUSE_GATE_UP: 3-8% a layer on every Gluon entry, benchmarks/NOTES.md
    # item 82): 8 warps on 128x128 blocks with the down GEMM on 128x256 (item 48), 3- and 4-deep rings; one
    # warpgroup on 128x64 with 3 stages (~104 KB: two programs a SM), which wins where K loops are short (item 84)
    dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, num_warps=8, num_stages=3, FUSE_GATE_UP=1,
         down=dict(BLOCK_SIZE_N=256)),
    dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, num_warps=8, num_stages=4, FUSE_GATE_UP=1,
         down=dict(BLOCK_SIZE_N=256)),
    dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=4, num_stages=3, FUSE_GATE_UP=1,
         down=dict(BLOCK_SIZE_N=128)))


def gluon_variants(best: dict, m: int, top_k: int, dtype: str, gluon_ok: bool, smem_limit: int,
                   gated: bool = True) -> list[dict]:
    """At prefill sizes (M x k >= 512 pairs) of int8 weights on a device the Gluon kernels run on
    (``gluon_ok``): the winner's blocks on the hand-pipelined Gluon wgmma kernels with a 3-deep ring and
    gate and up as one wgmma (unless it runs them already), and GLUON_TILES with the winner's
    GROUP_SIZE_M, where their accumulators and rings fit. Experts without a gate (``gated`` False) also
    get each tile twice as wide in gate_up: the same weight tile and accumulator, all of it up rows."""
    if dtype != "int8" or not gluon_ok or m * top_k < 512:
        return []
    from .kernels import gluon_moe
    own = [] if best.get("GLUON") else [dict(configs.without(best, "DEQUANT_ONCE", "SWAP_AB", "num_stages"),
                                             num_stages=3, GLUON=1, FUSE_GATE_UP=1)]
    tiles = [dict(tile, GROUP_SIZE_M=best["GROUP_SIZE_M"], GLUON=1) for tile in GLUON_TILES]
    if not gated:
        tiles += [dict(tile, BLOCK_SIZE_N=2 * tile["BLOCK_SIZE_N"]) for tile in tiles]
    return [cfg for cfg in own + tiles if cfg != best and gluon_moe.blocks_ok(cfg, smem_limit, gated)]


def wsrr_variants(best: dict, m: int, top_k: int, dtype: str, gluon_ok: bool, smem_limit: int) -> list[dict]:
    """At prefill sizes (M x k >= 512 pairs) of int8 weights where the Gluon kernels run: the winner with
    both GEMMs on the register-form kernels (WSRR), on each of TUNED_WSRR_ROWS' tiles with each of
    TUNED_WSRR_STAGES' rings that fits (the winner's other keys run where they do not apply); a winner
    already on one of them (a table's or the heuristic's WSRR entry) gets the others."""
    from .kernels import gluon_wsrr
    if dtype != "int8" or not gluon_ok or m * top_k < 512 or best.get("PAIRS"):
        return []
    base = configs.without(best, *configs.WSRR_KEYS)
    variants = [dict(base, WSRR=1, **({} if rows == 256 else {"WSRR_ROWS": rows}),
                     **({} if stages == gluon_wsrr.TILES[rows].stages else {"WSRR_STAGES": stages}))
                for rows in TUNED_WSRR_ROWS for stages in TUNED_WSRR_STAGES
                if gluon_wsrr.TILES[rows].smem_bytes(stages) <= smem_limit]
    return [cfg for cfg in variants if cfg != best]


# the register-form tiles the tuner tries (the 128-row one won at M=256 on the Mixtral shapes: NOTES item 99),
# and their ring depths (each tile's own is the better on average: items 110-112)
TUNED_WSRR_ROWS = (256, 128)
TUNED_WSRR_STAGES = (4, 5)


def gluon_usable(device: torch.device) -> bool:
    """Whether GLUON entries would run the Gluon kernels here (sm_90, and a Triton with that Gluon)."""
    from . import ops
    return (ops.gluon_moe is not None and torch.version.hip is None
            and torch.cuda.get_device_capability(device)[0] == 9)


def wave_tile_n(blocks: int, inter: int, block_n: int, slots: int, num_sms: int) -> int:
    """TILE_N for a gate_up grid of ``blocks`` row blocks: the columns of I a program computes so that
    ``blocks x cdiv(I, TILE_N)`` programs fill (nearly) whole waves of ``slots`` resident programs on each of
    ``num_sms`` SMs, as many waves as BLOCK_SIZE_N-wide programs need; at most ``block_n``, a multiple of 8.
    (A decode grid of 1.7 waves leaves 30% of the GPU's program slots idle in its last wave.)"""
    waves = math.ceil(blocks * math.ceil(inter / block_n) / (slots * num_sms))
    per_block = waves * slots * num_sms // blocks  # >= cdiv(I, block_n), so the result is <= block_n
    return min(block_n, math.ceil(math.ceil(inter / per_block) / 8) * 8)


WAVE_SLOTS = (1, 2, 3, 4, 6)  # resident gate_up programs a SM that wave_variants size grids for


def wave_variants(best: dict, m: int, top_k: int, inter: int, num_sms: int) -> list[dict]:
    """A PAIRS winner (exactly M x k row blocks; the align path's count depends on the routing) with
    narrower gate_up programs (TILE_N) that fill whole waves of 1, 2, 3, 4 or 6 resident programs a SM:
    the occupancy that holds is the one that measures fastest."""
    if (not best.get("PAIRS") or best.get("DEDUP_PAIRS") or "TILE_N" in best
            or any(best.get(key) for key in configs.TILE_N_EXCLUDES)):
        return []
    widths = {wave_tile_n(m * top_k, inter, best["BLOCK_SIZE_N"], s, num_sms) for s in WAVE_SLOTS}
    return [dict(best, TILE_N=t) for t in sorted(widths, reverse=True) if t < best["BLOCK_SIZE_N"]]


def expected_distinct_experts(m: int, num_experts: int, top_k: int) -> float:
    """Experts hit by M tokens routed uniformly at random, top-k each (without replacement)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** m)


def pairs_variants(best: dict, m: int, num_experts: int, top_k: int) -> list[dict]:
    """The winner without the align step. PAIRS (one block per (token, slot) pair) saves a launch per
    layer but reads an expert once per pair that picked it: offered only where pairs rarely share an
    expert (at most 10% more weight reads than the distinct experts, on average): M = 1 always; M = 2
    with many experts. The tuner times one routing, so it cannot see the average. (Measured on the
    H200 at M = 2: 15% slower on 8 experts, top-2; 11% faster on 64, top-6.) PAIRS + DEDUP_PAIRS reads
    each expert once (the first pair of an expert takes all its rows): offered at decode from M = 2."""
    if best.get("PAIRS"):
        return []
    best = configs.without(best, *configs.TAIL_KEYS)  # the tail pass is an align-path mode
    out = [dict(best, PAIRS=1)] if pairs_fit(m, num_experts, top_k) else []
    if dedup_fits(best, m, top_k):
        # DEDUP_PAIRS: no align launch and no re-reads (each expert's first pair takes its rows)
        out.append(dict(configs.without(best, "SUM_TOPK"), PAIRS=1, DEDUP_PAIRS=1))
    return out


def dedup_fits(best: dict, m: int, top_k: int) -> bool:
    """PAIRS + DEDUP_PAIRS is offered from M = 2, up to DEDUP_MAX_PAIRS pairs, on decode-sized blocks."""
    return 2 <= m and m * top_k <= fused_moe.DEDUP_MAX_PAIRS and best["BLOCK_SIZE_M"] <= 32


def pairs_fit(m: int, num_experts: int, top_k: int) -> bool:
    return m <= 2 and m * top_k <= 1.10 * expected_distinct_experts(m, num_experts, top_k)


def sum_topk_variants(best: dict, m: int, num_experts: int, top_k: int) -> list[dict]:
    """Where PAIRS fits: the winner with PAIRS and the down GEMM summing each token's k experts in one
    block (SUM_TOPK: no separate top-k sum launch, no [M, k, H] round trip; one block per token and
    N tile, so fewer, longer programs)."""
    if top_k == 1 or best.get("down", {}).get("SUM_TOPK") or not pairs_fit(m, num_experts, top_k):
        return []
    plain = configs.without(best, "SPLIT_K", "DEDUP_PAIRS", "SUM_LAST", *configs.TAIL_KEYS)  # all excluded by SUM_TOPK
    return [configs.with_down(dict(plain, PAIRS=1), SUM_TOPK=1)]


def sum_last_variants(best: dict, m: int, num_experts: int, top_k: int) -> list[dict]:
    """At decode sizes, PAIRS with the down GEMM's last program per token tile adding up the split-K
    partials and the token's k experts (SUM_LAST): no separate sum launch, the programs as they are,
    with the winner's split of I and the other splits (1, 2, 4; the sum no longer costs a launch).
    On the winner where it runs PAIRS (with or without DEDUP_PAIRS); on an align-path winner with
    PAIRS added where PAIRS fits, else with PAIRS + DEDUP_PAIRS where that fits (from M = 2): the
    align launch and the sum launch both go; and on the align path itself (its blocks count their
    rows' arrivals), with the winner's split (and 2 where it has none)."""
    down = best.get("down", {})
    if (down.get("SUM_LAST") or any(best.get(key) for key in ("GLUON", "WSRR"))
            or best["BLOCK_SIZE_M"] > 32 or m * top_k > fused_moe.DEDUP_MAX_PAIRS):
        return []
    best = configs.without(best, *configs.TAIL_KEYS)  # the tail pass is an align-path mode
    own = down.get("SPLIT_K", 1)

    def summed(plain: dict, splits) -> list[dict]:
        return [configs.with_down(plain, SUM_LAST=1, **({"SPLIT_K": s} if s > 1 else {}))
                for s in splits if top_k * s > 1]

    aligned = [] if best.get("PAIRS") else summed(configs.without(best, "SPLIT_K"), [own] + ([2] if own == 1 else []))
    if best.get("PAIRS"):
        plain = configs.without(best, "SUM_TOPK", "SPLIT_K")
    elif pairs_fit(m, num_experts, top_k):
        plain = configs.without(dict(best, PAIRS=1), "SPLIT_K")
    elif dedup_fits(best, m, top_k):
        plain = configs.without(dict(best, PAIRS=1, DEDUP_PAIRS=1), "SPLIT_K", "SUM_TOPK")
    else:
        return aligned
    return summed(plain, [own] + [s for s in (1, 2, 4) if s != own]) + aligned


class SearchResult:
    """Outcome of one M: the best config and its time, the default's time, what was skipped or cut."""

    def __init__(self):
        self.best: Optional[dict] = None
        self.best_s = math.inf
        self.default_s: Optional[float] = None
        self.timed = 0
        self.not_tried = 0
        self.skipped: collections.Counter = collections.Counter()
        self.first_error: Optional[str] = None


class NothingRan(RuntimeError):
    """Every candidate config of one M failed (the tuner keeps the other token counts' results)."""


def _is_fatal(exc: BaseException) -> bool:
    """A CUDA fault poisons the context: stop instead of skipping every later candidate."""
    return type(exc).__name__ == "AcceleratorError" or "CUDA error" in str(exc)


def search(candidates: Sequence[dict], measure: Callable[[dict, float], float], *,
           refine: Optional[Callable[[dict], list[dict]]] = None, refine_rounds: int = 2,
           deadline: float = math.inf, clock: Callable[[], float] = time.perf_counter,
           on_step: Optional[Callable[[SearchResult], None]] = None,
           on_more: Optional[Callable[[int], None]] = None, min_gain: float = 0.02,
           confirm_rounds: int = 3) -> SearchResult:
    """Time candidates with ``measure(cfg, best_so_far_s) -> seconds`` and keep the fastest.

    The first candidate is taken to be the default config and is always timed. A candidate whose
    ``measure`` raises (compile failure, out of shared memory or registers) is skipped and counted.
    Once ``clock()`` passes ``deadline`` the remaining candidates are not tried (counted in
    ``not_tried``). ``refine(best)`` then gives a few variants of the winner to time as well; while a
    variant wins, its own variants are timed too, up to ``refine_rounds`` rounds while the deadline
    allows, so two changes that each help (a down split and a PDL form, say) can meet in one entry. No
    config is timed twice before the confirmation below. ``on_step(result)`` follows every timing;
    ``on_more(n)`` announces the ``n`` variants a round adds (a progress bar's total counts them too).

    A winner other than the default is then confirmed: it and the default are timed again ``confirm_rounds``
    times each, alternating, and it replaces the default only where its median of those fresh timings is at
    least ``min_gain`` below the default's (``best_s`` and ``default_s`` become those medians). Each timing is
    one noisy draw (a few % at some rows), and the fastest of dozens of configs no faster than the default
    would otherwise beat it almost every time, replacing a table's entry by chance; the winner's own first
    timing is the luckiest of its draws, so only fresh ones judge it (the fold of an A/B keeps the same 2%).
    """
    result = SearchResult()
    seen: set[str] = set()  # the configs attempted, as canonical JSON
    canonical = functools.partial(json.dumps, sort_keys=True)

    def attempt(cfg: dict, is_default: bool) -> None:
        seen.add(canonical(cfg))
        try:
            seconds = measure(cfg, result.best_s)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is just not a candidate
            if _is_fatal(exc):
                raise
            result.skipped[type(exc).__name__] += 1
            result.first_error = result.first_error or f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        else:
            result.timed += 1
            if is_default:
                result.default_s = seconds
            if seconds < result.best_s:
                result.best, result.best_s = dict(cfg), seconds
        if on_step is not None:
            on_step(result)

    for index, cfg in enumerate(candidates):
        if index > 0 and clock() > deadline:
            result.not_tried = len(candidates) - index
            break
        attempt(cfg, index == 0)
    refined = None
    for round_ in range(refine_rounds if refine is not None else 0):
        if result.best is None or result.best is refined or (round_ > 0 and clock() > deadline):
            break  # nothing ran, the last round's variants did not beat what they refined, or time is up
        refined = result.best
        variants = {canonical(cfg): cfg for cfg in refine(refined)}  # (two variants may be the same config)
        variants = [cfg for key, cfg in variants.items() if key not in seen]
        if on_more is not None:
            on_more(len(variants))
        for cfg in variants:
            attempt(cfg, False)
    if result.default_s is not None and result.best is not None and result.best != candidates[0] and confirm_rounds:
        fresh: dict[int, list[float]] = {0: [], 1: []}  # 0: the default, 1: the winner
        try:
            for round_ in range(confirm_rounds):
                for which in ((0, 1) if round_ % 2 == 0 else (1, 0)):
                    fresh[which].append(measure(candidates[0] if which == 0 else result.best, math.inf))
        except Exception as exc:  # noqa: BLE001 - a config that ran once and not again is not a winner
            if _is_fatal(exc):
                raise
            fresh[1] = [math.inf]
        default_s, best_s = (statistics.median(fresh[0] or [result.default_s]), statistics.median(fresh[1]))
        result.default_s = default_s
        if best_s <= default_s * (1 - min_gain):
            result.best_s = best_s
        else:  # no winner clear of the noise: the config serving M stays
            result.best, result.best_s = dict(candidates[0]), default_s
    if result.best is None:
        raise NothingRan(f"all {len(candidates)} candidate configs failed; the first error was {result.first_error}")
    return result


def write_table(best: dict[int, dict], num_experts: int, inter: int, device: str, fmt: str,
                out_dir: Optional[os.PathLike] = None, *, merge: bool = True, gated: bool = True) -> Path:
    """Write (merged into an existing table of the same name, new M values winning) and return the path.

    Clears ``get_config``'s table cache so the new table takes effect in this process too.
    """
    folder = Path(out_dir) if out_dir is not None else configs.user_config_dir()
    path = folder / configs.table_name(num_experts, inter, device, fmt, gated)
    best = {int(m): configs.check_config(cfg) for m, cfg in best.items()}
    # Read, merge and replace under the folder's lock: two tunes of one shape at once (other token counts, or two
    # GPUs of one kind) each wrote the table it had read, and the other's entries were lost
    with locked_folder(folder):
        table: dict[int, dict] = {}
        if merge and path.is_file():
            try:
                table = configs.read_table(path)
            except ValueError as e:
                logger.warning("experts_int8: replacing %s", e)
        table.update(best)
        # (a temporary file of its own: two tunes at once must not share one)
        write_atomic(path, json.dumps({str(m): table[m] for m in sorted(table)}, indent=4) + "\n")
    configs.clear_table_cache()
    return path


class _Progress:
    """tqdm when installed, otherwise a line every 10%."""

    def __init__(self, total: int, enabled: bool, log: Callable[[str], None]):
        self._bar = None
        self._total, self._done, self._next, self._log, self._enabled = total, 0, 0.1, log, enabled
        self._desc = ""
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, unit="cfg", dynamic_ncols=True)
            except ImportError:
                pass

    def describe(self, desc: str) -> None:
        self._desc = desc
        if self._bar is not None:
            self._bar.set_description(desc)

    def step(self, postfix: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)
        elif self._enabled and self._done >= self._next * self._total:
            self._log(f"  {self._done}/{self._total} configs timed ({self._desc}, {postfix})")
            self._next += 0.1

    def extend(self, n: int) -> None:
        """``n`` more steps than the total said (a search's refine rounds)."""
        self._total += n
        if self._bar is not None and n:
            self._bar.total += n
            self._bar.refresh()

    def advance(self, n: int) -> None:
        """Count ``n`` steps that will not run (a search cut short), without logging them."""
        self._done += n
        if self._bar is not None and n:
            self._bar.update(n)

    def write(self, line: str) -> None:
        """Log a line without tearing the bar (tqdm clears it, then redraws it under the line)."""
        if self._bar is None:
            self._log(line)
        else:
            with self._bar.external_write_mode():
                self._log(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _result_line(dtype: str, m: int, r: SearchResult) -> str:
    gain = f"{r.default_s / r.best_s:5.2f}x vs current" if r.default_s else "current config failed"
    skipped = f", skipped {sum(r.skipped.values())} ({dict(r.skipped)})" if r.skipped else ""
    cut = f", {r.not_tried} not tried (time budget)" if r.not_tried else ""
    return (f"  {dtype:4s} M={m:<5d} {r.best_s * 1e6:9.1f} us  {gain}  {_short(r.best)}  "
            f"[{r.timed} timed{skipped}{cut}]")


def _smem_limit() -> int:
    try:
        return configs.max_shared_memory(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - the default is right for Hopper
        return DEFAULT_SMEM


class WrongResult(ValueError):
    """A candidate config whose output differs from the reference path's (the search skips it)."""


def checked_call(cfg: dict, call: Callable[[], torch.Tensor], expected: torch.Tensor, tol: float = 3e-2,
                 row_tol: float = 0.1) -> None:
    """Run ``call`` under ``cfg`` and raise WrongResult unless its output is within ``tol`` (relative
    norm) of ``expected``, and every token's row within ``row_tol`` (relative to the rows' mean norm,
    so a few wrong tokens in a large batch do not hide in the total): a candidate is only timed once
    it computes the layer correctly, so no kernel variant can win a table on a wrong answer."""
    with configs.override_config(cfg):
        got = call()
    check_output(got, expected, tol, row_tol)


def check_output(got: torch.Tensor, expected: torch.Tensor, tol: float = 3e-2, row_tol: float = 0.1) -> None:
    """Raise WrongResult unless ``got`` is within ``checked_call``'s bounds of ``expected``."""
    diff, ref = got.double() - expected.double(), expected.double()
    err = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
    row_err = (diff.norm(dim=-1).max() / ref.norm(dim=-1).mean().clamp_min(1e-30)).item()
    if not (err <= tol and row_err <= row_tol):  # (NaN fails too)
        raise WrongResult(f"output differs from the reference path by {err:.3g} (relative norm; worst token "
                          f"{row_err:.3g})")


def _gpu_measure(x, layers, routing, reps: int, activation: str = "silu", calls: Optional[int] = None,
                 warm_s: float = 0.0, clamp: Optional[dict] = None) -> Callable[[dict, float], float]:
    """Seconds per ``fused_experts`` call (with ``activation``, its ``clamp`` options and the layers' biases)
    under a forced config, timed as the benchmark times it: ``calls`` calls cycling over the layers and the routing
    draws (the bench's :func:`~experts_int8.bench.calls_per_graph`; default one sweep of both) captured in a CUDA
    graph, replays between events. (Eager calls would measure the host at decode sizes, where a call's launches
    take longer than its kernels.) ``warm_s``: untimed replays for about that long before the timed ones (the bench's
    ``--warm-s``). Each config's output on the first layer is first checked against the torch reference path."""
    from . import bench
    from .ops import fused_experts

    layer, (weights, ids) = layers[0], routing[0]

    def first_layer(backend: str = "auto") -> torch.Tensor:
        return fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale,
                             w2_scale=layer.w2_scale, backend=backend, activation=activation,
                             w13_bias=layer.w13_bias, w2_bias=layer.w2_bias, **(clamp or {}))

    expected = first_layer("torch")

    def measure(cfg: dict, best_s: float) -> float:
        checked_call(cfg, first_layer, expected)
        with configs.override_config(cfg):
            seconds, _ = bench.time_calls(x, layers, routing, calls or math.lcm(len(layers), len(routing)),
                                          reps=reps, warmup=1, give_up_above_s=2 * best_s, activation=activation,
                                          warm_s=warm_s, clamp=clamp)
        return seconds

    return measure


def tune(num_experts: int, hidden: int, inter: int, top_k: int, dtypes: Iterable[str] = ("int8", "bf16"),
         ms: Sequence[int] = DEFAULT_MS, out_dir: Optional[os.PathLike] = None, *, max_candidates: int = 32,
         reps: int = 5, pool_gb: float = 4.0, budget_s: Optional[float] = 300.0, progress: bool = True,
         settle_s: float = 1.0, warm_s: float = 0.0, gated: bool = True, activation: str = "silu",
         biases: bool = False, clamp: Optional[dict] = None, log: Callable[[str], None] = print) -> dict[str, Path]:
    """Search block configs for experts ``[E, 2I, H]`` / ``[E, H, I]`` with top-k routing on this GPU
    (``gated`` False: experts without a gate, ``[E, I, H]``, into tables of their own: ``...,no_gate.json``),
    timing and checking every candidate with the experts' ``activation`` and, with ``biases``, expert
    biases (the table is the same: GPT-OSS's clamped SwiGLU with biases tunes E and I's table), and ``clamp``,
    a clamped SwiGLU's options (``fused_experts``' ``swiglu_limit``, ``swiglu_alpha``, ``limit_after_act``).

    ``inter`` is the per-rank intermediate size (divide by the tensor-parallel size first). Writes one
    table per weight format into ``out_dir`` (default: the user cache, used automatically by
    ``get_config``) and returns ``{dtype: path}``. ``budget_s`` (None: unbounded) bounds the search
    time: each M gets an even share of what is left, and past its share still times its current config
    and one round of variants of its winner, then confirms a new winner (:func:`search`), so a tune runs
    over, the more so the shorter the budget (200 s took 270 on GPT-OSS-120B's TP=4 shard, 240 over 330
    on TP=2: benchmarks/results/s42; 150 s took 290 on deepseek-v2-lite's 28 M and format pairs,
    results/s44b; 200 s took 215-257 over 14 M of bf16, results/s49); a search cut short keeps its best
    config so far and says so in the summary. ``settle_s``: the GPU idles that long after each weight
    pool's fill, whose power cap would otherwise slow the first M's first timings (the config serving it
    now among them; :func:`bench.settle`). ``warm_s``: untimed replays for about that long before each
    candidate's timed ones, so candidates are ranked on the clock held work runs at under the power cap, as
    the bench times its rows (``bench --warm-s``; on an H200 int8 decode meets the cap, NOTES items 204-206);
    each timing then takes that much longer, so a budget times fewer candidates.
    """
    from . import bench

    bench.check_form(gated, activation, clamp)
    if not torch.cuda.is_available():
        raise RuntimeError("tuning needs a CUDA GPU, and torch.cuda.is_available() is False")
    bench.check_not_interpreting()
    dtypes = list(dict.fromkeys(dtypes))
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}: use {' and/or '.join(DTYPES)}")
    if not bench.is_valid_shape(num_experts, hidden, inter, top_k):
        raise ValueError(f"bad shape E={num_experts}, H={hidden}, I={inter}, k={top_k}: positive, with k <= E")
    ms = sorted(set(int(m) for m in ms))
    if not ms or ms[0] < 1:
        raise ValueError(f"token counts must be positive integers, got {ms}")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not 0 <= warm_s <= 60:
        raise ValueError(f"warm_s must be between 0 and 60 seconds, got {warm_s}")

    check_writable_dir(out_dir if out_dir is not None else configs.user_config_dir(), "the tables' folder")
    bench.check_kernel_runs()
    device = torch.device("cuda", torch.cuda.current_device())
    gpu = configs.device_name(device)
    smem = _smem_limit()
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    gluon_ok = gluon_usable(device)
    tma_ok = tma_usable(device)
    pdl_ok = fused_moe.pdl_supported(device)
    started = time.perf_counter()
    # Candidates are timed as the bench times its rows: pools sized for this device's L2 within the bench's
    # budget, and as many calls a graph replay as the bench captures (from the same two ceilings)
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None) or bench.DEFAULT_L2_BYTES
    copy_bps, matmul_fps = bench.measure_copy_bandwidth(), bench.measure_matmul_rate()
    # The config serving each M now (shipped or cached table, else the heuristic) goes first, so a
    # table entry is only replaced by one measured faster here.
    plan = {(d, m): candidate_configs(m, num_experts, hidden, inter, top_k, DTYPES[d], smem_limit=smem,
                                      max_candidates=max_candidates,
                                      default=configs.get_config(m, num_experts, inter, top_k, DTYPES[d], device,
                                                                 gated))
            for d in dtypes for m in ms}
    form = bench.form_label(gated, activation, biases, clamp)
    log(f"tuning E={num_experts} H={hidden} I={inter} k={top_k}{', ' + form if form else ''} on {gpu}: "
        f"{', '.join(dtypes)} at M = "
        f"{', '.join(map(str, ms))}; {sum(map(len, plan.values()))} timings, "
        f"{len({json.dumps(c, sort_keys=True) for c in sum(plan.values(), [])})} distinct configs")
    bar = _Progress(sum(map(len, plan.values())), progress, log)
    slots_left = len(plan)
    paths: dict[str, Path] = {}
    failed: list[str] = []
    try:
        for d in dtypes:
            num_layers = bench.pool_layers_that_fit(num_experts, hidden, inter, top_k, d, l2_bytes=l2,
                                                    budget_bytes=pool_gb * 1e9,
                                                    free_bytes=torch.cuda.mem_get_info(device)[0], gated=gated)
            layers = bench.make_layers(num_layers, num_experts, hidden, inter, d, device, gated, biases)
            bench.settle(settle_s)
            results: dict[int, SearchResult] = {}
            for m in ms:
                bar.describe(f"{d} M={m}")
                x = torch.randn(m, hidden, dtype=torch.bfloat16, device=device)
                routing = bench.routing_draws(m, num_experts, top_k, device)  # as the bench routes
                _, calls = bench.row_plan(routing, len(layers), m=m, hidden=hidden, inter=inter, top_k=top_k, dtype=d,
                                          copy_bytes_per_s=copy_bps, matmul_flops_per_s=matmul_fps, gated=gated)
                float_config = configs.get_config(m, num_experts, inter, top_k, torch.bfloat16, device, gated)
                deadline = math.inf
                if budget_s is not None:
                    left = budget_s - (time.perf_counter() - started)
                    deadline = time.perf_counter() + max(0.0, left) / slots_left
                slots_left -= 1
                def variants(cfg, m=m, d=d):
                    return (group_variants(cfg, m, num_experts, top_k)
                            + split_k_variants(cfg, m, num_experts, hidden, top_k, num_sms)
                            + down_tile_variants(cfg, DTYPES[d].itemsize, smem)
                            + down_pipeline_variants(cfg, DTYPES[d].itemsize, smem)
                            + fuse_variants(cfg, d) + pairs_variants(cfg, m, num_experts, top_k)
                            + sum_topk_variants(cfg, m, num_experts, top_k) + swap_variants(cfg)
                            + sum_last_variants(cfg, m, num_experts, top_k)
                            + dequant_variants(cfg, m, d, float_config, tma_ok) + tma_variants(cfg, tma_ok)
                            + fp16_dot_variants(cfg, m, d, steady=warm_s > 0)
                            + gluon_variants(cfg, m, top_k, d, gluon_ok, smem, gated)
                            + wsrr_variants(cfg, m, top_k, d, gluon_ok, smem)
                            + tail_variants(cfg, m, top_k)
                            + wave_variants(cfg, m, top_k, inter, num_sms) + late_epilogue_variants(cfg)
                            + pdl_variants(cfg, m, top_k, pdl_ok))

                try:
                    measure = _gpu_measure(x, layers, routing, reps, activation, calls, warm_s, clamp)
                    result = search(plan[(d, m)], measure,
                                    deadline=deadline, refine=variants, on_more=bar.extend,
                                    on_step=lambda r: bar.step(f"best {r.best_s * 1e6:.1f} us" if r.best
                                                               else "none yet"))
                except NothingRan as e:  # the other token counts' results still make a table
                    failed.append(f"{d} M={m}: {e}")
                    bar.write(f"  {d:4s} M={m:<5d} failed: {e}")
                    continue
                bar.advance(result.not_tried)
                results[m] = result
            del layers
            torch.cuda.empty_cache()
            if not results:
                continue
            paths[d] = write_table({m: r.best for m, r in results.items()}, num_experts, inter, gpu,
                                   configs.weight_format(DTYPES[d]), out_dir, gated=gated)
            # each format's winners as soon as its table is written, so a tune cut short keeps them
            for m, r in results.items():
                bar.write(_result_line(d, m, r))
            bar.write(f"wrote {paths[d]}")
    finally:
        bar.close()

    if out_dir is not None and Path(out_dir).resolve() != configs.user_config_dir().resolve():
        log(f"note: get_config reads {configs.user_config_dir()} (set EXPERTS_INT8_CACHE to change it), "
            f"not {out_dir}")
    log(f"tuning took {time.perf_counter() - started:.0f} s")
    if failed:
        raise RuntimeError(f"no candidate config ran at {len(failed)} of the {len(plan)} token counts and formats "
                           f"(their tables keep the entries they had): " + "; ".join(failed))
    return paths


def _short(cfg: dict) -> str:
    flags = [k for k in ("SWAP_AB", "FUSE_GATE_UP", "PAIRS", "DEDUP_PAIRS", "DEQUANT_ONCE", "GLUON", "WSRR",
                         "TMA", "FP16_DOT", "LATE_EPILOGUE") if cfg.get(k)]
    flags += [f"{k}={cfg[k]}" for k in ("WSRR_ROWS", "WSRR_STAGES", *configs.TAIL_KEYS, "TILE_N", "PDL") if cfg.get(k)]
    down = cfg.get("down")
    return (f"M{cfg['BLOCK_SIZE_M']} N{cfg['BLOCK_SIZE_N']} K{cfg['BLOCK_SIZE_K']} G{cfg['GROUP_SIZE_M']} "
            f"w{cfg['num_warps']} s{cfg['num_stages']}" + "".join(f" {f}" for f in flags)
            + (f" down{json.dumps(down, separators=(',', ':'))}" if down else ""))
