"""Symmetric per-output-row int8 quantization of expert weights.

For a weight ``w[..., N, K]`` (N output rows, K reduction dim) each row gets
``scale = max|row| / 127`` (fp32) and ``q = clamp(round(w / scale), -127, 127)``.
No calibration data is involved. Stacked experts ``[E, N, K]`` are processed one
expert at a time so at most one expert's fp32 copy exists at once.
"""

from __future__ import annotations

import torch

QMAX = 127


def check_weights(w: torch.Tensor, name: str) -> None:
    """What int8 experts cannot hold, refused naming ``name``: NaN or Inf, and float64 values past float32's
    range (the scales are fp32). Meta tensors hold no values to check."""
    if w.device.type == "meta":
        return
    w = w.detach()  # (a trainable Parameter's values, read as plain numbers)
    if not torch.isfinite(w).all():
        n_nan, n_inf = int(torch.isnan(w).sum()), int(torch.isinf(w).sum())
        raise ValueError(f"{name} contains NaN or Inf ({n_nan} NaN, {n_inf} Inf values); int8 experts need finite "
                         f"weights and biases. Check the checkpoint this tensor came from.")
    if w.dtype == torch.float64 and w.abs().max() > torch.finfo(torch.float32).max:
        raise ValueError(f"{name} has values beyond float32's range (|w| up to {float(w.abs().max()):.3g}); the "
                         f"fp32 scales cannot hold them. Check the checkpoint this tensor came from.")


def quantize_rows(w: torch.Tensor, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize one ``[N, K]`` matrix (any float dtype) row by row."""
    # One fp32 working copy, updated in place: besides ``w`` only that copy and ``q`` exist at once
    # (this runs on the GPU while a checkpoint loads, where it is the loader's peak).
    wf = w.to(torch.float32, copy=True)
    # (two reductions: the CPU's aminmax took seven times as long as amax and amin together; the same values)
    lo, hi = wf.amin(dim=-1), wf.amax(dim=-1)
    # A NaN or Inf anywhere in a row makes its min or max one (amin and amax propagate NaN): the rows' extremes say
    # whether to check the values, instead of a pass over all of them (a bf16 isfinite on the CPU took longer
    # than the quantization itself). float64 past float32's range may round to a finite float32: checked always.
    if w.dtype == torch.float64 or w.device.type == "meta" or not (torch.isfinite(lo) & torch.isfinite(hi)).all():
        check_weights(w, name)
    amax = torch.maximum(hi, lo.neg())  # = |w|.amax(-1), exactly, without an |w| temporary
    # A tensor divisor: CUDA divides by a Python number through its reciprocal, which rounds some scales
    # one ulp away from the CPU's true division; this way both devices write the same checkpoint.
    scale = amax / torch.full_like(amax, QMAX)
    # All-zero rows (and rows so small that max|row| / 127 underflows to 0) get scale 1, so q = 0 and
    # dequantization never divides 0 by 0.
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = wf.div_(scale.unsqueeze(-1)).round_().clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def quantize_weights(w: torch.Tensor, *, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` float -> ``(q int8 [..., N, K], scale fp32 [..., N])``.

    ``name`` only appears in error messages (e.g. the checkpoint key).
    """
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"quantize_weights expects a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"{name}: quantize_weights expects a float tensor, got dtype {w.dtype}")
    if w.dim() < 2:
        raise ValueError(f"{name}: quantize_weights expects [..., N, K] (at least 2-D), got shape {tuple(w.shape)}")
    lead, (n, k) = w.shape[:-2], w.shape[-2:]
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty((*lead, n), dtype=torch.float32, device=w.device)
    if not w.numel():  # no rows, or rows of no values (all-zero rows: scale 1)
        return q, scale.fill_(1.0)
    w2d, q2d, s2d = w.reshape(-1, n, k), q.view(-1, n, k), scale.view(-1, n)
    for i in range(w2d.shape[0]):
        label = name if w2d.shape[0] == 1 else f"{name}[expert {i}]"
        q2d[i], s2d[i] = quantize_rows(w2d[i], label)
    return q, scale


def dequantize_weights(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_weights`: ``q [..., N, K]`` int8, ``scale [..., N]`` -> ``w`` in ``dtype``."""
    if not isinstance(q, torch.Tensor) or not isinstance(scale, torch.Tensor):
        raise TypeError(f"dequantize_weights expects tensors, got {type(q).__name__} and {type(scale).__name__}")
    if q.dtype != torch.int8:
        raise TypeError(f"dequantize_weights expects int8 weights, got {q.dtype}")
    if not dtype.is_floating_point:
        raise TypeError(f"dequantize_weights returns a float dtype, got {dtype}")
    if tuple(scale.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"scale shape {tuple(scale.shape)} does not match weight rows {tuple(q.shape[:-1])}")
    if q.dim() <= 2:
        return (q.float() * scale.float().unsqueeze(-1)).to(dtype)
    # One [N, K] matrix at a time into the result: the fp32 product of a whole layer's experts would be twice the
    # size of a bf16 result on top of it (the same values either way)
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    for o, qi, si in zip(out.view(-1, *q.shape[-2:]), q.reshape(-1, *q.shape[-2:]), scale.reshape(-1, q.shape[-2])):
        o.copy_(qi.float() * si.float().unsqueeze(-1))
    return out
