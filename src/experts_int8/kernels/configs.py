"""Block sizes for the MoE GEMMs: tuned tables when we have them, heuristics otherwise.

Tables are JSON files named ``E={E},N={N},device={device},dtype={dtype}.json`` where N is the
intermediate size I of the (possibly tensor-parallel-sharded) experts, ``device`` the GPU name
with spaces as underscores and ``dtype`` the *weight* format (``int8_w8a16`` or ``bf16``/``fp16``/
``fp32``). Experts without a gate (w13 ``[E, I, H]``: ``act(up)``) have tables of their own, the name
ending ``,no_gate.json``: their best blocks differ (one weight tile a K step) and gated ones may not even
fit them. Each maps a token count M (as a string) to a config; :func:`table_key` picks the entry.
A table in the user's tuning cache (written by ``experts-int8 tune``) overrides the package's entries for
the token counts it holds; a cached table that does not read is ignored with a warning naming it.

``with override_config(cfg):`` forces one config for every ``get_config`` call in the block (the
tuner times candidates this way; tests use it to pin block sizes).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import os
import re
from pathlib import Path
from typing import Iterator, Optional

import torch

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent / "configs"
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
# Optional: SWAP_AB (0/1) puts the weight tile on the left of the dot; "down" holds overrides of the
# keys above (all but BLOCK_SIZE_M, which the align step fixes for both GEMMs) for the down GEMM;
# DEQUANT_ONCE (int8 weights, large M) dequantizes the layer's experts first and runs float GEMMs;
# GLUON (int8 weights, sm_90, prefill) runs the GEMMs on kernels.gluon_moe's hand-pipelined wgmma kernels;
# TMA (sm_90+, the Triton GEMMs) loads weight tiles by tensor-descriptor copies (also a "down" override);
# FP16_DOT (int8 weights, bf16 x) runs gate_up's dot in fp16 on x's rows scaled by powers of two;
# TRIM_TAIL 0 keeps the GLUON kernels from running an expert's half-empty last row block on half the rows;
# WSRR (int8 weights, sm_90, prefill) runs both GEMMs on kernels.gluon_wsrr's warp-specialized register-form
# kernels where they apply (elsewhere the entry's other keys), on their tile of WSRR_ROWS (256 or 128) tokens
# with a ring of WSRR_STAGES (2-8; default the tile's own, kernels.gluon_wsrr.TILES) K tiles;
# TAIL_ROWS (prefill entries) sends an expert's last 1..TAIL_ROWS rows past a whole row block to a second pass
# on the entry for TAIL_ENTRY_ROWS rows an expert (tail_config) instead of a block of their own;
# TILE_N (the Triton gate_up, at most BLOCK_SIZE_N) is the columns of I a program computes, so that the grid
# fills whole waves of resident programs (tune.wave_tile_n);
# LATE_EPILOGUE 1 (the Triton GEMMs; also a "down" override) loads the epilogue's operands (scales, biases,
# routing weights) after the K loop instead of before it, for tiles that would lose a resident program a SM
# to the registers that hold them through the loop;
# PDL (the Triton GEMMs, sm_90+) launches both as programmatic dependents: 1 lets the next kernel launch at a
# program's start, 2 after its K loop (kernels.fused_moe's docstring); with it, the "down" override
# PDL_PREFETCH (1-16) has the down GEMM's programs, before they wait for gate_up, load what does not depend
# on it and ask L2 for their first PDL_PREFETCH K tiles of weights (not with SUM_TOPK, whose programs wait first).
OPTIONAL_KEYS = ("SWAP_AB", "FUSE_GATE_UP", "PAIRS", "DEDUP_PAIRS", "DEQUANT_ONCE", "GLUON", "TMA",
                 "FP16_DOT", "TRIM_TAIL", "WSRR", "WSRR_ROWS", "WSRR_STAGES", "TAIL_ROWS", "TAIL_ENTRY_ROWS", "TILE_N",
                 "LATE_EPILOGUE", "PDL", "down")
# Keys that mean a decode mode (one block per pair, a sum inside the down launch), and keys of the
# main pass only: the tail pass's entry drops both (it may run the Gluon kernels, not the register form).
DECODE_KEYS = ("PAIRS", "DEDUP_PAIRS", "SUM_TOPK", "SUM_LAST", "SPLIT_K")
TAIL_KEYS = ("TAIL_ROWS", "TAIL_ENTRY_ROWS")  # an align-path mode: a variant adding a decode mode drops them
# Keys of entries whose GEMMs are not the two Triton kernels (fused_moe's gate_up and down), so keys that only
# those kernels read (TILE_N, LATE_EPILOGUE, PDL) do nothing there
OTHER_KERNEL_KEYS = ("GLUON", "WSRR", "DEQUANT_ONCE")
# Keys whose kernels or loads do not take TILE_N (TMA's copies load whole tiles; the others run other kernels)
TILE_N_EXCLUDES = ("TMA", *OTHER_KERNEL_KEYS)
WSRR_KEYS = ("WSRR", "WSRR_ROWS", "WSRR_STAGES")
MAIN_PASS_KEYS = (*WSRR_KEYS, "DEQUANT_ONCE", *TAIL_KEYS)
# By default the tail pass runs the entry tuned for this many rows an expert (benchmarks/NOTES.md item
# 103: the best of the small entries for tails of up to 64 rows on the Mixtral shapes and jamba).
TAIL_ENTRY_ROWS = 16

MAX_BLOCK = 256  # the largest block size a config may name (the tuner's largest too)

_OVERRIDE: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("experts_int8_config", default=None)


def check_config(config: dict, *, _nested: bool = False) -> dict:
    """A validated copy of ``config``: the keys of CONFIG_KEYS (plus optional SWAP_AB, FUSE_GATE_UP,
    PAIRS, DEDUP_PAIRS (with PAIRS), DEQUANT_ONCE, GLUON, TMA, FP16_DOT, TRIM_TAIL,
    WSRR, WSRR_ROWS and WSRR_STAGES (with WSRR), TAIL_ROWS, TAIL_ENTRY_ROWS (with TAIL_ROWS), TILE_N, LATE_EPILOGUE,
    PDL (0-2) and "down", whose overrides may add SPLIT_K, TMA, SUM_LAST, LATE_EPILOGUE, PDL_PREFETCH (with PDL) or,
    with PAIRS, SUM_TOPK for the down GEMM),
    positive ints, block sizes powers of two from 16 (``tl.dot``'s minimum) to MAX_BLOCK."""
    required = () if _nested else CONFIG_KEYS
    allowed = (set(CONFIG_KEYS) - {"BLOCK_SIZE_M"}
               | {"SWAP_AB", "SPLIT_K", "SUM_TOPK", "SUM_LAST", "TMA", "LATE_EPILOGUE", "PDL_PREFETCH"}
               if _nested
               else set(CONFIG_KEYS) | set(OPTIONAL_KEYS))
    if not isinstance(config, dict) or not set(required) <= set(config) or not set(config) <= allowed:
        got = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"a MoE config needs the keys {list(CONFIG_KEYS)} (optionally {list(OPTIONAL_KEYS)}), "
                         f"got {got}")
    out = dict(config)
    for key, value in out.items():
        if key == "down":
            out[key] = check_config(value, _nested=True)
        elif key in ("SWAP_AB", "FUSE_GATE_UP", "PAIRS", "DEDUP_PAIRS", "DEQUANT_ONCE", "GLUON",
                     "SUM_TOPK", "SUM_LAST", "TMA", "FP16_DOT", "TRIM_TAIL", "WSRR", "LATE_EPILOGUE"):
            if value not in (0, 1):
                raise ValueError(f"config[{key!r}] must be 0 or 1, got {value!r}")
            out[key] = int(value)
        elif key == "PDL":
            if value not in (0, 1, 2):
                raise ValueError(f"config['PDL'] must be 0 (off), 1 or 2 (the next kernel launched at a program's "
                                 f"start or after its K loop), got {value!r}")
            out[key] = int(value)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config[{key!r}] must be a positive int, got {value!r}")
    down = out.get("down", {})
    if down.get("SUM_TOPK") and (not out.get("PAIRS") or down.get("SPLIT_K", 1) > 1):
        raise ValueError("config: down SUM_TOPK (one block per token) needs PAIRS and no SPLIT_K")
    align_path_gluon = not out.get("PAIRS") and (out.get("GLUON") or out.get("WSRR"))  # (whose down does not count)
    if down.get("SUM_LAST") and (down.get("SUM_TOPK") or align_path_gluon):
        raise ValueError("config: down SUM_LAST (the last program of a token's tile adds it up) runs on the Triton "
                         "kernels: without SUM_TOPK, and on the align path without GLUON or WSRR")
    if out.get("DEDUP_PAIRS") and (not out.get("PAIRS") or down.get("SUM_TOPK")):
        raise ValueError("config: DEDUP_PAIRS refines PAIRS (and excludes down SUM_TOPK); set PAIRS=1")
    if out.get("GLUON") and out.get("DEQUANT_ONCE"):
        raise ValueError("config: GLUON (the int8 wgmma kernels) and DEQUANT_ONCE (float weights) exclude each other")
    if "WSRR_ROWS" in out and (out["WSRR_ROWS"] not in (128, 256) or not out.get("WSRR")):
        raise ValueError(f"config: WSRR_ROWS (the register-form kernels' tile) is 128 or 256, with WSRR=1; got "
                         f"{out['WSRR_ROWS']!r}")
    if "WSRR_STAGES" in out and (not 2 <= out["WSRR_STAGES"] <= 8 or not out.get("WSRR")):
        raise ValueError(f"config: WSRR_STAGES (the register-form kernels' ring depth) is 2 to 8, with WSRR=1; got "
                         f"{out['WSRR_STAGES']!r}")
    if out.get("WSRR") and out.get("PAIRS"):
        raise ValueError("config: WSRR (the register-form prefill kernels) excludes the decode mode PAIRS")
    decode = any(out.get(key) or down.get(key) for key in DECODE_KEYS if key != "SPLIT_K")
    block = out.get("WSRR_ROWS", 256) if out.get("WSRR") else out.get("BLOCK_SIZE_M", 0)
    if "TAIL_ROWS" in out and (decode or down.get("SPLIT_K", 1) > 1 or out.get("DEQUANT_ONCE")
                               or out["TAIL_ROWS"] >= block):
        raise ValueError(f"config: TAIL_ROWS (an expert's last rows to a second pass) is below the row block "
                         f"(WSRR_ROWS with WSRR, else BLOCK_SIZE_M), on the align path without SPLIT_K, a decode "
                         f"mode or DEQUANT_ONCE; got {out['TAIL_ROWS']!r}")
    if "TAIL_ENTRY_ROWS" in out and "TAIL_ROWS" not in out:
        raise ValueError("config: TAIL_ENTRY_ROWS (which entry runs the tail pass) needs TAIL_ROWS")
    if "TILE_N" in out and (out["TILE_N"] > out.get("BLOCK_SIZE_N", 0) or any(out.get(k) for k in TILE_N_EXCLUDES)):
        raise ValueError(f"config: TILE_N (columns of I a Triton gate_up program computes) is at most BLOCK_SIZE_N, "
                         f"without TMA (whose copies load whole tiles), GLUON, WSRR or DEQUANT_ONCE; "
                         f"got {out['TILE_N']!r}")
    if out.get("PDL") and any(out.get(k) for k in OTHER_KERNEL_KEYS):
        raise ValueError("config: PDL applies to the Triton GEMMs, not with GLUON, WSRR or DEQUANT_ONCE")
    if "PDL_PREFETCH" in down and (not out.get("PDL") or down["PDL_PREFETCH"] > 16):
        raise ValueError(f"config: down PDL_PREFETCH (K tiles of weights the down GEMM asks L2 for before it waits "
                         f"for gate_up) is 1 to 16, with PDL; got {down['PDL_PREFETCH']!r}")
    if out.get("FUSE_GATE_UP") and out.get("SWAP_AB"):
        raise ValueError("config: FUSE_GATE_UP applies to the unswapped gate_up GEMM; drop SWAP_AB or FUSE_GATE_UP")
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        # (above 256 a tile's accumulator or operands outgrow a program's registers and shared memory: such a
        # table entry would compile for minutes, then fail, at the first forward that looks it up)
        if key in out and (not 16 <= out[key] <= MAX_BLOCK or out[key] & (out[key] - 1)):
            raise ValueError(f"config[{key!r}] must be a power of two from 16 to {MAX_BLOCK}, got {out[key]}")
    if "num_warps" in out and (out["num_warps"] > 32 or out["num_warps"] & (out["num_warps"] - 1)):
        # (Triton refuses other counts at every launch; its interpreter ignores them, so CPU tests would not see it)
        raise ValueError(f"config['num_warps'] must be a power of two up to 32, got {out['num_warps']}")
    return out


def without(config: dict, *keys: str) -> dict:
    """A copy of ``config`` without ``keys``, at the top level and in its "down" overrides (an empty
    "down" is dropped): how a variant turns off options that another one excludes."""
    out = {key: value for key, value in config.items() if key not in keys and key != "down"}
    down = {key: value for key, value in config.get("down", {}).items() if key not in keys}
    return {**out, "down": down} if down else out


def with_down(config: dict, **keys) -> dict:
    """A copy of ``config`` whose "down" overrides also set ``keys`` (the down GEMM's own tile, pipeline or
    mode; the other overrides stay)."""
    return {**config, "down": {**config.get("down", {}), **keys}}


def split_config(config: dict) -> tuple[dict, dict]:
    """``(gate_up, down)`` kernel configs from one table entry."""
    gate_up = {key: value for key, value in config.items() if key != "down"}
    return gate_up, {**gate_up, **config.get("down", {})}


@contextlib.contextmanager
def override_config(config: dict) -> Iterator[dict]:
    """Within the block, ``get_config`` returns ``config`` for every shape and M (context-local,
    so threads and nested blocks don't interfere). Yields the validated config."""
    token = _OVERRIDE.set(check_config(config))
    try:
        yield _OVERRIDE.get()
    finally:
        _OVERRIDE.reset(token)


def user_config_dir() -> Path:
    """Where ``experts-int8 tune`` writes tables: ``configs`` under ``$EXPERTS_INT8_CACHE``, else under
    ``$XDG_CACHE_HOME/experts_int8`` or ``~/.cache/experts_int8``."""
    # expanduser: a quoted '~/...' reaches us unexpanded, and would name a folder called '~' in the working one
    root = os.environ.get("EXPERTS_INT8_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache",
                                                                "experts_int8")
    return Path(os.path.expanduser(root)) / "configs"


def weight_format(weight_dtype: torch.dtype) -> str:
    return {
        torch.int8: "int8_w8a16",
        torch.bfloat16: "bf16",
        torch.float16: "fp16",
        torch.float32: "fp32",
    }[weight_dtype]


def device_name(device: Optional[torch.device] = None) -> str:
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return "cpu"
    return _cuda_name(_index(device))


def _index(device: Optional[torch.device]) -> int:
    return torch.cuda.current_device() if device is None or device.index is None else device.index


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    # spaces (and anything else a file name cannot hold, e.g. "/") as underscores
    return re.sub(r"[^\w.-]", "_", torch.cuda.get_device_name(index))


def table_name(num_experts: int, inter: int, device: str, fmt: str, gated: bool = True) -> str:
    return f"E={num_experts},N={inter},device={device},dtype={fmt}{'' if gated else ',no_gate'}.json"


def read_table(path: os.PathLike) -> dict[int, dict]:
    """A table file's validated entries by M; ValueError naming the file (and the entry) when it is not one."""
    # (JSONDecodeError is a ValueError; RecursionError: arrays nested past Python's stack, which went past the
    # cache's warning and failed every MoE layer)
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not a readable JSON table ({e})") from e
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: a table maps token counts to configs, got {json.dumps(raw)[:80]}")
    table = {}
    for key, config in raw.items():
        try:
            m = int(key)
            if m < 1 or str(m) != key:
                raise ValueError
        except ValueError:
            raise ValueError(f"{path}: {key!r} is not a token count (a positive integer)") from None
        try:
            table[m] = check_config(config)
        except ValueError as e:
            raise ValueError(f"{path}, M={m}: {e}") from None
    return table


def load_table(num_experts: int, inter: int, device: str, fmt: str, gated: bool = True) -> Optional[dict[int, dict]]:
    """The tuned table of a shape on ``device``: the package's entries, each M the user's cache also holds
    taken from there (a tune of a few token counts keeps the package's other entries). None: neither has one."""
    return _load_table(table_name(num_experts, inter, device, fmt, gated), user_config_dir(), device != "cpu")


@functools.lru_cache(maxsize=None)
def _load_table(name: str, user_dir: Path, warn: bool) -> Optional[dict[int, dict]]:
    shipped, user = PACKAGE_DIR / name, user_dir / name
    table = read_table(shipped) if shipped.is_file() else None
    if user.is_file():
        try:
            table = {**(table or {}), **read_table(user)}
            logger.info("experts_int8: using tuned MoE configs %s%s", user,
                        f" (other token counts: {shipped})" if shipped.is_file() else "")
        except ValueError as e:  # a broken cache must not stop every MoE layer (nor the tune that rewrites it)
            logger.warning("experts_int8: ignoring %s; delete it or run `experts-int8 tune` again", e)
    elif table is not None:
        logger.info("experts_int8: using tuned MoE configs %s", shipped)
    if table is None and warn:
        logger.warning("experts_int8: no tuned MoE configs for %s; using heuristic block sizes", name)
    return table


def clear_table_cache() -> None:
    """Forget the tables read so far (the tuner calls it after writing one)."""
    _load_table.cache_clear()


def pipeline_smem_bytes(config: dict, weight_bytes: int, act_bytes: int = 2, weight_tiles: int = 2) -> int:
    """Shared memory a program of one Triton GEMM takes (its compile's ``metadata.shared``), in bytes, as
    Triton 3.6-3.9 allocate it for sm_90, the most of any GPU before Blackwell: the software pipeline's rings of
    activation tiles and ``weight_tiles`` weight tiles (gate_up, the larger of the two GEMMs, has two: gate
    and up; down has one).

    - A dot of fewer than 64 rows (BLOCK_SIZE_M, or BLOCK_SIZE_N under SWAP_AB; every dot before Hopper) is an
      ``mma.sync`` whose operands pass through registers: rings of ``num_stages - 1`` tiles (the next tiles
      load while the dot runs on the last ones loaded).
    - On Hopper a dot of 64 rows or more is a ``wgmma``, which reads its shared-memory operands while it
      runs: their rings hold ``num_stages`` tiles. int8 weights, converted in registers, keep a ring of
      ``num_stages - 1`` and store the converted tile for the dot (one, which gate's and up's dots take in
      turn; twice as wide with FUSE_GATE_UP), or, under SWAP_AB, give the dot its register operand.
    - After the K loop the pipeline's memory may hold the output tile on its way to the store (a tile of
      128 x 128 and K tiles of 16: 32 KB where the rings take 24 KB): at least ``BLOCK_SIZE_M x BLOCK_SIZE_N``
      fp32 values are counted.
    - A few bytes a stage of barriers (TMA's copies; Blackwell's MMAs).

    tests/test_smem_estimate.py compares it with compiles. On sm_100 (Triton 3.9) an int8 gate_up of 64 rows or
    more stores a converted tile for each of gate and up, one more than counted here. A ``num_stages`` of 1 is
    counted as 2."""
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    stages = max(2, config["num_stages"])
    act, weights = bm * bk * act_bytes, weight_tiles * bk * bn * weight_bytes
    swap = bool(config.get("SWAP_AB"))
    if (bn if swap else bm) < 64:  # mma.sync: both rings num_stages - 1 deep
        rings = (stages - 1) * (act + weights)
    elif weight_bytes == act_bytes:  # wgmma on both tiles from shared memory
        rings = stages * (act + weights)
    elif swap:  # wgmma on the converted weights (registers) and x's tile (shared memory)
        rings = stages * act + (stages - 1) * weights
    else:  # wgmma on x's tile and the converted weight tile (shared memory)
        converted = (weight_tiles if config.get("FUSE_GATE_UP") else 1) * bk * bn * act_bytes
        rings = stages * act + (stages - 1) * weights + converted
    return max(rings, bm * bn * 4) + 8 * stages * (1 + weight_tiles)


def fit_shared_memory(config: dict, weight_bytes: int, limit: int) -> dict:
    """Fewer stages, then shorter K tiles, until gate_up's program fits ``limit`` bytes of shared memory as
    :func:`pipeline_smem_bytes` counts it (e.g. the ~99 KB of sm_86/sm_89 parts, where Hopper-sized defaults
    would not launch). Compiled by Triton 3.9 for sm_80 (163 KB), sm_86/sm_89/sm_120 (99 KB) and sm_90/sm_100
    (227 KB), each heuristic fitted so takes at most ``limit`` in both GEMMs: the int8 prefill heuristic's down
    GEMM, on tiles twice as wide as gate_up's, takes 8 KB more than gate_up on Hopper (104 KB) and less before
    it (mma.sync: 72 KB where the limit is 99 KB)."""
    config = dict(config)
    while pipeline_smem_bytes(config, weight_bytes) > limit:
        if config["num_stages"] > 2:
            config["num_stages"] -= 1
        elif config["BLOCK_SIZE_K"] > 32:
            config["BLOCK_SIZE_K"] //= 2
        else:
            break
    return config


@functools.lru_cache(maxsize=None)
def max_shared_memory(device_index: int) -> int:
    """Opt-in shared memory per block of a CUDA device, in bytes."""
    import triton

    return int(triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"])


def heuristic_config(m: int, num_experts: int, top_k: int, weight_dtype: torch.dtype, device: str) -> dict:
    """Defaults by the expected rows per expert: the configs that won the H200 sweeps on the Mixtral
    and Qwen3 shapes (benchmarks/NOTES.md); ``get_config`` shrinks them to the device's shared memory."""
    rows_per_expert = m * top_k / num_experts
    int8 = weight_dtype == torch.int8
    if device == "cpu":  # Triton's interpreter: small tiles keep tests quick
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=1)
    if rows_per_expert <= 16:  # decode: memory-bound, stream weights with long K tiles
        return dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256 if int8 else 128,
                    GROUP_SIZE_M=1, num_warps=4, num_stages=3 if int8 else 4)
    if rows_per_expert <= 32:
        return dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128 if int8 else 64,
                    GROUP_SIZE_M=8, num_warps=4, num_stages=4)
    if rows_per_expert <= 256 or not int8:
        if int8:
            return dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
        return dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
    # int8 prefill: narrower gate_up tiles (two fp32 accumulators) avoid register spills
    return dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4,
                down=dict(BLOCK_SIZE_N=128))


def table_key(table: dict, m: int, num_experts: int, top_k: int) -> int:
    """Which tuned M of ``table`` serves ``m`` tokens.

    The largest tuned M at or below ``m``, unless that entry is a decode config (BLOCK_SIZE_M < 64)
    whose blocks are shorter than the rows each expert expects at ``m`` (``m * top_k / num_experts``):
    it would read every weight in several passes straight from HBM, so the next larger tuned M is
    used. (Prefill configs keep their entry: their GROUP_SIZE_M ordering serves repeated weight tiles
    from L2.) Measured on the H200 against the nearest M on a linear or a log scale:
    results/lookup_ab_H200.json, benchmarks/NOTES.md.
    """
    keys = sorted(table)
    below = [key for key in keys if key <= m]
    if not below:
        return keys[0]
    above = [key for key in keys if key > m]
    block_m = table[below[-1]]["BLOCK_SIZE_M"]
    if above and block_m < 64 and m * top_k / num_experts > block_m:
        return above[0]
    return below[-1]


def overridden() -> bool:
    """Whether an ``override_config`` block is forcing the config (as opposed to a table or heuristic)."""
    return _OVERRIDE.get() is not None


def get_config(m: int, num_experts: int, inter: int, top_k: int, weight_dtype: torch.dtype,
               device: Optional[torch.device] = None, gated: bool = True) -> dict:
    """The block config for ``m`` tokens on experts of intermediate size ``inter`` (with a gate unless
    ``gated`` is False)."""
    forced = _OVERRIDE.get()
    if forced is not None:
        return dict(forced)
    return _lookup(m, num_experts, inter, top_k, weight_dtype, device, gated)[0]


def config_source(m: int, num_experts: int, inter: int, top_k: int, weight_dtype: torch.dtype,
                  device: Optional[torch.device] = None, gated: bool = True) -> str:
    """Where ``get_config``'s entry for ``m`` comes from: ``"override"``, ``"table M=<key>"`` (the tuned M
    that serves ``m``: a key other than ``m`` is an entry tuned for another size) or ``"heuristic"``. The
    benchmark records it per row, so a row timed on a borrowed entry shows as such."""
    if overridden():
        return "override"
    key = _lookup(m, num_experts, inter, top_k, weight_dtype, device, gated)[1]
    return "heuristic" if key is None else f"table M={key}"


def _lookup(m, num_experts, inter, top_k, weight_dtype, device, gated=True) -> tuple[dict, Optional[int]]:
    """The entry for ``m`` and the table key it comes from (None: the heuristic)."""
    dev = device_name(device)
    table = None if dev == "cpu" else load_table(num_experts, inter, dev, weight_format(weight_dtype), gated)
    if table:
        key = table_key(table, m, num_experts, top_k)
        return dict(table[key]), key
    return device_heuristic(m, num_experts, top_k, weight_dtype, device), None


def tail_config(config: dict, num_experts: int, inter: int, top_k: int, weight_dtype: torch.dtype,
                device: Optional[torch.device] = None, gated: bool = True) -> dict:
    """The config of a TAIL_ROWS entry's second pass (an expert's last rows, on the align path's Gluon or
    Triton kernels): the table's (or heuristic) entry for the entry's TAIL_ENTRY_ROWS rows an expert
    (default 16), without decode modes or main-pass keys. An ``override_config`` block forces the main
    entry, not this one (the tuner times a TAIL_ROWS candidate with the tail pass the table gives it)."""
    m = max(1, config.get("TAIL_ENTRY_ROWS", TAIL_ENTRY_ROWS) * num_experts // top_k)
    entry = _lookup(m, num_experts, inter, top_k, weight_dtype, device, gated)[0]
    return without(entry, *DECODE_KEYS, *MAIN_PASS_KEYS)


def device_heuristic(m: int, num_experts: int, top_k: int, weight_dtype: torch.dtype,
                     device: Optional[torch.device] = None) -> dict:
    """The heuristic config for ``m`` tokens, fitted to the device's shared memory (no table)."""
    dev = device_name(device)
    config = heuristic_config(m, num_experts, top_k, weight_dtype, dev)
    if dev == "cpu":
        return config
    index = _index(device)
    config = fit_shared_memory(config, weight_dtype.itemsize, max_shared_memory(index))
    # int8 prefill on Hopper: the register-form kernels (ops runs the entry's Triton blocks where they do not
    # apply, e.g. routing weights on the input)
    rows = m * top_k / num_experts
    tile = next((tile for start, tile in HEURISTIC_WSRR_TILES if rows >= start), None)
    if (weight_dtype == torch.int8 and tile is not None
            and torch.version.hip is None and compute_capability(index)[0] == 9):  # (ROCm's MI300 reports 9.4)
        config["WSRR"] = 1
        if tile != 256:  # (256 is the kernels' default tile, as in the tuner's entries)
            config["WSRR_ROWS"] = tile
    return config


# (rows an expert from, WSRR_ROWS): the int8 heuristic's register-form tile for prefill, as the shipped H200
# tables' entries have it. On an H200 the 256-row tile took 0.73-0.84x of the Triton heuristic's time at 256-1024
# rows an expert and 1.06x at 96 (benchmarks/NOTES.md item 208, results/s42); the 128-row tile 0.75-0.98x at
# 96-160 and 0.98-0.99x at 64 (item 211, results/s43).
HEURISTIC_WSRR_TILES = ((192, 256), (96, 128))


@functools.lru_cache(maxsize=None)
def compute_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)
