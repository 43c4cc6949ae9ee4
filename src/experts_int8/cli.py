"""The ``experts-int8`` command.

Adding a command: write a function under ``@command(...)`` with its click options; it receives its
options as keyword arguments and gets ``--debug`` and the error handling for free. Import heavy
modules inside the function so ``experts-int8 --help`` stays quick.

Errors: without ``--debug`` any exception prints one line (``Error: <what went wrong>``) on stderr
and exits with status 1; with ``--debug`` the full traceback is shown. Ctrl-C exits with 130.
"""

from __future__ import annotations

import functools
import json
import shlex
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


def clean_errors(fn: Callable) -> Callable:
    """Wrap a command callback: adds ``--debug``; without it, exceptions become one ``Error:`` line."""

    @functools.wraps(fn)
    def wrapper(*args, debug: bool = False, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click reports these itself
        except KeyboardInterrupt:
            if debug:
                raise
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001 - the whole point: one clear line instead of a traceback
            if debug:
                raise
            click.echo(f"Error: {one_line(exc)}  (run with --debug for the traceback)", err=True)
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
        raise click.BadParameter(f"expected E,H,I,k (four integers, e.g. 8,4096,14336,2), got {text!r}") from None
    if min(e, h, i, k) < 1 or k > e:
        raise click.BadParameter(f"E, H, I, k must be positive with k <= E, got {text!r}")
    return e, h, i, k


def shape_from_model_config(path: str) -> tuple[int, int, int, int]:
    """(E, H, I, k) from a Hugging Face ``config.json`` (or the folder holding it) of an MoE model."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    with open(p) as f:
        cfg = json.load(f)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM config inside
        cfg = {**cfg, **cfg["text_config"]}

    def first(*keys):
        for key in keys:
            if cfg.get(key) is not None:
                return int(cfg[key])
        raise ValueError(f"{p} is not an MoE model config: none of {', '.join(keys)} is set")

    experts = first("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    hidden = first("hidden_size")
    inter = first("moe_intermediate_size", "intermediate_size")
    top_k = first("num_experts_per_tok", "moe_top_k", "top_k")
    return experts, hidden, inter, top_k


# --- bench ---------------------------------------------------------------------------------------

@command("bench", epilog="""\b
Examples:
  experts-int8 bench                                   # 5 shapes x 14 M x bf16 + int8
  experts-int8 bench --quick --shapes qwen3-30b-a3b,mixtral-8x7b --m 1,16,256,4096
  experts-int8 bench --dtypes int8 --shapes 8:4096:14336:2 --out /tmp/results
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
@click.option("--eager", is_flag=True, help="Time eager calls instead of CUDA graph replays.")
@click.option("--no-plot", is_flag=True, help="Skip the PNG.")
def bench_command(shapes, ms, dtypes, out, quick, reps, pool_gb, eager, no_plot):
    """Time fused_experts with bf16 and int8 experts against the GPU's copy and matmul ceilings.

    Prints a table and writes JSON + PNG (time and fraction of ceiling vs M, one panel per shape)
    with the GPU name, the library commit and this command line.
    """
    from . import bench

    names = [s for s in (shapes.split(",") if shapes else bench.SHAPES) if s.strip()]
    for name in names:
        bench.parse_shape(name)
    kw = dict(shapes=names, ms=bench.parse_int_list([ms]) if ms else list(bench.DEFAULT_MS),
              dtypes=bench.parse_dtypes([dtypes]), out_dir=out, pool_gb=pool_gb, use_graph=not eager,
              plot=not no_plot)
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
""")
@click.option("--shape", default=None, metavar="E,H,I,k", help="Experts, hidden size, intermediate size, top-k.")
@click.option("--model-config", type=click.Path(exists=True), default=None,
              help="A Hugging Face config.json (or its folder) to read the shape from.")
@click.option("--tp", type=click.IntRange(1), default=1, show_default=True,
              help="Tensor-parallel size: the experts' intermediate size is split this many ways.")
@click.option("--dtypes", default="int8,bf16", show_default=True, help="Weight formats to tune.")
@click.option("--m", "ms", default=None, metavar="LIST", help="Comma-separated token counts. Default: 1,4,16,...,4096.")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="Where to write the tables. Default: the user cache, which get_config reads.")
@click.option("--max-candidates", type=click.IntRange(1), default=32, show_default=True,
              help="Configs timed per M (plus the default and GROUP_SIZE_M variants of the winner).")
@click.option("--reps", type=click.IntRange(1), default=5, show_default=True, help="Timed runs per config (median).")
@click.option("--budget-s", type=click.FloatRange(0), default=300.0, show_default=True,
              help="Stop searching after this many seconds in all (0: no limit); the best so far is kept.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def tune_command(shape, model_config, tp, dtypes, ms, out_dir, max_candidates, reps, budget_s, no_progress):
    """Search MoE block configs on this GPU and save them where get_config finds them.

    Writes E={E},N={I},device={gpu},dtype={int8_w8a16|bf16}.json tables (M -> config) into the user
    cache ($EXPERTS_INT8_CACHE, default ~/.cache/experts_int8/configs); from then on the library
    uses them automatically for that expert shape on this GPU.
    """
    from . import bench
    from .tune import DEFAULT_MS, tune

    if (shape is None) == (model_config is None):
        raise click.UsageError("give exactly one of --shape E,H,I,k or --model-config PATH")
    e, h, i, k = parse_shape_option(shape) if shape else shape_from_model_config(model_config)
    if i % tp:
        raise click.BadParameter(f"the intermediate size {i} is not divisible by --tp {tp}", param_hint="--tp")
    tune(e, h, i // tp, k, dtypes=bench.parse_dtypes([dtypes]),
         ms=bench.parse_int_list([ms]) if ms else DEFAULT_MS, out_dir=out_dir, max_candidates=max_candidates,
         reps=reps, budget_s=budget_s or None, progress=not no_progress, log=click.echo)


if __name__ == "__main__":
    main()
