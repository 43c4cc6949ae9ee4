"""The ``experts-int8`` command.

Adding a command: write a function under ``@command(...)`` with its click options; it receives its
options as keyword arguments and gets ``--debug`` and the error handling for free. Import heavy
modules inside the function so ``experts-int8 --help`` stays quick.

Errors: without ``--debug`` any exception prints one line (``Error: <what went wrong>``) on stderr
and exits with status 1; with ``--debug`` the full traceback is shown. Ctrl-C exits with 130.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

import click

CONTEXT_SETTINGS = dict(help_option_names=["-h", "--help"], max_content_width=100)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="experts-int8", message="%(prog)s %(version)s")
def main():
    """Mixture-of-Experts inference with int8 expert weights (W8A16) in one fused Triton kernel."""


def one_line(exc: BaseException) -> str:
    """``exc`` as a single line: its message (lines joined), or its type when it has none."""
    message = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)  # no repr quotes
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    return text or type(exc).__name__


# The optional dependencies, by the extra that installs them (pyproject.toml's optional-dependencies).
EXTRAS = {"transformers": "hf", "accelerate": "hf"}


def install_hint(exc: BaseException) -> str:
    """For a missing optional dependency: the pip command that installs it."""
    if not isinstance(exc, ModuleNotFoundError) or exc.name is None:
        return ""
    package = exc.name.split(".")[0]
    if package == "triton":
        return "; the Triton kernels (and tune, bench) need Linux, where pip installs Triton with experts-int8"
    extra = EXTRAS.get(package)
    return f"; install it with: pip install 'experts-int8[{extra}]'" if extra else ""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a job's time limit, `docker stop`, a closed terminal), raised where the process is, so
    that the cleanup a Ctrl-C gets (no partial output) runs for them too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise(received: list):
    """SIGTERM and SIGHUP raise :class:`Terminated` inside, SIGINT (where Python's handler has it) KeyboardInterrupt,
    and each adds its number to ``received`` (in the main thread; elsewhere left as they are). A signal's exception
    raised inside native code that calls back into Python (safetensors' reads through torch) can come out as
    another error; ``received`` still says the signal came."""

    def stop(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    signums = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    signums = [n for n in signums if signal.getsignal(n) is not signal.SIG_IGN]  # (nohup's SIGHUP stays ignored)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signums.append(signal.SIGINT)
    try:
        before = {n: signal.signal(n, stop) for n in signums}
    except ValueError:  # not the main thread
        before = {}
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(n, handler)


def _stopped(signum: int) -> None:
    click.echo("Interrupted." if signum == signal.SIGINT else f"Stopped by {signal.Signals(signum).name}.", err=True)
    sys.exit(128 + signum)


def clean_errors(fn: Callable) -> Callable:
    """Wrap a command callback: adds ``--debug``; without it, exceptions become one ``Error:`` line."""

    @functools.wraps(fn)
    def wrapper(*args, debug: bool = False, **kwargs):
        received: list[int] = []
        try:
            with _signals_raise(received):
                return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click reports these itself
        except BrokenPipeError:  # (`... | head`: the reader left; say nothing more, as a pipe's writer does)
            if debug:
                raise
            try:  # (Python would report the pipe again when it flushes stdout at exit)
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, sys.stdout.fileno())
                finally:  # (dup2 makes its own: this one was left open, one more each time in a process that goes on)
                    os.close(devnull)
            except (OSError, ValueError):  # no file descriptor behind stdout
                pass
            sys.exit(128 + 13)  # (SIGPIPE's status)
        except KeyboardInterrupt as exc:
            if debug:
                raise
            _stopped(exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
        except Exception as exc:  # noqa: BLE001 - the whole point: one clear line instead of a traceback
            if debug:
                raise
            if received:  # the signal's exception, turned into this one inside native code: a Ctrl-C read as
                _stopped(received[0])  # "Error: ... the file changed or is damaged ...: download it again"
            click.echo(f"Error: {one_line(exc)}{install_hint(exc)}  (run with --debug for the traceback)", err=True)
            sys.exit(1)

    return click.option("--debug", is_flag=True, help="Show the full traceback when something fails.")(wrapper)


def command(name: Optional[str] = None, **kwargs) -> Callable:
    """Register a subcommand of ``experts-int8`` with ``--debug`` and clean errors (see the module doc)."""

    def decorate(fn: Callable) -> click.Command:
        return main.command(name, context_settings=CONTEXT_SETTINGS, **kwargs)(clean_errors(fn))

    return decorate


def _command_line() -> str:
    return shlex.join(["experts-int8", *sys.argv[1:]])


# --- option parsing shared by commands ----------------------------------------------------------

def parse_shape_option(text: str) -> tuple[int, int, int, int]:
    """``"E,H,I,k"`` -> four positive ints with k <= E."""
    try:
        e, h, i, k = (int(p) for p in text.replace(":", ",").split(","))
    except ValueError:
        raise click.BadParameter(f"expected E,H,I,k (four integers, e.g. 8,4096,14336,2), got {text!r}",
                                 param_hint="--shape") from None
    from .bench import is_valid_shape

    if not is_valid_shape(e, h, i, k):
        raise click.BadParameter(f"E, H, I, k must be positive with k <= E, got {text!r}", param_hint="--shape")
    return e, h, i, k


def parse_patterns(values) -> list[str]:
    """``--modules-to-not-convert``'s values (each comma-separated; a comma inside a regex's ``{m,n}`` is kept) ->
    the patterns, blanks dropped."""
    import re

    patterns = [p.strip() for v in values for p in re.split(r",(?![^{]*\})", v) if p.strip()]
    if not patterns:
        raise click.BadParameter("no pattern given", param_hint="--modules-to-not-convert")
    return patterns


def shape_from_model_config(path: str) -> tuple[int, int, int, int]:
    """(E, H, I, k) from a Hugging Face ``config.json`` (or the folder holding it) of an MoE model."""
    from .convert import text_config

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    with open(p) as f:
        try:
            cfg = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{p} is not valid JSON ({exc}); give a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{p} holds a JSON {type(cfg).__name__}, not a model config's object")
    cfg = text_config(cfg)  # (multimodal wrappers keep the LM config inside)

    def first(*keys):
        for key in keys:
            if cfg.get(key) is not None:
                raw = cfg[key] if isinstance(cfg[key], list) else [cfg[key]]  # per layer (Hunyuan)
                if not raw or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
                    raise ValueError(f"{p}: {key} is {cfg[key]!r}, not an integer (or one per layer)")
                if len(set(raw)) != 1:
                    raise ValueError(f"{p}: {key} differs between layers ({sorted(set(raw))}); tune each layer's "
                                     f"shape with --shape E,H,I,k")
                return raw[0]
        raise ValueError(f"{p} is not an MoE model config: none of {', '.join(keys)} is set")

    experts = first("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    hidden = first("moe_latent_size", "hidden_size")  # the experts' width (NemotronH's latent projection)
    inter = first("moe_intermediate_size", "intermediate_size")
    top_k = first("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k", "moe_k", "moe_topk")
    from .bench import is_valid_shape

    if not is_valid_shape(experts, hidden, inter, top_k):
        raise ValueError(f"{p}: the experts' shape E={experts}, H={hidden}, I={inter}, k={top_k} is not one to "
                         f"tune (all positive, k <= E)")
    return experts, hidden, inter, top_k


def experts_form(path: str) -> Optional[dict]:
    """The experts' form (``gated``, ``activation``, ``biases``) of the model of a ``config.json`` (or its folder),
    from its own modules built on the meta device where transformers can build them; None otherwise (a config
    alone does not say)."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    if not (folder / "config.json").is_file():
        return None
    try:
        from .integrations.transformers import experts_form as read_form

        return read_form(folder, json.loads((folder / "config.json").read_text()))
    except Exception:  # noqa: BLE001 - a module transformers cannot build (an unknown hidden_act, say) tells nothing
        return None


# --- bench ---------------------------------------------------------------------------------------

@command("bench", epilog="""\b
Examples:
  experts-int8 bench                                   # 5 shapes x 14 M x bf16 + int8
  experts-int8 bench --quick --shapes qwen3-30b-a3b,mixtral-8x7b --m 1,16,256,4096
  experts-int8 bench --dtypes int8 --shapes 8:4096:14336:2 --out /tmp/results
  experts-int8 bench --shapes 128:2688:1856:6 --no-gate --activation relu2   # Nemotron 3 Nano
  experts-int8 bench --shapes 32:2880:2880:4 --activation swiglu_oai --biases # GPT-OSS-20B
""")
@click.option("--shapes", default=None, metavar="LIST",
              help="Comma-separated named shapes (mixtral-8x7b, mixtral-8x22b, jamba-1.5-mini, qwen3-30b-a3b, "
                   "deepseek-v2-lite) or E:H:I:k. Default: all five.")
@click.option("--m", "ms", default=None, metavar="LIST", help="Comma-separated token counts. Default: 1,2,4,...,8192.")
@click.option("--dtypes", default="bf16,int8", show_default=True, help="Weight formats to time, in the same run.")
@click.option("--out", default="benchmarks/results", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the JSON and PNG.")
@click.option("--quick", is_flag=True, help="5 timed replays per row instead of 20.")
@click.option("--reps", type=click.IntRange(1), default=None, help="Timed replays per row (median).")
@click.option("--pool-gb", type=click.FloatRange(0, min_open=True), default=4.0, show_default=True,
              help="Weight pool budget per shape and dtype, in GB.")
@click.option("--settle-s", type=click.FloatRange(0, 60), default=1.0, show_default=True,
              help="Seconds the GPU idles before each shape and dtype's rows, so the power cap the rows before "
                   "left has lifted.")
@click.option("--settle-every-row/--no-settle-every-row", default=True, show_default=True,
              help="Idle --settle-s before every row too, not only before each section's first (without: a "
                   "shorter run, whose rows inherit their neighbours' power state).")
@click.option("--warm-s", type=click.FloatRange(0, 60), default=0.5, show_default=True,
              help="Seconds of untimed replays before each row's timed ones, so that every row is timed in the "
                   "clock state its own work sets.")
@click.option("--eager", is_flag=True, help="Time eager calls instead of CUDA graph replays.")
@click.option("--no-plot", is_flag=True, help="Skip the PNG.")
@click.option("--no-gate", is_flag=True, help="Experts without a gate (up_proj [E, I, H], act(up): NemotronH), "
                                              "every shape.")
@click.option("--activation", default="silu", show_default=True,
              help="The experts' activation (silu, gelu, gelu_tanh, swiglu_oai for GPT-OSS, relu2).")
@click.option("--biases", is_flag=True, help="Expert biases on both GEMMs (GPT-OSS).")
def bench_command(shapes, ms, dtypes, out, quick, reps, pool_gb, settle_s, settle_every_row, warm_s, eager, no_plot,
                  no_gate, activation, biases):
    """Time fused_experts with bf16 and int8 experts against the GPU's copy and matmul ceilings.

    Prints a table and writes JSON + PNG (time and fraction of ceiling vs M, one panel per shape)
    with the GPU name, the library commit and this command line. The commit recorded is
    $EXPERTS_INT8_COMMIT when set (for a copy of the source tree whose .git is stale or missing),
    else git's HEAD of the library's source tree, else "unknown".
    """
    from . import bench

    names = [s for s in (shapes.split(",") if shapes is not None else bench.SHAPES) if s.strip()]
    if not names:
        raise click.BadParameter("no shapes given", param_hint="--shapes")
    for name in names:
        bench.parse_shape(name)
    kw = dict(shapes=names, ms=bench.parse_int_list([ms]) if ms else list(bench.DEFAULT_MS),
              dtypes=bench.parse_dtypes([dtypes]), out_dir=out, pool_gb=pool_gb, settle_s=settle_s,
              settle_every_row=settle_every_row, warm_s=warm_s,
              use_graph=not eager, plot=not no_plot, gated=not no_gate, activation=activation, biases=biases)
    bench.check_form(kw["gated"], activation)
    if reps is not None:
        kw["reps"] = reps
    settings = bench.Settings.quick(**kw) if quick else bench.Settings(**kw)
    bench.run_benchmark(settings, command=_command_line())


# --- tune ----------------------------------------------------------------------------------------

@command("tune", epilog="""\b
Examples:
  experts-int8 tune --shape 8,4096,14336,2                 # Mixtral-8x7B experts
  experts-int8 tune --model-config path/to/Qwen3-30B-A3B/config.json --tp 2
  experts-int8 tune --shape 64,2048,1408,6 --dtypes int8 --m 1,16,64,256 --budget-s 120
  experts-int8 tune --shape 128,2688,1856,6 --no-gate       # Nemotron 3 Nano (experts without a gate)
  experts-int8 tune --shape 32,2880,2880,4 --activation swiglu_oai --biases   # GPT-OSS-20B
""")
@click.option("--shape", default=None, metavar="E,H,I,k", help="Experts, hidden size, intermediate size, top-k.")
@click.option("--model-config", type=click.Path(exists=True), default=None,
              help="A Hugging Face config.json (or its folder) to read the shape from.")
@click.option("--tp", type=click.IntRange(1), default=1, show_default=True,
              help="Tensor-parallel size: the experts' intermediate size is split this many ways.")
@click.option("--dtypes", default="int8,bf16", show_default=True, help="Weight formats to tune.")
@click.option("--m", "ms", default=None, metavar="LIST", help="Comma-separated token counts. Default: 1,2,4,...,8192.")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the tables. Default: the user cache, which get_config reads (see above).")
@click.option("--max-candidates", type=click.IntRange(1), default=32, show_default=True,
              help="Configs timed per M (plus the default and GROUP_SIZE_M variants of the winner).")
@click.option("--reps", type=click.IntRange(1), default=5, show_default=True, help="Timed runs per config (median).")
@click.option("--budget-s", type=click.FloatRange(0), default=300.0, show_default=True,
              help="Search time in all (0: no limit), shared evenly by the M values left; past its share an M "
                   "still times its current config, one round of variants of its winner and the winner's "
                   "confirmation against the current config, so a tune runs over, the more so the shorter the "
                   "budget (200 s took 215-257 s over 14 M of one format). The best so far is kept.")
@click.option("--warm-s", type=click.FloatRange(0, 60), default=0.0, show_default=True,
              help="Untimed replays for about this long before each candidate's timed ones, so candidates are "
                   "ranked on the clock held work runs at under the GPU's power cap, as `bench --warm-s` times "
                   "rows. Each timing takes that much longer, so the budget times fewer candidates.")
@click.option("--no-gate", is_flag=True, help="Experts without a gate (up_proj [E, I, H], act(up): NemotronH).")
@click.option("--activation", default=None,
              help="The experts' activation each candidate is timed and checked with (silu, gelu, gelu_tanh, "
                   "swiglu_oai for GPT-OSS, relu2). Default: the model's (--model-config), else silu.")
@click.option("--biases", is_flag=True, help="Time and check candidates with expert biases (GPT-OSS; with "
                                             "--model-config: where the model's experts have them).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def tune_command(shape, model_config, tp, dtypes, ms, out_dir, max_candidates, reps, budget_s, warm_s, no_gate,
                 activation, biases, no_progress):
    """Search MoE block configs on this GPU and save them where get_config finds them.

    Writes E={E},N={I},device={gpu},dtype={int8_w8a16|bf16}.json tables (M -> config; experts without a
    gate: ...,no_gate.json) into the user cache (configs/ under $EXPERTS_INT8_CACHE, else under
    $XDG_CACHE_HOME/experts_int8 or ~/.cache/experts_int8); from then on the library uses them
    automatically for that expert shape on this GPU.
    """
    from . import bench
    from .tune import DEFAULT_MS, tune

    if (shape is None) == (model_config is None):
        raise click.UsageError("give exactly one of --shape E,H,I,k or --model-config PATH")
    e, h, i, k = parse_shape_option(shape) if shape else shape_from_model_config(model_config)
    form = experts_form(model_config) if model_config else None
    clamp = form.get("clamp", {}) if form is not None else {}  # (the model's own: no option sets one)
    if form is not None:  # the model's own form; an option against it would time another (for --no-gate, into
        # a table the model never reads; for the others, into the model's own table)
        against = [("--no-gate (its experts have a gate)", no_gate and form["gated"]),
                   (f"--activation {activation} (its experts' is {form['activation']})",
                    activation is not None and activation != form["activation"]),
                   ("--biases (its experts have none)", biases and not form["biases"])]
        said = [option for option, conflict in against if conflict]
        if said:
            raise click.UsageError(f"{model_config}: {'; '.join(said)}: that would time other experts than this "
                                   f"model's; leave the option out")
        no_gate = no_gate or not form["gated"]
        activation = activation or form["activation"]
        biases = biases or form["biases"]
        label = bench.form_label(not no_gate, activation, biases, clamp)
        if label:
            click.echo(f"the model's experts: {label}: tuning that form")
    activation = activation or "silu"
    if i % tp:
        raise click.BadParameter(f"the intermediate size {i} is not divisible by --tp {tp}", param_hint="--tp")
    bench.check_form(not no_gate, activation)
    tune(e, h, i // tp, k, dtypes=bench.parse_dtypes([dtypes]),
         ms=bench.parse_int_list([ms]) if ms else DEFAULT_MS, out_dir=out_dir, max_candidates=max_candidates,
         reps=reps, budget_s=budget_s or None, warm_s=warm_s, progress=not no_progress, gated=not no_gate,
         activation=activation, biases=biases, clamp=clamp, log=click.echo)


# --- demo / quantize / generate -----------------------------------------------------------------

def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _not_empty(ctx, param, value):
    if value is not None and not value.strip():
        raise click.BadParameter("is empty: give cuda, cuda:N or cpu (or leave the option out)")
    return value


def device_option(fn: Callable) -> Callable:
    return click.option("--device", default=None, metavar="DEVICE", callback=_not_empty,
                        help="Where to run: cuda, cuda:1, cpu. Default: cuda if available, else cpu.")(fn)


@command("demo", epilog="""\b
Examples:
  experts-int8 demo                         # CPU or GPU, offline, no arguments
  experts-int8 demo --device cpu --new-tokens 32
  experts-int8 demo --keep /tmp/demo        # keep the bf16 and int8 checkpoints (with a tokenizer)
  experts-int8 demo --router-scale 1        # raw random routers (near-uniform: lower SNR)
""")
@device_option
@click.option("--new-tokens", type=click.IntRange(1, 512), default=16, show_default=True,
              help="Tokens to generate with each model (greedy).")
@click.option("--router-scale", type=click.FloatRange(0, min_open=True), default=None,
              help="Multiply the random router weights by this (default 20: decisive routing like a trained model).")
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="Write the demo checkpoints here (must not exist or be empty) instead of a temporary folder.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def demo_command(device, new_tokens, router_scale, keep, seed, no_progress):
    """Quantize, save, reload and compare a small random Mixtral: int8 experts vs bf16.

    Builds an embedded Mixtral (4 layers, 8 experts, top-2, hidden 256) with random bf16 weights, saves
    it, loads it with ExpertsInt8Config (quantizing the routed experts on the fly), saves and reloads
    the int8 checkpoint, and prints memory, checkpoint size, logits SNR, top-1 agreement and tokens/s
    of int8 vs bf16. Needs no download; takes seconds on a CPU.
    """
    from .demo import DEFAULT_ROUTER_SCALE, run_demo

    run_demo(device=device or _default_device(), keep=keep, new_tokens=new_tokens, seed=seed,
             router_scale=DEFAULT_ROUTER_SCALE if router_scale is None else router_scale,
             progress=not no_progress, log=click.echo)


@command("quantize", epilog="""\b
Examples:
  experts-int8 quantize ~/models/Mixtral-8x7B-v0.1 ~/models/Mixtral-8x7B-int8
  experts-int8 quantize ./Qwen3-30B-A3B ./Qwen3-30B-A3B-int8 --device cuda --max-shard-size 2GB
  experts-int8 quantize ./Mixtral-8x7B ./Mixtral-8x7B-w8a16 --format compressed-tensors   # vllm serve DST
  experts-int8 quantize ./DeepSeek-V3 ./DeepSeek-V3-int8          # an FP8 release, read as its float weights
  experts-int8 quantize ./Mixtral-8x7B ./Mixtral-8x7B-int8 --modules-to-not-convert layers.0,layers.31
\b
Then: AutoModelForCausalLM.from_pretrained(DST) after `import experts_int8`, or
  experts-int8 generate DST --prompt "Hello"
""")
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["native", "compressed-tensors"]), default="native",
              show_default=True,
              help="Output format: native = what save_pretrained of an ExpertsInt8Config model writes; "
                   "compressed-tensors = pack-quantized W8A16 per-channel, per-expert Linears (for vLLM).")
@device_option
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest output shard (e.g. 2GB, 500MB).")
@click.option("--overwrite", is_flag=True,
              help="Replace DST if it is a checkpoint folder (with a config.json) or empty, once the new one is "
                   "complete.")
@click.option("--modules-to-not-convert", "not_convert", multiple=True, metavar="LIST",
              help="Comma-separated experts modules to keep float, as ExpertsInt8Config(modules_to_not_convert=...) "
                   "reads them: module names as transformers names them, fragments such as layers.1 (layer 1, not "
                   "11), or regular expressions (a comma inside {m,n} stays in its pattern). Repeatable. Recorded in "
                   "config.json; native format only.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def quantize_command(src, dst, fmt, device, max_shard_size, overwrite, not_convert, no_progress):
    """Convert a Hugging Face MoE checkpoint directory SRC into an int8 experts checkpoint DST.

    Streams the safetensors shards tensor by tensor (memory ~ one output shard): routed experts
    (per-expert w1/w2/w3 or gate_proj/up_proj/down_proj keys, or fused gate_up_proj/down_proj) become
    int8 with fp32 per-row scales; every other tensor, the tokenizer and other files are copied;
    config.json gets quantization_config. With --format compressed-tensors the same int8 values and
    fp32 scales are written as compressed-tensors pack-quantized Linears, one per expert projection
    (weight_packed, weight_scale, weight_shape), non-expert layers listed in `ignore`. Writes into a temporary
    folder next to DST and renames it at the end, so a failure leaves nothing behind. Prints time, sizes and
    the quantization SNR per layer.
    An FP8 release (quant_method fp8 with block scales or AutoFP8's or transformers' per-tensor ones,
    compressed-tensors' float-quantized, ModelOpt's), an NVFP4 one (compressed-tensors' nvfp4-pack-quantized, or
    mixed-precision with float-quantized groups; ModelOpt's) or an MXFP4 one (GPT-OSS) is read as the float
    checkpoint it encodes; its other FP8 or FP4 layers are written in the config's float dtype, its activation and
    KV cache scales dropped.
    """
    from .convert import format_bytes, parse_size, quantize_checkpoint
    from .run import check_device

    patterns = parse_patterns(not_convert) if not_convert else None
    parse_size(max_shard_size)
    dev = check_device(device or _default_device())
    r = quantize_checkpoint(src, dst, format=fmt, device=dev, max_shard_size=max_shard_size, overwrite=overwrite,
                            progress=not no_progress, modules_to_not_convert=patterns)
    click.echo(f"quantized {src} -> {dst} in {r.seconds:.1f} s ({r.num_tensors} tensors, format {fmt})")
    if r.kept:
        click.echo(f"kept float (--modules-to-not-convert): {len(r.kept)} experts modules: {', '.join(r.kept)}")
    click.echo(f"size on disk: {format_bytes(r.bytes_before)} -> {format_bytes(r.bytes_after)} "
               f"({r.bytes_after / r.bytes_before:.2f}x)")
    click.echo("quantization SNR of the dequantized experts vs the original weights (dB):")
    layers: dict[str, dict[str, float]] = {}
    for name, value in r.snr_db.items():
        prefix, _, tensor = name.rpartition(".")
        layers.setdefault(prefix, {})[tensor] = value
    width = max(len(p) for p in layers)
    w13 = "gate_up_proj" if any("gate_up_proj" in v for v in layers.values()) else "up_proj"  # (up_proj: no gate)
    click.echo(f"  {'experts':<{width}}  {w13:>12}  down_proj")
    for prefix, v in layers.items():
        click.echo(f"  {prefix:<{width}}  {v.get('gate_up_proj', v.get('up_proj')):>12.1f}  {v['down_proj']:>9.1f}")
    lo, med = r.snr_summary()
    click.echo(f"  min {lo:.1f} dB, median {med:.1f} dB over {len(r.snr_db)} tensors")


@command("generate", epilog="""\b
Examples:
  experts-int8 generate ~/models/Mixtral-8x7B-int8 --prompt "The capital of France is"
  experts-int8 generate ~/models/Mixtral-8x7B-v0.1 --prompt "Hello" --max-new-tokens 64   # quantized on load
  experts-int8 generate ~/models/Qwen3-30B-A3B-int8 --chat --prompt "Name three prime numbers."
  experts-int8 demo --keep /tmp/demo && experts-int8 generate /tmp/demo/int8 --prompt "The assert"
  torchrun --nproc-per-node 2 --no-python experts-int8 generate ./Mixtral-8x7B-int8 --prompt "Hi" --parallel tp
""")
@click.argument("model", type=click.Path())
@click.option("--prompt", required=True, help="Text to continue (with --chat: the user's message).")
@click.option("--chat", is_flag=True, help="Send PROMPT as a user message through the model's chat template (an "
                                           "instruct model's format) and print the reply.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=32, show_default=True)
@device_option
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="Compute dtype (and dtype of the non-expert weights).")
@click.option("--parallel", type=click.Choice(["tp", "ep"]), default=None,
              help="Split the routed experts over the ranks torchrun started (tp: slices of each expert; ep: "
                   "whole experts); rank 0 prints.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def generate_command(model, prompt, chat, max_new_tokens, device, dtype, parallel, no_progress):
    """Load MODEL with int8 experts and continue PROMPT (greedy); print the text, tokens/s and peak memory.

    A float checkpoint is quantized while it loads; an int8 checkpoint (config.json with
    quantization_config.quant_method = experts_int8, from save_pretrained or `experts-int8 quantize`)
    loads directly. MODEL must include its tokenizer files.
    """
    from .convert import read_model_dir
    from .run import DTYPES, check_device, checkpoint_kind, has_tokenizer

    _, config, files = read_model_dir(model)
    kind = checkpoint_kind(config, files)
    if not files:
        raise ValueError(f"{model} has no *.safetensors weights")
    if not has_tokenizer(model):
        raise ValueError(f"{model} has no tokenizer (tokenizer.json / tokenizer_config.json); copy the tokenizer "
                         f"files of the original model into it")
    dev = check_device(device or _default_device())
    ranks = torchrun_ranks("generate", parallel, dev) if parallel else contextlib.nullcontext(dev)
    with ranks as dev:
        _generate(model, config, prompt, chat, max_new_tokens, dev, DTYPES[dtype], parallel, kind, no_progress)


def _generate(model, config, prompt, chat, max_new_tokens, dev, dtype, parallel, kind, no_progress):
    """``generate``'s load, generation and report. With ``parallel`` (inside :func:`torchrun_ranks`) each rank
    holds its part of the experts on its device (``load_model(parallel=...)``); rank 0 reports."""
    import time

    import torch
    import torch.distributed as dist

    from .convert import format_bytes
    from .run import (check_context, check_token_ids, generate, load_model, load_tokenizer, peak_memory,
                      quiet_transformers)

    rank, world_size = (dist.get_rank(), dist.get_world_size()) if parallel else (0, 1)

    def say(*args, **kwargs):
        if rank == 0:
            click.echo(*args, **kwargs)

    # (until the command ends: left on, a process that goes on, a notebook calling main, kept transformers quiet)
    click.get_current_context().with_resource(quiet_transformers())
    tokenizer = load_tokenizer(model)
    if chat:
        if not tokenizer.chat_template:
            raise ValueError(f"{model}'s tokenizer has no chat template (chat_template.jinja or "
                             f"tokenizer_config.json's chat_template); leave out --chat to continue the prompt as text")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty after tokenization")
    check_token_ids(config, ids, model)
    check_context(config, ids.shape[1] + max_new_tokens, f"the prompt ({ids.shape[1]} tokens) and --max-new-tokens")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    what = "int8 checkpoint" if kind == "int8" else "float checkpoint, quantizing on load"
    where = (f"experts split ({parallel}) over {world_size} ranks on {dev.type}"
             + (", each rank reading its part" if kind == "int8" else ", loaded whole on every rank's CPU first")
             if parallel else f"on {dev} ...")
    say(f"loading {model} ({what}) {where}", err=True)
    t0 = time.perf_counter()
    m, _ = load_model(model, device=dev, dtype=dtype, parallel=parallel)
    load_s = time.perf_counter() - t0
    generate(m, ids, 2, stop_at_eos=False)  # warm-up (the kernels' first compile), untimed
    g = generate(m, ids, max_new_tokens, progress=not no_progress and rank == 0)
    say(("" if chat else prompt) + tokenizer.decode(g.ids[0, ids.shape[1]:], skip_special_tokens=True))
    memory, peak = peak_memory(dev)
    split = f", {world_size} ranks, {parallel}" if parallel else ""
    say(f"\n{g.new_tokens} tokens in {g.seconds:.2f} s ({g.tokens_per_s:.1f} tokens/s, prompt {ids.shape[1]} tokens, "
        f"greedy{split}); loaded in {load_s:.1f} s; {memory}{' on rank 0' if parallel else ''}: {format_bytes(peak)}",
        err=True)


def _env_whole_number(name: str, default: Optional[int]) -> Optional[int]:
    """The environment variable ``name`` (one torchrun sets) as a whole number >= 0; ``default`` when unset."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:  # (int()'s own message named neither the variable nor the fix)
        value = -1
    if value < 0:
        raise ValueError(f"{name}={text!r} is not a whole number: run under torchrun, which sets it")
    return value


@contextlib.contextmanager
def torchrun_ranks(command: str, mode: str, dev):
    """The process group of the ranks torchrun started, for ``COMMAND --parallel MODE``: yields this rank's
    device (``cuda:LOCAL_RANK`` on CUDA, NCCL; the CPU with gloo otherwise)."""
    import torch
    import torch.distributed as dist

    world_size = _env_whole_number("WORLD_SIZE", 1)
    if world_size < 2:
        raise ValueError(f"--parallel {mode} needs several ranks: launch with torchrun, e.g. torchrun "
                         f"--nproc-per-node 2 --no-python experts-int8 {command} ... --parallel {mode}")
    rank = _env_whole_number("RANK", None)  # (unset: torch's own error says it is missing)
    if rank is not None and rank >= world_size:
        raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world_size}: run under torchrun, which sets both")
    local_rank = _env_whole_number("LOCAL_RANK", 0)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    try:
        yield dev
    finally:
        dist.destroy_process_group()


@command("eval", epilog="""\b
Examples:
  experts-int8 eval ./Mixtral-8x7B --text wiki.txt                 # routed experts int8 vs bf16
  experts-int8 eval ./SmolLM2-135M --text notes.txt --dense-as-experts --dtype fp32
  experts-int8 eval ./model --text book.txt --max-tokens 4096 --window 512 --stride 256
""")
@click.argument("model", type=click.Path())
@click.option("--text", "text_file", required=True, type=click.Path(dir_okay=False),
              help="Plain-text file to score.")
@device_option
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="Dtype of the float model and of the int8 model's activations.")
@click.option("--max-tokens", type=click.IntRange(2), default=8192, show_default=True,
              help="Read at most this many tokens from the start of the text (all but the first are scored).")
@click.option("--window", type=click.IntRange(2), default=1024, show_default=True, help="Tokens per forward pass.")
@click.option("--stride", type=click.IntRange(1), default=None,
              help="Advance between windows. Default: half the window.")
@click.option("--dense-as-experts", is_flag=True,
              help="For a dense model: compute each gated MLP as a 1-expert int8 MoE layer (E=1, k=1).")
def eval_command(model, text_file, device, dtype, max_tokens, window, stride, dense_as_experts):
    """Perplexity, top-1 agreement and KL divergence of the int8 model against the float model.

    MODEL is a float checkpoint directory with a tokenizer. Its routed experts are quantized on load
    (or, with --dense-as-experts, its dense MLPs), and both models score the same text over sliding
    windows. Both models are held in memory at once. For routed experts it also reports, on the first
    window, the logits SNR with the float model's routing (the int8 experts' own error), every MoE
    layer's SNR on the float model's inputs and routing, and how many tokens' top-k choices the int8
    noise upstream of a router changed.
    """
    import copy

    import torch

    from .convert import read_model_dir
    from .evaluate import compare_models, dense_mlps_as_int8_experts_, routing_quality
    from .run import (DTYPES, check_context, check_device, check_token_ids, checkpoint_kind, from_pretrained,
                      has_tokenizer, load_model, load_tokenizer, quiet_transformers, read_tokens)

    stride = window // 2 if stride is None else stride
    if stride >= window:
        raise click.BadParameter(f"must be smaller than --window ({window})", param_hint="--stride")
    text = Path(text_file)
    if not text.is_file():
        raise ValueError(f"{text_file} does not exist or is not a file")
    _, config, files = read_model_dir(model)
    if checkpoint_kind(config, files) != "float":
        raise ValueError(f"{model} is already an int8 checkpoint; eval needs the float checkpoint to compare against")
    if not has_tokenizer(model):
        raise ValueError(f"{model} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    dev = check_device(device or _default_device())
    click.get_current_context().with_resource(quiet_transformers())  # (until the command ends, as generate's)
    check_context(config, window, "--window's tokens")
    ids = read_tokens(load_tokenizer(model), text, max_tokens)
    if len(ids) < 2:
        raise ValueError(f"{text_file} gives fewer than 2 tokens")
    check_token_ids(config, ids, model)
    if dense_as_experts:
        float_model = from_pretrained(config, model, dtype=DTYPES[dtype]).to(dev).eval()
        int8_model = copy.deepcopy(float_model)
        count = dense_mlps_as_int8_experts_(int8_model)
        what = f"{count} dense MLPs as 1-expert int8 layers"
    else:
        # The int8 model first: a model without routed experts is refused before any weight is read.
        int8_model, _ = load_model(model, device=dev, dtype=DTYPES[dtype])
        float_model = from_pretrained(config, model, dtype=DTYPES[dtype]).to(dev).eval()
        what = "routed experts int8"
    window = min(window, len(ids))  # a short text fits one window
    r = compare_models(float_model, int8_model, ids, window=window, stride=min(stride, window - 1))
    click.echo(f"{model}: {r['tokens']} tokens of {text.name} scored (of {len(ids)} read), {dtype} on {dev}, {what}")
    click.echo(f"{'':24}{'float':>10}{'int8':>10}")
    click.echo(f"{'perplexity':24}{r['ppl_float']:10.4f}{r['ppl_int8']:10.4f}  (int8 {r['ppl_rel_diff']:+.3%})")
    click.echo(f"{'top-1 accuracy':24}{r['top1_acc_float']:10.2%}{r['top1_acc_int8']:10.2%}")
    click.echo(f"{'top-1 agreement':24}{'':10}{r['top1_agreement']:10.2%}")
    click.echo(f"{'mean KL(float || int8)':24}{'':10}{r['mean_kl']:10.2e}  nats")
    if not dense_as_experts:
        q = routing_quality(float_model, int8_model, torch.tensor([ids[:window]]))
        layers, changed = sorted(q["moe_layer_snr_db_reference_routing"]), q["tokens_with_changed_topk_per_layer"]
        click.echo(f"first window ({window} tokens), logits SNR: {q['logits_snr_db_free_running']:.1f} dB, "
                   f"{q['logits_snr_db_reference_routing']:.1f} dB with the float model's routing")
        click.echo(f"  MoE layers with the float routing: min {layers[0]:.1f} dB, median "
                   f"{statistics.median(layers):.1f} dB over {len(layers)}; top-k changed for {max(changed):.1%} of "
                   f"tokens in the worst layer,"
                   f" {sum(changed) / len(changed):.1%} on average")


@command("bench-e2e", epilog="""\b
Examples:
  experts-int8 bench-e2e --config mixtral-8x7b --random-weights          # full size, one GPU (~93 GB bf16)
  experts-int8 bench-e2e --config mixtral-8x7b --random-weights --decode loop   # no per-token host sync
  experts-int8 bench-e2e --config qwen3-30b-a3b --random-weights --batch 1,8
  experts-int8 bench-e2e --config ./GLM-4.5-Air/config.json --random-weights --layers 8   # any model's shapes
  experts-int8 bench-e2e --config mixtral-8x7b --random-weights --layers 4 --prompt-len 256 --new-tokens 32
  torchrun --nproc-per-node 2 --no-python experts-int8 bench-e2e --config mixtral-8x7b --random-weights \\
      --columns ours-int8 --parallel tp
""")
@click.option("--config", "config_name", required=True, metavar="NAME|PATH",
              help="Architecture to build: mixtral-8x7b, qwen3-30b-a3b, or a model's config.json (or its folder).")
@click.option("--random-weights", is_flag=True, required=True,
              help="Build the full-size architecture with random weights (no checkpoint needed).")
@device_option
@click.option("--batch", "batches", default="1,4,8", show_default=True, help="Comma-separated batch sizes.")
@click.option("--prompt-len", type=click.IntRange(1), default=1024, show_default=True)
@click.option("--new-tokens", type=click.IntRange(2), default=128, show_default=True)
@click.option("--layers", type=click.IntRange(1), default=None, help="Fewer layers than the real model (quicker runs).")
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True,
              help="Timed generations per cell (median).")
@click.option("--cache", type=click.Choice(["static", "dynamic"]), default="static", show_default=True,
              help="KV cache; static compiles the decode step (transformers' fastest path).")
@click.option("--decode", type=click.Choice(["generate", "loop"]), default="generate", show_default=True,
              help="generate: model.generate. loop: the same forward and static cache in a CUDA-graphed "
                   "greedy loop with no host sync per token.")
@click.option("--compile-mode", type=click.Choice(["reduce-overhead", "max-autotune"]), default="reduce-overhead",
              show_default=True, help="torch.compile mode of the decode step (both capture CUDA graphs; "
                                      "max-autotune also autotunes the dense GEMMs, compiling for minutes).")
@click.option("--columns", default=None, metavar="LIST",
              help="Comma-separated subset of hf-bf16, ours-bf16, ours-int8 (default: all three; they run "
                   "in that order, int8 last since it quantizes in place).")
@click.option("--parallel", type=click.Choice(["tp", "ep"]), default=None,
              help="Under torchrun: the int8 column's experts split over the ranks (rank 0 reports).")
@click.option("--out", default="benchmarks/results", show_default=True, type=click.Path(file_okay=False))
def bench_e2e_command(config_name, random_weights, device, batches, prompt_len, new_tokens, layers, reps, cache,
                      decode, compile_mode, columns, parallel, out):
    """End-to-end generation latency: transformers' experts vs ours in bf16 vs ours in int8.

    One model, three columns in one run: transformers' default experts implementation, the same bf16
    weights through our fused kernel, then the experts quantized to int8 in place. Prints end-to-end
    seconds and decode tokens/s per batch size and writes JSON under --out, with the library commit
    ($EXPERTS_INT8_COMMIT when set, else git's HEAD of the library's source tree).
    """
    from .bench_e2e import COLUMNS, CONFIGS, config_dir, run

    if config_name not in CONFIGS and config_dir(config_name) is None:
        raise click.BadParameter(f"choose one of {sorted(CONFIGS)}, or give a model's config.json (or its folder)",
                                 param_hint="--config")
    from .bench import parse_int_list
    from .files import check_writable_dir
    from .run import check_device

    try:
        sizes = tuple(parse_int_list([batches], "batch sizes"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--batch") from None
    chosen = [c.strip() for c in columns.split(",") if c.strip()] if columns is not None else COLUMNS
    if not chosen or set(chosen) - set(COLUMNS):
        raise click.BadParameter(f"choose from {', '.join(COLUMNS)}, got {columns!r}", param_hint="--columns")
    kwargs = dict(columns=tuple(c for c in COLUMNS if c in chosen), batches=sizes, prompt_len=prompt_len,
                  new_tokens=new_tokens, reps=reps, cache=cache, decode=decode, compile_mode=compile_mode, out=out,
                  log=click.echo, overrides=dict(num_hidden_layers=layers) if layers else None)
    dev = device or _default_device()
    check_device(dev)
    if out:
        check_writable_dir(out, "--out")  # (before the runs, not after them)
    if parallel:
        ranks = torchrun_ranks("bench-e2e", parallel, check_device(dev))
    else:
        ranks = contextlib.nullcontext(dev)
    with ranks as rank_device:
        run(config_name, device=str(rank_device), parallel=parallel, **kwargs)


if __name__ == "__main__":
    main()
