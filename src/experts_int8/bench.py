"""Kernel benchmark: ``fused_experts`` with int8 and bf16 experts against the card's own ceilings.

Legend: M tokens, E experts, H hidden, I intermediate, k experts per token.

Method (its results: README.md, "Speed"):

1. Measure the two ceilings on the card at hand: device-to-device copy bandwidth (bytes read +
   written per second) and the dense bf16 matmul rate (``torch.mm``).
2. For each shape and weight format, build a *pool* of distinct layers of random weights (values
   do not change the speed; int8 weights come with fp32 scales). The pool is sized so that the
   weights read between two visits of the same layer exceed the L2 cache many times over (at M=1
   only k experts per layer are read), capped by a memory budget; it is freed before the next one.
3. For each M: route M random tokens (softmax top-k of seeded random logits; at decode sizes 16
   draws the calls cycle through, as the experts hit vary from step to step), capture a CUDA graph
   that calls ``fused_experts`` on the layers back to back, replay it, time each replay with CUDA
   events and keep the median time per call.
4. Account: weight bytes = distinct experts hit (unique ``topk_ids``, mean over the draws) x 3HI x bytes per
   weight; FLOPs = 2 * M * k * 3 * H * I. Report both as fractions of the ceilings, the roofline
   floor ``max(bytes / copy, flops / matmul)`` over the measured time, and the int8 / bf16 speed-up.

Results: a table on stdout, and JSON + PNG under ``--out`` with the GPU, the library commit and
the command. The pure accounting helpers at the top run (and are tested) without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from .files import atomic_path, check_writable_dir, write_atomic
from .reference import ACTIVATIONS, GATED_ONLY, clamp_of

logger = logging.getLogger(__name__)

# name -> (E, H, I, k)
SHAPES = {
    "mixtral-8x7b": (8, 4096, 14336, 2),
    "mixtral-8x22b": (8, 6144, 16384, 2),
    "jamba-1.5-mini": (16, 4096, 14336, 2),
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v2-lite": (64, 2048, 1408, 6),
}
DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DTYPES = ("bf16", "int8")
WEIGHT_BYTES = {"bf16": 2, "int8": 1}
DEFAULT_L2_BYTES = 50 * 2**20  # H100/H200; the measured value is used when torch reports it


# --- accounting (pure) ---------------------------------------------------------------------------

def weight_matrices(gated: bool = True) -> int:
    """H x I matrices an expert holds: gate, up and down (3), or up and down without a gate (2)."""
    return 3 if gated else 2


def expert_bytes(hidden: int, inter: int, dtype: str, gated: bool = True) -> int:
    """Weight bytes of one expert (w13 and w2, scales not counted): 3 * H * I * bytes per weight (2 * H * I
    without a gate)."""
    return weight_matrices(gated) * hidden * inter * WEIGHT_BYTES[dtype]


def layer_bytes(num_experts: int, hidden: int, inter: int, dtype: str, gated: bool = True) -> int:
    return num_experts * expert_bytes(hidden, inter, dtype, gated)


def moe_flops(m: int, top_k: int, hidden: int, inter: int, gated: bool = True) -> int:
    """Useful FLOPs of one layer: two GEMMs over M*k rows, 2 * M * k * 3 * H * I (2 * H * I without a gate)."""
    return 2 * m * top_k * weight_matrices(gated) * hidden * inter


def weight_bytes_read(distinct_experts: float, hidden: int, inter: int, dtype: str, gated: bool = True) -> float:
    """Expert weight bytes one call must read: distinct experts hit x 3HI (2HI) x bytes per weight."""
    return distinct_experts * expert_bytes(hidden, inter, dtype, gated)


def distinct_experts(topk_ids: torch.Tensor) -> int:
    """How many different experts a routing ``topk_ids [M, k]`` touches."""
    return int(torch.unique(topk_ids).numel())


def layers_for_pool(num_experts: int, hidden: int, inter: int, top_k: int, dtype: str, *,
                    l2_bytes: int = DEFAULT_L2_BYTES, budget_bytes: float = 4e9, l2_multiple: int = 10,
                    max_layers: int = 16, gated: bool = True) -> int:
    """How many distinct layers to cycle through.

    Enough that the weights read between two visits of one layer at M=1 (min(k, E) experts per
    layer) reach ``l2_multiple`` x L2, but no more than fit ``budget_bytes`` (always at least one).
    """
    per_visit = min(top_k, num_experts) * expert_bytes(hidden, inter, dtype, gated)
    wanted = math.ceil(l2_multiple * l2_bytes / per_visit)
    affordable = int(budget_bytes // layer_bytes(num_experts, hidden, inter, dtype, gated))
    return max(1, min(wanted, affordable, max_layers))


def pool_layers_that_fit(num_experts: int, hidden: int, inter: int, top_k: int, dtype: str, *, l2_bytes: int,
                         budget_bytes: float, free_bytes: float, gated: bool = True) -> int:
    """The layers a timing pool holds on the device: :func:`layers_for_pool` within ``budget_bytes``, and
    within 60% of the device's ``free_bytes`` (at least one). The bench sizes its pools this way, and the
    tuner times its candidates on pools sized the same, so a config wins where the bench's rows run."""
    n = layers_for_pool(num_experts, hidden, inter, top_k, dtype, l2_bytes=l2_bytes, budget_bytes=budget_bytes,
                        gated=gated)
    return max(1, min(n, int(0.6 * free_bytes // layer_bytes(num_experts, hidden, inter, dtype, gated))))


def layer_pool(shape: str, dtype: str, l2_bytes: int, budget_bytes: float = 4e9, device: torch.device | str = "cuda",
               gated: bool = True) -> tuple[tuple[int, int, int, int], list[Layer]]:
    """A named (or E:H:I:k) shape's ``(E, H, I, k)`` and random layers enough to stream from HBM
    (:func:`layers_for_pool`): what the benchmark scripts that time a few variants start from."""
    _, (e, h, i, k) = parse_shape(shape)
    n = layers_for_pool(e, h, i, k, dtype, l2_bytes=l2_bytes, budget_bytes=budget_bytes, gated=gated)
    return (e, h, i, k), make_layers(n, e, h, i, dtype, device, gated)


def calls_per_graph(num_layers: int, floor_s: float, *, draws: int = 1, target_s: float = 1e-3,
                    max_calls: int = 128) -> int:
    """Calls captured in one graph: whole sweeps over the layers and over the routing ``draws``
    (:func:`routing_draws`; so that both weight formats, whose pools differ, route every draw as often),
    enough that one replay lasts about ``target_s`` when the call runs at its roofline floor ``floor_s``
    (launch cost amortised). ``max_calls`` caps the sweeps, not one sweep: where ``lcm(num_layers, draws)``
    exceeds it (15 layers and 16 draws: 240) a replay holds that one sweep."""
    unit = math.lcm(num_layers, draws)
    sweeps = max(1, math.ceil(target_s / max(unit * floor_s, 1e-9)))
    sweeps = min(sweeps, max(1, max_calls // unit))
    return unit * sweeps


def row_plan(routing, num_layers: int, *, m: int, hidden: int, inter: int, top_k: int, dtype: str,
             copy_bytes_per_s: float, matmul_flops_per_s: float, gated: bool = True) -> tuple[float, int]:
    """(distinct experts hit, the mean over the routing draws; calls per graph replay) of a row: what the bench
    accounts and captures, and the tuner and the A/B script capture as it does."""
    distinct = statistics.fmean(distinct_experts(ids) for _, ids in routing)
    floor = row_metrics(m=m, hidden=hidden, inter=inter, top_k=top_k, dtype=dtype, time_s=1.0, distinct=distinct,
                        copy_bytes_per_s=copy_bytes_per_s, matmul_flops_per_s=matmul_flops_per_s,
                        gated=gated)["floor_us"] / 1e6
    return distinct, calls_per_graph(num_layers, floor, draws=len(routing))


def row_metrics(*, m: int, hidden: int, inter: int, top_k: int, dtype: str, time_s: float,
                distinct: float, copy_bytes_per_s: float, matmul_flops_per_s: float, gated: bool = True) -> dict:
    """Per-call numbers of one (shape, M, dtype) row from its median time and the two ceilings."""
    nbytes = weight_bytes_read(distinct, hidden, inter, dtype, gated)
    flops = moe_flops(m, top_k, hidden, inter, gated)
    bytes_per_s, flops_per_s = nbytes / time_s, flops / time_s
    floor_s = max(nbytes / copy_bytes_per_s, flops / matmul_flops_per_s)
    return dict(
        time_us=time_s * 1e6,
        distinct_experts=distinct,
        weight_bytes=nbytes,
        flops=flops,
        weight_GBps=bytes_per_s / 1e9,
        bw_frac=bytes_per_s / copy_bytes_per_s,
        tflops=flops_per_s / 1e12,
        flop_frac=flops_per_s / matmul_flops_per_s,
        floor_us=floor_s * 1e6,
        roofline_frac=floor_s / time_s,
        bound="memory" if nbytes / copy_bytes_per_s >= flops / matmul_flops_per_s else "compute",
    )


def add_speedups(rows: list[dict]) -> None:
    """Set ``speedup_vs_bf16 = t(bf16) / t(int8)`` on each int8 row that has a bf16 twin."""
    bf16 = {(r["shape"], r["M"]): r["time_us"] for r in rows if r["dtype"] == "bf16" and "time_us" in r}
    for r in rows:
        if r["dtype"] == "int8" and "time_us" in r and (r["shape"], r["M"]) in bf16:
            r["speedup_vs_bf16"] = bf16[(r["shape"], r["M"])] / r["time_us"]


# --- parsing -----------------------------------------------------------------------------------

def check_form(gated: bool, activation: str, clamp: Optional[dict] = None) -> None:
    """The experts' form the bench builds: a known activation, one that has a form without a gate when
    the experts have none, and ``clamp`` options that apply to it (reference.clamp_of)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}: use one of {', '.join(ACTIVATIONS)}")
    if not gated and activation in GATED_ONLY:
        raise ValueError(f"activation {activation!r} needs gate and up rows: drop --no-gate or pick another")
    clamp_of(activation, gated=gated, **(clamp or {}))


def form_label(gated: bool, activation: str, biases: bool, clamp: Optional[dict] = None) -> str:
    """How the experts' form differs from gated SiLU experts without biases, for logs ('' where it does not);
    ``clamp``: a clamped SwiGLU's options (fused_experts' ``swiglu_limit``, ``swiglu_alpha``, ``limit_after_act``)."""
    parts = ([] if gated else ["without a gate"]) + ([] if activation == "silu" else [activation])
    if clamp and clamp.get("swiglu_limit") is not None:
        parts.append(f"clamped at {clamp['swiglu_limit']:g}" + (" after the activation" if clamp.get(
            "limit_after_act") else "") + (f" (slope {clamp['swiglu_alpha']:g})" if clamp.get("swiglu_alpha") else ""))
    return ", ".join(parts + (["biases"] if biases else []))


def is_valid_shape(num_experts: int, hidden: int, inter: int, top_k: int) -> bool:
    """E, H, I and k all positive, with k <= E (a token picks k different experts): the one rule for every
    shape given to bench and tune, whichever way it came."""
    return min(num_experts, hidden, inter, top_k) >= 1 and top_k <= num_experts


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int]]:
    """A named shape from SHAPES or ``E:H:I:k`` (e.g. ``8:256:512:2``) -> (name, (E, H, I, k))."""
    text = text.strip()
    if text in SHAPES:
        return text, SHAPES[text]
    parts = text.replace(",", ":").split(":")
    try:
        e, h, i, k = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"unknown shape {text!r}: use one of {', '.join(SHAPES)} or E:H:I:k (colons: commas "
                         f"separate shapes, e.g. 8:4096:14336:2,qwen3-30b-a3b)") from None
    if not is_valid_shape(e, h, i, k):
        raise ValueError(f"shape {text!r}: E, H, I, k must be positive with k <= E")
    return f"E{e}-H{h}-I{i}-k{k}", (e, h, i, k)


def parse_int_list(values: Iterable[str], what: str = "M") -> list[int]:
    """``["1,2", "4"]`` -> ``[1, 2, 4]``; every value a positive int."""
    out = []
    for value in values:
        for part in str(value).split(","):
            if not part.strip():
                continue
            try:
                n = int(part)
            except ValueError:
                raise ValueError(f"{what} must be positive integers, got {part.strip()!r}") from None
            if n < 1:
                raise ValueError(f"{what} must be positive integers, got {n}")
            out.append(n)
    if not out:
        raise ValueError(f"no {what} values given")
    return out


def parse_dtypes(values: Iterable[str]) -> list[str]:
    out = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if part not in DTYPES:
                raise ValueError(f"unknown dtype {part!r}: use {' and/or '.join(DTYPES)}")
            if part not in out:
                out.append(part)
    if not out:
        raise ValueError("no dtypes given")
    return out


# --- provenance --------------------------------------------------------------------------------

def library_commit() -> tuple[str, Optional[bool]]:
    """(commit, dirty) of the library's source tree: ``$EXPERTS_INT8_COMMIT`` when set (a copied tree
    whose ``.git`` may be stale), else ``git``, else ``.git`` read directly, else ``"unknown"``.
    ``dirty`` is None when unknown."""
    if os.environ.get("EXPERTS_INT8_COMMIT"):
        return os.environ["EXPERTS_INT8_COMMIT"], None
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
        if commit:
            return commit, dirty
    except (OSError, subprocess.SubprocessError):
        pass
    for parent in here.parents:  # no git binary: read .git/HEAD ourselves
        head = parent / ".git" / "HEAD"
        if head.is_file():
            ref = head.read_text().strip()
            if not ref.startswith("ref: "):
                return ref, None
            ref = ref[5:]
            loose = parent / ".git" / ref
            if loose.is_file():
                return loose.read_text().strip(), None
            packed = parent / ".git" / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0], None
            break
    return "unknown", None


def environment(device: Optional[torch.device] = None) -> dict:
    import triton

    info = dict(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                python=platform.python_version(), host=platform.node())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                    memory_bytes=props.total_memory, l2_bytes=getattr(props, "L2_cache_size", None))
    else:
        info.update(gpu="cpu")
    commit, dirty = library_commit()
    info.update(commit=commit, dirty=dirty)
    return info


def default_command() -> str:
    argv0 = sys.argv[0] if sys.argv else "?"
    if argv0.endswith(".py"):
        return shlex.join(["python3", argv0, *sys.argv[1:]])
    return shlex.join([Path(argv0).name, *sys.argv[1:]])


# --- measuring (CUDA) ---------------------------------------------------------------------------

def _median_event_time(fn: Callable[[], None], reps: int, warmup: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def measure_copy_bandwidth(nbytes: int = 2**30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written."""
    # float32 elements: the copy kernel moves 16-byte vectors, as the MoE kernels do (uint8 copies run
    # measurably slower on H200 and would understate the ceiling).
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    seconds = _median_event_time(lambda: dst.copy_(src), reps, warmup=3)
    return 2 * nbytes / seconds


def measure_matmul_rate(n: int = 8192, reps: int = 10) -> float:
    """Dense bf16 ``n x n @ n x n`` matmul rate in FLOP/s."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    seconds = _median_event_time(lambda: torch.mm(a, b, out=c), reps, warmup=3)
    return 2 * n**3 / seconds


@dataclasses.dataclass
class Layer:
    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: Optional[torch.Tensor]
    w2_scale: Optional[torch.Tensor]
    w13_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None


def make_layers(num_layers: int, num_experts: int, hidden: int, inter: int, dtype: str,
                device: torch.device | str = "cuda", gated: bool = True, biases: bool = False) -> list[Layer]:
    """Random expert weights: bf16 ~ N(0, 0.02), or int8 in [-127, 127] with fp32 row scales (``gated``
    False: experts without a gate, w13 [E, I, H]); with ``biases``, bf16 expert biases ~ N(0, 0.02) too."""
    layers = []
    rows = (2 if gated else 1) * inter
    for _ in range(num_layers):
        if dtype == "bf16":
            w13 = torch.randn(num_experts, rows, hidden, dtype=torch.bfloat16, device=device).mul_(0.02)
            w2 = torch.randn(num_experts, hidden, inter, dtype=torch.bfloat16, device=device).mul_(0.02)
            layer = Layer(w13, w2, None, None)
        else:
            w13 = torch.randint(-127, 128, (num_experts, rows, hidden), dtype=torch.int8, device=device)
            w2 = torch.randint(-127, 128, (num_experts, hidden, inter), dtype=torch.int8, device=device)
            s13 = torch.rand(num_experts, rows, device=device).mul_(2e-4).add_(1e-4)
            s2 = torch.rand(num_experts, hidden, device=device).mul_(2e-4).add_(1e-4)
            layer = Layer(w13, w2, s13, s2)
        if biases:
            layer.w13_bias = torch.randn(num_experts, rows, dtype=torch.bfloat16, device=device).mul_(0.02)
            layer.w2_bias = torch.randn(num_experts, hidden, dtype=torch.bfloat16, device=device).mul_(0.02)
        layers.append(layer)
    return layers


# Routing draws a row cycles through: at decode sizes the experts hit vary from step to step (two tokens,
# top-2 of 16: 3 or 4 experts), so one draw would fit a row, and the table tuned on it, to that draw's luck
# (a pairs mode that reads an expert twice when two tokens share it looked free on a draw where none did).
# Past DRAWS_UP_TO_M tokens every draw hits (nearly) every expert of the bench's shapes: one draw.
ROUTING_DRAWS, DRAWS_UP_TO_M = 16, 64


def routing_draws(m: int, num_experts: int, top_k: int, device="cuda") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The routings a row's calls cycle through: softmax top-k of random logits -> (topk_weights [M, k],
    topk_ids [M, k]), :data:`ROUTING_DRAWS` of them up to :data:`DRAWS_UP_TO_M` tokens, else one.

    Each draw's logits are seeded by (M, E, k, draw), so both weight formats of a row route identically
    (the int8/bf16 ratio compares equal work; :func:`calls_per_graph` makes every replay take each draw
    equally often). Consecutive calls also read distinct layers' weights, so the replays read from HBM."""
    from .routing import select_experts

    draws = []
    for draw in range(ROUTING_DRAWS if m <= DRAWS_UP_TO_M else 1):
        seed = f"{m},{num_experts},{top_k}" + (f",{draw}" if draw else "")  # (draw 0: the one-draw rows' seed)
        logits = torch.randn(m, num_experts, generator=torch.Generator().manual_seed(zlib.crc32(seed.encode())))
        draws.append(select_experts(logits.to(device), top_k))
    return draws


def _layer_calls(x, layers: Sequence[Layer], routing, num_calls: int, activation: str = "silu",
                 clamp: Optional[dict] = None) -> Callable[[], None]:
    from .ops import fused_experts

    def run():
        for c in range(num_calls):
            layer = layers[c % len(layers)]
            weights, ids = routing[c % len(routing)]
            fused_experts(x, layer.w13, layer.w2, weights, ids, w13_scale=layer.w13_scale, w2_scale=layer.w2_scale,
                          activation=activation, w13_bias=layer.w13_bias, w2_bias=layer.w2_bias, **(clamp or {}))
    return run


def time_calls(x, layers, routing, num_calls: int, *, reps: int, warmup: int, row_budget_s: float = 1.5,
               use_graph: bool = True, give_up_above_s: float = math.inf, activation: str = "silu",
               warm_s: float = 0.0, clamp: Optional[dict] = None) -> tuple[float, str]:
    """Median seconds per ``fused_experts`` call (with ``activation``, its ``clamp`` options and the layers'
    biases, if any) and the method (``cuda_graph`` or ``eager``): the ``num_calls`` calls cycle over the layers
    and, apart, over the routings (:func:`routing_draws`; :func:`time_run`)."""
    return time_run(_layer_calls(x, layers, routing, num_calls, activation, clamp), num_calls, reps=reps,
                    warmup=warmup, row_budget_s=row_budget_s, use_graph=use_graph, give_up_above_s=give_up_above_s,
                    warm_s=warm_s)


def time_run(run: Callable[[], None], num_calls: int, *, reps: int, warmup: int, row_budget_s: float = 1.5,
             use_graph: bool = True, give_up_above_s: float = math.inf, warm_s: float = 0.0) -> tuple[float, str]:
    """Median seconds per call of ``run`` (which makes ``num_calls`` calls) and the method.

    ``run`` is captured in one CUDA graph; each replay is timed with events. Fewer replays are made
    when one replay is long (``row_budget_s`` per row, never fewer than 5); none after the first when
    it already took over ``give_up_above_s`` per call (the tuner's early exit for clearly slower
    configs). Before the timed replays, untimed ones for about ``warm_s`` seconds: held work meets the
    GPU's power cap and runs on a lower clock from then on (on the H200, prefill of either format and int8
    decode; NOTES items 204-206), so a row timed in a short burst would depend on how long its own replays
    last (which differs between formats: an int8 pool holds twice the layers of a bf16 one). If capture
    fails the same calls are timed eagerly, with a warning.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compiles the kernels and warms the allocator off the capture
        run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    method, replay = "eager", run
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            method, replay = "cuda_graph", graph.replay
        except Exception as exc:  # noqa: BLE001 - fall back, but say so
            logger.warning(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); timing eagerly")
            torch.cuda.synchronize()
    probe = _median_event_time(replay, reps=1, warmup=max(1, warmup))
    if probe / num_calls > give_up_above_s:
        seconds = probe
    else:
        reps = max(min(reps, 5), min(reps, int(row_budget_s / max(probe, 1e-9))))
        seconds = _median_event_time(replay, reps=reps, warmup=math.ceil(warm_s / max(probe, 1e-9)))
    if method == "cuda_graph":
        del graph
    return seconds / num_calls, method


def settle(seconds: float) -> None:
    """Let the GPU idle before a section's rows. The work before them (the last section's prefill rows,
    this section's pool fill) can leave the GPU under its power cap for about half a second, and decode
    rows timed then run on the capped SM clock: 8x22b int8 M=1 read 159 µs instead of 152, jamba int8
    M=8 480 instead of 432 (NOTES 142). Each row should be timed in the state its own work sets."""
    if seconds > 0:
        torch.cuda.synchronize()
        time.sleep(seconds)


def settle_seconds(text: str) -> float:
    """``--settle-s``, ``--warm-s``: a number of seconds from 0 to 60 (argparse ``type``; the CLI's options take
    the same)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"seconds from 0 to 60, got {text!r}")
    return seconds


@dataclasses.dataclass
class Settings:
    shapes: list = dataclasses.field(default_factory=lambda: list(SHAPES))
    ms: list = dataclasses.field(default_factory=lambda: list(DEFAULT_MS))
    dtypes: list = dataclasses.field(default_factory=lambda: list(DTYPES))
    out_dir: str = "benchmarks/results"
    reps: int = 20
    warmup: int = 2
    pool_gb: float = 4.0
    settle_s: float = 1.0  # idle before each (shape, dtype) section's first row: see settle()
    # the same idle before every row, so no row inherits the power state of the rows before it: on an H200 its
    # decode rows agreed within 1% between rounds, without it up to 7% (benchmarks/NOTES.md item 212)
    settle_every_row: bool = True
    warm_s: float = 0.5  # untimed replays before each row's timed ones: see time_run()
    use_graph: bool = True
    plot: bool = True
    gated: bool = True  # False: every shape's experts without a gate (w13 [E, I, H], act(up): NemotronH)
    activation: str = "silu"  # reference.ACTIVATIONS (swiglu_oai with biases: GPT-OSS)
    biases: bool = False  # expert biases on both GEMMs (bf16; their bytes are not counted)

    @classmethod
    def quick(cls, **kw) -> "Settings":
        return cls(**{"reps": 5, "warmup": 1, **kw})


# The values Triton reads as true in a boolean setting such as TRITON_INTERPRET (any case)
TRITON_TRUE = ("1", "true", "on", "yes", "y")


def check_not_interpreting() -> None:
    """Refuse GPU timing work while Triton's interpreter is on: it would run instead of compiled kernels."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is not None and value.lower() in TRITON_TRUE:  # (as Triton parses it: "true" or "on" turn it on too)
        raise RuntimeError(f"TRITON_INTERPRET={value} is set, so Triton would not compile for the GPU; unset it")


def check_kernel_runs() -> None:
    """Refuse GPU timing work on a GPU older than the fused kernel needs: fused_experts runs the torch path there,
    so every row (and every config the tuner tries) would time that, and a tune would write a table of it."""
    from .ops import MIN_CAPABILITY

    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        raise RuntimeError(f"{torch.cuda.get_device_name()} (compute capability {capability[0]}.{capability[1]}) is "
                           f"older than the fused kernel needs ({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}, Ampere): "
                           f"MoE layers run the torch path there, with nothing to tune or time")


def run_benchmark(settings: Settings, *, command: Optional[str] = None, log: Callable[[str], None] = print) -> dict:
    """Run the benchmark on the current CUDA device; returns the result dict (also written to disk)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the kernel benchmark needs a CUDA GPU, and torch.cuda.is_available() is False")
    check_not_interpreting()
    from .kernels.configs import config_source, get_config

    check_writable_dir(settings.out_dir, "the output folder")
    check_kernel_runs()
    shapes = [parse_shape(s) for s in settings.shapes]
    dtypes = parse_dtypes(settings.dtypes)
    check_form(settings.gated, settings.activation)
    started = time.perf_counter()
    env = environment()
    l2 = env.get("l2_bytes") or DEFAULT_L2_BYTES
    log(f"# {env['gpu']}  torch {env['torch']}  triton {env['triton']}  commit {env['commit'][:12]}")
    copy_bps = measure_copy_bandwidth()
    matmul_fps = measure_matmul_rate()
    log(f"# ceilings: copy {copy_bps / 1e12:.2f} TB/s (read + write), bf16 matmul {matmul_fps / 1e12:.0f} TFLOP/s")

    rows: list[dict] = []
    fatal = None
    for name, (e, h, i, k) in shapes:
        for dtype in dtypes:
            if fatal:
                break
            weight_dtype = torch.int8 if dtype == "int8" else torch.bfloat16
            gated = settings.gated
            num_layers = pool_layers_that_fit(e, h, i, k, dtype, l2_bytes=l2, budget_bytes=settings.pool_gb * 1e9,
                                              free_bytes=torch.cuda.mem_get_info()[0], gated=gated)
            layers = make_layers(num_layers, e, h, i, dtype, "cuda", gated, settings.biases)
            pool_gb = num_layers * layer_bytes(e, h, i, dtype, gated) / 1e9
            form = form_label(gated, settings.activation, settings.biases)
            log(f"# {name} (E={e}, H={h}, I={i}, k={k}{', ' + form if form else ''}) {dtype}: "
                f"{num_layers} layer(s), {pool_gb:.1f} GB of weights")
            for row_index, m in enumerate(settings.ms):
                if row_index == 0 or settings.settle_every_row:
                    settle(settings.settle_s)
                row = dict(shape=name, E=e, H=h, I=i, k=k, M=m, dtype=dtype, gated=gated, layers=num_layers)
                try:
                    x = torch.randn(m, h, dtype=torch.bfloat16, device="cuda")
                    routing = routing_draws(m, e, k)
                    distinct, calls = row_plan(routing, num_layers, m=m, hidden=h, inter=i, top_k=k, dtype=dtype,
                                               copy_bytes_per_s=copy_bps, matmul_flops_per_s=matmul_fps, gated=gated)
                    seconds, method = time_calls(x, layers, routing, calls, reps=settings.reps,
                                                 warmup=settings.warmup, use_graph=settings.use_graph,
                                                 activation=settings.activation, warm_s=settings.warm_s)
                    lookup = (m, e, i, k, weight_dtype, torch.device("cuda"), gated)
                    row.update(calls_per_replay=calls, routing_draws=len(routing), timing=method,
                               config=get_config(*lookup),
                               config_source=config_source(*lookup))
                    row.update(row_metrics(m=m, hidden=h, inter=i, top_k=k, dtype=dtype, time_s=seconds,
                                           distinct=distinct, copy_bytes_per_s=copy_bps,
                                           matmul_flops_per_s=matmul_fps, gated=gated))
                    borrowed = "" if row["config_source"] == f"table M={m}" else f"  ({row['config_source']})"
                    log(f"  M={m:<5d} {dtype:4s} {row['time_us']:10.1f} us  weights {row['bw_frac']:6.1%} of copy  "
                        f"{row['tflops']:6.1f} TFLOP/s ({row['flop_frac']:6.1%})  roofline {row['roofline_frac']:6.1%}"
                        f"{borrowed}")
                except Exception as exc:  # noqa: BLE001 - one failing row must not lose the run
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    log(f"  M={m:<5d} {dtype:4s} FAILED: {row['error']}")
                    if "CUDA error" in str(exc) or type(exc).__name__ == "AcceleratorError":
                        fatal = row["error"]  # the CUDA context is likely gone: keep what we have and stop
                rows.append(row)
                if fatal:
                    break
            del layers
            torch.cuda.empty_cache()
    add_speedups(rows)

    result = dict(
        benchmark="bench_kernel",
        command=command or default_command(),
        time_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **env,
        ceilings=dict(copy_bytes_per_s=copy_bps, copy_GBps=copy_bps / 1e9, matmul_flops_per_s=matmul_fps,
                      matmul_TFLOPs=matmul_fps / 1e12, copy_size_bytes=2**30, matmul_n=8192),
        settings=dataclasses.asdict(settings),
        rows=rows,
        elapsed_s=time.perf_counter() - started,
    )
    log("")
    log(format_table(result))
    paths = write_results(result, settings.out_dir, plot=settings.plot)
    log("")
    for path in paths:
        log(f"wrote {path}")
    log(f"# total {result['elapsed_s']:.0f} s")
    if fatal:
        raise RuntimeError(f"the benchmark stopped early after a CUDA error ({fatal}); partial results were written")
    return result


# --- reporting -----------------------------------------------------------------------------------

def format_table(result: dict) -> str:
    """One line per (shape, M): time, % of copy bandwidth, % of matmul rate per dtype, speed-up."""
    rows = result["rows"]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    head = f"{'shape':<18} {'M':>5} " + "".join(f"| {d + ' us':>10} {'%copy':>6} {'%mm':>6} {'%roof':>6} "
                                               for d in dtypes)
    head += "| int8/bf16" if len(dtypes) == 2 else ""
    form = "" if all(r.get("gated", True) for r in rows) else "; experts without a gate"
    lines = [f"ceilings: copy {result['ceilings']['copy_GBps']:.0f} GB/s, "
             f"matmul {result['ceilings']['matmul_TFLOPs']:.0f} TFLOP/s  ({result.get('gpu', '?')}{form})", head,
             "-" * len(head)]
    keys = list(dict.fromkeys((r["shape"], r["M"]) for r in rows))
    by_key = {(r["shape"], r["M"], r["dtype"]): r for r in rows}
    for shape, m in keys:
        line = f"{shape:<18} {m:>5} "
        speedup = None
        for d in dtypes:
            r = by_key.get((shape, m, d))
            if r is None or "time_us" not in r:
                line += f"| {'failed' if r else '-':>10} {'':>6} {'':>6} {'':>6} "
                continue
            line += (f"| {r['time_us']:10.1f} {100 * r['bw_frac']:6.1f} {100 * r['flop_frac']:6.1f} "
                     f"{100 * r['roofline_frac']:6.1f} ")
            speedup = r.get("speedup_vs_bf16", speedup)
        if len(dtypes) == 2:
            line += f"| {speedup:8.2f}x" if speedup else "|        -"
        lines.append(line)
    return "\n".join(lines)


def result_stem(result: dict) -> str:
    gpu = str(result.get("gpu", "gpu")).replace(" ", "_").replace("/", "_")
    stamp = result.get("time_utc", "").replace(":", "").replace("-", "").replace("+0000", "Z")
    return f"bench_kernel_{gpu}_{stamp}"


def write_results(result: dict, out_dir: str | os.PathLike, *, plot: bool = True) -> list[Path]:
    """Write ``<stem>.json`` and (when matplotlib is importable) ``<stem>.png``; returns the paths."""
    out = Path(out_dir)
    stem = result_stem(result)
    path = write_atomic(out / f"{stem}.json", json.dumps(result, indent=1) + "\n")
    paths = [path]
    if plot:
        png = plot_results(result, out / f"{stem}.png")
        if png is not None:
            paths.append(png)
    return paths


def plot_results(result: dict, path: Path) -> Optional[Path]:
    """Time (top) and fraction of ceiling (bottom) vs M, one column per shape. None without matplotlib."""
    try:  # (a Figure of its own, not pyplot's: matplotlib.use("Agg") switched the caller's backend for good, a
        import matplotlib.figure  # notebook's among them, and a failure kept pyplot's figure open)
    except ImportError:
        logger.warning("matplotlib is not installed: no PNG plot (the JSON has every number); pip install matplotlib "
                       "for it, or pass --no-plot")
        return None
    rows = [r for r in result["rows"] if "time_us" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    if not shapes:
        return None
    fig = matplotlib.figure.Figure(figsize=(4 * len(shapes), 7))
    axes = fig.subplots(2, len(shapes), squeeze=False)
    colors = {"bf16": "tab:blue", "int8": "tab:red"}
    for col, shape in enumerate(shapes):
        top, bottom = axes[0][col], axes[1][col]
        for dtype in DTYPES:
            sel = sorted((r for r in rows if r["shape"] == shape and r["dtype"] == dtype), key=lambda r: r["M"])
            if not sel:
                continue
            ms = [r["M"] for r in sel]
            top.plot(ms, [r["time_us"] for r in sel], "o-", color=colors[dtype], label=dtype)
            bottom.plot(ms, [r["bw_frac"] for r in sel], "o-", color=colors[dtype],
                        label=f"{dtype} weight bytes / copy")
            bottom.plot(ms, [r["flop_frac"] for r in sel], "s--", color=colors[dtype], label=f"{dtype} FLOP/s / matmul")
        e, h, i, k = (rows[[r["shape"] for r in rows].index(shape)][key] for key in ("E", "H", "I", "k"))
        top.set_title(f"{shape}\nE={e} H={h} I={i} k={k}", fontsize=9)
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        top.set_ylabel("time per layer (us)")
        bottom.set_xscale("log", base=2)
        bottom.set_ylim(0, 1.05)
        bottom.set_xlabel("M (tokens)")
        bottom.set_ylabel("fraction of measured ceiling")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
        if col == 0:
            top.legend(fontsize=8)
            bottom.legend(fontsize=7)
    ceil = result["ceilings"]
    fig.suptitle(f"experts_int8 fused_experts on {result.get('gpu', '?')} (copy {ceil['copy_GBps']:.0f} GB/s, "
                 f"matmul {ceil['matmul_TFLOPs']:.0f} TFLOP/s) @ {str(result.get('commit', '?'))[:10]}"
                 f"{' (dirty)' if result.get('dirty') else ''}", fontsize=10)
    # the command that made the numbers, under the panels (the JSON holds it too)
    fig.text(0.01, 0.005, f"$ {result.get('command', '?')}", fontsize=7, family="monospace", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    with atomic_path(path) as tmp:  # (a full disk leaves no part of a PNG)
        fig.savefig(tmp, dpi=110, format="png")
    return path


# --- command line (the benchmarks/bench_kernel.py script; ``experts-int8 bench`` mirrors it) ------

EXAMPLES = """examples:
  python3 benchmarks/bench_kernel.py                       # everything: 5 shapes x 14 M x bf16 + int8
  python3 benchmarks/bench_kernel.py --quick --shapes qwen3-30b-a3b mixtral-8x7b --m 1,16,256,4096
  python3 benchmarks/bench_kernel.py --dtypes int8 --shapes 8:4096:14336:2 --out /tmp/results
"""


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Time fused_experts (bf16 and int8 experts) against the GPU's copy and matmul "
                               "ceilings; print a table, write JSON + PNG.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), metavar="SHAPE",
                        help=f"named shapes ({', '.join(SHAPES)}) or E:H:I:k; default: all five")
    parser.add_argument("--m", nargs="+", default=[",".join(map(str, DEFAULT_MS))], metavar="M",
                        help="token counts, comma or space separated; default: 1,2,4,...,8192")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), metavar="DTYPE", help="bf16 and/or int8")
    parser.add_argument("--out", default=str(Path("benchmarks") / "results"), help="results folder")
    parser.add_argument("--quick", action="store_true", help="5 timed replays instead of 20, one warm-up")
    parser.add_argument("--reps", type=int, default=None, help="timed replays per row (median)")
    parser.add_argument("--pool-gb", type=float, default=4.0, help="weight pool budget per shape and dtype (GB)")
    parser.add_argument("--settle-s", type=settle_seconds, default=1.0,
                        help="seconds the GPU idles before each shape and dtype's rows, so the power cap that "
                             "the rows before left has lifted (default 1)")
    parser.add_argument("--settle-every-row", action=argparse.BooleanOptionalAction, default=True,
                        help="idle --settle-s before every row too, not only before each section's first "
                             "(default; --no-settle-every-row: a shorter run, whose rows inherit their "
                             "neighbours' power state)")
    parser.add_argument("--warm-s", type=settle_seconds, default=0.5,
                        help="seconds of untimed replays before each row's timed ones, so that every row is timed "
                             "in the clock state its own work sets (default 0.5)")
    parser.add_argument("--eager", action="store_true", help="time eager calls instead of CUDA graph replays")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--no-gate", action="store_true",
                        help="experts without a gate (up_proj [E, I, H], act(up): NemotronH) for every shape")
    parser.add_argument("--activation", default="silu", choices=ACTIVATIONS, help="the experts' activation")
    parser.add_argument("--biases", action="store_true", help="expert biases on both GEMMs (GPT-OSS)")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    factory = Settings.quick if args.quick else Settings
    kw = dict(shapes=list(args.shapes), ms=parse_int_list(args.m), dtypes=parse_dtypes(args.dtypes), out_dir=args.out,
              pool_gb=args.pool_gb, settle_s=args.settle_s, settle_every_row=args.settle_every_row, warm_s=args.warm_s,
              use_graph=not args.eager, plot=not args.no_plot, gated=not args.no_gate, activation=args.activation,
              biases=args.biases)
    if args.reps is not None:
        kw["reps"] = args.reps
    for s in kw["shapes"]:
        parse_shape(s)  # fail before touching the GPU
    check_form(kw["gated"], kw["activation"])
    return factory(**kw)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    args = build_parser(prog).parse_args(argv)
    run_benchmark(settings_from_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
