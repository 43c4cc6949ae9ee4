"""Loading a model directory for inference and timing generation (used by ``experts-int8 generate`` and
``experts-int8 demo``).

A float checkpoint is quantized while it loads (``ExpertsInt8Config``); a checkpoint whose
``config.json`` has ``quantization_config.quant_method == "experts_int8"`` (written by ``save_pretrained``
or ``experts-int8 quantize``) loads its int8 experts directly.
"""

from __future__ import annotations

import functools
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import read_headers
from .convert import QUANT_CONFIG, needs_remote_code, read_model_dir, text_config
from .releases import modelopt_config, release_encoding

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:  # torch's message lists every device type it knows
        raise ValueError(f"unknown device {device!r}: use cuda, cuda:N or cpu") from None
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device {device!r}: experts_int8 runs on cuda, cuda:N or cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    return dev


def checkpoint_kind(config: dict, files=()) -> str:
    """``"int8"`` for an experts_int8 checkpoint, ``"float"`` for an unquantized one; raises for others, and for
    int8 weights (in the safetensors ``files``) under a config.json that does not say so."""
    if needs_remote_code(config):  # (refused here, before transformers would ask on stdin whether to run it)
        from .integrations.transformers import remote_code_message

        raise ValueError(remote_code_message(config))
    qc = config.get("quantization_config")
    if qc and not isinstance(qc, dict):
        raise ValueError(f"config.json's quantization_config is a JSON {type(qc).__name__}, not an object")
    if qc and qc.get("quant_method") == QUANT_CONFIG["quant_method"]:
        return "int8"
    src = Path(files[0]).parent if files else ""
    if not qc and src:  # (a ModelOpt release may say so only in its hf_quant_config.json, which transformers ignores)
        try:
            qc = modelopt_config(src)
        except ValueError:
            qc = {"quant_method": "modelopt"}
        if qc and not any(dtype in ("F8_E4M3", "U8") for dtype, _ in read_headers(files).values()):
            qc = None  # (a stray hf_quant_config.json beside float weights, which transformers loads as they are)
    if qc:
        try:
            readable = release_encoding(config, src) is not None
        except ValueError:
            readable = False
        raise ValueError(f"the checkpoint is quantized with {qc.get('quant_method')!r}; experts-int8 loads float "
                         f"checkpoints (quantizing on the fly) or its own int8 checkpoints"
                         + ("; for generate, convert this release first (experts-int8 quantize SRC DST); eval "
                            "needs a float checkpoint" if readable else ""))
    # transformers would load int8 values as float weights (dropping their scales) and only report it
    int8 = next((key for key, (dtype, _) in read_headers(files).items() if dtype == "I8"), None)
    if int8 is not None:
        raise ValueError(f"config.json has no quantization_config, but the weights hold int8 tensors (e.g. {int8}): "
                         f"put back the config.json written with them (experts-int8 quantize or save_pretrained "
                         f"writes it), or use the float checkpoint")
    return "float"


def has_tokenizer(path) -> bool:
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def auto_model_class(config: dict):
    """transformers' Auto class for a checkpoint's ``config.json``: the causal LM where there is one, else
    the vision-language model (Qwen3-VL, GLM-4.5V), which runs text prompts through its text model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return AutoModelForCausalLM if config.get("model_type") in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES \
        else AutoModelForImageTextToText


def load_model(path, *, device="cpu", dtype: torch.dtype = torch.bfloat16, parallel: Optional[str] = None,
               group=None):
    """``(model, kind)``: the model of directory ``path`` with int8 routed experts, in eval mode on ``device``.

    ``parallel`` (``"tp"`` or ``"ep"``, with torch.distributed initialized): the routed experts split over
    ``group``'s ranks (:mod:`experts_int8.parallel`). An int8 checkpoint is read split, each rank only its
    part of the experts; a float one loads whole on the CPU, is quantized, and then split."""
    from .integrations.transformers import ExpertsInt8Config, NoExpertsError, verify_int8_model
    from .parallel import _split_over, parallelize_experts, refusing_on_every_rank, split_while_loading

    before_split = nullcontext
    if parallel is not None:  # the mode and the process group, before a load that can take minutes
        split = _split_over(group, parallel, "load_model")
        # what fails on this rank alone before its exchange of shapes (its copy of the files missing, a float
        # checkpoint's load) reaches the other ranks there (an int8 load: split_while_loading does so)
        before_split = functools.partial(refusing_on_every_rank, split, group, device)
    with before_split():
        _, config, files = read_model_dir(path)
        kind = checkpoint_kind(config, files)
        if not files:
            raise ValueError(f"{path} has no *.safetensors weights")
        dev = check_device(str(device))
    kwargs = {"dtype": dtype}
    if kind == "float":
        kwargs["quantization_config"] = ExpertsInt8Config()
    whole_then_split = parallel is not None and kind == "float"  # loads on the CPU, then splits onto dev
    move_after = dev.type != "cpu"
    if move_after and not whole_then_split:
        try:
            import accelerate  # noqa: F401  -- device_map needs it

            kwargs["device_map"], move_after = str(dev), False
        except ImportError:
            pass
    loading = (split_while_loading(parallel, group, dev) if parallel is not None and kind == "int8"
               else before_split())
    with loading:
        try:
            model = from_pretrained(config, path, **kwargs)
        except NoExpertsError:
            raise ValueError(f"{path} ({', '.join(config.get('architectures') or [config.get('model_type', '?')])}) "
                             f"has no routed MoE experts: experts-int8 runs MoE models (to measure a dense "
                             f"model's MLPs as 1-expert int8 layers: experts-int8 eval --dense-as-experts)") from None
    if whole_then_split:
        parallelize_experts(model, parallel, group, dev)
    if move_after:
        model = model.to(dev)
    qc = getattr(model.config, "quantization_config", None)
    verify_int8_model(model, qc if isinstance(qc, ExpertsInt8Config) else None)  # (its modules_to_not_convert)
    return model.eval(), kind


def from_pretrained(config: dict, path, **kwargs):
    """``from_pretrained`` of the model class ``config`` names. Its load report is logged as a warning, which
    :func:`quiet_transformers` hides, so what it would say is said here in one line: tensors refused, and
    weights the model needs that the files lack (transformers gives those random values and goes on)."""
    from .integrations.transformers import TensorMismatchError

    try:
        model, info = auto_model_class(config).from_pretrained(str(path), output_loading_info=True, **kwargs)
    except (RuntimeError, TensorMismatchError) as exc:
        # transformers refuses a mismatched tensor over its report; 5.17 loads a mismatched experts tensor into
        # the quantized module, which the quantizer's check then refuses
        if isinstance(exc, RuntimeError) and "above report" not in str(exc):
            raise
        raise ValueError(f"{path}: its tensors were refused ({str(exc).splitlines()[0]}): some weights' "
                         f"shapes or dtypes do not fit the model its config.json describes; check that they "
                         f"belong together") from None
    missing = sorted(info["missing_keys"])
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(f"{path}: {len(missing)} weight(s) the model needs are not in its files ({shown}); "
                         f"transformers would start them from random values. Is a shard or file missing?")
    return model


def load_tokenizer(path):
    """The tokenizer saved with the model at ``path``; a file that does not parse is named in the error."""
    import importlib.util

    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError) as exc:  # JSONDecodeError is a ValueError
        hint = ""
        if (Path(path) / "tokenizer.model").is_file() and not (Path(path) / "tokenizer.json").is_file() and not all(
                importlib.util.find_spec(m) for m in ("sentencepiece", "google.protobuf")):
            hint = "; its tokenizer.model is a sentencepiece model: pip install sentencepiece protobuf"
        raise ValueError(f"{path}: its tokenizer files do not load ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}){hint}") from None


def read_tokens(tokenizer, path, max_tokens: int) -> list[int]:
    """The first ``max_tokens`` tokens of the text file ``path``, reading and tokenizing only as much of it as
    that takes (a whole corpus file would be tokenized, and held, for a few thousand tokens)."""
    with open(path, errors="replace") as f:
        text = f.read(max(4096, 16 * max_tokens))
        while True:
            ids = tokenizer(text).input_ids
            if len(ids) > max_tokens + 64:  # (a margin: the cut may split the last word read, so its tokens)
                return ids[:max_tokens]
            more = f.read(len(text))  # (doubling what was read)
            if not more:
                return ids[:max_tokens]
            text += more


def check_context(config: dict, tokens: int, what: str) -> None:
    """Refuse ``tokens`` positions (``what`` they are) past the model's ``max_position_embeddings``."""
    limit = text_config(config).get("max_position_embeddings")
    if isinstance(limit, int) and not isinstance(limit, bool) and tokens > limit:
        raise ValueError(f"{what} take {tokens} positions, past the model's max_position_embeddings ({limit}); "
                         f"ask for fewer")


def check_token_ids(config: dict, ids, path) -> None:
    """Refuse token ids past the model's ``vocab_size``: a tokenizer of another model (the embedding's own error
    said only "index out of range in self")."""
    vocab = text_config(config).get("vocab_size")
    top = max((int(i) for i in torch.as_tensor(ids).flatten().tolist()), default=-1)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and top >= vocab:
        raise ValueError(f"{path}'s tokenizer gives token id {top}, past the model's vocab_size ({vocab}): its "
                         f"tokenizer files are not this model's; copy the original model's tokenizer files")


def memory_bytes(model) -> dict:
    """Bytes of the routed experts (weights + scales) and of all parameters and buffers."""
    from .integrations.transformers import find_experts

    def size(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    experts = find_experts(model)
    expert_ids = set()
    expert_bytes = 0
    for _, module in experts:
        tensors = [t for t in list(module.parameters()) + list(module.buffers()) if id(t) not in expert_ids]
        expert_ids.update(id(t) for t in tensors)
        expert_bytes += size(tensors)
    total = size({id(t): t for t in list(model.parameters()) + list(model.buffers())}.values())
    return {"experts": expert_bytes, "total": total, "expert_modules": len(experts)}


class _BarStreamer:
    """A transformers streamer that advances a tqdm bar per generated token (the prompt is skipped)."""

    def __init__(self, bar):
        self.bar, self.seen_prompt = bar, False

    def put(self, value):
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.bar.update(1)

    def end(self):
        pass


@dataclass
class Generation:
    ids: torch.Tensor         # [batch, prompt + new]
    new_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, progress: bool = False,
             desc: str = "generating", stop_at_eos: bool = True) -> Generation:
    """Greedy generation (the argmax token each step), timed (prefill + decode, after the caller's warm-up)."""
    from tqdm.auto import tqdm
    from transformers import GenerationConfig

    from .evaluate import input_device

    device = input_device(model)  # (not the meta device of an embedding accelerate offloads)
    input_ids = input_ids.to(device)
    cfg = model.generation_config
    # Only the special tokens of the checkpoint's generation_config.json: transformers fills whatever a call
    # leaves unset from it, and a shipped repetition_penalty, no_repeat_ngram_size or num_beams would change
    # the tokens of what is called greedy.
    eos = cfg.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (
        eos[0] if isinstance(eos, (list, tuple)) and eos else eos)
    greedy = GenerationConfig(do_sample=False, num_beams=1, bos_token_id=cfg.bos_token_id, eos_token_id=eos,
                              pad_token_id=pad)  # (a list of end tokens: the first pads)
    extra = {} if stop_at_eos else {"min_new_tokens": max_new_tokens}
    with tqdm(total=max_new_tokens, desc=desc, unit="tok", disable=not progress, leave=False) as bar:
        model.generation_config = greedy
        try:
            _sync(device)
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     max_new_tokens=max_new_tokens, streamer=_BarStreamer(bar) if progress else None,
                                     **extra)
            _sync(device)
            seconds = time.perf_counter() - start
        finally:
            model.generation_config = cfg
    return Generation(out, out.shape[1] - input_ids.shape[1], seconds)


def peak_memory(device) -> tuple[str, int]:
    """(what was measured, bytes): peak CUDA memory allocated, or on CPU the process's peak RSS."""
    if torch.device(device).type == "cuda":
        return "peak GPU memory allocated", torch.cuda.max_memory_allocated(device)
    return "peak process memory (RSS)", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class quiet_transformers:  # noqa: N801 - called as a function, as torch.set_grad_enabled is
    """No transformers progress bars / info logs (our commands show their own), from the call on; ``restore()``,
    or the end of a ``with`` block, puts the caller's settings back (what a library function owes its caller)."""

    def __init__(self):
        from transformers.utils import logging as hf_logging

        self._hf = hf_logging
        self._before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()

    def restore(self) -> None:
        verbosity, bars = self._before
        self._hf.set_verbosity(verbosity)
        if bars:
            self._hf.enable_progress_bar()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


__all__ = ["DTYPES", "Generation", "checkpoint_kind", "generate", "has_tokenizer", "load_model",
           "memory_bytes", "peak_memory"]
