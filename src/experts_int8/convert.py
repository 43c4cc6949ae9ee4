"""Offline conversion of a Hugging Face MoE checkpoint directory into an int8 experts checkpoint.

    report = quantize_checkpoint("Mixtral-8x7B", "Mixtral-8x7B-int8")

The result is the same on-disk format that ``save_pretrained`` writes for a model loaded with
``ExpertsInt8Config`` (so ``from_pretrained(dst)`` reloads it without re-quantizing), and the same int8 values
when that load keeps the checkpoint's dtype (the converter quantizes the stored weights; a load in a narrower
dtype quantizes them after rounding, which moves a few values by one step):

  * every routed-experts block becomes four tensors under the checkpoint's own prefix
    (``<prefix>.experts.gate_up_proj`` int8 ``[E, 2I, H]`` gate rows then up rows,
    ``<prefix>.experts.gate_up_proj_scale`` fp32 ``[E, 2I]``, ``<prefix>.experts.down_proj`` int8
    ``[E, H, I]``, ``<prefix>.experts.down_proj_scale`` fp32 ``[E, H]``; experts without a gate, whose
    checkpoints hold up and down projections only (NemotronH), get ``<prefix>.experts.up_proj`` int8
    ``[E, I, H]`` and its ``up_proj_scale`` ``[E, I]`` in place of the gate_up tensors);
  * every other tensor is copied unchanged (name, dtype, values);
  * ``config.json`` gains ``quantization_config`` (``quant_method: experts_int8``); tokenizer and
    other small files are copied.

A quantized release whose encoding :mod:`experts_int8.releases` reads (FP8 with block scales: DeepSeek-V3/R1,
MiniMax-M2, Qwen3's -FP8; AutoFP8's per-tensor FP8: neuralmagic's older -FP8; compressed-tensors' float-quantized
FP8: RedHatAI's -FP8-dynamic and -FP8; MXFP4: GPT-OSS) is read as the float checkpoint it encodes, in the
config's dtype: its experts become int8 as above, its other encoded weights are written in that float dtype, its
scale tensors (static input scales too) are dropped, and ``quantization_config`` is ours.

Recognised expert keys: per expert ``<prefix>.experts.{e}.{w1|w3|w2}.weight`` (Mixtral) or
``<prefix>.experts.{e}.{gate_proj|up_proj|down_proj}.weight``, and already fused float
``<prefix>.experts.gate_up_proj`` ``[E, 2I, H]`` (``up_proj`` ``[E, I, H]`` without a gate) /
``<prefix>.experts.down_proj`` ``[E, H, I]`` (GPT-OSS:
``[E, H, 2I]`` with interleaved gate/up columns and ``[E, I, H]``, plus ``..._bias`` tensors, rewritten to
that layout, the biases in fp32, as loading with ``ExpertsInt8Config`` does). A whole experts tensor that
transformers renames for the architecture (Granite's ``block_sparse_moe.input_linear.weight``) reads as the
fused tensor it becomes, and whole experts tensors it concatenates (Step-3.7's stacked ``moe.gate_proj.weight``
and ``moe.up_proj.weight``) read as the fused ``gate_up_proj`` they make.

``format="compressed-tensors"`` (:func:`export_compressed_tensors`) writes the same int8 values and
scales in the compressed-tensors "pack-quantized" W8A16 layout that vLLM loads, one Linear per
expert projection under the checkpoint's own per-expert names (fused sources get the names transformers
merges for the architecture, ``<prefix>.experts.{e}.{w1|w3|w2}`` for the Mixtral family,
``gate_proj|up_proj|down_proj`` for most others; an architecture whose experts it reads fused only is refused):

  * ``<proj>.weight_packed`` int32 ``[N, ceil(K / 4)]``: four values per word, value ``q + 128``
    (unsigned byte) of element ``4j + b`` in bits ``8b .. 8b + 7`` of word ``j``, zero padding;
  * ``<proj>.weight_scale`` fp32 ``[N, 1]`` (our scales, bit for bit; compressed-tensors and vLLM
    allocate this parameter in the model dtype and cast it on load: for bf16 a relative change of at
    most 2^-8 per row: 55 dB below the weights on the tiny test Mixtral);
  * ``<proj>.weight_shape`` int64 ``[2]`` = ``[N, K]``;
  * ``quantization_config``: one group, ``targets ["Linear"]``, 8-bit int symmetric ``channel``
    weights, no activation quantization, ``format pack-quantized``, ``quantization_status
    compressed``, and ``ignore`` = every non-expert 2-D ``*.weight`` module plus ``lm_head``
    (those tensors are copied unchanged), and the same layers under the names transformers gives them where
    it renames modules on load (its compressed-tensors loader matches the list against the model's names).

Streaming: tensors are read one at a time with ``safe_open`` and each expert is quantized on its
own, so memory holds about one output shard plus one expert's float copy. Output goes into a
temporary directory next to ``dst`` that is renamed at the end: a failure leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .checkpoint import EXPERT_COUNT_KEYS, FLOAT_DTYPES, CheckpointKeys, from_fused_layout, to_fused_layout
from .files import check_writable_dir, missing_folders, remove_empty, signals_held
from .releases import MODELOPT_CONFIG, float_decoders, release_encoding
from .quant import dequantize_weights, quantize_weights

QUANT_CONFIG = {"quant_method": "experts_int8", "bits": 8, "scheme": "symmetric_per_row",
                "modules_to_not_convert": None, "allow_no_experts": False}
INDEX_NAME = "model.safetensors.index.json"
FORMATS = ("native", "compressed-tensors")
# Per-expert projection names (gate, up, down) for experts stored fused in the source, without transformers to
# say which names its loader merges (see _loader_expert_names)
DEFAULT_EXPORT_NAMES = ("gate_proj", "up_proj", "down_proj")
# Per-expert projection names -> role in the fused layout.
ROLES = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}
PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)"
                        r"\.weight$")
FUSED = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<proj>(gate_up_proj|up_proj|down_proj)(_bias)?)$")
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
# weights of other frameworks a repository may hold beside its safetensors: not copied into the int8 checkpoint
OTHER_WEIGHT_SUFFIXES = (".msgpack", ".h5", ".onnx", ".onnx_data", ".npz", ".ot", ".mlmodel", ".bin.gz", ".tflite")


@dataclass
class ExpertsGroup:
    """One routed-experts block of the source checkpoint and where its tensors live."""

    prefix: str                                                   # e.g. model.layers.3.block_sparse_moe.experts
    per_expert: dict = field(default_factory=dict)                # (role, e) -> source key
    fused: dict = field(default_factory=dict)                     # "gate_up_proj" | "down_proj" (| "..._bias") -> key
    layout: str = "fused"                                         # of the fused tensors: checkpoint.to_fused_layout

    def source_keys(self) -> list[str]:
        return list(self.per_expert.values()) + list(self.fused.values())

    @property
    def w13(self) -> str:
        """The first projection's name: ``gate_up_proj``, or ``up_proj`` for experts without a gate (a fused
        ``up_proj`` tensor, or per-expert up and down projections and no gate one)."""
        gated = "up_proj" not in self.fused if self.fused else any(role == "gate" for role, _ in self.per_expert)
        return "gate_up_proj" if gated else "up_proj"


@dataclass
class ConversionReport:
    src: str
    dst: str
    seconds: float
    bytes_before: int
    bytes_after: int
    num_tensors: int
    snr_db: dict  # "<prefix>.gate_up_proj" -> dB (dequantized vs original)
    kept: list = field(default_factory=list)  # the experts modules modules_to_not_convert kept float (model names)

    def snr_summary(self) -> tuple[float, float]:
        values = list(self.snr_db.values())
        return min(values), statistics.median(values)


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"1.5GiB"``, ``"1000"`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read the size {text!r} (examples: 5GB, 500MB, 2GiB)")
    base = 1024 if m.group(3) else 1000
    power = " KMGT".index(m.group(2).upper() or " ")
    size = int(float(m.group(1)) * base ** power)
    if size < 1:
        raise ValueError(f"the size {text!r} is not positive (examples: 5GB, 500MB, 2GiB)")
    return size


def format_bytes(n: float) -> str:
    for unit, digits in (("B", 0), ("KB", 1), ("MB", 1), ("GB", 1)):
        if abs(round(n, digits)) < 1000:  # as printed: 999960 B is "1.0 MB", not "1000.0 KB"
            return f"{n:.{digits}f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # (the largest unit, however many: every path returns a str)


def _weight_files(p: Path) -> tuple[list[Path], Optional[dict[str, str]]]:
    """The safetensors files transformers loads from ``p``, and the index's weight_map where they come from one:
    model.safetensors, else those its index names (each must be there), else every *.safetensors. (transformers
    reads model.safetensors first: an unsharded save_pretrained over a sharded one leaves the old index beside
    it, naming shards it deleted.) Another file beside an index (a consolidated.safetensors from another
    release) is not the model's: read, its keys would overwrite the model's."""
    single = p / "model.safetensors"
    if single.is_file():
        return [single], None
    weight_map = _index_map(p)
    if weight_map is not None:
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (p / n).is_file()]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ValueError(f"{p / INDEX_NAME} names {missing[0]}{more}, missing from {p}; download the checkpoint "
                             f"again")
        return [p / n for n in names], weight_map
    return sorted(p.glob("*.safetensors")), None


def _index_map(p: Path) -> Optional[dict[str, str]]:
    """The weight_map of ``p``'s safetensors index (key -> file name in ``p``); None without an index."""
    index = p / INDEX_NAME
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("its keys and file names must be strings")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, RecursionError) as e:  # (the last: nested
        # past Python's stack, named no file)
        raise ValueError(f"{index} is not a safetensors index (a JSON object with a weight_map): "
                         f"{type(e).__name__}: {e}") from None
    outside = sorted({n for n in weight_map.values() if Path(n).name != n or n in ("", ".", "..")})
    if outside:  # ("../x.safetensors", an absolute path: a file that is not this checkpoint's)
        raise ValueError(f"{index} names {outside[0]!r}, not a file name in {p}: an index names the checkpoint's own "
                         f"files; download the checkpoint again")
    return weight_map


def read_model_dir(path) -> tuple[Path, dict, list[Path]]:
    """Check ``path`` is a Hugging Face model directory; returns (dir, config dict, safetensors files)."""
    if str(path) == "":  # (the current folder to the OS: the errors below named a blank)
        raise ValueError("the model path is empty: give a model directory")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if not p.is_dir():
        raise NotADirectoryError(f"{path} is a file; expected a model directory (config.json + *.safetensors)")
    config_file = p / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, RecursionError) as e:  # (the second: nested past Python's stack, named no file)
        raise ValueError(f"{config_file} is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} holds a JSON {type(config).__name__}, not a model config's object")
    text = text_config(config)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        value = text.get(key)
        if value is not None and (type(value) is not int or value < 1):  # (0 built a model that failed deep inside)
            raise ValueError(f"{config_file}: {key} is {value!r}, not a positive integer; the config is damaged: "
                             f"download it again")
    files, weight_map = _weight_files(p)
    placed: dict[str, list[str]] = {}  # (file -> its keys, once: a walk of the map per file took 20,000 files 50 s)
    for k, name in (weight_map or {}).items():
        placed.setdefault(name, []).append(k)
    for f in files:  # headers only: a truncated or foreign file is named here, not deep in a load
        if f.is_dir():  # (safetensors' own message: "No such device (os error 19)")
            raise ValueError(f"{f} is a folder, not a safetensors file; remove it or put the checkpoint's file there")
        # (a FIFO's open waits for a writer for ever, past Ctrl-C and SIGTERM; a dangling link, a Hub snapshot's
        # pruned blob, is no pipe: safe_open names it missing, to be downloaded again)
        if f.exists() and not f.is_file():
            raise ValueError(f"{f} is not a regular file (a pipe or a device), not a safetensors file; remove it or "
                             f"put the checkpoint's file there")
        try:
            with safe_open(str(f), framework="pt") as handle:
                keys = set(handle.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{f} is not a readable safetensors file ({exc}); download or convert it "
                             f"again") from None
        # A key the index places in a file that lacks it is read nowhere: the model would miss it
        absent = sorted(k for k in placed.get(f.name, ()) if k not in keys)
        if absent:
            more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
            raise ValueError(f"{p / INDEX_NAME} places {absent[0]}{more} in {f.name}, missing from that file: the "
                             f"index and the files do not match; download the checkpoint again")
    return p, config, files


def text_config(config: dict) -> dict:
    """A config.json's language-model settings (a multimodal wrapper's text_config over its top level)."""
    return {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config


def plan_groups(keys, layout: str = "fused", renames=()) -> dict[str, ExpertsGroup]:
    """Group the routed-experts keys of a checkpoint by block prefix (``layout``: its fused tensors';
    ``renames``: ``(pattern, name)`` pairs that give a whole experts tensor its fused name, see
    :func:`_experts_renames`)."""
    groups: dict[str, ExpertsGroup] = {}
    for key in keys:
        name = key
        for pattern, target in renames:
            name = pattern.sub(target, name)
        m = PER_EXPERT.match(key)
        if m:
            g = groups.setdefault(m["prefix"], ExpertsGroup(m["prefix"], layout=layout))
            g.per_expert[(ROLES[m["proj"]], int(m["e"]))] = key
            continue
        m = FUSED.match(name)
        if m:
            groups.setdefault(m["prefix"], ExpertsGroup(m["prefix"], layout=layout)).fused[m["proj"]] = key
    return groups


def _require_float(key: str, dtype: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{key} is {dtype}, not a float tensor (is this checkpoint already quantized?)")


def _check_group(g: ExpertsGroup, headers: dict, hidden: Optional[int]) -> tuple[int, int, int]:
    """Validate one block's keys and shapes; returns (E, H, I)."""
    if g.per_expert and g.fused:
        raise ValueError(f"{g.prefix}: the checkpoint has both per-expert and fused keys for the same experts")
    if g.fused:
        biased = g.layout == "gpt_oss"  # the only experts with biases (and the kernel takes them only so)
        w13, rows = g.w13, "2I" if g.w13 == "gate_up_proj" else "I"
        if {"gate_up_proj", "up_proj"} <= set(g.fused):
            raise ValueError(f"{g.prefix}: the checkpoint has both gate_up_proj and up_proj tensors for the same "
                             f"experts")
        missing = {w13, "down_proj"} - set(g.fused)
        if biased:
            missing |= {"gate_up_proj_bias", "down_proj_bias"} - set(g.fused)
        elif set(g.fused) - {w13, "down_proj"}:
            raise ValueError(f"{g.prefix}: expert biases are supported for GPT-OSS only")
        if missing:
            raise ValueError(f"{g.prefix}: fused experts tensor {g.prefix}.{min(missing)} is missing")
        for key in g.fused.values():
            _require_float(key, headers[key][0])
        s13, s2 = headers[g.fused[w13]][1], headers[g.fused["down_proj"]][1]
        if len(s13) != 3 or len(s2) != 3:
            raise ValueError(f"{g.prefix}: expected fused experts tensors of 3 dims, got {list(s13)} and {list(s2)}")
        fused = {t: tuple(to_fused_layout(g.layout, t, torch.empty(headers[k][1], device="meta")).shape)
                 for t, k in g.fused.items()}
        e, h, i = fused["down_proj"]
        if fused[w13] != (e, (2 if w13 == "gate_up_proj" else 1) * i, h) or (hidden is not None and h != hidden):
            raise ValueError(f"{g.prefix}: experts layout not supported: {w13} {list(s13)}, down_proj "
                             f"{list(s2)}; expected {w13} [E, {rows}, H] and down_proj [E, H, I]"
                             + (f" with H = hidden_size = {hidden}" if hidden is not None else "")
                             + f" (where transformers converts the layout: {_LOAD_AND_SAVE})")
        if biased and (fused["gate_up_proj_bias"], fused["down_proj_bias"]) != ((e, 2 * i), (e, h)):
            raise ValueError(f"{g.prefix}: expert biases of shapes {list(headers[g.fused['gate_up_proj_bias']][1])} "
                             f"and {list(headers[g.fused['down_proj_bias']][1])} do not match the experts")
        return e, h, i
    experts = sorted({e for _, e in g.per_expert})
    n = len(experts)
    if experts != list(range(n)):
        raise ValueError(f"{g.prefix}: expert indices are not 0..{n - 1} (found {experts[:8]}...)")
    shapes = {}
    for (role, e), key in sorted(g.per_expert.items()):
        dtype, shape = headers[key]
        _require_float(key, dtype)
        shapes.setdefault(role, set()).add(tuple(shape))
    for role in ("gate", "up", "down") if g.w13 == "gate_up_proj" else ("up", "down"):
        have = [e for e in experts if (role, e) in g.per_expert]
        if len(have) != n:
            miss = sorted(set(experts) - set(have))[0]
            raise ValueError(f"{g.prefix}: expert {miss} has no {role} projection in the checkpoint")
        if len(shapes[role]) != 1:
            raise ValueError(f"{g.prefix}: {role} projections differ in shape across experts: {sorted(shapes[role])}")
    (ui, uh), (dh, di) = (next(iter(shapes[r])) for r in ("up", "down"))
    gi, gh = next(iter(shapes.get("gate", {(ui, uh)})))  # (without a gate: the up projection's)
    if not (gi == ui == di and gh == uh == dh) or (hidden is not None and gh != hidden):
        raise ValueError(f"{g.prefix}: inconsistent expert shapes gate {[gi, gh]}, up {[ui, uh]}, down {[dh, di]}")
    return n, gh, gi


def _snr_db(signal: float, noise: float) -> float:
    import math

    if noise == 0:
        return float("inf")
    return 10 * math.log10(signal / noise) if signal > 0 else float("-inf")


class _Writer:
    """Buffers output tensors and writes a safetensors shard whenever ``max_bytes`` would be exceeded."""

    def __init__(self, out_dir: Path, max_bytes: int):
        self.out_dir, self.max_bytes = out_dir, max_bytes
        self.buffer: dict[str, torch.Tensor] = {}
        self.buffered = 0
        self.shards: list[tuple[str, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.buffer and self.buffered + size > self.max_bytes:
            self.flush()
        self.buffer[name] = tensor.contiguous().cpu()  # (a tensor decoded on the device: held here, not there)
        self.buffered += size
        self.total += size

    def flush(self) -> None:
        if not self.buffer:
            return
        name = f"shard-{len(self.shards):05d}.safetensors"
        try:
            save_file(self.buffer, str(self.out_dir / name), metadata={"format": "pt"})
        except Exception as exc:  # noqa: BLE001 - safetensors' own error types (a full disk among them)
            raise OSError(f"writing the converted checkpoint in {self.out_dir.parent} failed ({exc}); "
                          f"{format_bytes(self.total)} were converted so far; free space there or choose another "
                          f"DST") from None
        self.shards.append((name, list(self.buffer)))
        self.buffer, self.buffered = {}, 0

    def finish(self) -> None:
        self.flush()
        n = len(self.shards)
        if n == 1:
            os.replace(self.out_dir / self.shards[0][0], self.out_dir / "model.safetensors")
            return
        weight_map = {}
        for i, (tmp_name, keys) in enumerate(self.shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(self.out_dir / tmp_name, self.out_dir / final)
            weight_map.update({k: final for k in keys})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _check_dst(src, dst, src_dir: Path, overwrite: bool) -> Path:
    """DST as an absolute path, refused where writing it would clash with SRC, replace a folder without
    ``overwrite``, or fail for want of a writable folder."""
    dst_dir = Path(os.path.abspath(dst))  # (".." taken lexically: the final rename goes where the checks looked)
    if dst_dir.resolve() == src_dir.resolve():
        raise ValueError("DST must differ from SRC")
    if src_dir.resolve().is_relative_to(dst_dir.resolve()):  # replacing DST would delete the source
        raise ValueError(f"DST {dst} holds SRC {src}: choose a DST outside the source checkpoint's folders")
    _check_replaceable(dst_dir)  # (first: a DST --overwrite would refuse too is not told to pass it)
    if dst_dir.exists() and not overwrite:
        raise FileExistsError(f"{dst} already exists (pass --overwrite to replace it)")
    check_writable_dir(dst_dir.parent, f"DST {dst}: its folder")
    return dst_dir


def _tensor_index(files) -> tuple[dict[str, tuple[str, tuple]], dict[str, Path], list[str]]:
    """``(headers, key_file, order)`` of the source's safetensors ``files``: each key's (dtype, shape) and file,
    and the keys file by file (no tensor data read)."""
    headers: dict[str, tuple[str, tuple]] = {}
    key_file: dict[str, Path] = {}
    order: list[str] = []
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for key in sorted(handle.keys()):
                if key in key_file:
                    raise ValueError(f"tensor {key} appears in both {key_file[key].name} and {f.name}")
                s = handle.get_slice(key)
                headers[key], key_file[key] = (s.get_dtype(), tuple(s.get_shape())), f
                order.append(key)
    return headers, key_file, order


def quantize_checkpoint(src, dst, *, format: str = "native", device="cpu", max_shard_size="5GB",
                        overwrite: bool = False, progress: bool = True,
                        modules_to_not_convert: Optional[list[str]] = None) -> ConversionReport:
    """Convert the checkpoint directory ``src`` into an int8 experts checkpoint at ``dst`` (see module doc).

    ``format``: ``"native"`` (what ``save_pretrained`` of an ``ExpertsInt8Config`` model writes) or
    ``"compressed-tensors"`` (pack-quantized W8A16 for vLLM; see :func:`export_compressed_tensors`).

    ``modules_to_not_convert`` (native format only): as ``ExpertsInt8Config``'s (module names, fragments at module
    boundaries such as ``"layers.1"``, or regular expressions), matched against the experts modules' names in the
    model transformers builds: those experts are written float, as ``save_pretrained`` of a model loaded with that
    config writes them (fused ``gate_up_proj`` / ``down_proj`` in the model's layout, recorded in
    ``quantization_config``). An entry that names no experts module, or entries that name all of them, are refused
    before any work.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (choose one of {', '.join(FORMATS)})")
    patterns = _not_convert_patterns(modules_to_not_convert)  # (an invalid pattern: refused before anything else)
    if patterns and format != "native":
        # (transformers' compressed-tensors loader merges every layer's experts from packed keys and fails on float
        # ones; whether vLLM reads experts from the ignore list is unchecked)
        raise ValueError("modules_to_not_convert writes the native format only: a compressed-tensors export with "
                         "float experts would not load in transformers; write --format native")
    for name, path in (("SRC", src), ("DST", dst)):
        if str(path) == "":  # (an empty path is the current folder to the OS: the errors named a blank)
            raise ValueError(f"{name} is an empty path: give a folder")
    start = time.perf_counter()
    src_dir, config, files = read_model_dir(src)
    if not files:
        others = sorted(f.name for f in src_dir.iterdir() if f.suffix in WEIGHT_FILE_SUFFIXES)
        raise ValueError(f"{src} has no *.safetensors weights" + (f" (found {', '.join(others[:3])}; only "
                         f"safetensors checkpoints can be converted)" if others else ""))
    encoding = release_encoding(config, src)
    dst_dir = _check_dst(src, dst, src_dir, overwrite)
    _side_files(src_dir)  # (its refusal before any work)
    max_bytes = parse_size(max_shard_size)
    device = torch.device(device)
    headers, key_file, order = _tensor_index(files)

    renames = _experts_renames(config)
    # (a whole experts tensor's name as transformers loads it, and which of the loaded tensor's row parts it is)
    loaded = [(pattern, target, 0, 1) for pattern, target in renames] + [
        (re.compile(re.escape("." + source) + "$"), "." + target, part, 2)
        for sources, target in _experts_concatenations(config) for part, source in enumerate(sources)]
    decoders = float_decoders(encoding, headers, text_config(config), _loader_expert_names(config),
                              loaded) if encoding else {}
    merges = _experts_merges(config, headers)  # (of the decoded tensors, where a release encodes the parts)
    for made in (decoders, merges):  # (a tensor made of others takes the first one's place; the others go)
        first = {keys[0]: key for key, (keys, _) in made.items()}
        order = [first.get(key, key) for key in order]
    order = [key for key in order if key in headers]

    def load(key: str) -> torch.Tensor:
        # A file open only while one tensor is read: a handle kept open keeps every page read through it
        # mapped, and the process's memory would grow to the whole source checkpoint.
        try:
            with safe_open(str(key_file[key]), framework="pt") as handle:
                return handle.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"{key_file[key]}: reading {key} failed ({exc}); the file changed or is damaged since "
                             f"the conversion began: download it again") from None

    def read(key: str) -> torch.Tensor:
        if key in merges:
            keys, merge = merges[key]
            return merge(*(read(k) for k in keys))
        if key in decoders:  # (on the conversion's device: a release's every weight decodes, most of the work)
            keys, decode = decoders[key]
            return decode(*(load(k).to(device) for k in keys))
        return load(key)

    if format == "compressed-tensors" and _model_type(config) in EXPORT_UNSUPPORTED:
        raise ValueError(EXPORT_UNSUPPORTED[_model_type(config)])
    groups = plan_groups(headers, "fused", renames)
    layout = "fused"
    built = any(g.fused for g in groups.values()) or not needs_remote_code(config)
    if built:  # (the layout check also refuses experts the kernel cannot run)
        layout = _layout(src_dir, config)
        groups = plan_groups(headers, layout or "fused", renames)
    if not groups:
        # (a model whose experts transformers builds from tensors of other names than these)
        what = (f"; its model has routed experts, stored under names this converter does not read: {_LOAD_AND_SAVE}"
                if built and layout is not None else "; nothing to quantize")
        raise ValueError(f"{src} ({config.get('model_type', 'unknown model type')}) has no routed MoE experts "
                         f"tensors (keys like '...experts.0.w1.weight', '...experts.0.gate_proj.weight' or "
                         f"'...experts.gate_up_proj'){what}")
    if layout is None:  # (converted, the DST would not load: its model has no experts to put them in)
        raise ValueError(f"{src}: config.json's model_type {_model_type(config)!r} builds a model without routed "
                         f"experts, but the weights hold experts tensors ({next(iter(groups))}): the config and the "
                         f"weights do not belong together; download the checkpoint again")
    text = text_config(config)
    hidden = text.get("moe_latent_size") or text.get("hidden_size")  # (the experts' width: NemotronH's latent)
    shapes = {p: _check_group(g, headers, hidden) for p, g in groups.items()}
    # A size of 0 holds no data, yet the other sizes still allocate scales and loop over rows: a 1 KB file of
    # experts [0, 2**28] made minutes of work and gigabytes of scales
    empty = next(((p, s) for p, s in shapes.items() if 0 in s), None)
    if empty:
        raise ValueError(f"{empty[0]}: experts of E, H, I = {list(empty[1])}, a size of 0: the checkpoint is "
                         f"damaged; download it again")
    counts = {text[k] for k in EXPERT_COUNT_KEYS if type(text.get(k)) is int}  # (a per-layer list: not checked)
    wrong = next(((p, e) for p, (e, _, _) in shapes.items() if counts and e not in counts), None)
    if wrong:  # (converted, the DST would not load: its model is built with the config's count)
        raise ValueError(f"{wrong[0]} holds {wrong[1]} experts, but config.json says {min(counts)}: the config and "
                         f"the weights do not belong together; download the checkpoint again")
    kept = _kept_groups(src, src_dir, config, groups, patterns) if patterns else {}
    if format == "native":
        quant_config = dict(QUANT_CONFIG, modules_to_not_convert=list(patterns) if patterns else None)

        def emit(g, shape, get, device, snr):  # (the experts modules_to_not_convert names: written float)
            return _float_group(g, shape, get) if g.prefix in kept else _quantize_group(g, shape, get, device, snr)
    else:
        names = _loader_expert_names(config)
        if names is None and any(not g.per_expert for g in groups.values()):
            raise ValueError(f"{src} ({_model_type(config)}) holds its experts fused, and transformers reads this "
                             f"architecture's experts fused only: a compressed-tensors export (one Linear per "
                             f"expert projection) would load with its experts missing. Write the native int8 "
                             f"format instead (--format native)")
        quant_config = compressed_tensors_config(_ignored_modules(headers, groups,
                                                                  _model_linear_names(src_dir, config)))
        emit = lambda *a: _compressed_tensors_group(*a, fused_names=names)  # noqa: E731
    in_group = {k: p for p, g in groups.items() for k in g.source_keys()}

    parent = dst_dir.resolve().parent
    made = missing_folders(parent)  # removed on failure
    tmp = None
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dst_dir.name}.", suffix=".partial", dir=parent))
        except OSError as exc:  # (the OS's message named our temporary folder, not DST)
            raise OSError(f"DST {dst}: its parent folder {parent} is not writable ({exc.strerror}); choose another "
                          f"DST") from None
        writer = _Writer(tmp, max_bytes)
        snr: dict[str, float] = {}
        from tqdm.auto import tqdm

        done = set()
        bar = tqdm(total=len(order), unit="tensor", desc="quantizing", disable=not progress, leave=False)
        for key in order:
            if key in done:
                continue
            prefix = in_group.get(key)
            if prefix is None:
                writer.add(key, read(key))
                done.add(key)
                bar.update(1)
                continue
            g = groups[prefix]
            for name, tensors in emit(g, shapes[prefix], read, device, snr):
                writer.add(name, tensors)
            done.update(g.source_keys())
            bar.update(len(g.source_keys()))
        bar.close()
        try:
            writer.finish()
            _default_permissions(tmp)  # (before the copies: a private 0600 file of SRC stays private in DST)
            _copy_side_files(src_dir, tmp, config, quant_config)
        except OSError as exc:  # (the OS's message named our temporary folder, and no way out)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise OSError(f"writing the converted checkpoint in {parent} failed ({exc.strerror}); free space there "
                          f"or choose another DST") from None
        _move_into_place(tmp, dst_dir, overwrite)
    except BaseException:
        with signals_held():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            remove_empty(made)
        raise
    bytes_before = sum(f.stat().st_size for f in files)
    bytes_after = sum(f.stat().st_size for f in dst_dir.glob("*.safetensors"))
    return ConversionReport(str(src), str(dst), time.perf_counter() - start, bytes_before, bytes_after,
                            len(headers), snr, sorted(kept.values()))


def _not_convert_patterns(modules_to_not_convert) -> Optional[tuple[str, ...]]:
    """``modules_to_not_convert`` checked by ExpertsInt8Config's own rules (a list of str, each a valid pattern);
    None for none."""
    if modules_to_not_convert is None:
        return None
    from .integrations.transformers import _patterns

    return _patterns(modules_to_not_convert) or None


def _kept_groups(src, src_dir: Path, config: dict, groups: dict, patterns) -> dict[str, str]:
    """``{prefix: experts module name}`` of the ``groups`` that ``patterns`` keep float, matched as loading
    ``DST`` matches its ``modules_to_not_convert``: against the names of the model transformers builds (Mixtral's
    ``block_sparse_moe`` is ``mlp`` there), found by layer index and last names as loading finds the checkpoint's
    keys of a module; the checkpoint's own prefix where transformers cannot build the model."""
    from .integrations.transformers import ExpertsInt8Config, _names, experts_module_names

    config_obj = ExpertsInt8Config(modules_to_not_convert=list(patterns))
    try:
        model_names = experts_module_names(src_dir, config)
    except Exception:  # noqa: BLE001 - a model transformers cannot build (remote code) loads nowhere but by its keys
        model_names = []
    keys = CheckpointKeys(f"{p}.down_proj" for p in groups)
    name_of = {p: p for p in groups}
    for name in model_names:
        key = keys.find(f"{name}.down_proj")
        if key is not None:
            name_of[key[: -len(".down_proj")]] = name
    names = [name_of[p] for p in groups]
    # Refused, where ExpertsInt8Config only warns: a load may meet a config written for another model, but this is
    # one conversion the user runs for this checkpoint, and an entry that names nothing is almost surely a typo
    # (or a checkpoint name transformers renames, block_sparse_moe for mlp), which would otherwise cost a whole
    # conversion to an output that quantized the experts meant to stay float.
    unused = [m for m in patterns if not any(_names(m, name) for name in names)]
    if unused:
        raise ValueError(f"modules_to_not_convert {unused} names no routed experts module of {src} (they are named "
                         f"like {names[0]}, as transformers builds the model); give module names, fragments at "
                         f"module boundaries such as 'layers.1', or regular expressions of them")
    kept = {p: name_of[p] for p in groups if config_obj.skips(name_of[p])}
    if len(kept) == len(groups):  # (the converter has no allow_no_experts: a model without experts is refused too)
        raise ValueError(f"modules_to_not_convert {list(patterns)} names every routed experts module of {src} "
                         f"({len(groups)}): nothing to quantize")
    return kept


def _float_group(g: ExpertsGroup, shape, get):
    """Yield one experts block kept float (``modules_to_not_convert``), its values as the source holds them, as
    ``save_pretrained`` writes the experts a model loaded with ``ExpertsInt8Config`` kept float (and as loading DST
    reads them: the experts' merges are dropped on an int8 load): the fused tensors under the block's names in the
    model's layout (fused sources as they are; per-expert ones merged, a whole layer's float experts in memory at
    once)."""
    if g.fused:
        for t, key in g.fused.items():  # (a whole tensor transformers renames: under its fused name)
            yield f"{g.prefix}.{t}", get(key)
        return
    roles = ("gate", "up") if g.w13 == "gate_up_proj" else ("up",)
    w13 = torch.stack([torch.cat([get(g.per_expert[(r, x)]) for r in roles], dim=0) for x in range(shape[0])])
    yield f"{g.prefix}.{g.w13}", from_fused_layout(g.layout, g.w13, w13).contiguous()
    del w13
    w2 = torch.stack([get(g.per_expert[("down", x)]) for x in range(shape[0])])
    yield f"{g.prefix}.down_proj", from_fused_layout(g.layout, "down_proj", w2).contiguous()


_LOAD_AND_SAVE = ("load the model with quantization_config=ExpertsInt8Config() (quantized while loading) and "
                  "save_pretrained it instead")
# Architectures the compressed-tensors export (one bias-free Linear per expert projection, under the
# checkpoint's per-expert names) cannot express.
_GRANITE = ("Granite MoE checkpoints keep each layer's experts as one block_sparse_moe.input_linear / output_linear "
            "tensor, which the compressed-tensors export (one Linear per expert projection) does not write; write "
            "the native int8 format instead (--format native)")
EXPORT_UNSUPPORTED = {
    "gpt_oss": "GPT-OSS's experts have biases and a clamped SwiGLU, which the compressed-tensors export (one "
               "Linear per expert projection) does not carry; write the native int8 format instead (--format "
               "native)",
    "granitemoe": _GRANITE,
    "granitemoehybrid": _GRANITE,
    "granitemoeshared": _GRANITE,
}


def _conversions(config: dict) -> list:
    """transformers' checkpoint conversions for this model (its own type's and its text model's: Step-3.7's are
    its wrapper's); none without transformers."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return []
    types = sorted({config.get("model_type"), _model_type(config)} - {None})
    return [c for model_type in types for c in get_checkpoint_conversion_mapping(model_type) or []]


def _experts_renames(config: dict) -> list:
    """transformers' renames of whole experts tensors for this architecture, e.g. Granite's
    ``block_sparse_moe.input_linear.weight`` -> ``block_sparse_moe.experts.gate_up_proj`` (none without
    transformers)."""
    try:
        from transformers.core_model_loading import WeightRenaming
    except ImportError:
        return []
    renames = []
    for conversion in _conversions(config):
        if isinstance(conversion, WeightRenaming):
            for source, target in zip(conversion.source_patterns, conversion.target_patterns):
                if FUSED.match("model." + target):  # a whole experts tensor, not a module's rename
                    renames.append((re.compile(source), target))
    return renames


def _experts_merges(config: dict, headers: dict) -> dict:
    """Whole experts tensors transformers concatenates while loading (Step-3.7's stacked ``moe.gate_proj.weight``
    and ``moe.up_proj.weight`` [E, I, H] into ``mlp.experts.gate_up_proj`` [E, 2I, H]): each fused key -> (its
    parts' keys, the concatenation), as :func:`releases.float_decoders` gives them. ``headers`` is changed to the
    fused tensors' (the parts consumed)."""
    merges = {}
    for sources, target in _experts_concatenations(config):
        for key in [k for k in headers if k.endswith("." + sources[0])]:
            base = key[:-len(sources[0])]
            parts = (key, base + sources[1])
            if parts[1] not in headers:
                raise ValueError(f"{key} has no {parts[1]} beside it, which transformers concatenates with it into "
                                 f"{base + target}: the checkpoint is incomplete; download it again")
            (d0, s0), (d1, s1) = headers[parts[0]], headers[parts[1]]
            if d0 != d1 or len(s0) != 3 or tuple(s0) != tuple(s1):
                raise ValueError(f"{parts[0]} ({d0} {list(s0)}) and {parts[1]} ({d1} {list(s1)}) are not the two "
                                 f"halves [E, I, H] of {base + target}: the checkpoint is damaged; download it again")
            merges[base + target] = (parts, _cat_rows)
    for fused, (parts, _) in merges.items():
        dtype, shape = headers[parts[0]]
        for part in parts:
            del headers[part]
        headers[fused] = (dtype, (shape[0], 2 * shape[1], shape[2]))
    return merges


def _experts_concatenations(config: dict) -> list:
    """transformers' concatenations of two whole experts tensors while loading: [((first, second), fused name)]
    (Step-3.7's ``(moe.gate_proj.weight, moe.up_proj.weight)`` -> ``mlp.experts.gate_up_proj``)."""
    try:
        from transformers.core_model_loading import Concatenate, WeightConverter
    except ImportError:
        return []
    found = []
    for conversion in _conversions(config):
        operations = getattr(conversion, "operations", None) or []
        if not (isinstance(conversion, WeightConverter) and len(conversion.source_patterns) == 2
                and len(operations) == 1 and isinstance(operations[0], Concatenate) and operations[0].dim == 1):
            continue
        target = conversion.target_patterns[0]
        sources = [pattern.replace("\\", "") for pattern in conversion.source_patterns]
        if FUSED.match("model." + target) and not any("*" in source for source in sources):
            found.append((sources, target))  # (a whole experts tensor; per-expert merges are plan_groups' own)
    return found


def _cat_rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat([gate, up], dim=1)


def _loader_expert_names(config: dict) -> Optional[tuple[str, str, str]]:
    """(gate, up, down): the per-expert projection names transformers merges into this architecture's experts
    (Mixtral's w1, w3, w2; most others' gate_proj, up_proj, down_proj), read from its conversion mapping (the
    model's and its text model's); None where it merges none: its checkpoints hold the experts fused, and
    per-expert names would not load."""
    try:
        from transformers.core_model_loading import WeightConverter
    except ImportError:
        return DEFAULT_EXPORT_NAMES
    names = {}
    for conversion in _conversions(config):
        if not isinstance(conversion, WeightConverter):
            continue
        found = [re.search(r"experts\.\*\.(\w+)\.weight$", pattern.replace("\\", ""))
                 for pattern in conversion.source_patterns]
        if not found or not all(found):
            continue
        projections, target = [m.group(1) for m in found], conversion.target_patterns[0]
        if target.endswith("gate_up_proj") and len(projections) == 2:
            names["gate"], names["up"] = projections
        elif target.endswith("up_proj") and len(projections) == 1:  # experts without a gate
            names["up"] = projections[0]
        elif target.endswith("down_proj") and len(projections) == 1:
            names["down"] = projections[0]
    if "up" not in names or "down" not in names:
        return None
    return names.get("gate", DEFAULT_EXPORT_NAMES[0]), names["up"], names["down"]


def _architectures() -> Optional[dict]:
    """The integration's table of architectures; None without transformers (the converter does not need it)."""
    try:
        from .integrations.transformers import ARCHITECTURES
    except ImportError:
        return None
    return ARCHITECTURES


def _layout(src_dir: Path, config: dict) -> Optional[str]:
    """The fused experts tensors' layout of this architecture (``checkpoint.to_fused_layout``). Outside the
    table, the model's experts modules decide, built from the config on the meta device, and a model whose
    experts the kernel cannot run is refused as loading refuses it (None: the config builds a dense model);
    without transformers the plain layout (another then fails _check_group's shape check)."""
    architectures = _architectures()
    if architectures is None:
        return "fused"
    arch = architectures.get(_model_type(config))
    if arch is not None:
        return arch.layout
    from .integrations.transformers import layout_from_config

    return layout_from_config(src_dir, config)


def needs_remote_code(config: dict) -> bool:
    """The architecture is the checkpoint's own code (``auto_map``), unknown to transformers (Kimi K2's
    kimi_k2). Per-expert keys convert without building it; fused ones need its layout; loading refuses it."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    return bool(config.get("auto_map")) and config.get("model_type") not in CONFIG_MAPPING  # (AutoConfig's key)


def _model_type(config: dict) -> Optional[str]:
    return text_config(config).get("model_type") or config.get("model_type")


SNR_ROWS = 256  # rows of an expert whose quantization error is summed at a time


def _quantize_group(g: ExpertsGroup, shape, get, device, snr: dict):
    """Yield the four int8 tensors of one experts block, recording the SNR of each weight tensor."""
    e, h, i = shape
    w13 = g.w13
    rows = 2 * i if w13 == "gate_up_proj" else i
    q13 = torch.empty((e, rows, h), dtype=torch.int8)
    s13 = torch.empty((e, rows), dtype=torch.float32)
    q2 = torch.empty((e, h, i), dtype=torch.int8)
    s2 = torch.empty((e, h), dtype=torch.float32)
    # (fp64 sums kept on the device, read once per block of experts: a GPU is not waited for twice per rows block)
    stats = {w13: [torch.zeros((), dtype=torch.float64, device=device) for _ in range(2)],
             "down_proj": [torch.zeros((), dtype=torch.float64, device=device) for _ in range(2)]}

    def one(w, name, q_out, s_out, stat):
        w = w.to(device)
        q, s = quantize_weights(w, name=name)
        for lo in range(0, w.shape[0], SNR_ROWS):  # (fp64 copies of a block of rows, not of the whole expert)
            # (reshape: .to returns a float64 block itself, strided where the layout transposed it)
            wf = w[lo:lo + SNR_ROWS].to(torch.float64, memory_format=torch.contiguous_format).reshape(-1)
            # the dequantized rows less the weights, in place (the error's negative: the same squares); the sums of
            # squares as dot products, one pass each (pow / sum temporaries took three times as long as the
            # quantization on the CPU)
            err = dequantize_weights(q[lo:lo + SNR_ROWS], s[lo:lo + SNR_ROWS], torch.float64).view(-1).sub_(wf)
            stat[0] += torch.dot(wf, wf)
            stat[1] += torch.dot(err, err)
        q_out.copy_(q.cpu())
        s_out.copy_(s.cpu())

    if g.fused:
        f13, f2 = (to_fused_layout(g.layout, t, get(g.fused[t])) for t in (w13, "down_proj"))
        for x in range(e):
            one(f13[x], f"{g.fused[w13]}[expert {x}]", q13[x], s13[x], stats[w13])
            one(f2[x], f"{g.fused['down_proj']}[expert {x}]", q2[x], s2[x], stats["down_proj"])
        del f13, f2
        for t in ("gate_up_proj_bias", "down_proj_bias"):  # GPT-OSS: in the kernel's layout, fp32
            if t in g.fused:
                yield f"{g.prefix}.{t}", to_fused_layout(g.layout, t, get(g.fused[t])).float().contiguous()
    else:
        for x in range(e):
            parts = [g.per_expert[(role, x)] for role in (("gate", "up") if w13 == "gate_up_proj" else ("up",))]
            one(torch.cat([get(k) for k in parts], dim=0), " + ".join(parts), q13[x], s13[x], stats[w13])
            one(get(g.per_expert[("down", x)]), g.per_expert[("down", x)], q2[x], s2[x], stats["down_proj"])
    for name, (sig, noise) in stats.items():
        snr[f"{g.prefix}.{name}"] = _snr_db(float(sig), float(noise))
    yield f"{g.prefix}.down_proj", q2
    yield f"{g.prefix}.down_proj_scale", s2
    yield f"{g.prefix}.{w13}", q13
    yield f"{g.prefix}.{w13}_scale", s13


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """int8 ``q [N, K]`` in [-127, 127] -> int32 ``[N, ceil(K / 4)]`` in compressed-tensors' 8-bit packing.

    Element ``4j + b`` of a row is stored as the unsigned byte ``q + 128`` in bits ``8b .. 8b + 7``
    of word ``j`` (bit arithmetic, so the result does not depend on the host's byte order); a row
    whose length is not a multiple of 4 is padded with zero bytes.
    """
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"pack_int8 expects a 2-D int8 tensor, got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    u = q.to(torch.int64) + 128
    if k % 4:
        u = torch.nn.functional.pad(u, (0, 4 - k % 4))
    u = u.view(n, -1, 4)
    words = u[..., 0] | (u[..., 1] << 8) | (u[..., 2] << 16) | (u[..., 3] << 24)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def compressed_tensors_config(ignore) -> dict:
    """``quantization_config`` of a compressed-tensors pack-quantized W8A16 per-channel checkpoint."""
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "strategy": "channel",
               "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "pack-quantized"}},
            "ignore": list(ignore), "kv_cache_scheme": None, "global_compression_ratio": None,
            "sparsity_config": {}, "transform_config": {}}


def _ignored_modules(headers: dict, groups: dict, model_names=()) -> list[str]:
    """Every non-expert module with a 2-D ``.weight`` (the Linear layers that stay in the model dtype) + lm_head,
    + ``model_names``: the same layers under the names transformers gives them (see :func:`_model_linear_names`)."""
    experts = {k for g in groups.values() for k in g.source_keys()}
    names = {k[: -len(".weight")] for k, (_, shape) in headers.items()
             if k.endswith(".weight") and len(shape) == 2 and k not in experts}
    exported = {n for n in model_names if PER_EXPERT.match(n + ".weight")}  # (per-expert Linears: quantized)
    return sorted(names | {"lm_head"} | (set(model_names) - exported))


def _model_linear_names(src_dir: Path, config: dict) -> list[str]:
    """The non-expert Linear modules of the model transformers builds for ``src_dir``, under its names: a
    transformers load that keeps the checkpoint compressed (its default) matches the ignore list against those,
    and where they differ from the checkpoint's (a renamed router or prefix) a layer missing from the list is
    expected packed and loads without its weight. [] without transformers or where it cannot build the model
    (the checkpoint's names alone, which vLLM reads; a warning says so in the second case)."""
    try:
        from .integrations.transformers import dense_linear_names
        from .run import quiet_transformers
    except ImportError:
        return []
    try:
        with quiet_transformers():  # (a config's deprecation notes, already the source's business)
            return dense_linear_names(src_dir, config)
    except Exception as exc:  # noqa: BLE001 - any failure to build: the export itself does not need the names
        warnings.warn(f"{src_dir}: this transformers could not build the model ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}), so the export's ignore list names its "
                      f"layers as the checkpoint does only; a transformers release that renames them on load may "
                      f"then expect those layers packed. vLLM reads the checkpoint's names", stacklevel=2)
        return []


def _compressed_tensors_group(g: ExpertsGroup, shape, get, device, snr: dict, *, fused_names):
    """Yield one experts block as per-expert pack-quantized Linears (same int8 values as the native format)."""
    e, h, i = shape
    native = dict(_quantize_group(g, shape, get, device, snr))
    q13, s13 = native[f"{g.prefix}.{g.w13}"], native[f"{g.prefix}.{g.w13}_scale"]
    q2, s2 = native[f"{g.prefix}.down_proj"], native[f"{g.prefix}.down_proj_scale"]
    gated = g.w13 == "gate_up_proj"
    for x in range(e):
        projections = (("gate", 0, q13[x, :i], s13[x, :i]),) if gated else ()
        for role, n, q, s in projections + (("up", 1, q13[x, -i:], s13[x, -i:]), ("down", 2, q2[x], s2[x])):
            key = g.per_expert.get((role, x))  # (a per-expert source's own name; fused_names only for fused ones)
            module = key[: -len(".weight")] if key else f"{g.prefix}.{x}.{fused_names[n]}"
            yield f"{module}.weight_packed", pack_int8(q)
            yield f"{module}.weight_scale", s.reshape(-1, 1).clone()
            yield f"{module}.weight_shape", torch.tensor(list(q.shape), dtype=torch.int64)


def export_compressed_tensors(src, dst, **kwargs) -> ConversionReport:
    """``quantize_checkpoint(src, dst, format="compressed-tensors", ...)``: a checkpoint vLLM loads as W8A16.

    Loadable with transformers too (``pip install compressed-tensors``; its CPU path dequantizes the
    experts on load).
    """
    return quantize_checkpoint(src, dst, format="compressed-tensors", **kwargs)


def _check_replaceable(dst: Path) -> None:
    """Refuse, before any work, a DST that the final rename could not replace or should not: a link, a mount
    point, or (under --overwrite) a folder that holds something other than a model checkpoint."""
    if dst.is_symlink():
        raise ValueError(f"DST {dst} is a symbolic link; give the folder it points to, or another DST")
    if Path.cwd().is_relative_to(dst.resolve()):
        raise ValueError(f"DST {dst} holds the current folder, which a rename cannot replace; run from elsewhere "
                         f"or choose another DST")
    if dst.exists():
        if os.path.ismount(dst):
            raise ValueError(f"DST {dst} is a mount point, which a rename cannot replace; write into a folder in it")
        if not dst.is_dir():  # (no word of --overwrite, which would refuse it too)
            raise ValueError(f"DST {dst} is an existing file, not a folder; choose another DST")
        if any(dst.iterdir()) and not (dst / "config.json").is_file():
            raise ValueError(f"DST {dst} is not a model checkpoint folder (no config.json), and --overwrite replaces "
                             f"only one; choose another DST")


def _reason(exc: BaseException) -> str:
    """Why ``exc`` happened, without an OSError's file names (ours name temporary folders removed by now)."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


def _rename_new(tmp: Path, dst: Path) -> bool:
    """Rename ``tmp`` to an absent ``dst`` (or an empty folder that appeared meanwhile); False where ``dst`` holds
    files by now."""
    try:
        os.rename(tmp, dst)
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise OSError(f"moving the converted checkpoint to DST {dst} failed ({_reason(exc)})") from exc


def _move_into_place(tmp: Path, dst: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``dst``; with ``overwrite`` an existing ``dst`` is swapped out and removed,
    or put back if the swap fails. A ``dst`` that appeared while converting is not replaced without it."""
    if not dst.exists() and _rename_new(tmp, dst):
        return
    if not overwrite:
        raise FileExistsError(f"{dst} appeared while converting (another run?); it was left as it is: pass "
                              f"--overwrite to replace it, or choose another DST")
    _check_replaceable(dst)  # (again: what is there now may not be what was there at the start)
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
    try:
        os.replace(dst, old / "x")
    except FileNotFoundError:  # another run took it away meanwhile: nothing to put back, ours goes in its place
        old.rmdir()
        if not _rename_new(tmp, dst):
            raise FileExistsError(f"{dst} was replaced by another run while this one replaced it; it was left as "
                                  f"it is") from None
        return
    except BaseException as exc:  # (an empty .old folder was left beside DST)
        old.rmdir()
        if isinstance(exc, OSError):
            raise OSError(f"DST {dst} could not be moved aside to be replaced ({_reason(exc)}); it was left as "
                          f"it is") from exc
        raise
    try:
        os.replace(tmp, dst)
    except BaseException as exc:
        try:
            os.replace(old / "x", dst)  # the old checkpoint back where it was
        except OSError:
            raise OSError(f"replacing DST {dst} failed ({_reason(exc)}), and so did putting it back: the old "
                          f"checkpoint is in {old / 'x'}") from exc
        old.rmdir()
        if isinstance(exc, OSError):
            raise OSError(f"replacing DST {dst} failed ({_reason(exc)}); the old checkpoint was put back") from exc
        raise
    try:
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:  # (Ctrl-C or SIGTERM while a large old checkpoint is deleted, seconds: what remained of it
        with signals_held():  # was left in a hidden folder beside DST, never to be removed)
            shutil.rmtree(old, ignore_errors=True)
        raise


def _default_permissions(folder: Path) -> None:
    """The umask's permissions for ``folder`` and the files written in it: the temporary folder is private (0700)
    and safetensors writes its files 0600, so a checkpoint served from another account could not read them."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _side_files(src_dir: Path) -> list[Path]:
    """The non-weight files of ``src_dir`` the converted checkpoint gets a copy of (tokenizer, generation config).
    A link to a file outside the checkpoint is refused: its contents would be copied into a checkpoint made to be
    shared (a downloaded folder's ``notes.txt -> /proc/self/environ`` carried the user's tokens into DST). A Hub
    cache snapshot's links into its repository's blobs/ are the checkpoint's own files, as are links into any Hub
    cache's blobs/: a checkpoint in a snapshot's subfolder, or a folder huggingface_hub < 0.23 downloaded with
    ``local_dir``, whose files over 5 MB (a large tokenizer.json) link into the cache; and a link to a file of
    the same name in another checkpoint's folder."""
    root = src_dir.resolve()
    blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    files = []
    for f in sorted(src_dir.iterdir()):
        # (a ModelOpt release's hf_quant_config.json would make vLLM read the int8 output as ModelOpt's)
        if not f.is_file() or f.name in ("config.json", INDEX_NAME, MODELOPT_CONFIG) \
                or f.name.endswith(WEIGHT_FILE_SUFFIXES) \
                or f.name.endswith(OTHER_WEIGHT_SUFFIXES) or f.name.endswith(".index.json"):
            continue
        target = f.resolve()
        # (a folder of links to another checkpoint's files beside an edited config.json, the usual way to change
        # a config without copying the weights, links its tokenizer files too: each to its namesake in a folder
        # with a config.json, which no secret such as /proc/self/environ or ~/.ssh/id_rsa is)
        if not target.is_relative_to(root) and target.parent != blobs and not _hub_blob(target) \
                and not (target.name == f.name and (target.parent / "config.json").is_file()):
            raise ValueError(f"{f} links to {target}, outside the checkpoint folder, and DST would get a copy of "
                             f"it; copy the file into {src_dir} if it belongs to the checkpoint, or remove the link")
        files.append(f)
    return files


def _hub_blob(target: Path) -> bool:
    """Whether resolved ``target`` is a file of a Hugging Face cache's ``<repo type>s--<org>--<name>/blobs/``
    (each a public or the user's own download: not a secret a hostile link could reach)."""
    return target.parent.name == "blobs" and target.parent.parent.name.startswith(("models--", "datasets--",
                                                                                     "spaces--"))


def _copy_side_files(src_dir: Path, out_dir: Path, config: dict, quant_config: dict) -> None:
    """config.json with quantization_config, plus every other non-weight file (tokenizer, generation config)."""
    for f in _side_files(src_dir):
        shutil.copy2(f, out_dir / f.name)
    config = dict(config)
    config["quantization_config"] = quant_config
    # (DeepSeek-V4's release names its experts' FP4 encoding here; transformers would fold it into ours)
    config.pop("expert_dtype", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


__all__ = ["ConversionReport", "FORMATS", "compressed_tensors_config", "export_compressed_tensors", "format_bytes",
           "pack_int8", "parse_size", "plan_groups", "quantize_checkpoint", "read_model_dir"]
