"""Safetensors helpers: read tensor headers without loading data, validate int8 experts checkpoints, and
turn a checkpoint's experts tensors into the kernel's layout."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from safetensors import safe_open

SAFETENSORS_DTYPES = {torch.int8: "I8", torch.float32: "F32"}  # the dtypes of an int8 experts checkpoint's tensors
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # safetensors' names of the float dtypes a checkpoint can convert
# config.json's number of routed experts, under the names architectures give it
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def read_headers(files: Iterable[str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{key: (safetensors dtype, shape)}`` over all ``*.safetensors`` files given (no tensor data read)."""
    out = {}
    for path in files or ():
        if not str(path).endswith(".safetensors"):
            continue
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                s = f.get_slice(key)
                out[key] = (s.get_dtype(), tuple(s.get_shape()))
    return out


def _signature(name: str) -> tuple:
    """Layer indices + the last two name parts: equal for a key and its renamed in-memory name
    (e.g. ``layers.3.block_sparse_moe.experts.down_proj`` and ``layers.3.mlp.experts.down_proj``)."""
    parts = name.split(".")
    return tuple(p for p in parts[:-2] if p.isdigit()) + tuple(parts[-2:])


class CheckpointKeys:
    """Finds the checkpoint key of an in-memory tensor name: the name itself, or the one key with its
    layer indices and last two parts (``save_pretrained`` may write a model's renamed modules under their
    original names); of several such keys, the one whose stack differs from the name's by a base prefix alone,
    else the one sharing the most words with the name."""

    def __init__(self, keys: Iterable[str]):
        self.keys = set(keys)
        self.by_signature: dict[tuple, list[str]] = {}
        for key in self.keys:
            self.by_signature.setdefault(_signature(key), []).append(key)

    def find(self, name: str) -> Optional[str]:
        if name in self.keys:
            return name
        candidates = self.by_signature.get(_signature(name), [])
        if len(candidates) > 1:  # (DeepSeek-V4's layers.0 and its draft block mtp.0)
            # the stack whose path to the layer index differs from the name's by a base prefix alone
            # (``layers.0`` for ``model.layers.0``), else the one sharing the most words with it
            stacks = [key for key in candidates if _prefix_compatible(_stack(key), _stack(name))]
            candidates = stacks or candidates
            words = set(name.split("."))
            shared = [len(words & set(key.split("."))) for key in candidates]
            candidates = [key for key, n in zip(candidates, shared) if n == max(shared)]
        return candidates[0] if len(candidates) == 1 else None


def _stack(name: str) -> list[str]:
    """The words of a name before its first layer index (``model.layers`` of ``model.layers.3.mlp...``)."""
    parts = name.split(".")
    return parts[:next((i for i, p in enumerate(parts) if p.isdigit()), len(parts))]


def _prefix_compatible(a: list[str], b: list[str]) -> bool:
    short, long = sorted((a, b), key=len)
    return long[len(long) - len(short):] == short


def check_int8_checkpoint(headers: dict, expected: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Raise ValueError naming the key when an expected int8 experts tensor or its scale is missing,
    mis-shaped or of the wrong dtype. ``expected``: in-memory name -> (safetensors dtype, shape)."""
    keys = CheckpointKeys(headers)
    problems = []
    for name, (dtype, shape) in sorted(expected.items()):
        key = keys.find(name)
        if key is None:
            # Name it as the file would: a sibling tensor of the same module shows its on-disk prefix.
            prefix, _, tensor = name.rpartition(".")
            siblings = (keys.find(other) for other in expected if other.rpartition(".")[0] == prefix)
            sibling = next((k for k in siblings if k is not None), None)
            on_disk = f"{sibling.rpartition('.')[0]}.{tensor}" if sibling else name
            model_name = f" (the model's {name})" if on_disk != name else ""
            problems.append(f"{on_disk}{model_name}: not found in the checkpoint (expected {dtype} {list(shape)})")
            continue
        got_dtype, got_shape = headers[key]
        # fp32 scales and biases saved in another float dtype load as the values they hold, in fp32: a model cast
        # after quantizing (model.to(torch.bfloat16)) saved them in its dtype before 4124398 kept them fp32
        float_ok = dtype == SAFETENSORS_DTYPES[torch.float32] and got_dtype in FLOAT_DTYPES
        if (got_dtype != dtype and not float_ok) or tuple(got_shape) != tuple(shape):
            problems.append(f"{key}: expected {dtype} {list(shape)}, got {got_dtype} {list(got_shape)}")
    if problems:
        raise ValueError("int8 experts checkpoint is incomplete or inconsistent:\n  " + "\n  ".join(problems))


def to_fused_layout(layout: str, tensor: str, w: torch.Tensor) -> torch.Tensor:
    """One experts tensor (``[E, ...]``, or a single expert's ``[...]``) from ``layout`` to ours:
    ``gate_up_proj [.., 2I, H]`` gate rows then up rows, ``down_proj [.., H, I]``, biases ``[.., 2I]``
    (gate then up) and ``[.., H]``."""
    if layout == "fused" or tensor == "down_proj_bias":
        return w
    if layout == "transposed":  # transformers' is_transposed experts: [.., H, 2I] gate then up, [.., I, H]
        return w if tensor.endswith("_bias") else w.transpose(-1, -2)
    if layout != "gpt_oss":
        raise ValueError(f"unknown experts layout {layout!r}")
    if tensor == "gate_up_proj":  # [.., H, 2I] interleaved columns -> [.., 2I, H]
        return torch.cat([w[..., 0::2], w[..., 1::2]], dim=-1).transpose(-1, -2)
    if tensor == "gate_up_proj_bias":
        return torch.cat([w[..., 0::2], w[..., 1::2]], dim=-1)
    if tensor == "down_proj":  # [.., I, H] -> [.., H, I]
        return w.transpose(-1, -2)
    raise ValueError(f"unknown experts tensor {tensor!r}")


def from_fused_layout(layout: str, tensor: str, w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_fused_layout`: one experts tensor from our layout back to ``layout``'s."""
    if layout == "fused" or tensor == "down_proj_bias":
        return w
    if layout == "transposed":
        return w if tensor.endswith("_bias") else w.transpose(-1, -2)
    if layout != "gpt_oss":
        raise ValueError(f"unknown experts layout {layout!r}")
    if tensor in ("gate_up_proj", "gate_up_proj_bias"):  # gate rows then up rows -> interleaved columns
        cols = w.transpose(-1, -2) if tensor == "gate_up_proj" else w
        half = cols.shape[-1] // 2
        return torch.stack([cols[..., :half], cols[..., half:]], dim=-1).flatten(-2)
    if tensor == "down_proj":
        return w.transpose(-1, -2)
    raise ValueError(f"unknown experts tensor {tensor!r}")


__all__ = ["CheckpointKeys", "check_int8_checkpoint", "from_fused_layout", "read_headers", "to_fused_layout"]
