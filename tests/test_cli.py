"""The ``experts-int8`` demo / quantize / generate commands, through click's CliRunner (CPU, seconds)."""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from experts_int8 import ExpertsInt8Config, quantize_  # noqa: E402
from experts_int8 import run as run_module  # noqa: E402
from experts_int8.cli import main  # noqa: E402

from models import ARCH_NAMES, VISION_LANGUAGE_NAMES, auto_class, tiny_config, tiny_model  # noqa: E402

COMMANDS = ("demo", "quantize", "generate", "eval", "bench", "tune", "bench-e2e")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def tensors(path) -> dict:
    out = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        out.update(load_file(f))
    return out


def assert_one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One demo run on the CPU that keeps its checkpoints (bf16 + int8, with the demo tokenizer)."""
    keep = tmp_path_factory.mktemp("demo") / "kept"
    result = invoke("demo", "--device", "cpu", "--no-progress", "--new-tokens", "4", "--keep", keep)
    return result, keep


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    def make(arch):
        path = tmp_path_factory.mktemp(arch) / "bf16"
        tiny_model(arch, dtype=torch.bfloat16).save_pretrained(path)
        return path
    return make


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output and f"experts-int8 {command}" in result.output
    if command in ("demo", "quantize", "generate"):
        assert "--device" in result.output and "--debug" in result.output


def test_demo_prints_the_table_with_high_snr(demo_run):
    result, keep = demo_run
    assert result.exit_code == 0, result.output
    out = result.output
    for row in ("routed experts (weights + scales)", "all parameters + buffers", "checkpoint on disk",
                "logits SNR vs bf16", "top-1 agreement", "tokens/s"):
        assert row in out, out
    snr = float(re.search(r"logits SNR vs bf16\s+-\s+([0-9.]+) dB", out).group(1))
    assert snr >= 30, out
    assert "router (gate) weights scaled x20" in out
    assert "logits identical to on-the-fly quantization" in out
    ratio = float(re.search(r"routed experts \(weights \+ scales\).*\(([0-9.]+)x\)", out).group(1))
    assert 0.45 < ratio < 0.55, out  # int8 + fp32 row scales vs bf16
    assert (keep / "int8" / "config.json").is_file() and (keep / "bf16" / "tokenizer.json").is_file()


def test_demo_keep_refuses_a_folder_that_is_not_empty_or_a_file_and_leaves_it_alone(tmp_path):
    """--keep writes bf16/ and int8/ into its folder: one holding the user's files, or a file, is refused before
    anything is built, and left as it was."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("x")
    assert_one_line_error(invoke("demo", "--device", "cpu", "--no-progress", "--keep", tmp_path / "mine"),
                          f"--keep {tmp_path / 'mine'}: exists and is not an empty directory")
    result = invoke("demo", "--device", "cpu", "--no-progress", "--keep", tmp_path / "file.txt")
    assert result.exit_code == 2 and "is a file" in result.output, result.output  # (click's usage error)
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "mine"] and os.listdir(tmp_path / "mine") == ["notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine" and (tmp_path / "file.txt").read_text() == "x"


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_demo_report_claims_decisive_routing_only_for_scaled_up_routers(scale):
    """``--router-scale 1`` shows the raw, near-uniform routers: the report must not call them decisive."""
    from experts_int8.demo import DemoResult, _print_report

    lines = []
    r = DemoResult(rows=[("logits SNR vs bf16", "-", "33.0 dB")], snr_db=33.0, top1=0.9, reload_identical=True,
                   device="cpu", seconds=1.0, workdir="/tmp/x", router_scale=scale, kept=False)
    _print_report(r, lines.append)
    router = next(line for line in lines if line.startswith("router (gate) weights"))
    assert f"x{scale:g}" in router and "decisive like a trained" not in router and "near-uniform" in router


def test_run_demo_leaves_the_callers_transformers_settings_as_they_were():
    """run_demo is a library function: its quiet loads must not silence transformers for the rest of the program."""
    from transformers.utils import logging as hf_logging

    from experts_int8.demo import run_demo

    hf_logging.set_verbosity_info()
    hf_logging.enable_progress_bar()
    try:
        result = run_demo(device="cpu", new_tokens=2, progress=False, log=lambda line: None)
        assert result.reload_identical
        assert hf_logging.get_verbosity() == hf_logging.INFO and hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.set_verbosity_warning()


def test_demo_model_is_seeded_without_reseeding_the_callers_generator():
    from experts_int8.demo import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(7)
    expected_next = torch.rand(4)
    torch.manual_seed(7)
    first = build_model(tokenizer, seed=3).state_dict()
    assert torch.equal(torch.rand(4), expected_next)
    second = build_model(tokenizer, seed=3).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_generate_and_eval_leave_transformers_settings_as_they_were(demo_run, tmp_path):
    """The commands quiet transformers while they run; called in a process that goes on (a notebook calling main,
    CliRunner), transformers spoke again afterwards, also after a failure."""
    from transformers.utils import logging as hf_logging

    _, keep = demo_run
    text = tmp_path / "text.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 8)
    hf_logging.set_verbosity_info()
    hf_logging.enable_progress_bar()
    try:
        for args in (("generate", keep / "int8", "--prompt", "The assert", "--max-new-tokens", "2"),
                     ("eval", keep / "bf16", "--text", text, "--max-tokens", "32", "--window", "16"),
                     ("eval", keep / "bf16", "--text", text, "--window", "100000")):  # (refused after the quiet)
            result = invoke(*args, "--device", "cpu")
            assert (result.exit_code == 0) == (args[-1] != "100000"), result.output
            assert hf_logging.get_verbosity() == hf_logging.INFO and hf_logging.is_progress_bar_enabled(), args
    finally:
        hf_logging.set_verbosity_warning()


def test_generate_int8_and_float_checkpoints(demo_run):
    _, keep = demo_run
    texts = []
    for sub in ("int8", "bf16"):  # int8 loads directly; bf16 is quantized on load: same int8 model
        result = invoke("generate", keep / sub, "--prompt", "The assert", "--max-new-tokens", "5",
                        "--device", "cpu", "--no-progress")
        assert result.exit_code == 0, result.output
        assert "tokens/s" in result.output and "peak process memory" in result.output
        texts.append(result.stdout.splitlines()[0])
    assert texts[0].startswith("The assert") and texts[0] == texts[1]


@pytest.mark.parametrize("sub", ["bf16", "int8"])
def test_weights_missing_from_the_files_are_an_error_not_random_values(demo_run, tmp_path, sub):
    """transformers starts weights its files lack from random values and says so only in a log line, which
    the commands silence: the int8-vs-float comparison of eval, or generate's text, would be of noise."""
    _, keep = demo_run
    incomplete = tmp_path / sub
    shutil.copytree(keep / sub, incomplete)
    tensors = load_file(incomplete / "model.safetensors")
    dropped = [name for name in tensors if name.endswith(("layers.0.self_attn.q_proj.weight",
                                                            "layers.1.input_layernorm.weight"))]
    assert len(dropped) == 2
    save_file({k: v for k, v in tensors.items() if k not in dropped}, incomplete / "model.safetensors",
              metadata={"format": "pt"})
    for args in (("generate", incomplete, "--prompt", "The assert", "--max-new-tokens", "2", "--no-progress"),
                 ("eval", incomplete, "--text", keep / "bf16" / "tokenizer.json", "--max-tokens", "64")):
        result = invoke(*args, "--device", "cpu")
        if args[0] == "eval" and sub == "int8":  # (eval takes float checkpoints only: refused before loading)
            assert result.exit_code == 1
            continue
        assert result.exit_code == 1, result.output
        assert "2 weight(s) the model needs are not in its files" in result.output, result.output
        assert all(name in result.output for name in dropped)


def test_generate_is_greedy_whatever_the_checkpoints_generation_config_says():
    """transformers fills what a generate call leaves unset from the checkpoint's generation_config.json: a
    shipped repetition_penalty or no_repeat_ngram_size changed the tokens of what was reported as greedy."""
    model = tiny_model("mixtral", dtype=torch.float32).eval()
    ids = torch.tensor([[3, 7, 7, 1]])
    want = ids
    with torch.no_grad():
        for _ in range(24):
            want = torch.cat([want, model(want).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert want.unique().numel() < want.numel()  # repeats, which the processors below would forbid
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    shipped = model.generation_config
    got = run_module.generate(model, ids, 24, stop_at_eos=False)
    assert torch.equal(got.ids, want) and got.new_tokens == 24
    assert model.generation_config is shipped  # (put back)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_generate_parallel_over_two_ranks(demo_run, dtype):
    """torchrun, two CPU ranks (gloo), the experts split over them: rank 0 prints the one-process text.

    That very text in fp32 only. In bf16 each rank rounds its partial output before the all-reduce (benchmarks/
    NOTES.md item 179), and the demo's random model has greedy choices between logits one bf16 step apart: which,
    depends on the prompt's tokens, so on the Python that ran the demo (its tokenizer learns pydoc_data, which
    differs between versions). On 3.10, "The assert"'s first choice was 1.0 against 0.9961: the ranks printed
    'The assert%%%%%', one process 'The assertanager...' (in fp32 the split is within 3e-7 of one process)."""
    _, keep = demo_run
    args = [keep / "int8", "--prompt", "The assert", "--max-new-tokens", "5", "--device", "cpu", "--no-progress",
            "--dtype", dtype]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "experts_int8.cli", "generate", *map(str, args), "--parallel", "tp"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    # (torch < 2.11's gloo prints a line per rank, the two at times interleaved into fragments and an empty line)
    printed = [line for line in run.stdout.splitlines() if line and not re.search(r"\[Gloo\]|peer ranks", line)]
    assert len(printed) == 1 and printed[0].startswith("The assert"), run.stdout  # one rank printed
    assert "2 ranks, tp" in run.stderr
    if dtype == "fp32":
        single = invoke("generate", *args)
        assert single.exit_code == 0, single.output
        assert printed == [single.stdout.splitlines()[0]]  # the same text


def test_generate_parallel_needs_torchrun(demo_run):
    _, keep = demo_run
    assert_one_line_error(invoke("generate", keep / "int8", "--prompt", "a", "--device", "cpu", "--parallel", "ep"),
                          "--parallel ep needs several ranks: launch with torchrun")


@pytest.mark.parametrize("env, says", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number: run under torchrun, which sets it"),
    ({"WORLD_SIZE": ""}, "WORLD_SIZE='' is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "x"}, "RANK='x' is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a whole number"),
])
def test_generate_parallel_names_a_bad_torchrun_variable(demo_run, monkeypatch, env, says):
    """int()'s own message ("invalid literal for int() with base 10: 'abc'") named neither the variable nor the fix."""
    _, keep = demo_run
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert_one_line_error(invoke("generate", keep / "int8", "--prompt", "a", "--device", "cpu", "--parallel", "tp"),
                          says)


def _fused_checkpoint(tmp_path, arch="mixtral"):
    """A checkpoint with already fused float experts keys (the in-memory transformers 5 names)."""
    model = tiny_model(arch, dtype=torch.bfloat16)
    path = tmp_path / "fused"
    model.save_pretrained(path)
    for f in glob.glob(str(path / "*.safetensors")):
        os.remove(f)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("arch,layout", [(a, "per-expert") for a in ARCH_NAMES + VISION_LANGUAGE_NAMES] +
                         [("mixtral", "fused"), ("nemotron_h", "fused"), ("mellum", "per-expert")])  # (mellum: outside the table)
def test_quantize_matches_on_the_fly_quantization(bf16_checkpoint, tmp_path, arch, layout):
    src = bf16_checkpoint(arch) if layout == "per-expert" else _fused_checkpoint(tmp_path, arch)
    dst = tmp_path / "int8"
    result = invoke("quantize", src, dst, "--device", "cpu", "--no-progress", "--max-shard-size", "40KB")
    assert result.exit_code == 0, result.output
    assert re.search(r"min [0-9.]+ dB, median [0-9.]+ dB", result.output), result.output
    assert len(glob.glob(str(dst / "*.safetensors"))) > 1 and (dst / "model.safetensors.index.json").is_file()

    fly = auto_class(arch).from_pretrained(src, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    fly.save_pretrained(tmp_path / "saved")
    ours, theirs = tensors(dst), tensors(tmp_path / "saved")
    assert set(ours) == set(theirs)
    for key in ours:
        if ".experts." in key:
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
        else:  # copied from the source; transformers 5.17 loads DeepSeek-V3's score bias in fp32
            assert torch.equal(ours[key].to(theirs[key].dtype), theirs[key]), key

    reloaded = auto_class(arch).from_pretrained(dst, dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, fly(ids).logits)


def test_quantize_reads_the_files_the_index_names(tmp_path):
    """A file beside the index that it does not name (a consolidated.safetensors from another release) is not
    the model's: transformers ignores it, and so must the converter (its keys overwrote the model's on reload).
    A file the index names but the folder lacks is refused (it converted, and reloaded with random weights)."""
    model = tiny_model("qwen3_moe", dtype=torch.bfloat16)
    src = tmp_path / "src"
    model.save_pretrained(src, max_shard_size="60KB")
    assert (src / "model.safetensors.index.json").is_file()
    stray = {k.removeprefix("model."): torch.randn_like(v.float()).to(v.dtype) for k, v in model.state_dict().items()}
    save_file(stray, str(src / "consolidated.safetensors"), metadata={"format": "pt"})
    result = invoke("quantize", src, tmp_path / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    fly = AutoModelForCausalLM.from_pretrained(src, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "int8", dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, fly(ids).logits)

    shards = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    gone = sorted(set(shards.values()))[-1]
    os.remove(src / gone)
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"),
                          f"model.safetensors.index.json names {gone}, missing from", "download the checkpoint again")
    assert not (tmp_path / "o").exists()


def test_an_index_that_does_not_match_its_files_is_refused(tmp_path):
    """An index that places keys in a file lacking them converted without those tensors (exit 0, a DST that does
    not load); one naming a file outside the folder read it; file names not strings, and a folder named
    model.safetensors, gave Python's or the OS's words ("unsupported operand", "No such device")."""
    src = tmp_path / "src"
    tiny_model("qwen3_moe", dtype=torch.bfloat16).save_pretrained(src, max_shard_size="60KB")
    index = src / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    first, last = sorted(set(good["weight_map"].values()))[0], sorted(set(good["weight_map"].values()))[-1]
    shutil.copy(src / last, tmp_path / "x.safetensors")
    damaged = {
        "in a file lacking them": ({k: first for k in good["weight_map"]}, f"in {first}, missing from that file"),
        "outside": ({k: "../x.safetensors" if v == last else v for k, v in good["weight_map"].items()},
                    "names '../x.safetensors', not a file name in"),
        "absolute": ({k: str(tmp_path / "x.safetensors") if v == last else v for k, v in good["weight_map"].items()},
                     "not a file name in"),
        "not strings": ({k: 3 for k in good["weight_map"]}, "its keys and file names must be strings"),
    }
    for weight_map, message in damaged.values():
        index.write_text(json.dumps({**good, "weight_map": weight_map}))
        for args in (("quantize", src, tmp_path / "o", "--no-progress"), ("generate", src, "--prompt", "a")):
            assert_one_line_error(invoke(*args, "--device", "cpu"), "model.safetensors.index.json", message)
        assert sorted(os.listdir(tmp_path)) == ["src", "x.safetensors"]
    index.unlink()
    (src / "model.safetensors").mkdir()
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"),
                          "model.safetensors is a folder, not a safetensors file")
    assert sorted(os.listdir(tmp_path)) == ["src", "x.safetensors"]


def test_a_weight_file_that_is_a_pipe_is_refused(bf16_checkpoint, tmp_path):
    """A named pipe among the *.safetensors blocked the header read for ever (safetensors' open waits for a writer
    and retries when a signal interrupts it: Ctrl-C and SIGTERM did not stop it). Here a writer process comes to
    every open of it (a thread could not: the blocked open holds the GIL), so that a regression fails instead of
    hanging the run."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    os.rename(src / "model.safetensors", src / "a.safetensors")
    os.mkfifo(src / "b.safetensors")
    writer = subprocess.Popen([sys.executable, "-c", f"""
import os, time
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        fd = os.open({str(src / "b.safetensors")!r}, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # (ENXIO: no reader yet)
        time.sleep(0.05)
        continue
    os.write(fd, b"x" * 16)
    os.close(fd)
"""])
    try:
        for args in (("quantize", src, tmp_path / "o", "--no-progress"), ("generate", src, "--prompt", "a")):
            assert_one_line_error(invoke(*args, "--device", "cpu"), "b.safetensors is not a regular file (a pipe")
    finally:
        writer.kill()
        writer.wait()
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_weight_file_that_is_a_dangling_link_is_named_missing(bf16_checkpoint, tmp_path):
    """A Hub snapshot's link to a pruned blob is no pipe or device: the error says to download it again."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    (src / "model.safetensors").unlink()
    (src / "model.safetensors").symlink_to("../../blobs/gone")
    result = invoke("quantize", src, tmp_path / "int8", "--no-progress")
    assert_one_line_error(result, "model.safetensors is not a readable safetensors file", "No such file",
                          "download or convert it again")


def test_an_index_is_checked_against_its_files_in_one_walk(tmp_path, monkeypatch):
    """Each file's keys were found by a walk of the whole weight_map, files x keys comparisons: an index of 20,000
    files took 50 s before any work (DeepSeek-V3's 163 files and 91,000 keys: 15 million)."""
    from experts_int8 import convert

    class Name(str):  # the index's file names, counting the comparisons made with them
        compared = 0

        def __eq__(self, other):
            Name.compared += 1
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    src = tmp_path / "src"
    tiny_model("qwen3_moe", dtype=torch.bfloat16).save_pretrained(src, max_shard_size="30KB")
    real = convert._index_map
    monkeypatch.setattr(convert, "_index_map", lambda p: {k: Name(v) for k, v in real(p).items()})
    weight_map = real(src)
    files = len(set(weight_map.values()))
    assert files >= 8
    convert.read_model_dir(src)
    assert Name.compared < 3 * (len(weight_map) + files), (Name.compared, files, len(weight_map))


def test_json_nested_past_pythons_stack_is_named(bf16_checkpoint, tmp_path):
    """A config.json or index of arrays nested 100,000 deep said only "maximum recursion depth exceeded"."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    nested = "[" * 100_000 + "]" * 100_000
    config = (src / "config.json").read_text()
    (src / "config.json").write_text(nested)
    for args in (("quantize", src, tmp_path / "o", "--no-progress"), ("generate", src, "--prompt", "a")):
        assert_one_line_error(invoke(*args, "--device", "cpu"), "config.json is not valid JSON")
    (src / "config.json").write_text(config)
    os.rename(src / "model.safetensors", src / "model-00001-of-00001.safetensors")
    (src / "model.safetensors.index.json").write_text('{"weight_map": ' + nested + "}")
    for args in (("quantize", src, tmp_path / "o", "--no-progress"), ("generate", src, "--prompt", "a")):
        assert_one_line_error(invoke(*args, "--device", "cpu"), "model.safetensors.index.json is not a safetensors "
                                                                 "index")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_quantize_refuses_a_config_whose_expert_count_the_weights_do_not_have(bf16_checkpoint, tmp_path):
    """It converted (exit 0) into a DST that no load accepts: the model is built with the config's count."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_local_experts": config["num_local_experts"] + 2}))
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"),
                          f"experts holds {config['num_local_experts']} experts, but config.json says "
                          f"{config['num_local_experts'] + 2}")
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_quantize_refuses_experts_with_a_size_of_0(bf16_checkpoint, tmp_path):
    """Experts of I = 0 hold no data, but their [E, H] scales and the loop over H's rows follow H: a 1 KB file with
    H = 2**28 (config.json's hidden_size to match) ran for minutes into gigabytes. A small H converted (exit 0)."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    config = json.loads((src / "config.json").read_text())
    weights = load_file(src / "model.safetensors")
    for key in list(weights):
        if ".experts." in key:
            weights[key] = torch.empty((64, 0) if key.endswith("w2.weight") else (0, 64), dtype=torch.bfloat16)
    save_file(weights, src / "model.safetensors")
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"),
                          "experts: experts of E, H, I = [5, 64, 0], a size of 0", "download it again")
    assert config["hidden_size"] == 64 and sorted(os.listdir(tmp_path)) == ["src"]


def test_a_tokenizer_of_another_model_is_named(demo_run, bf16_checkpoint, tmp_path):
    """A tokenizer whose ids pass the model's vocab_size (copied from another model) failed in the embedding with
    "index out of range in self"."""
    _, keep = demo_run
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)  # (vocab_size 96; the demo tokenizer's ids go further)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(keep / "bf16" / f, src / f)
    (tmp_path / "t.txt").write_text("The assert statement checks a condition. " * 4)
    for args in (("generate", src, "--prompt", "The assert statement", "--no-progress"),
                 ("eval", src, "--text", tmp_path / "t.txt", "--window", "64")):
        assert_one_line_error(invoke(*args, "--device", "cpu"), "tokenizer gives token id",
                              "past the model's vocab_size (96)", "copy the original model's tokenizer files")


def test_a_config_size_that_is_not_a_positive_integer_is_named(demo_run, tmp_path):
    """hidden_size 0 was told "inconsistent expert shapes" by quantize (the shapes agreed) and "0.0 cannot be
    raised to a negative power" by generate."""
    _, keep = demo_run
    for value in (0, "64"):
        src = tmp_path / f"src{value}"
        shutil.copytree(keep / "bf16", src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "hidden_size": value}))
        for args in (("quantize", src, tmp_path / "o", "--no-progress"), ("generate", src, "--prompt", "a")):
            assert_one_line_error(invoke(*args, "--device", "cpu"),
                                  f"config.json: hidden_size is {value!r}, not a positive integer")
    assert not (tmp_path / "o").exists()


def test_an_unsharded_save_over_a_sharded_one_is_read_as_transformers_reads_it(tmp_path):
    """save_pretrained without shards over a sharded save deletes the shards but leaves their index beside the new
    model.safetensors; transformers loads model.safetensors, and so must quantize and generate (they refused the
    folder: 'the index names ..., missing')."""
    src = tmp_path / "src"
    tiny_model("qwen3_moe", dtype=torch.bfloat16, seed=1).save_pretrained(src, max_shard_size="60KB")
    tiny_model("qwen3_moe", dtype=torch.bfloat16).save_pretrained(src)
    assert (src / "model.safetensors").is_file() and (src / "model.safetensors.index.json").is_file()
    result = invoke("quantize", src, tmp_path / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    fly = AutoModelForCausalLM.from_pretrained(src, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "int8")(ids).logits, fly(ids).logits)
    fly.save_pretrained(src)  # the int8 model over the same folder: its index is still there
    model, kind = run_module.load_model(src)
    with torch.no_grad():
        assert kind == "int8" and torch.equal(model(ids).logits, fly(ids).logits)


FP8_LINEAR = re.compile(r"_proj\.weight$|\.w[123]\.weight$")  # (DeepSeek-V3's FP8 set: not embeddings,
# norms, the router or lm_head)


def _fp8_release(float_dir, out, block, scales="F32"):
    """``float_dir``'s checkpoint as an FP8 release with block scales, made as DeepSeek-V3's is: each Linear weight
    in e4m3, one fp32 factor (its block's amax / 448) per block of rows and columns in ``<name>.weight_scale_inv``
    (``scales``: stored as F32, BF16 or F16, or as UE8M0 powers of two, the factor rounded up to one, in
    F8_E8M0 or as exponent bytes U8). Returns the float state those products make, computed block by block (the
    converter's reference)."""
    shutil.copytree(float_dir, out)
    state, encoded = tensors(float_dir), {}
    for f in glob.glob(str(out / "*.safetensors")):
        os.remove(f)
    out_state = {}

    def encode(w):  # one matrix: its e4m3 values, block scales, and the float they decode to
        (n, k), (bn, bk) = w.shape, block
        q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
        scale = torch.empty(-(-n // bn), -(-k // bk))
        decoded = torch.empty(n, k)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
                scale[i, j] = tile.abs().amax().clamp(min=1e-12) / 448
                if scales in ("F8_E8M0", "U8"):
                    scale[i, j] = torch.exp2(torch.ceil(torch.log2(scale[i, j])))
                else:  # (what the stored dtype holds)
                    scale[i, j] = scale[i, j].to({"F32": torch.float32, "BF16": torch.bfloat16,
                                                  "F16": torch.float16}[scales]).float()
                q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (tile / scale[i, j]).to(torch.float8_e4m3fn)
                decoded[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (
                    q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float() * scale[i, j])
        return q, scale, decoded

    for key, w in state.items():
        if not FP8_LINEAR.search(key):
            out_state[key] = w
            continue
        # (stacked experts [E, N, K], Step-3.7's: matrix by matrix)
        q, scale, decoded = (torch.stack(t) for t in zip(*map(encode, w))) if w.dim() == 3 else encode(w)
        out_state[key] = q
        out_state[f"{key}_scale_inv"] = {
            "F32": scale, "BF16": scale.bfloat16(), "F16": scale.half(),
            "F8_E8M0": scale.to(torch.float8_e8m0fnu),
            "U8": (torch.log2(scale) + 127).to(torch.uint8)}[scales]
        encoded[key] = decoded.to(w.dtype)
    # two shards, as a release's index spreads them: the scales apart from their weights
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in out_state.items() if not k.endswith("_inv")},
              "model-00002-of-00002.safetensors": {k: v for k, v in out_state.items() if k.endswith("_inv")}}
    for name, part in shards.items():
        save_file(part, str(out / name), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(config))
    return {**state, **encoded}


def _convert_both(release, float_dir, decoded: dict, tmp_path, *args, device="cpu"):
    """Convert ``release`` and the float checkpoint it encodes (``float_dir``'s files with the ``decoded``
    weights) alike on ``device``; returns the two results' tensors."""
    ref = tmp_path / "decoded"
    shutil.copytree(float_dir, ref)
    for f in glob.glob(str(ref / "*.safetensors")):
        os.remove(f)
    save_file(decoded, str(ref / "model.safetensors"), metadata={"format": "pt"})
    for src in (release, ref):
        result = invoke("quantize", src, tmp_path / f"int8_{src.name}", "--device", device, "--no-progress", *args)
        assert result.exit_code == 0, result.output
    return tensors(tmp_path / f"int8_{release.name}"), tensors(ref.parent / "int8_decoded")


def _assert_converted_alike(ours: dict, theirs: dict, tmp_path, release: str, arch: str, reload: bool = True):
    """The release's conversion (``int8_<release>``) equals the decoded checkpoint's tensor for tensor, bit for bit,
    with its quantization_config; with ``reload`` it loads (the native format) and runs."""
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    config = json.loads((tmp_path / f"int8_{release}" / "config.json").read_text())
    assert config["quantization_config"] == json.loads(
        (tmp_path / "int8_decoded" / "config.json").read_text())["quantization_config"]
    if reload:
        model = auto_class(arch).from_pretrained(tmp_path / f"int8_{release}", dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.isfinite(model(torch.tensor([[3, 5, 7, 9]])).logits).all()


@pytest.mark.parametrize("arch, fmt", [(arch, fmt) for arch in ("deepseek_v3", "qwen3_moe")
                                       for fmt in ("native", "compressed-tensors")] + [("step3p7", "native")])
def test_quantize_reads_an_fp8_release_as_the_float_checkpoint_it_encodes(bf16_checkpoint, tmp_path, arch, fmt):
    """An FP8 release with block scales (ragged blocks here) converts to exactly what its decoded float
    checkpoint converts to, in either format: experts int8, its other FP8 weights in the config's bf16, no
    scale tensors left, our quantization_config; it reloads and runs. (Step-3.7: its stacked experts halves
    decoded, then concatenated.)"""
    fp8 = tmp_path / "fp8"
    decoded = _fp8_release(bf16_checkpoint(arch), fp8, block=(24, 40))
    ours, theirs = _convert_both(fp8, bf16_checkpoint(arch), decoded, tmp_path, "--format", fmt)
    assert set(ours) == set(theirs) and not any(k.endswith("_scale_inv") for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "fp8", arch, reload=fmt == "native")


def _assert_breakages_refused(src, state: dict, cases, tmp_path) -> None:
    """For each (break, needle) of ``cases``: ``state`` broken so, written as ``src``'s one weights file, is refused
    by the converter in one line holding ``needle``, with nothing written."""
    for broken, needle in cases:
        bad = dict(state)
        broken(bad)
        save_file(bad, str(src / "model.safetensors"), metadata={"format": "pt"})
        assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"), needle)
        assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))


def _mxfp4_release(float_dir, out):
    """``float_dir``'s GPT-OSS checkpoint as its MXFP4 release: each experts tensor ``[E, K, N]`` stored as
    ``_blocks`` ``[E, N, K/32, 16]`` (two e2m1 codes a byte, low first) and ``_scales`` ``[E, N, K/32]`` (exponent +
    127, the group's amax over 6 rounded up to a power of two). Returns the float state transformers' own
    decoder makes of it (the converter's reference)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    shutil.copytree(float_dir, out)
    state, stored = tensors(float_dir), {}
    for f in glob.glob(str(out / "*.safetensors")):
        os.remove(f)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    decoded = {}
    for key, w in state.items():
        if not key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            stored[key] = w
            continue
        groups = w.float().transpose(1, 2).unflatten(-1, (-1, 32))  # [E, N, G, 32]
        exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=2.0 ** -100) / 6))
        x = groups / torch.exp2(exponent)[..., None]
        codes = (x.abs()[..., None] - grid).abs().argmin(-1) + 8 * (x < 0)  # (sign bit: code + 8)
        stored[f"{key}_blocks"] = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
        stored[f"{key}_scales"] = (exponent + 127).to(torch.uint8)
        decoded[key] = convert_moe_packed_tensors(stored[f"{key}_blocks"], stored[f"{key}_scales"],
                                                  dtype=torch.bfloat16)
        assert decoded[key].shape == w.shape and (decoded[key].float() - w.float()).abs().max() > 0
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config))
    return {**state, **decoded}


def test_quantize_reads_an_mxfp4_release_as_transformers_decodes_it(bf16_checkpoint, tmp_path):
    """GPT-OSS's MXFP4 release converts to exactly what the float checkpoint transformers decodes from it
    converts to; the result reloads and runs."""
    mx = tmp_path / "mxfp4"
    decoded = _mxfp4_release(bf16_checkpoint("gpt_oss"), mx)
    ours, theirs = _convert_both(mx, bf16_checkpoint("gpt_oss"), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_blocks", "_scales")) for k in ours)
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    model = auto_class("gpt_oss").from_pretrained(tmp_path / "int8_mxfp4", dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[3, 5, 7, 9]])).logits).all()

    state = load_file(mx / "model.safetensors")
    key = next(k for k in state if k.endswith("down_proj_scales"))
    state[key] = state[key][:, :1].contiguous()
    save_file(state, str(mx / "model.safetensors"), metadata={"format": "pt"})
    assert_one_line_error(invoke("quantize", mx, tmp_path / "o", "--no-progress"), f"{key} is U8",
                          "scales")
    assert not (tmp_path / "o").exists()


V4_FP8 = re.compile(r"\.(w\w*|\w+_proj)\.weight$")  # (DeepSeek-V4's FP8 linears: not the router, norms, embeddings)


def _deepseek_v4_release(float_dir, out, block=(8, 32)):
    """``float_dir``'s DeepSeek-V4 checkpoint in its release's own layout: names without ``model.``
    (``embed.weight``), routed experts in FP4 (I8 ``[N, K/2]``, two e2m1 codes a byte, low first, and ``.scale``
    F8_E8M0 ``[N, K/32]``: each group's amax over 6 rounded up to a power of two), the other linears in e4m3 with
    ``.scale`` F8_E8M0 block factors, a draft block under ``mtp.0``, ``expert_dtype: fp4`` in config.json.
    Returns the float state (under the release's names) that transformers' own FP8 decoder makes of it (the
    converter's reference)."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    shutil.copytree(float_dir, out)
    for f in glob.glob(str(out / "*.safetensors")):
        os.remove(f)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    stored, decoded, state = {}, {}, tensors(float_dir)
    # (and a draft block as the release's: transformers' model skips it, the converter quantizes its experts too)
    state.update({k.replace("model.layers.1.", "mtp.0."): w.clone() for k, w in state.items() if ".layers.1.ffn." in k})
    state["mtp.0.e_proj.weight"] = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)).bfloat16()
    for key, w in state.items():
        key = re.sub(r"^model\.", "", key).replace("embed_tokens.weight", "embed.weight")
        if ".experts." in key and ".shared_experts." not in key:
            groups = w.float().unflatten(-1, (-1, 32))  # [N, K/32, 32]
            exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=2.0 ** -100) / 6))
            x = groups / torch.exp2(exponent)[..., None]
            codes = ((x.abs()[..., None] - grid).abs().argmin(-1) + 8 * (x < 0)).flatten(-2)
            stored[key] = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8).view(torch.int8)
            scale = torch.exp2(exponent).to(torch.float8_e8m0fnu)
        elif V4_FP8.search(key) and not key.endswith("ffn.gate.weight"):
            scale = torch.exp2(torch.ceil(torch.log2(_block_amax(w, block).clamp(min=1e-12) / 448)))
            stored[key] = (w.float() / _per_value(scale, block, w.shape)).to(torch.float8_e4m3fn)
            scale = scale.to(torch.float8_e8m0fnu)
        else:
            stored[key] = decoded[key] = w
            continue
        stored[f"{key.removesuffix('.weight')}.scale"] = scale
        decoded[key] = Fp8Dequantize(None)._dequantize_one(stored[key], scale, output_dtype=w.dtype)
        assert decoded[key].shape == w.shape and (decoded[key].float() - w.float()).abs().max() > 0, key
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "scale_fmt": "ue8m0", "weight_block_size": list(block)}
    config["expert_dtype"] = "fp4"
    (out / "config.json").write_text(json.dumps(config))
    return decoded


def _block_amax(w, block):
    (n, k), (bn, bk) = w.shape, block
    padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
    padded[:n, :k] = w.float().abs()
    return padded.unflatten(1, (-1, bk)).unflatten(0, (-1, bn)).amax(dim=(1, 3))


def _per_value(scale, block, shape):
    return scale.float().repeat_interleave(block[0], 0)[:shape[0]].repeat_interleave(block[1], 1)[:, :shape[1]]


def test_quantize_reads_deepseek_v4s_release_layout(bf16_checkpoint, tmp_path):
    """DeepSeek-V4's release (its own tensor names, FP4 routed experts with per-32 factors, FP8 linears with
    ``.scale`` block factors) converts to exactly what the float checkpoint transformers decodes from it converts
    to; the result reloads (no ``expert_dtype`` left to fold into our quantization_config) to the logits of that
    float checkpoint quantized while loading."""
    release = tmp_path / "v4"
    decoded = _deepseek_v4_release(bf16_checkpoint("deepseek_v4"), release)
    assert {str(v.dtype) for k, v in tensors(release).items() if ".experts." in k and ".shared_" not in k} == {
        "torch.int8", "torch.float8_e8m0fnu"}
    ours, theirs = _convert_both(release, bf16_checkpoint("deepseek_v4"), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(".scale") for k in ours)
    assert {"layers.1.ffn.experts.gate_up_proj", "mtp.0.ffn.experts.gate_up_proj"} <= set(ours)
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    config = json.loads((tmp_path / "int8_v4" / "config.json").read_text())
    assert "expert_dtype" not in config and config["quantization_config"]["quant_method"] == "experts_int8"
    converted = auto_class("deepseek_v4").from_pretrained(tmp_path / "int8_v4", dtype=torch.float32)
    loaded = auto_class("deepseek_v4").from_pretrained(tmp_path / "decoded", dtype=torch.float32,
                                                      quantization_config=ExpertsInt8Config())
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, loaded(ids).logits)


def test_a_deepseek_v4_release_missing_an_fp4_weights_factors_is_refused_by_name(bf16_checkpoint, tmp_path):
    """An FP4 weight (I8) whose ``.scale`` is missing is named as one without its factors, before any work: it was
    taken for a float checkpoint's int8 tensor (an expert: "is this checkpoint already quantized?"; any other
    weight: copied as int8 codes, which a load reads as numbers)."""
    release = tmp_path / "v4"
    _deepseek_v4_release(bf16_checkpoint("deepseek_v4"), release)
    state = load_file(release / "model.safetensors")
    del state["layers.1.ffn.experts.3.w2.scale"]
    save_file(state, str(release / "model.safetensors"), metadata={"format": "pt"})
    assert_one_line_error(invoke("quantize", release, tmp_path / "o", "--no-progress"),
                          "layers.1.ffn.experts.3.w2.weight is I8 without its block scales",
                          "layers.1.ffn.experts.3.w2.scale", "incomplete")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))


@pytest.mark.gpu
@pytest.mark.parametrize("release", ["deepseek_v4", "fp8", "autofp8", "mxfp4", "nvfp4"])
def test_releases_decode_on_the_gpu_to_the_cpus_values(bf16_checkpoint, tmp_path, release):
    """With --device cuda a release's weights decode on the GPU: the output equals what its decoded float
    checkpoint converts to there, as on the CPU (exact products, one rounding)."""
    if release == "nvfp4":
        pytest.importorskip("compressed_tensors")  # (the release is packed by its own compressor)
    arch = {"deepseek_v4": "deepseek_v4", "fp8": "deepseek_v3", "autofp8": "mixtral", "mxfp4": "gpt_oss",
            "nvfp4": "qwen3_moe"}[release]
    src = tmp_path / release
    make = {"deepseek_v4": _deepseek_v4_release, "mxfp4": _mxfp4_release, "nvfp4": _compressed_nvfp4_release,
            "autofp8": lambda f, o: _autofp8_release(f, o, static=True),
            "fp8": lambda f, o: _fp8_release(f, o, block=(16, 24), scales="U8")}[release]
    decoded = make(bf16_checkpoint(arch), src)
    ours, theirs = _convert_both(src, bf16_checkpoint(arch), decoded, tmp_path, device="cuda")
    assert set(ours) == set(theirs)
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


def test_nvfp4_decodes_as_compressed_tensors_decompresses_it():
    """Every byte of NVFP4 codes (low nibble first, -0 included) with e4m3 group factors of every finite value
    (subnormals included) and a global factor decodes to what compressed-tensors' own NVFP4 decompression makes
    (bfloat16), and in float32 to its ``dequantize`` of the float32 codes (the factor divided first: the same
    float32 roundings, not only the same bfloat16 ones)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    from experts_int8.releases import dequantize_nvfp4

    packed = torch.arange(256, dtype=torch.uint8).reshape(8, 32).repeat(16, 1)  # [128, 32]: 64 values a row
    finite = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().isfinite()
    codes = torch.arange(256, dtype=torch.uint8)[finite]
    scale = codes[torch.randperm(128 * 4, generator=torch.Generator().manual_seed(0)) % codes.numel()]
    scale = scale.reshape(128, 4).view(torch.float8_e4m3fn)
    for global_scale in (torch.tensor([1.0]), torch.tensor([2687.3]), torch.tensor([0.37])):
        want = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized").decompress(
            {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": global_scale},
            preset_name_to_scheme("NVFP4", ["Linear"]))["weight"]
        got = dequantize_nvfp4(packed, scale, global_scale, dtype=torch.bfloat16)
        assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)
        assert torch.equal(got.signbit(), want.signbit())
        exact = dequantize(x_q=unpack_fp4_from_uint8(packed, 128, 64, dtype=torch.float32), scale=scale.float(),
                           args=preset_name_to_scheme("NVFP4", ["Linear"]).weights, global_scale=global_scale,
                           dtype=torch.float32)
        assert torch.equal(dequantize_nvfp4(packed, scale, global_scale, dtype=torch.float32), exact)


def test_modelopt_nvfp4_decodes_in_modelopts_order():
    """ModelOpt's NVFP4: every byte of codes (low nibble first) with every finite e4m3 group factor decodes in
    float32 as ModelOpt's own ``NVFP4QTensor.dequantize`` computes it: the factor ``weight_scale * weight_scale_2``
    first (one float32 rounding), then the e2m1 value times it (another); not the codes times the e4m3 factor first,
    which rounds differently in float32."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    from experts_int8.releases import dequantize_modelopt_nvfp4

    packed = torch.arange(256, dtype=torch.uint8).reshape(8, 32).repeat(16, 1)  # [128, 32]: 64 values a row
    finite = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().isfinite()
    codes = torch.arange(256, dtype=torch.uint8)[finite]
    scale = codes[torch.randperm(128 * 4, generator=torch.Generator().manual_seed(0)) % codes.numel()]
    scale = scale.reshape(128, 4).view(torch.float8_e4m3fn)
    values = unpack_fp4_from_uint8(packed, 128, 64, dtype=torch.float32)
    for scale_2 in (torch.tensor(1.0), torch.tensor(3.7e-4), torch.tensor([1.3e-5])):
        factor = scale.float() * scale_2  # (ModelOpt's per_block_scale)
        want = (values.view(128, 4, 16) * factor[..., None]).view(128, 64)
        assert torch.equal(dequantize_modelopt_nvfp4(packed, scale, scale_2, dtype=torch.float32), want)
        assert torch.equal(dequantize_modelopt_nvfp4(packed, scale, scale_2, dtype=torch.bfloat16),
                           want.to(torch.bfloat16))


def test_fp4_rows_decode_as_transformers_decodes_them():
    """FP4 codes (low nibble first) with UE8M0 factors per 32 values of a row, stored as F8_E8M0 or as exponent
    bytes, decode matrix by matrix to what transformers' FP8 loader makes of them."""
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    from experts_int8.releases import dequantize_fp4_rows

    packed = torch.randint(-128, 128, (3, 8, 48), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    exponents = torch.randint(110, 140, (3, 8, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    for scales in (exponents, exponents.view(torch.float8_e8m0fnu)):
        got = dequantize_fp4_rows(packed, scales, dtype=torch.bfloat16)
        assert got.shape == (3, 8, 96)
        for e in range(3):
            want = Fp8Dequantize(None)._dequantize_one(packed[e], exponents[e], output_dtype=torch.bfloat16)
            assert torch.equal(got[e], want)
    # (rows of 40 values: a last group of 8 takes its own factor)
    ragged = dequantize_fp4_rows(packed[0, :, :20], exponents[0, :, :2], dtype=torch.float32)
    full = Fp8Dequantize(None)._dequantize_one(packed[0], exponents[0], output_dtype=torch.float32)
    assert ragged.shape == (8, 40) and torch.equal(ragged, full[:, :40])
    # (a byte's low nibble first: 0x21 holds 0.5 then 1.0, 0x7F holds -6 then 6; exponent byte 128 doubles them)
    two = dequantize_fp4_rows(torch.tensor([[0x21, 0x7F]], dtype=torch.uint8).view(torch.int8),
                              torch.tensor([[128]], dtype=torch.uint8), dtype=torch.float32)
    assert two.tolist() == [[1.0, 2.0, -12.0, 12.0]]


def test_fp8_fused_experts_decode_matrix_by_matrix():
    """A fused FP8 experts tensor [E, N, K] decodes as its matrices do one by one (ragged edge blocks too), and
    stays within float32 temporaries of one matrix."""
    from experts_int8.releases import dequantize_fp8_blocks

    w = (torch.randn(3, 37, 70) * 100).to(torch.float8_e4m3fn)
    scales = torch.rand(3, 3, 3) + 0.5
    fused = dequantize_fp8_blocks(w, scales, block=(16, 32), dtype=torch.bfloat16)
    for e in range(3):
        want = torch.stack([torch.stack([w[e, i, j].float() * scales[e, i // 16, j // 32] for j in range(70)])
                            for i in range(37)]).bfloat16()
        assert torch.equal(fused[e], want)
        assert torch.equal(fused[e], dequantize_fp8_blocks(w[e], scales[e], block=(16, 32), dtype=torch.bfloat16))


@pytest.mark.parametrize("scales", ["BF16", "F16", "F8_E8M0", "U8"])
def test_fp8_block_scales_in_every_stored_dtype(bf16_checkpoint, tmp_path, scales):
    """Qwen3's FP8 releases store BF16 scales, some F16, newer ones UE8M0 powers of two (F8_E8M0, or exponent
    bytes): each converts to what its decoded float checkpoint converts to."""
    fp8 = tmp_path / "fp8"
    decoded = _fp8_release(bf16_checkpoint("qwen3_moe"), fp8, block=(16, 24), scales=scales)
    assert {str(v.dtype) for k, v in tensors(fp8).items() if k.endswith("_scale_inv")} == {
        {"BF16": "torch.bfloat16", "F16": "torch.float16", "F8_E8M0": "torch.float8_e8m0fnu",
         "U8": "torch.uint8"}[scales]}
    ours, theirs = _convert_both(fp8, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("name", [".scale", ".qscale_weight"])
def test_fp8_block_scales_under_the_other_names_transformers_reads(bf16_checkpoint, tmp_path, name):
    """Block factors stored as ``<module>.scale`` (DeepSeek-V4) or ``<module>.qscale_weight`` (Mistral Large 4)
    instead of ``<module>.weight_scale_inv`` convert as the decoded float checkpoint does."""
    fp8 = tmp_path / "fp8"
    decoded = _fp8_release(bf16_checkpoint("qwen3_moe"), fp8, block=(16, 24))
    for path in glob.glob(str(fp8 / "*.safetensors")):
        part = load_file(path)
        save_file({re.sub(r"\.weight_scale_inv$", name, k): v for k, v in part.items()}, path,
                  metadata={"format": "pt"})
    index = json.loads((fp8 / "model.safetensors.index.json").read_text())
    index["weight_map"] = {re.sub(r"\.weight_scale_inv$", name, k): f for k, f in index["weight_map"].items()}
    (fp8 / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any(k.endswith(name) for k in tensors(fp8))
    ours, theirs = _convert_both(fp8, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _autofp8_release(float_dir, out, static, scalar=True):
    """``float_dir``'s checkpoint as AutoFP8's per-tensor FP8 release (neuralmagic's older -FP8, as vLLM's fp8 loader
    reads it): each Linear weight (not the router or lm_head, listed in ``ignored_layers``) in e4m3 with one fp32
    ``weight_scale`` (its amax / 448: ``[]`` where ``scalar``, as AutoFP8 writes it, else ``[1]``), and with
    ``static`` an fp32 ``input_scale`` ``[]`` beside it and an FP8 KV cache's (``k_proj``'s and ``v_proj``'s
    ``output_scale``, ``kv_cache_scheme static``). Made as :func:`_fp8_release` makes block scales, with a block
    larger than any matrix; returns the float state those products make (the converter's reference)."""
    decoded = _fp8_release(float_dir, out, block=(1 << 20, 1 << 20))
    state = tensors(out)
    for f in glob.glob(str(out / "model*.safetensors*")):
        os.remove(f)
    stored = {}
    for key, value in state.items():
        if key.endswith(".weight_scale_inv"):
            assert value.shape == (1, 1)
            stored[key.removesuffix("_inv")] = value.reshape(() if scalar else (1,)).contiguous()
            if static:
                stored[f"{key.removesuffix('.weight_scale_inv')}.input_scale"] = torch.tensor(0.02)
            if static and key.endswith(("k_proj.weight_scale_inv", "v_proj.weight_scale_inv")):
                stored[f"{key.removesuffix('.weight_scale_inv')}.output_scale"] = torch.tensor(0.05)
        else:
            stored[key] = value
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "static" if static else "dynamic",
        "ignored_layers": ["lm_head"] + sorted({k.removesuffix(".weight") for k in state
                                                 if k.endswith("gate.weight") and "proj" not in k})}
    if static:
        config["quantization_config"]["kv_cache_scheme"] = "static"
    (out / "config.json").write_text(json.dumps(config))
    return decoded


@pytest.mark.parametrize("arch, static, scalar", [("mixtral", True, True), ("mixtral", False, False),
                                                  ("qwen3_moe", True, False), ("qwen3_moe", False, True)])
def test_quantize_reads_an_autofp8_per_tensor_release_as_the_float_checkpoint_it_encodes(bf16_checkpoint, tmp_path,
                                                                                         arch, static, scalar):
    """AutoFP8's per-tensor FP8 release (quant_method fp8, no weight_block_size; static or dynamic activations, its
    scales [] or [1]) converts bit for bit to what its decoded float checkpoint converts to: experts int8, its other
    FP8 weights in the config's bf16, no weight, input or KV-cache scales left, our quantization_config; it reloads
    and runs."""
    fp8 = tmp_path / "fp8"
    decoded = _autofp8_release(bf16_checkpoint(arch), fp8, static=static, scalar=scalar)
    stored = tensors(fp8)
    assert {tuple(v.shape) for k, v in stored.items() if k.endswith(".weight_scale")} == {() if scalar else (1,)}
    assert any(k.endswith(".input_scale") for k in stored) == static
    assert any(k.endswith("k_proj.output_scale") for k in stored) == static
    ours, theirs = _convert_both(fp8, bf16_checkpoint(arch), decoded, tmp_path)
    assert set(ours) == set(theirs)
    assert not any(k.endswith((".weight_scale", ".input_scale", ".output_scale")) for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "fp8", arch)


def _transformers_fp8_release(arch, float_dir, out, scheme, monkeypatch, keep=(), **save):
    """``float_dir``'s checkpoint as transformers' own per-tensor FP8 writes it (``FineGrainedFP8Config`` without a
    ``weight_block_size``, quantized while loading, then ``save_pretrained``; its check for a GPU skipped: the
    quantization itself is plain torch): each Linear's e4m3 ``weight`` beside ``weight_scale_inv`` ``[1, 1]``, the
    experts' weights split back per expert without factors, which stay in the merged tensors' names
    (``experts.gate_up_proj_scale_inv`` and ``experts.down_proj_scale_inv`` ``[E, 1, 1]``), as do fused experts it
    renames or concatenates while loading and back on saving (Granite's ``input_linear.weight`` ``[E, N, K]``,
    Step-3.7's ``moe.gate_proj.weight`` and ``moe.up_proj.weight``). Returns the float state
    those products make, as transformers' ``Fp8Dequantize`` makes them (in float32, rounded once to the weight's
    bf16; the converter's reference). ``keep``: modules left float (besides lm_head); ``save``: save_pretrained's
    settings (max_shard_size...)."""
    from transformers import FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    monkeypatch.setattr(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *args, **kwargs: None)
    config = FineGrainedFP8Config(weight_block_size=None, activation_scheme=scheme,
                                  modules_to_not_convert=["lm_head", *keep] if keep else None)
    auto_class(arch).from_pretrained(float_dir, quantization_config=config, dtype=torch.bfloat16).save_pretrained(
        out, **save)
    stored, decoded, merged = tensors(out), {}, {"w1": "gate_up", "w3": "gate_up", "gate_proj": "gate_up",
                                                 "up_proj": "gate_up", "w2": "down", "down_proj": "down"}
    renamed = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
               "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
               "moe.gate_proj.weight": "mlp.experts.gate_up_proj", "moe.up_proj.weight": "mlp.experts.gate_up_proj",
               "moe.down_proj.weight": "mlp.experts.down_proj"}
    for key, value in stored.items():
        if key.endswith(("_scale_inv", "activation_scale")):
            continue
        expert = re.match(r"(.+\.experts)\.(\d+)\.(\w+)\.weight$", key)
        fused = re.match(rf"(.+\.)({'|'.join(map(re.escape, renamed))})$", key)
        if value.dtype == torch.float8_e4m3fn:
            scale = (stored[f"{expert[1]}.{merged[expert[3]]}_proj_scale_inv"][int(expert[2])] if expert else
                     stored[f"{fused[1]}{renamed[fused[2]]}_scale_inv"] if fused else stored.get(f"{key}_scale_inv"))
            if scale is None:  # (a weight split while loading: its factors are under the split names)
                continue
            value = (value.float() * scale.float()).bfloat16()
        decoded[key] = value
    return decoded


@pytest.mark.parametrize("arch, scheme, options", [("mixtral", "dynamic", {}), ("qwen3_moe", "static", {}),
                                                ("granitemoeshared", "static", {"max_shard_size": "20KB"}),
                                                ("step3p7", "dynamic", {"keep": ("vision_model",
                                                                                 "multi_modal_projector")})])
def test_quantize_reads_transformers_per_tensor_fp8_release_as_the_float_checkpoint_it_encodes(
        bf16_checkpoint, tmp_path, monkeypatch, arch, scheme, options):
    """transformers' own per-tensor FP8 (quant_method fp8, weight_block_size null), as its save_pretrained writes it
    (Linear factors [1, 1] in weight_scale_inv; the experts' in the merged tensors' names, [E, 1, 1], also where it
    renames fused experts back, Granite's, beside its shared MLP's own input_linear, or splits them back, Step-3.7's
    stacked gate and up halves; in shards, the factors apart from their weights), converts bit for bit to what its
    decoded float checkpoint converts to: no weight or activation scales left, our quantization_config; it reloads
    and runs."""
    fp8, float_dir = tmp_path / "fp8", bf16_checkpoint(arch)
    decoded = _transformers_fp8_release(arch, float_dir, fp8, scheme, monkeypatch, **options)
    stored = tensors(fp8)
    # (the weights as the float checkpoint holds them: per expert, or fused under its names)
    assert {k for k in stored if not k.endswith(("_scale_inv", "activation_scale"))} == set(tensors(float_dir))
    assert {tuple(v.shape) for k, v in stored.items() if k.endswith(".weight_scale_inv")} == {(1, 1)}
    assert {tuple(v.shape)[1:] for k, v in stored.items() if k.endswith("experts.gate_up_proj_scale_inv")} == {(1, 1)}
    assert any(k.endswith("activation_scale") for k in stored) == (scheme == "static")
    assert json.loads((fp8 / "config.json").read_text())["quantization_config"]["weight_block_size"] is None
    ours, theirs = _convert_both(fp8, float_dir, decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_scale_inv", "activation_scale")) for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "fp8", arch)


def test_transformers_per_tensor_fp8_of_a_weight_split_while_loading_is_refused_saying_so(bf16_checkpoint, tmp_path,
                                                                                          monkeypatch):
    """Step-3.7's vision attention joins q, k and v in one in_proj_weight that transformers splits while loading:
    its per-tensor FP8 release saves the joined weight with three factors under the split names. That is refused in
    one line naming the weight and saying the factors are kept where they are not read, nothing written."""
    fp8 = tmp_path / "fp8"
    _transformers_fp8_release("step3p7", bf16_checkpoint("step3p7"), fp8, "dynamic", monkeypatch)
    joined = sorted(k for k, v in tensors(fp8).items() if k.endswith("in_proj_weight")
                    and v.dtype == torch.float8_e4m3fn)
    assert joined and not any(f"{k}_scale_inv" in tensors(fp8) for k in joined)
    assert_one_line_error(invoke("quantize", fp8, tmp_path / "o", "--no-progress"), joined[0],
                          "without its scales", "keeps them where they are not read", "convert the float checkpoint")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))


@pytest.mark.parametrize("name", [".input_scale", ".activation_scale"])
def test_a_block_scaled_fp8_release_with_static_activations_drops_their_scales(bf16_checkpoint, tmp_path, name):
    """A block-scaled FP8 release with static activations (vLLM refuses the pair; transformers' own FP8 writes it,
    naming the scales ``activation_scale``) converts as its dynamic twin does: the weights decode alike, the
    activation scales are dropped (an int8-weight model runs its activations in float)."""
    fp8 = tmp_path / "fp8"
    decoded = _fp8_release(bf16_checkpoint("qwen3_moe"), fp8, block=(16, 24))
    shard = fp8 / "model-00002-of-00002.safetensors"
    part = load_file(shard)
    part.update({f"{k.removesuffix('.weight_scale_inv')}{name}": torch.tensor(0.02) for k in list(part)})
    save_file(part, str(shard), metadata={"format": "pt"})
    index = json.loads((fp8 / "model.safetensors.index.json").read_text())
    index["weight_map"].update({k: shard.name for k in part})
    (fp8 / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((fp8 / "config.json").read_text())
    config["quantization_config"]["activation_scheme"] = "static"
    (fp8 / "config.json").write_text(json.dumps(config))
    ours, theirs = _convert_both(fp8, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(name) for k in ours)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_autofp8_releases_it_cannot_decode_are_refused_by_name(bf16_checkpoint, tmp_path):
    """A per-tensor FP8 release whose weight lacks its scale, whose scale is per row ([N, 1]: not a layout vLLM's
    fp8 loader reads) or of another dtype, with a weight_scale or an input_scale beside a float weight, factors
    under both AutoFP8's name and transformers' (weight_scale_inv), or no activation_scheme is refused in one line
    that says what is wrong, before anything is written."""
    fp8 = tmp_path / "fp8"
    _autofp8_release(bf16_checkpoint("mixtral"), fp8, static=True)
    state = tensors(fp8)
    key = "model.layers.1.block_sparse_moe.experts.2.w2.weight"
    gate = "model.layers.1.block_sparse_moe.gate"
    _assert_breakages_refused(fp8, state, (
        (lambda st: st.pop(f"{key}_scale"),
         f"{key} is F8_E4M3 without its scales {key}_scale or {key}_scale_inv (or model.layers.1.block_sparse_moe."
         f"experts.down_proj_scale_inv); the FP8 checkpoint is incomplete (download it again) or keeps them where "
         f"they are not read"),
        (lambda st: st.__setitem__(f"{key}_scale", st[f"{key}_scale"].expand(64, 1).contiguous()),
         f"{key}_scale is F32 [64, 1], not the [] or [1] scales (F32, BF16, F16) that F8_E4M3 [64, 48] with tensor "
         f"scales needs"),
        (lambda st: st.__setitem__(f"{key}_scale", st[f"{key}_scale"].to(torch.float8_e8m0fnu)),
         f"{key}_scale is F8_E8M0 [], not the [] or [1] scales"),
        (lambda st: st.__setitem__(f"{gate}.weight_scale", torch.tensor(1.0)),
         f"{gate}.weight_scale belongs to no fp8 weight"),
        (lambda st: st.__setitem__(f"{gate}.input_scale", torch.tensor(1.0)),
         f"{gate}.input_scale belongs to no fp8 weight"),
        (lambda st: st.__setitem__(f"{key}_scale_inv", st[f"{key}_scale"].reshape(1, 1).clone()),
         f"{key}_scale_inv belongs to no fp8 weight")), tmp_path)  # (both scales: one is no weight's)
    save_file(state, str(fp8 / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8 / "config.json").read_text())
    for scheme in (None, "per-token"):
        qc = {k: v for k, v in config["quantization_config"].items() if k != "activation_scheme"}
        (fp8 / "config.json").write_text(json.dumps(dict(config, quantization_config=dict(
            qc, **({"activation_scheme": scheme} if scheme else {})))))
        assert_one_line_error(invoke("quantize", fp8, tmp_path / "o", "--no-progress"),
                              f"weight_block_size None, activation_scheme {scheme!r}",
                              "convert the original float checkpoint instead")
        assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))


def _write_compressed_release(out, stored: dict, scheme, fmt: str, kv_cache: bool):
    """Writes a compressed-tensors release's ``stored`` tensors into ``out`` and its config.json's
    quantization_config (one group of ``scheme`` in format ``fmt``, the router and lm_head ignored); with
    ``kv_cache`` an FP8 KV cache's ``k_scale`` and ``v_scale`` on each attention module (and its
    ``kv_cache_scheme``)."""
    if kv_cache:
        for key in [k for k in stored if k.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.weight_packed"))]:
            attention = key.split(".k_proj.")[0]
            stored[f"{attention}.k_scale"], stored[f"{attention}.v_scale"] = torch.tensor(0.5), torch.tensor(0.25)
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    kv_scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": json.loads(scheme.model_dump_json())},
        "kv_cache_scheme": kv_scheme if kv_cache else None,
        "sparsity_config": {}, "transform_config": {}, "global_compression_ratio": None,
        "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"]}
    (out / "config.json").write_text(json.dumps(config))


def _group_weights_changed(qc: dict, **changes) -> dict:
    """A copy of a one-group compressed-tensors ``qc`` with its group's weights changed."""
    group = json.loads(json.dumps(qc["config_groups"]["group_0"]))
    group["weights"].update(changes)
    return dict(qc, config_groups={"group_0": group})


def _assert_configs_refused(src, tmp_path, bads):
    """Each (quantization_config, needle) of ``bads`` in ``src``'s config.json makes quantize refuse in one line
    with the needle and the way that works, writing nothing; the config.json is put back after."""
    config = json.loads((src / "config.json").read_text())
    for bad, needle in bads:
        (src / "config.json").write_text(json.dumps(dict(config, quantization_config=bad)))
        assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"), needle,
                              "convert the original float checkpoint instead")
        assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))
    (src / "config.json").write_text(json.dumps(config))


def _loaded_by_transformers(ct, float_dir, decoded: dict, tmp_path) -> tuple[dict, dict]:
    """(the state transformers loads from the qwen3_moe compressed-tensors release ``ct``, compressed-tensors
    decompressing it; the state it loads from ``float_dir`` with the ``decoded`` weights), both in bf16."""
    from transformers import CompressedTensorsConfig

    ref = tmp_path / "decoded"
    shutil.copytree(float_dir, ref)
    save_file(decoded, str(ref / "model.safetensors"), metadata={"format": "pt"})
    loaded = auto_class("qwen3_moe").from_pretrained(
        ct, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(run_compressed=False)).state_dict()
    return loaded, auto_class("qwen3_moe").from_pretrained(ref, dtype=torch.bfloat16).state_dict()


def _compressed_fp8_release(float_dir, out, strategy, block=None, scales="BF16", scalar=False, static=False,
                            kv_cache=False, only=None):
    """``float_dir``'s checkpoint as a compressed-tensors float-quantized FP8 release, made as llm-compressor makes
    RedHatAI's: each Linear weight (not the router or lm_head) in e4m3 by compressed-tensors' own compressor, its
    ``weight_scale`` (amax / 448 of the tensor: ``[1]``, or ``[]`` where ``scalar``; of each row: ``[N, 1]``; of
    each block: ``[ceil(N/bn), ceil(K/bk)]``) in ``scales`` (BF16 as those releases, or F32), and with ``static``
    an ``input_scale`` ``[1]`` (the -FP8 releases' static activations), with ``kv_cache`` an FP8 KV cache's
    ``k_scale`` and ``v_scale`` on each attention module (and its ``kv_cache_scheme``); with ``only``, just the
    weights whose keys it accepts. Returns the float state that compressed-tensors' own decompression makes of it, in
    the checkpoint's dtype (the converter's reference)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, dynamic=False,
                               block_structure=list(block) if block else None)
    activations = QuantizationArgs(num_bits=8, type="float", strategy="tensor" if static else "token",
                                   symmetric=True, dynamic=not static)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)
    compressor = BaseCompressor.get_value_from_registry("float-quantized")
    shutil.copytree(float_dir, out)
    for f in glob.glob(str(out / "*.safetensors")):
        os.remove(f)
    state, stored, decoded = tensors(float_dir), {}, {}
    dtype = {"BF16": torch.bfloat16, "F32": torch.float32}[scales]
    for key, w in state.items():
        if not FP8_LINEAR.search(key) or (only and not only(key)):
            stored[key] = w
            continue
        if strategy == "block":
            amax = _block_amax(w, block)
        else:
            amax = w.float().abs().amax(dim=-1, keepdim=True) if strategy == "channel" else w.float().abs().amax()
        scale = (amax.clamp(min=1e-12) / 448).to(dtype)
        scale = scale.reshape(() if scalar else (1,)) if strategy == "tensor" else scale
        base = key.removesuffix(".weight")
        stored[key] = compressor.compress({"weight": w, "weight_scale": scale}, scheme)["weight"]
        stored[f"{base}.weight_scale"] = scale
        if static:
            stored[f"{base}.input_scale"] = torch.tensor([0.02])
        decoded[key] = compressor.decompress({"weight": stored[key], "weight_scale": scale}, scheme)["weight"].to(
            w.dtype).contiguous()  # (a ragged block's: a slice of the padded blocks)
        assert stored[key].dtype == torch.float8_e4m3fn and decoded[key].shape == w.shape
        assert 0 < (decoded[key].float() - w.float()).abs().max() < w.float().abs().max() / 8, key
    _write_compressed_release(out, stored, scheme, "float-quantized", kv_cache)
    return {**state, **decoded}


CT_RELEASES = {"channel": dict(strategy="channel"), "tensor": dict(strategy="tensor"),
               "block": dict(strategy="block", block=(24, 40)),
               "block_f32": dict(strategy="block", block=(16, 128), scales="F32"),
               "tensor_scalar_static": dict(strategy="tensor", scalar=True, static=True),
               "channel_static": dict(strategy="channel", static=True),
               "channel_static_kv": dict(strategy="channel", static=True, kv_cache=True)}


@pytest.mark.parametrize("arch, release", [("qwen3_moe", r) for r in ("channel", "tensor", "block", "block_f32",
                                                                      "tensor_scalar_static")]
                         + [("mixtral", "channel_static"), ("mixtral", "tensor_scalar_static"),
                            ("qwen3_moe", "channel_static_kv")])
def test_quantize_reads_a_compressed_tensors_fp8_release_as_the_float_checkpoint_it_encodes(
        bf16_checkpoint, tmp_path, arch, release):
    """A compressed-tensors float-quantized FP8 release (RedHatAI's -FP8-dynamic: per-row scales; -FP8: one scale a
    tensor, static input scales; FP8_BLOCK: ragged blocks here) converts bit for bit to what the float checkpoint
    compressed-tensors decompresses from it converts to: experts int8, its other FP8 weights in the config's bf16,
    no weight or input scales left, our quantization_config; it reloads and runs."""
    ct = tmp_path / "ct"
    decoded = _compressed_fp8_release(bf16_checkpoint(arch), ct, **CT_RELEASES[release])
    assert any(k.endswith(".input_scale") for k in tensors(ct)) == ("static" in release)
    assert any(k.endswith(".k_scale") for k in tensors(ct)) == release.endswith("_kv")
    ours, theirs = _convert_both(ct, bf16_checkpoint(arch), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_scale", "input_scale")) and "experts" not in k
                                                for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "ct", arch)


@pytest.mark.parametrize("release", ["channel", "tensor", "tensor_scalar_static"])
def test_compressed_tensors_fp8_reference_is_what_transformers_loads(bf16_checkpoint, tmp_path, release):
    """The reference above is transformers' own: the release loaded by transformers with compressed-tensors
    decompressing it (``CompressedTensorsConfig(run_compressed=False)``) holds the weights of the decoded float
    checkpoint, experts fused as it fuses them. (Not block scales: transformers 5.25 multiplies an expert's FP8
    weight by its scales without expanding the blocks, and fails; compressed-tensors' decompression is the reference
    there.)"""
    ct = tmp_path / "ct"
    decoded = _compressed_fp8_release(bf16_checkpoint("qwen3_moe"), ct, **CT_RELEASES[release])
    loaded, want = _loaded_by_transformers(ct, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    weights = [k for k in want if k.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj"))]
    assert any("experts" in k for k in weights) and any("self_attn" in k for k in weights)
    for key in weights:
        assert loaded[key].dtype == want[key].dtype and torch.equal(loaded[key], want[key]), key


def _compressed_nvfp4_release(float_dir, out, static=False, kv_cache=False, only=None):
    """``float_dir``'s checkpoint as a compressed-tensors nvfp4-pack-quantized release, made as llm-compressor makes
    RedHatAI's -NVFP4: each Linear weight (not the router or lm_head) packed by compressed-tensors' own NVFP4
    compressor (two e2m1 codes a byte) with its ``weight_global_scale`` (F32 ``[1]``: 448 * 6 / the tensor's amax)
    and ``weight_scale`` (e4m3 ``[N, K/16]``: each group's amax / 6 times the global scale), the config's scheme
    its NVFP4 preset; with ``static`` an ``input_global_scale`` ``[1]`` (as those releases have), with ``kv_cache`` an
    FP8 KV cache's ``k_scale`` and ``v_scale`` (and its ``kv_cache_scheme``); with ``only``, just the weights whose
    keys it accepts. Returns the float state that compressed-tensors' own decompression makes of it, in the
    checkpoint's dtype (the converter's reference)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    compressor = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    shutil.copytree(float_dir, out)
    for f in glob.glob(str(out / "*.safetensors")):
        os.remove(f)
    state, stored, decoded = tensors(float_dir), {}, {}
    for key, w in state.items():
        if not FP8_LINEAR.search(key) or (only and not only(key)):
            stored[key] = w
            continue
        global_scale = (448 * 6 / w.float().abs().amax().clamp(min=1e-12)).reshape(1)
        amax = w.float().unflatten(-1, (-1, 16)).abs().amax(-1)
        scale = (amax / 6 * global_scale).clamp(min=2 ** -9).to(torch.float8_e4m3fn)
        base = key.removesuffix(".weight")
        packed = compressor.compress({"weight": w, "weight_scale": scale.float(), "weight_global_scale": global_scale},
                                     scheme)
        stored.update({f"{base}.{name}": t for name, t in packed.items()})
        if static:
            stored[f"{base}.input_global_scale"] = torch.tensor([50.0])
        decoded[key] = compressor.decompress(packed, scheme)["weight"].to(w.dtype)
        assert packed["weight_packed"].dtype == torch.uint8 and packed["weight_scale"].dtype == torch.float8_e4m3fn
        assert decoded[key].shape == w.shape and packed["weight_packed"].shape == (w.shape[0], w.shape[1] // 2)
        assert 0 < (decoded[key].float() - w.float()).abs().max() < w.float().abs().max() / 4, key
    _write_compressed_release(out, stored, scheme, "nvfp4-pack-quantized", kv_cache)
    return {**state, **decoded}


@pytest.mark.parametrize("arch, static, kv_cache", [("qwen3_moe", False, False), ("qwen3_moe", True, True),
                                                    ("mixtral", True, False)])
def test_quantize_reads_a_compressed_tensors_nvfp4_release_as_the_float_checkpoint_it_encodes(
        bf16_checkpoint, tmp_path, arch, static, kv_cache):
    """A compressed-tensors nvfp4-pack-quantized release (RedHatAI's -NVFP4 MoE releases) converts bit for bit to
    what the float checkpoint compressed-tensors decompresses from it converts to: experts int8, its other NVFP4
    weights in the config's bf16, no packed weights or scales left (input and KV cache scales dropped), our
    quantization_config; it reloads and runs."""
    ct = tmp_path / "ct"
    decoded = _compressed_nvfp4_release(bf16_checkpoint(arch), ct, static=static, kv_cache=kv_cache)
    stored = tensors(ct)
    assert any(k.endswith(".input_global_scale") for k in stored) == static
    assert any(k.endswith(".k_scale") for k in stored) == kv_cache
    ours, theirs = _convert_both(ct, bf16_checkpoint(arch), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_packed", "_global_scale", "k_scale")) for k in ours)
    assert any(k.endswith("self_attn.q_proj.weight") and ours[k].dtype == torch.bfloat16 for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "ct", arch)


def _compressed_mixed_release(float_dir, out, tmp_path, fp8="channel"):
    """``float_dir``'s checkpoint as the compressed-tensors mixed-precision release llm-compressor writes for NVFP4
    experts and FP8 attention: each group's Linears by its own compressor (the two builders above, each on its
    group's keys), config.json's ``format: mixed-precision`` and each group its own ``format``, as compressed-tensors
    0.20.1's ``infer_model_format`` writes them where groups differ. Returns its own decompression of it."""
    from compressed_tensors.quantization import QuantizationScheme

    experts = re.compile(r"\.experts\.").search
    part = tmp_path / "nvfp4_part"
    by_nvfp4 = _compressed_nvfp4_release(float_dir, part, only=experts)
    by_fp8 = _compressed_fp8_release(part, out, only=lambda key: not experts(key), **CT_RELEASES[fp8])
    qcs = [json.loads((d / "config.json").read_text())["quantization_config"] for d in (out, part)]
    groups = {f"group_{i}": json.loads(QuantizationScheme.model_validate(dict(
        qc["config_groups"]["group_0"], targets=[target], format=qc["format"])).model_dump_json())
        for i, (qc, target) in enumerate(zip(qcs, ("re:.*self_attn.*", "re:.*experts.*")))}
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = dict(qcs[0], format="mixed-precision", config_groups=groups)
    (out / "config.json").write_text(json.dumps(config))
    return {key: by_fp8.get(key, value) for key, value in by_nvfp4.items()}  # (the experts' weights: NVFP4's)


@pytest.mark.parametrize("arch, fp8", [("qwen3_moe", "channel"), ("qwen3_moe", "block"),
                                       ("mixtral", "tensor_scalar_static")])
def test_quantize_reads_a_compressed_tensors_mixed_precision_release_as_the_float_checkpoint_it_encodes(
        bf16_checkpoint, tmp_path, arch, fp8):
    """A compressed-tensors mixed-precision release (experts NVFP4, attention FP8 with channel, block or tensor
    scales) converts bit for bit to what the float checkpoint compressed-tensors decompresses from it converts to,
    each weight decoded by its own encoding: experts int8, attention in the config's bf16, no packed weights or
    scales left outside the experts; it reloads and runs."""
    ct = tmp_path / "ct"
    decoded = _compressed_mixed_release(bf16_checkpoint(arch), ct, tmp_path, fp8)
    stored = tensors(ct)
    assert any("experts" in k and k.endswith(".weight_packed") for k in stored)
    assert any("self_attn" in k and v.dtype == torch.float8_e4m3fn for k, v in stored.items())
    ours, theirs = _convert_both(ct, bf16_checkpoint(arch), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_packed", "_global_scale", "input_scale")) or (
        k.endswith("_scale") and "experts" not in k) for k in ours)
    assert any(k.endswith("self_attn.q_proj.weight") and ours[k].dtype == torch.bfloat16 for k in ours)
    _assert_converted_alike(ours, theirs, tmp_path, "ct", arch)


def test_compressed_tensors_mixed_precision_groups_it_cannot_decode_are_refused_naming_the_group(bf16_checkpoint,
                                                                                                tmp_path):
    """A mixed-precision config with a group not in float-quantized or nvfp4-pack-quantized (int4 pack-quantized,
    naive-quantized, none said), a group's weights not its format's, or FP8 groups with different scales, is refused
    before anything is written, in one line naming the group and saying to convert the float checkpoint."""
    ct = tmp_path / "ct"
    _compressed_mixed_release(bf16_checkpoint("qwen3_moe"), ct, tmp_path)
    config = json.loads((ct / "config.json").read_text())
    qc = config["quantization_config"]

    def group(name, **changes):
        changed = json.loads(json.dumps(qc["config_groups"][name]))
        changed["weights"].update(changes.pop("weights", {}))
        return dict(changed, **changes)

    int4 = dict(num_bits=4, type="int", strategy="group", group_size=128)
    cases = (
        ({"group_1": group("group_1", weights=int4, format="pack-quantized")},
         "group 'group_1' of a 'mixed-precision' release is in format 'pack-quantized'"),
        ({"group_0": group("group_0", format="naive-quantized")}, "group 'group_0' of a 'mixed-precision' "
                                                                 "release is in format 'naive-quantized'"),
        ({"group_1": group("group_1", format=None)}, "group 'group_1' of a 'mixed-precision' release is in "
                                                     "format None"),
        ({"group_1": group("group_1", format="float-quantized")},
         "group 'group_1' quantizes weights with num_bits 4, type 'float', strategy 'tensor_group'"),
        ({"group_2": group("group_0", weights=dict(strategy="tensor"))},
         "quantize weights in different ways (channel, tensor)"))
    _assert_configs_refused(ct, tmp_path, [(dict(qc, config_groups={**qc["config_groups"], **groups}), needle)
                                           for groups, needle in cases])


def test_compressed_tensors_nvfp4_reference_is_what_transformers_loads_outside_the_experts(bf16_checkpoint,
                                                                                          tmp_path):
    """The NVFP4 reference above is transformers' own for the Linear weights it loads as Linears: the release loaded
    by transformers with compressed-tensors decompressing it holds the decoded float checkpoint's attention weights.
    (Not the experts: transformers 5.25 fuses them unscaled, e2m1 codes times the e4m3 factors alone, up to 448 * 6;
    compressed-tensors' decompression is the reference there.)"""
    ct = tmp_path / "ct"
    decoded = _compressed_nvfp4_release(bf16_checkpoint("qwen3_moe"), ct)
    loaded, want = _loaded_by_transformers(ct, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    weights = [k for k in want if k.endswith("_proj.weight") and "self_attn" in k]
    assert len(weights) == 8
    for key in weights:
        assert loaded[key].dtype == want[key].dtype and torch.equal(loaded[key], want[key]), key


def test_compressed_tensors_nvfp4_releases_it_cannot_decode_are_refused(bf16_checkpoint, tmp_path):
    """An nvfp4-pack-quantized config whose weights are not NVFP4 (other group sizes, bits, strategy, asymmetric)
    is refused before anything is written, in one line that says what and the way that works; so are packed
    weights without their group or global scales, scales of the wrong dtype or shape, and NVFP4 tensors in an FP8
    release."""
    ct = tmp_path / "ct"
    _compressed_nvfp4_release(bf16_checkpoint("qwen3_moe"), ct)
    config = json.loads((ct / "config.json").read_text())
    qc = config["quantization_config"]
    weights = partial(_group_weights_changed, qc)
    _assert_configs_refused(ct, tmp_path, (
        (weights(group_size=32), "group_size 32 in format 'nvfp4-pack-quantized'"), (weights(num_bits=8), "num_bits 8"),
        (weights(strategy="group"), "strategy 'group'"), (weights(symmetric=False), "symmetric False")))
    state = tensors(ct)
    key = "model.layers.1.mlp.experts.2.down_proj.weight"
    _assert_breakages_refused(ct, state, (
        (lambda st: st.pop(f"{key}_global_scale"), f"{key}_packed is NVFP4 without its {key}_global_scale; the "
         f"compressed-tensors checkpoint is incomplete"),
        (lambda st: st.pop(f"{key}_scale"), f"{key}_packed is NVFP4 without its {key}_scale"),
        (lambda st: st.__setitem__(f"{key}_scale", st[f"{key}_scale"].float()),
         f"{key}_scale is F32 [64, 2], not the F8_E4M3 [64, 2] group scales that NVFP4 [64, 16] needs"),
        (lambda st: st.__setitem__(f"{key}_global_scale", torch.ones(2)),
         f"{key}_global_scale is F32 [2], not the F32 [1] global scale"),
        (lambda st: st.__setitem__(f"{key}_packed", st[f"{key}_packed"].view(torch.int8)),
         f"{key}_packed is I8 [64, 16], not NVFP4 codes (U8 [N, K/2], two values a byte)")), tmp_path)
    (ct / "config.json").write_text(json.dumps(dict(config, quantization_config=dict(
        qc, format="float-quantized", config_groups={"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}}))))
    _assert_breakages_refused(ct, state, ((lambda st: None, "_global_scale belongs to no compressed-tensors weight"),),
                              tmp_path)


def _modelopt_release(float_dir, out, algo, hf_file=False, kv_cache=False):
    """``float_dir``'s checkpoint as NVIDIA ModelOpt's release (nvidia/*-FP8, *-FP4), in the layout vLLM's ModelOpt
    loader reads: each Linear weight (not the router or lm_head, in ``exclude_modules``) with an F32 ``input_scale``
    ``[]``; ``FP8``: an e4m3 ``weight`` and an F32 ``weight_scale`` ``[]`` (amax / 448: AutoFP8's per-tensor
    products, :func:`_autofp8_release`); ``NVFP4``: a U8 ``weight`` ``[N, K/2]`` (two e2m1 codes a byte, low nibble
    first, packed by compressed-tensors' packer), an e4m3 ``weight_scale`` ``[N, K/16]`` (each group's amax / 6 over
    the global factor) and an F32 ``weight_scale_2`` ``[]`` (amax / (6 * 448), a multiplier). With ``kv_cache`` an
    FP8 KV cache's ``k_proj.k_scale`` and ``v_proj.v_scale``. The config in config.json (``quant_method: modelopt``,
    ``quant_algo``...) or, with ``hf_file``, only in ``hf_quant_config.json``. Returns the float state its products
    make (the factor ``weight_scale * weight_scale_2`` first, as ModelOpt's ``NVFP4QTensor.dequantize``), rounded to the
    checkpoint's bf16 (the converter's reference)."""
    from compressed_tensors.compressors.nvfp4.helpers import quantize_and_pack_fp4, unpack_fp4_from_uint8

    if algo == "FP8":
        decoded = _autofp8_release(float_dir, out, static=True)
        stored = {k: v for k, v in tensors(out).items() if not k.endswith(".output_scale")}
    else:
        shutil.copytree(float_dir, out)
        for f in glob.glob(str(out / "*.safetensors")):
            os.remove(f)
        state, stored, decoded = tensors(float_dir), {}, {}
        for key, w in state.items():
            if not FP8_LINEAR.search(key):
                stored[key] = w
                continue
            scale_2 = (w.float().abs().amax() / (6 * 448)).reshape(())
            amax = w.float().unflatten(-1, (-1, 16)).abs().amax(-1)
            scale = (amax / 6 / scale_2).clamp(min=2 ** -9).to(torch.float8_e4m3fn)
            packed = quantize_and_pack_fp4(w, scale.float(), global_scale=(1 / scale_2).reshape(1))
            base = key.removesuffix(".weight")
            stored.update({key: packed, f"{base}.weight_scale": scale, f"{base}.weight_scale_2": scale_2,
                           f"{base}.input_scale": torch.tensor(0.01)})
            codes = unpack_fp4_from_uint8(packed, *w.shape, dtype=torch.float32)
            decoded[key] = (codes * (scale.float() * scale_2).repeat_interleave(16, 1)).to(w.dtype)
            assert 0 < (decoded[key].float() - w.float()).abs().max() < w.float().abs().max() / 4, key
        decoded = {**state, **decoded}
    if kv_cache:
        for key in [k for k in stored if k.endswith("self_attn.k_proj.weight")]:
            attention = key.removesuffix(".k_proj.weight")
            stored[f"{attention}.k_proj.k_scale"] = torch.tensor(0.5)
            stored[f"{attention}.v_proj.v_scale"] = torch.tensor(0.25)
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    exclude = ["lm_head", "*.mlp.gate", "*block_sparse_moe.gate"]
    quantization = {"quant_algo": algo, "kv_cache_quant_algo": "FP8" if kv_cache else None,
                    "exclude_modules": exclude, **({"group_size": 16} if algo == "NVFP4" else {})}
    config.pop("quantization_config", None)
    if hf_file:
        (out / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quantization}))
    else:
        kv_scheme = {"num_bits": 8, "type": "float", "dynamic": False} if kv_cache else None
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": algo, "ignore": exclude,
                                         "kv_cache_scheme": kv_scheme, "producer": {"name": "modelopt"},
                                         **({"group_size": 16} if algo == "NVFP4" else {})}
    (out / "config.json").write_text(json.dumps(config))
    return decoded


@pytest.mark.parametrize("arch, algo, hf_file, kv_cache", [
    ("qwen3_moe", "NVFP4", False, False), ("qwen3_moe", "NVFP4", True, True), ("mixtral", "NVFP4", False, True),
    ("qwen3_moe", "FP8", True, False), ("mixtral", "FP8", False, True)])
def test_quantize_reads_a_modelopt_release_as_the_float_checkpoint_it_encodes(bf16_checkpoint, tmp_path, arch, algo,
                                                                               hf_file, kv_cache):
    """A ModelOpt release (nvidia's -FP8 and -FP4: config.json's quant_method modelopt, or hf_quant_config.json
    alone) converts bit for bit to what its decoded float checkpoint converts to: experts int8, its other quantized
    weights in the config's bf16, no weight, input or KV cache scales left, our quantization_config, no
    hf_quant_config.json; it reloads and runs."""
    src = tmp_path / "mo"
    decoded = _modelopt_release(bf16_checkpoint(arch), src, algo, hf_file=hf_file, kv_cache=kv_cache)
    assert (src / "hf_quant_config.json").is_file() == hf_file
    assert any(k.endswith(".k_scale") for k in tensors(src)) == kv_cache
    ours, theirs = _convert_both(src, bf16_checkpoint(arch), decoded, tmp_path)
    assert set(ours) == set(theirs) and not any(k.endswith(("_scale_2", "input_scale", "k_scale")) for k in ours)
    assert any(k.endswith("self_attn.q_proj.weight") and ours[k].dtype == torch.bfloat16 for k in ours)
    assert not (tmp_path / "int8_mo" / "hf_quant_config.json").exists()
    _assert_converted_alike(ours, theirs, tmp_path, "mo", arch)


def test_quantize_reads_a_modelopt_release_whose_quant_method_names_its_format(bf16_checkpoint, tmp_path):
    """config.json's ``quant_method: modelopt_fp4`` (a name vLLM's ModelOpt loader reads as modelopt, as any
    ``modelopt...``) is read as ``modelopt``: the same conversion, not the refusal of an unknown method."""
    src = tmp_path / "mo"
    decoded = _modelopt_release(bf16_checkpoint("qwen3_moe"), src, "NVFP4")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "modelopt_fp4"
    (src / "config.json").write_text(json.dumps(config))
    ours, theirs = _convert_both(src, bf16_checkpoint("qwen3_moe"), decoded, tmp_path)
    assert set(ours) == set(theirs)
    _assert_converted_alike(ours, theirs, tmp_path, "mo", "qwen3_moe", reload=False)


@pytest.mark.parametrize("hf_file", [False, True])
def test_generate_refuses_a_modelopt_release_saying_to_convert_it(bf16_checkpoint, tmp_path, hf_file):
    """generate and eval refuse a ModelOpt release, also one described only by its hf_quant_config.json (which
    transformers does not read: it would load the FP8 or FP4 codes as float weights and drop their scales),
    saying to convert it first; a damaged hf_quant_config.json still reads as ModelOpt's, without that advice."""
    src = tmp_path / "mo"
    _modelopt_release(bf16_checkpoint("qwen3_moe"), src, "FP8", hf_file=hf_file)
    assert_one_line_error(invoke("generate", src, "--prompt", "a", "--device", "cpu"),
                          "quantized with 'modelopt'", "experts-int8 quantize SRC DST")
    assert_one_line_error(invoke("eval", src, "--text", str(src / "config.json"), "--device", "cpu"),
                          "quantized with 'modelopt'")
    if hf_file:
        (src / "hf_quant_config.json").write_text("{")
        result = invoke("generate", src, "--prompt", "a", "--device", "cpu")
        assert_one_line_error(result, "quantized with 'modelopt'")
        assert "experts-int8 quantize SRC DST" not in result.output


def test_a_float_checkpoint_with_a_stray_hf_quant_config_json_runs_as_float(bf16_checkpoint, tmp_path):
    """An hf_quant_config.json (valid or damaged) beside float weights, no FP8 or FP4 codes among them, does not make
    generate and eval refuse the checkpoint as ModelOpt's: transformers ignores that file and loads the weights as
    they are. Beside a ModelOpt release's codes it is still refused."""
    from experts_int8.run import checkpoint_kind

    src = tmp_path / "float"
    shutil.copytree(bf16_checkpoint("qwen3_moe"), src)
    config, files = json.loads((src / "config.json").read_text()), sorted(src.glob("*.safetensors"))
    for text in (json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}), "{"):
        (src / "hf_quant_config.json").write_text(text)
        assert checkpoint_kind(config, files) == "float"
    release = tmp_path / "mo"
    _modelopt_release(bf16_checkpoint("qwen3_moe"), release, "NVFP4", hf_file=True)
    with pytest.raises(ValueError, match="quantized with 'modelopt'"):
        checkpoint_kind(json.loads((release / "config.json").read_text()), sorted(release.glob("*.safetensors")))


def test_modelopt_releases_it_cannot_decode_are_refused(bf16_checkpoint, tmp_path):
    """ModelOpt's other algorithms (W4A8_AWQ, per-channel FP8, MXFP8...) and NVFP4 in groups other than 16 are
    refused before anything is written, in one line that says what and the way that works; so is a damaged
    hf_quant_config.json, and NVFP4 weights without their scales or with scales of the wrong dtype."""
    src = tmp_path / "mo"
    _modelopt_release(bf16_checkpoint("qwen3_moe"), src, "NVFP4")
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    _assert_configs_refused(src, tmp_path, (
        (dict(qc, quant_algo="W4A8_AWQ"), "quant_algo 'W4A8_AWQ'"),
        (dict(qc, quant_algo="FP8_PER_CHANNEL_PER_TOKEN"), "quant_algo 'FP8_PER_CHANNEL_PER_TOKEN'"),
        (dict(qc, group_size=32), "quant_algo 'NVFP4', group_size 32"),
        (dict(qc, quant_algo=None), "quant_algo None")))
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    for text, needle in (("{", "hf_quant_config.json is not valid JSON (Expecting property name enclosed in double "
                          "quotes: line 1 column 2 (char 1)); it is damaged (download it again), or remove it"),
                         (json.dumps({"producer": {"name": "modelopt"}}), "has no \"quantization\" object")):
        (src / "hf_quant_config.json").write_text(text)
        assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"), needle)
    (src / "hf_quant_config.json").unlink()
    (src / "config.json").write_text(json.dumps(config))
    state = tensors(src)
    key = "model.layers.1.mlp.experts.2.down_proj.weight"
    _assert_breakages_refused(src, state, (
        (lambda st: st.pop(f"{key}_scale_2"), f"{key} is NVFP4 without its {key}_scale_2; the ModelOpt checkpoint is "
         f"incomplete"),
        (lambda st: st.__setitem__(f"{key}_scale", st[f"{key}_scale"].float()),
         f"{key}_scale is F32 [64, 2], not the F8_E4M3 [64, 2] group scales that NVFP4 [64, 16] needs"),
        (lambda st: st.pop(f"{key}_scale"), f"{key} is NVFP4 without its {key}_scale;"),
        (lambda st: (st.pop(f"{key}_scale"), st.__setitem__(key, torch.zeros(64, 32, dtype=torch.bfloat16))),
         "down_proj.input_scale belongs to no modelopt weight")), tmp_path)


def test_compressed_tensors_releases_it_cannot_decode_are_refused_with_the_way_that_works(bf16_checkpoint, tmp_path):
    """compressed-tensors' other formats (int4 pack-quantized, naive-quantized, NVFP4...) and float-quantized
    weights it does not decode (not 8 bits, not float, group scales, asymmetric, blocks without a size, groups
    quantized differently, sparse) are refused before anything is written, in one line that says what and the way
    that works; so are scales of the wrong shape, missing ones and a zero point."""
    ct = tmp_path / "ct"
    _compressed_fp8_release(bf16_checkpoint("qwen3_moe"), ct, strategy="channel")
    assert_one_line_error(invoke("generate", ct, "--prompt", "a", "--device", "cpu"),
                          "quantized with 'compressed-tensors'", "experts-int8 quantize SRC DST")
    config = json.loads((ct / "config.json").read_text())
    qc = config["quantization_config"]
    weights = partial(_group_weights_changed, qc)
    int4 = weights(num_bits=4, type="int", strategy="group", group_size=128)
    _assert_configs_refused(ct, tmp_path, (
        (dict(int4, format="pack-quantized"), "format 'pack-quantized', not 'float-quantized'"),
        (dict(qc, format="naive-quantized"), "format 'naive-quantized'"),
        (weights(num_bits=4), "'group_0' quantizes weights with num_bits 4"),
        (weights(type="int"), "type 'int'"),
        (weights(strategy="group", group_size=128), "strategy 'group'"),
        (weights(symmetric=False), "symmetric False"),
        (weights(strategy="block", block_structure=None), "block_structure None"),
        (dict(qc, config_groups={**qc["config_groups"], "group_1": weights(
            strategy="tensor")["config_groups"]["group_0"]}), "quantize weights in different ways"),
        (dict(qc, sparsity_config={"format": "sparse-24-bitmask"}), "with a sparsity_config")))
    state = tensors(ct)
    key = "model.layers.1.mlp.experts.2.down_proj.weight"
    _assert_breakages_refused(ct, state, (
        (lambda st: st.pop(f"{key}_scale"),
         f"{key} is F8_E4M3 without its scales {key}_scale; the compressed-tensors checkpoint is incomplete"),
        (lambda st: st.__setitem__(f"{key}_scale", st[f"{key}_scale"][:, 0].contiguous()),
         f"{key}_scale is BF16 [64], not the [64, 1] scales (F32, BF16, F16) that F8_E4M3 [64, 32] with channel "
         f"scales needs"),
        (lambda st: st.__setitem__(f"{key}_zero_point", torch.zeros(64, 1)),
         f"{key}_zero_point belongs to no compressed-tensors weight")), tmp_path)


def test_fp8_and_other_quantized_sources_are_refused_with_the_way_that_works(bf16_checkpoint, tmp_path):
    fp8 = tmp_path / "fp8"
    _fp8_release(bf16_checkpoint("qwen3_moe"), fp8, block=(16, 16))
    stored = tensors(fp8)
    assert_one_line_error(invoke("generate", fp8, "--prompt", "a", "--device", "cpu"),
                          "quantized with 'fp8'", "experts-int8 quantize SRC DST")
    config = json.loads((fp8 / "config.json").read_text())
    for qc, needle in (({"quant_method": "gptq", "bits": 4}, "already quantized (quant_method 'gptq')"),
                       ({"quant_method": "fp8"}, "weight_block_size None, activation_scheme None"),
                       ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [16]},
                        "weight_block_size [16], activation_scheme 'static'")):
        (fp8 / "config.json").write_text(json.dumps(dict(config, quantization_config=qc)))
        assert_one_line_error(invoke("quantize", fp8, tmp_path / "o", "--no-progress"), needle,
                              "convert the original float checkpoint")
    (fp8 / "config.json").write_text(json.dumps(config))
    for f in glob.glob(str(fp8 / "model-*.safetensors")):
        os.remove(f)
    os.remove(fp8 / "model.safetensors.index.json")
    state = dict(stored)
    key = next(k for k in state if k.endswith("experts.1.down_proj.weight"))
    _assert_breakages_refused(fp8, state, (
        (lambda st: st.pop(f"{key}_scale_inv"), f"{key} is F8_E4M3 without its block scales"),
        (lambda st: st.__setitem__(f"{key}_scale_inv", st[f"{key}_scale_inv"][:, :1].contiguous()),
         f"{key}_scale_inv is F32"),
        (lambda st: st.__setitem__(f"{key.removesuffix('.weight')}.scale", st[f"{key}_scale_inv"].clone()),
         f"{key.removesuffix('.weight')}.scale belongs to no fp8 weight")), tmp_path)


def test_quantize_refuses_transposed_fused_experts_with_the_way_that_works(tmp_path):
    """Fused experts stored [E, H, 2I] / [E, I, H] (as Qwen3-VL's releases): transformers transposes them
    while loading; the streaming converter refuses them and says so."""
    src = _fused_checkpoint(tmp_path, "mixtral")
    (path,) = glob.glob(str(src / "*.safetensors"))
    state = {k: v.transpose(1, 2).contiguous() if k.endswith(("experts.gate_up_proj", "experts.down_proj")) else v
             for k, v in load_file(path).items()}
    save_file(state, path, metadata={"format": "pt"})
    result = invoke("quantize", src, tmp_path / "o", "--no-progress")
    assert_one_line_error(result, "experts layout not supported", "[E, 2I, H]", "ExpertsInt8Config")
    assert not (tmp_path / "o").exists()


def test_quantize_failure_leaves_nothing(bf16_checkpoint, tmp_path):
    src = tmp_path / "poisoned"
    good = bf16_checkpoint("mixtral")
    os.makedirs(src)
    for f in os.listdir(good):
        if not f.endswith(".safetensors"):
            os.link(good / f, src / f)
    state = tensors(good)
    key = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    state[key][0, 0] = float("nan")
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    os.makedirs(out)
    result = invoke("quantize", src, out / "int8", "--device", "cpu", "--no-progress")
    assert_one_line_error(result, key, "NaN")
    assert os.listdir(out) == []  # neither DST nor the temporary folder


def test_demo_failure_leaves_no_kept_checkpoint(tmp_path, monkeypatch):
    """A demo that fails after saving its bf16 checkpoint removes what it wrote under --keep (and the folders
    it made for it), so the same --keep works on the next run; an empty --keep folder given stays, empty."""
    from experts_int8 import run

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(run, "load_model", fail)
    given = tmp_path / "given"
    given.mkdir()
    for keep in (tmp_path / "a" / "kept", given):
        result = invoke("demo", "--device", "cpu", "--no-progress", "--new-tokens", "2", "--keep", keep)
        assert_one_line_error(result, "disk full")
    assert sorted(os.listdir(tmp_path)) == ["given"] and os.listdir(given) == []


@pytest.mark.parametrize("exc", [BrokenPipeError, KeyboardInterrupt])
def test_demo_interrupted_while_printing_removes_its_temporary_folder(tmp_path, monkeypatch, exc):
    """`experts-int8 demo | head` (a broken pipe) or Ctrl-C while the table prints: the demo's temporary checkpoints
    are removed then, not when the garbage collector finds the folder (the traceback holds it meanwhile)."""
    import tempfile

    from experts_int8 import demo

    def fail(*args, **kwargs):
        raise exc()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "_print_report", fail)
    with pytest.raises(exc) as raised:  # noqa: F841 - its traceback held, as a notebook holds its last one
        demo.run_demo(device="cpu", new_tokens=2, progress=False)
    assert os.listdir(tmp_path) == []


def test_quantize_failure_removes_the_folders_it_made(bf16_checkpoint, tmp_path):
    src = tmp_path / "poisoned"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    state = tensors(src)
    state["model.layers.0.block_sparse_moe.experts.0.w1.weight"][0, 0] = float("inf")
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    result = invoke("quantize", src, tmp_path / "a" / "b" / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code != 0
    assert sorted(os.listdir(tmp_path)) == ["poisoned"]  # neither DST nor the parents made for it


def test_quantize_refuses_a_dst_that_holds_src(bf16_checkpoint, tmp_path):
    """--overwrite swaps DST out and deletes it: a DST above SRC would take the source (and whatever else it
    holds) with it, so it is refused before anything is written."""
    work = tmp_path / "work"
    shutil.copytree(bf16_checkpoint("mixtral"), work / "src")
    (work / "notes.txt").write_text("x")
    before = sorted(os.listdir(work / "src"))
    for dst in (work, tmp_path):
        result = invoke("quantize", work / "src", dst, "--no-progress", "--overwrite")
        assert_one_line_error(result, "holds SRC", "outside")
    assert sorted(os.listdir(work / "src")) == before and (work / "notes.txt").exists()
    assert sorted(os.listdir(work)) == ["notes.txt", "src"]


def test_quantize_output_takes_the_umask_permissions(bf16_checkpoint, tmp_path):
    """The checkpoint is written in a private temporary folder (and safetensors writes 0600 files): the
    result is readable as the umask allows, e.g. by a server running under another account."""
    old = os.umask(0o022)
    try:
        dst = tmp_path / "int8"
        assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(dst.stat().st_mode) == 0o755
    assert {stat.S_IMODE(f.stat().st_mode) for f in dst.iterdir()} == {0o644}


def test_quantize_keeps_a_private_side_file_private(bf16_checkpoint, tmp_path):
    """A file of SRC only its owner may read (0600) was copied into DST readable by everyone (the umask's 0644)."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    (src / "notes.txt").write_text("private")
    (src / "notes.txt").chmod(0o600)
    old = os.umask(0o022)
    try:
        assert invoke("quantize", src, tmp_path / "int8", "--no-progress").exit_code == 0
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "int8").iterdir()}
    assert modes.pop("notes.txt") == 0o600 and set(modes.values()) == {0o644}, modes


def test_quantize_refuses_a_side_file_linked_from_outside_the_checkpoint(bf16_checkpoint, tmp_path):
    """A file of SRC linking outside it (`notes.txt -> /proc/self/environ` in a downloaded folder, or a user's key)
    had its contents copied into DST, made to be shared; a Hub cache snapshot's links into its blobs/ convert."""
    repo = tmp_path / "models--org--name"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for f in bf16_checkpoint("mixtral").iterdir():
        shutil.copy(f, blobs / f.name)
        (snapshot / f.name).symlink_to(Path("../../blobs") / f.name)
    (blobs / "readme").write_text("the model card")
    (snapshot / "README.md").symlink_to("../../blobs/readme")
    result = invoke("quantize", snapshot, tmp_path / "hub-int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hub-int8" / "README.md").read_text() == "the model card"
    (tmp_path / "secret").write_text("a key")
    for name, target in (("notes.txt", "/proc/self/environ"), ("key.txt", tmp_path / "secret"),
                         ("up.txt", "../../../secret")):
        (snapshot / name).symlink_to(target)
        result = invoke("quantize", snapshot, tmp_path / "int8", "--device", "cpu", "--no-progress")
        assert_one_line_error(result, f"{snapshot / name} links to", "outside the checkpoint folder", "remove the link")
        assert sorted(os.listdir(tmp_path)) == ["hub-int8", "models--org--name", "secret"]
        (snapshot / name).unlink()


def test_quantize_converts_side_files_linked_into_a_hub_caches_blobs(bf16_checkpoint, tmp_path):
    """A checkpoint in a Hub snapshot's subfolder, and a folder huggingface_hub < 0.23 downloaded with local_dir
    (its files over 5 MB, a large tokenizer.json, link into the cache's blobs/), were refused as linking outside
    SRC."""
    repo = tmp_path / "hub" / "models--org--name"
    sub, blobs = repo / "snapshots" / "abc123" / "checkpoint", repo / "blobs"
    sub.mkdir(parents=True)
    blobs.mkdir()
    local = tmp_path / "local"
    local.mkdir()
    for f in bf16_checkpoint("mixtral").iterdir():
        shutil.copy(f, local / f.name)
        shutil.copy(f, blobs / f.name)
        (sub / f.name).symlink_to(Path("../../../blobs") / f.name)
    (blobs / "0123abcd").write_text("the model card")
    (sub / "README.md").symlink_to("../../../blobs/0123abcd")
    (local / "README.md").symlink_to(blobs / "0123abcd")
    for src, dst in ((sub, tmp_path / "sub-int8"), (local, tmp_path / "local-int8")):
        result = invoke("quantize", src, dst, "--device", "cpu", "--no-progress")
        assert result.exit_code == 0, result.output
        assert (dst / "README.md").read_text() == "the model card" and not (dst / "README.md").is_symlink()


def test_quantize_converts_a_folder_of_links_to_another_checkpoint(bf16_checkpoint, tmp_path):
    """A folder of links to a checkpoint's files beside an edited config.json (a config changed without copying
    the weights) was refused: its tokenizer links led outside SRC. A link to a file of another name there is not."""
    src, edited = tmp_path / "orig", tmp_path / "edited"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    (src / "tokenizer.json").write_text("{}")
    edited.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (edited / f.name).symlink_to(f)
    shutil.copy(src / "config.json", edited / "config.json")
    result = invoke("quantize", edited, tmp_path / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert {f.name for f in (tmp_path / "int8").iterdir()} >= {f.name for f in edited.iterdir()}
    (tmp_path / ".env").write_text("a key")  # (a namesake in a folder that is no checkpoint: refused too)
    for name, target in (("notes.txt", src / "tokenizer.json"), (".env", tmp_path / ".env")):
        (edited / name).symlink_to(target)
        result = invoke("quantize", edited, tmp_path / "int8b", "--device", "cpu", "--no-progress")
        assert_one_line_error(result, f"{name} links to", "outside the checkpoint folder")
        (edited / name).unlink()


def test_quantize_refuses_existing_dst_and_overwrites_on_request(bf16_checkpoint, tmp_path):
    """--overwrite replaces a checkpoint folder only: not a folder of other things (`quantize SRC ~/models
    --overwrite` would have deleted every model in it), a link or a file, refused before any work."""
    dst = tmp_path / "int8"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress"), "--overwrite")
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite"),
                          "is not a model checkpoint folder (no config.json)")
    assert (dst / "keep.txt").exists()
    (dst / "config.json").write_text("{}")  # an older checkpoint
    result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert result.exit_code == 0, result.output
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()
    assert sorted(os.listdir(tmp_path)) == ["int8"]
    link = tmp_path / "link"
    link.symlink_to(dst)
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), link, "--no-progress", "--overwrite"),
                          "is a symbolic link")
    assert sorted(os.listdir(tmp_path)) == ["int8", "link"]


def test_quantize_names_what_is_wrong_with_dst_or_an_empty_path(bf16_checkpoint, tmp_path):
    """The OS's errors named a temporary folder ("[Errno 1] Operation not permitted: '/sys/.out.x.partial'") or
    only a path ("[Errno 17] File exists"); a plain file as DST was told to pass --overwrite, which then refused
    it; an empty SRC or DST printed a blank name."""
    src = bf16_checkpoint("mixtral")
    (tmp_path / "file.txt").write_text("x")
    for dst in (tmp_path / "file.txt" / "out", tmp_path / "file.txt" / "a" / "b"):
        assert_one_line_error(invoke("quantize", src, dst, "--no-progress"),
                              f"{tmp_path / 'file.txt'} is a file, not a folder; choose another folder")
    for more in ([], ["--overwrite"]):
        result = invoke("quantize", src, tmp_path / "file.txt", "--no-progress", *more)
        assert_one_line_error(result, "is an existing file, not a folder; choose another DST")
        assert "--overwrite" not in result.output
    denied = PermissionError(1, "Operation not permitted", str(tmp_path / ".out.x1y2.partial"))
    with mock.patch("experts_int8.convert.tempfile.mkdtemp", side_effect=denied):
        result = invoke("quantize", src, tmp_path / "new" / "out", "--no-progress")
    assert_one_line_error(result, f"its parent folder {tmp_path / 'new'} is not writable (Operation not permitted)")
    assert ".partial" not in result.output
    if os.geteuid() != 0:  # (root writes anywhere)
        (tmp_path / "ro").mkdir(mode=0o555)
        assert_one_line_error(invoke("quantize", src, tmp_path / "ro" / "out", "--no-progress"), "is not writable")
    assert sorted(os.listdir(tmp_path)) == ["file.txt"] + (["ro"] if os.geteuid() != 0 else [])
    assert_one_line_error(invoke("quantize", src, "", "--no-progress"), "DST is an empty path")
    assert_one_line_error(invoke("quantize", "", tmp_path / "out", "--no-progress"), "SRC is an empty path")
    assert_one_line_error(invoke("generate", "", "--prompt", "a", "--device", "cpu"), "the model path is empty")


def test_quantize_keeps_a_dst_that_appears_while_it_runs_and_puts_back_one_it_failed_to_replace(
        bf16_checkpoint, tmp_path):
    """Without --overwrite a DST that appears meanwhile (another run's) is left alone, not swapped out and
    deleted; with it, a failure of the swap's second rename puts the old checkpoint back."""
    from experts_int8 import convert

    dst, real = tmp_path / "int8", convert.save_file

    def appear(*args, **kwargs):
        if not dst.exists():
            dst.mkdir()
            (dst / "theirs.txt").write_text("not yours")
        return real(*args, **kwargs)

    with mock.patch.object(convert, "save_file", appear):
        assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress"),
                              "appeared while converting", "--overwrite")
    assert sorted(os.listdir(dst)) == ["theirs.txt"] and sorted(os.listdir(tmp_path)) == ["int8"]

    (dst / "config.json").write_text("{}")
    before = sorted(os.listdir(dst))
    replace = os.replace

    def second_rename_fails(a, b):
        if Path(b) == dst and str(a).endswith(".partial"):
            raise OSError(5, "Input/output error")
        return replace(a, b)

    with mock.patch.object(convert.os, "replace", second_rename_fails):
        assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite"),
                              f"replacing DST {dst} failed (Input/output error); the old checkpoint was put back")
    assert sorted(os.listdir(dst)) == before and sorted(os.listdir(tmp_path)) == ["int8"]

    shutil.rmtree(dst)  # under --overwrite, what appears meanwhile is checked as what was there at the start

    with mock.patch.object(convert, "save_file", appear):
        assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite"),
                              "is not a model checkpoint folder")
    assert sorted(os.listdir(dst)) == ["theirs.txt"] and sorted(os.listdir(tmp_path)) == ["int8"]


def test_quantize_overwrite_whose_dst_another_run_takes_away_meanwhile_leaves_no_old_folder(bf16_checkpoint,
                                                                                             tmp_path):
    """Two runs into one DST with --overwrite: one swapped DST out just before the other's own swap, whose rename of
    the gone DST failed with a bare "No such file or directory" naming its temporary .old folder, and left that
    folder (empty) beside DST."""
    from experts_int8 import convert

    dst = tmp_path / "int8"
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    real = convert.tempfile.mkdtemp

    def the_other_run_swaps_dst_out(*args, **kwargs):
        folder = real(*args, **kwargs)
        if kwargs.get("suffix") == ".old":
            shutil.rmtree(dst)
        return folder

    with mock.patch.object(convert.tempfile, "mkdtemp", the_other_run_swaps_dst_out):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path)) == ["int8"] and (dst / "model.safetensors").is_file()


def _snapshot(folder: Path) -> dict:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def _failing(real, when, err):
    """``real`` (os.rename / os.replace), raising the OS's own OSError (both paths named) where ``when(a, b)``."""
    def call(a, b, *args, **kwargs):
        if when(Path(a), Path(b)):
            raise OSError(err, os.strerror(err), str(a), None, str(b))
        return real(a, b, *args, **kwargs)
    return call


def test_quantize_whose_final_rename_fails_leaves_nothing_and_names_dst(bf16_checkpoint, tmp_path):
    """The rename of the finished output onto a new DST failing (a read-only remount, an I/O error): no .partial
    folder nor DST is left, and the one-line error names DST, not the removed temporary folder."""
    from experts_int8 import convert

    dst = tmp_path / "new" / "int8"
    rename = _failing(os.rename, lambda a, b: b == dst, errno.EROFS)
    with mock.patch.object(convert.os, "rename", rename):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress")
    assert_one_line_error(result, str(dst), "Read-only file system")
    assert ".partial" not in result.output
    assert os.listdir(tmp_path) == []


def test_quantize_overwrite_that_cannot_move_the_old_dst_aside_leaves_it_as_it_was(bf16_checkpoint, tmp_path):
    """--overwrite whose first rename of the swap (DST aside into a hidden .old folder) fails: DST is left as it was,
    no .old or .partial folder beside it, and the error names DST."""
    from experts_int8 import convert

    dst = tmp_path / "int8"
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    before = _snapshot(dst)
    replace = _failing(os.replace, lambda a, b: a == dst and b.parent.name.endswith(".old"), errno.EBUSY)
    with mock.patch.object(convert.os, "replace", replace):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert_one_line_error(result, str(dst), "Device or resource busy", "left as it is")
    assert ".old" not in result.output and ".partial" not in result.output
    assert os.listdir(tmp_path) == ["int8"] and _snapshot(dst) == before


def test_quantize_overwrite_whose_swap_and_put_back_both_fail_says_where_the_old_checkpoint_is(bf16_checkpoint,
                                                                                               tmp_path):
    """--overwrite whose new checkpoint cannot take DST's place, nor the old one go back: the error says where the
    old checkpoint is, and it is there whole; the new output is removed."""
    from experts_int8 import convert

    dst = tmp_path / "int8"
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    before = _snapshot(dst)
    replace = _failing(os.replace, lambda a, b: b == dst, errno.EIO)  # (the new one in, then the old one back)
    with mock.patch.object(convert.os, "replace", replace):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert_one_line_error(result, f"replacing DST {dst} failed (Input/output error), and so did putting it back: the "
                                  f"old checkpoint is in")
    assert ".partial" not in result.output  # (the temporary folder, removed: not named)
    [old] = os.listdir(tmp_path)
    assert old.startswith(".int8.") and old.endswith(".old") and str(tmp_path / old / "x") in result.output
    assert _snapshot(tmp_path / old / "x") == before


def test_quantize_whose_dst_appears_just_before_the_final_rename_leaves_it_alone(bf16_checkpoint, tmp_path):
    """Another run's DST made between the check that DST is free and the rename itself: the rename fails (not
    empty), and that DST is left as it is, as one made earlier is."""
    from experts_int8 import convert

    dst, rename = tmp_path / "int8", os.rename

    def another_run_first(a, b):
        if Path(b) == dst:
            dst.mkdir()
            (dst / "theirs.txt").write_text("not yours")
        return rename(a, b)

    with mock.patch.object(convert.os, "rename", another_run_first):
        assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress"),
                              "appeared while converting", "--overwrite")
    assert os.listdir(tmp_path) == ["int8"] and os.listdir(dst) == ["theirs.txt"]


@pytest.mark.parametrize("theirs", [False, True])
def test_quantize_overwrite_whose_dst_another_run_takes_away_meanwhile(bf16_checkpoint, tmp_path, theirs):
    """--overwrite whose DST another run removes just before the swap moves it aside: the new checkpoint goes in its
    place; where that run has made a DST of its own by then, it is left alone and the error says so (not the OS's
    message naming the temporary folder)."""
    from experts_int8 import convert

    dst, replace = tmp_path / "int8", os.replace
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0

    def taken_away_first(a, b):
        if Path(a) == dst and Path(b).parent.name.endswith(".old"):
            shutil.rmtree(dst)
            try:
                return replace(a, b)
            finally:
                if theirs:
                    dst.mkdir()
                    (dst / "theirs.txt").write_text("not yours")
        return replace(a, b)

    with mock.patch.object(convert.os, "replace", taken_away_first):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert os.listdir(tmp_path) == ["int8"]
    if theirs:
        assert_one_line_error(result, f"{dst} was replaced by another run", "left as it is")
        assert ".partial" not in result.output and os.listdir(dst) == ["theirs.txt"]
    else:
        assert result.exit_code == 0, result.output
        assert (dst / "model.safetensors").is_file() and (dst / "config.json").is_file()


@pytest.mark.parametrize("which", ["aside", "in"])
def test_quantize_overwrite_interrupted_during_the_swap_leaves_the_old_dst_in_place(bf16_checkpoint, tmp_path,
                                                                                    which):
    """Ctrl-C at either rename of the swap (the old DST aside, the new one in): the old DST is in place, whole,
    with no .old or .partial folder beside it."""
    from experts_int8 import convert

    dst = tmp_path / "int8"
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    before, replace, pressed = _snapshot(dst), os.replace, []

    def interrupted(a, b):
        if not pressed and (Path(a) == dst if which == "aside" else Path(b) == dst):
            pressed.append(a)
            raise KeyboardInterrupt
        return replace(a, b)

    with mock.patch.object(convert.os, "replace", interrupted):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert pressed and result.exit_code == 128 + signal.SIGINT, result.output
    assert os.listdir(tmp_path) == ["int8"] and _snapshot(dst) == before


def test_quantize_overwrite_interrupted_while_deleting_the_old_checkpoint_leaves_no_old_folder(bf16_checkpoint,
                                                                                               tmp_path):
    """Ctrl-C or SIGTERM while the replaced checkpoint is deleted (seconds for a large one, once the new one is in
    place) left what remained of it in a hidden .old folder beside DST, never to be removed."""
    from experts_int8 import convert

    dst = tmp_path / "int8"
    assert invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress").exit_code == 0
    real, stopped = convert.shutil.rmtree, []

    def stopped_midway(path, *args, **kwargs):
        if str(path).endswith(".old") and not stopped:
            stopped.append(path)
            os.unlink(next(f for f in Path(path).rglob("*") if f.is_file()))  # (part of it deleted)
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    with mock.patch.object(convert.shutil, "rmtree", stopped_midway):
        result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--no-progress", "--overwrite")
    assert stopped and result.exit_code == 128 + signal.SIGINT, result.output
    assert sorted(os.listdir(tmp_path)) == ["int8"] and (dst / "model.safetensors").is_file()


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, as at a terminal, put back afterwards (a shell's background job, `pytest ... &`,
    starts with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_quantize_cleanup_runs_to_its_end_through_a_second_ctrl_c(bf16_checkpoint, tmp_path, python_sigint):
    """An impatient second Ctrl-C while a failed run's output was removed left the rest of it in a hidden .partial
    folder beside DST, never to be removed."""
    from experts_int8 import convert

    real_save, real_rmtree, pressed = convert.save_file, convert.shutil.rmtree, []

    def interrupted(*args, **kwargs):  # (the first Ctrl-C, while a shard is written)
        real_save(*args, **kwargs)
        raise KeyboardInterrupt

    def pressed_again(path, *args, **kwargs):
        if str(path).endswith(".partial") and not pressed:
            pressed.append(path)
            os.unlink(next(f for f in Path(path).rglob("*") if f.is_file()))  # (part of it removed)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # (where Python would run its handler)
        return real_rmtree(path, *args, **kwargs)

    with mock.patch.object(convert, "save_file", interrupted), \
            mock.patch.object(convert.shutil, "rmtree", pressed_again):
        result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "int8", "--no-progress")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (put back)
    assert pressed and result.exit_code == 128 + signal.SIGINT, result.output
    assert os.listdir(tmp_path) == []


def test_generate_and_eval_with_real_repositories_settings(demo_run, tmp_path):
    """A list of end tokens and no pad token (generate crashed comparing a list with an int); an instruct model's
    chat template (--chat); a prompt and new tokens, or an eval window, past max_position_embeddings (generate ran
    on silently): one line."""
    _, keep = demo_run
    model = tmp_path / "model"
    shutil.copytree(keep / "int8", model)
    gen = json.loads((model / "generation_config.json").read_text()) if (model / "generation_config.json").is_file() \
        else {}
    gen.pop("pad_token_id", None)
    (model / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 3]}))
    result = invoke("generate", model, "--prompt", "def f", "--device", "cpu", "--max-new-tokens", "3",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert_one_line_error(invoke("generate", model, "--chat", "--prompt", "hi", "--device", "cpu"),
                          "has no chat template", "leave out --chat")
    (model / "chat_template.jinja").write_text("{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}"
                                               "{% if add_generation_prompt %}<b>{% endif %}")
    result = invoke("generate", model, "--chat", "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "3",
                    "--no-progress")
    from experts_int8.run import load_tokenizer

    templated = len(load_tokenizer(model)("<u>hi</u><b>").input_ids)
    assert result.exit_code == 0 and f"prompt {templated} tokens" in result.output, result.output
    limit = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert_one_line_error(invoke("generate", model, "--prompt", "def f", "--device", "cpu", "--max-new-tokens",
                                 str(limit)), "past the model's max_position_embeddings", str(limit))
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    assert_one_line_error(invoke("eval", keep / "bf16", "--text", text, "--device", "cpu", "--window",
                                 str(limit + 1)), "--window's tokens take", "max_position_embeddings")


def test_eval_reads_only_the_start_of_a_large_text():
    """The first tokens of a large file, as the whole file's tokenization starts, from a part of it read."""
    import tempfile

    from experts_int8.run import read_tokens

    read = []

    def tokenizer(text):  # one id per character (and a record of how much was tokenized)
        read.append(len(text))
        return type("Encoding", (), {"input_ids": [ord(c) for c in text]})()

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(chr(97 + i % 26) for i in range(3_000_000)))
    try:
        whole = [97 + i % 26 for i in range(3_000_000)]
        assert read_tokens(tokenizer, f.name, 1000) == whole[:1000] and max(read) < 100_000
        read.clear()
        assert read_tokens(tokenizer, f.name, 10 ** 7) == whole and max(read) == 3_000_000
    finally:
        os.remove(f.name)


def test_quantize_leaves_other_frameworks_weights_and_takes_dst_paths_lexically(bf16_checkpoint, tmp_path):
    """Weights of other frameworks beside the safetensors are not copied; DST `new/../other/x` through a folder
    that does not exist lands in other/x (the rename used the path as typed)."""
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    for name in ("flax_model.msgpack", "tf_model.h5", "model.onnx", "notes.txt"):
        (src / name).write_bytes(b"x" * 1000)
    result = invoke("quantize", src, f"{tmp_path}/new/../other/x", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    out = tmp_path / "other" / "x"
    assert (out / "notes.txt").is_file() and (out / "model.safetensors").is_file()
    assert not any((out / n).exists() for n in ("flax_model.msgpack", "tf_model.h5", "model.onnx"))
    assert not (tmp_path / "new").exists()


def test_a_reader_that_leaves_the_pipe_gets_no_error_line(bf16_checkpoint, tmp_path):
    """`experts-int8 quantize ... | head -1`: the report's writes find the pipe closed; a writer then stops quietly
    with SIGPIPE's status, not with "Error: [Errno 32] Broken pipe"."""
    with mock.patch("experts_int8.convert.quantize_checkpoint", side_effect=BrokenPipeError(32, "Broken pipe")):
        result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--no-progress")
        assert result.exit_code == 128 + 13 and result.output == "", result.output
        if os.path.isdir("/proc/self/fd"):  # no descriptor left open for it, in a process that goes on (CliRunner's)
            before = len(os.listdir("/proc/self/fd"))
            invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--no-progress")
            assert len(os.listdir("/proc/self/fd")) == before


def test_quantize_stopped_by_sigterm_or_a_full_disk_leaves_nothing(bf16_checkpoint, tmp_path):
    """SIGTERM (a job's time limit, docker stop) cleans up as Ctrl-C does, with 128 + 15; a full disk says where."""
    from experts_int8 import convert

    real, calls = convert.save_file, []

    def terminated_on_the_second_shard(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    def not_caught(signum, frame):  # (what runs if the command does not catch it: not the default, which kills)
        raise AssertionError("SIGTERM reached the test's own handler")

    before = signal.signal(signal.SIGTERM, not_caught)
    try:
        with mock.patch.object(convert, "save_file", terminated_on_the_second_shard):
            result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "a" / "o", "--no-progress",
                            "--max-shard-size", "40KB")
        assert signal.getsignal(signal.SIGTERM) is not_caught  # (put back after the command)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 128 + signal.SIGTERM and "Stopped by SIGTERM" in result.output, result.output
    assert os.listdir(tmp_path) == []

    def hung_up(*args, **kwargs):  # (under nohup, SIGHUP is ignored: a closed terminal must not stop the run)
        os.kill(os.getpid(), signal.SIGHUP)
        return real(*args, **kwargs)

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with mock.patch.object(convert, "save_file", hung_up):
            result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "nohup", "--no-progress")
    finally:
        signal.signal(signal.SIGHUP, before)
    assert result.exit_code == 0 and (tmp_path / "nohup" / "model.safetensors").is_file(), result.output
    shutil.rmtree(tmp_path / "nohup")

    def full(*args, **kwargs):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    with mock.patch.object(convert, "save_file", full):
        assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--no-progress"),
                              f"writing the converted checkpoint in {tmp_path} failed", "No space left",
                              "free space there or choose another DST")
    assert os.listdir(tmp_path) == []

    def full_after_the_weights(src, dst, *args, **kwargs):  # (the tokenizer's copy, after the shards fit)
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    with mock.patch.object(convert.shutil, "copy2", full_after_the_weights):
        result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--no-progress")
    assert_one_line_error(result, f"writing the converted checkpoint in {tmp_path} failed (No space left on device)",
                          "free space there or choose another DST")
    assert ".partial" not in result.output and os.listdir(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_that_native_code_turns_into_another_error_still_stops_the_command(bf16_checkpoint, tmp_path,
                                                                                    signum):
    """A Ctrl-C that lands while safetensors reads a tensor (through torch, which swallows the KeyboardInterrupt into a
    ValueError "could not determine the shape of object type 'torch.storage.UntypedStorage'") was reported as
    "Error: ... the file changed or is damaged since the conversion began: download it again", status 1."""
    from experts_int8 import convert

    real, calls = convert.safe_open, []

    class Reader:
        def __init__(self, *args, **kwargs):
            self.handle = real(*args, **kwargs)

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def __getattr__(self, name):  # (keys, metadata, get_slice: the file's own)
            return getattr(self.handle, name)

        def get_tensor(self, key):
            calls.append(key)
            if len(calls) == 3:
                swallowed = False
                try:
                    signal.raise_signal(signum)  # (the handler runs here and raises)
                except KeyboardInterrupt:
                    swallowed = True
                if swallowed:
                    raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'")
            return self.handle.get_tensor(key)

    before = {n: signal.signal(n, h) for n, h in ((signal.SIGINT, signal.default_int_handler),
                                                     (signal.SIGTERM, signal.SIG_DFL))}
    try:
        with mock.patch.object(convert, "safe_open", Reader):
            result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--no-progress")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (put back after the command)
    finally:
        for n, handler in before.items():
            signal.signal(n, handler)
    assert len(calls) == 3
    assert result.exit_code == 128 + signum, result.output
    assert ("Interrupted." if signum == signal.SIGINT else "Stopped by SIGTERM.") in result.output
    assert "damaged" not in result.output and os.listdir(tmp_path) == []


def test_bad_sizes_and_devices_give_one_line(bf16_checkpoint, tmp_path):
    for size in ("0", "0MB", "lots"):
        result = invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--max-shard-size", size)
        assert_one_line_error(result, repr(size))
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "o", "--device", "gpu"),
                          "unknown device 'gpu': use cuda, cuda:N or cpu")
    for command in (("quantize", bf16_checkpoint("mixtral"), tmp_path / "o"), ("demo",)):
        result = invoke(*command, "--device", "")
        assert result.exit_code == 2 and "--device" in result.output and "is empty" in result.output
    assert not (tmp_path / "o").exists()


def test_bad_paths_give_one_line(tmp_path):
    missing = tmp_path / "missing"
    assert_one_line_error(invoke("quantize", missing, tmp_path / "o"), "no such file")
    assert_one_line_error(invoke("generate", missing, "--prompt", "a"), "no such file")
    assert_one_line_error(invoke("quantize", tmp_path, tmp_path / "o"), "not a Hugging Face model directory")
    assert_one_line_error(invoke("generate", tmp_path, "--prompt", "a"), "not a Hugging Face model directory")
    assert not (tmp_path / "o").exists()


def test_model_without_experts_gives_one_line(tmp_path):
    dense = tmp_path / "dense"
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(dense)
    assert_one_line_error(invoke("quantize", dense, tmp_path / "o", "--no-progress"), "no routed MoE experts")
    assert not (tmp_path / "o").exists()
    assert_one_line_error(invoke("generate", dense, "--prompt", "a"), "no tokenizer")


def _dense_llama(demo_run, tmp_path: Path, layers: int) -> tuple[Path, Path]:
    """A dense Llama checkpoint with the demo's tokenizer, and a text file for eval."""
    _, keep = demo_run
    dense = tmp_path / "dense"
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=64,  # (the tokenizer's vocabulary)
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(dense)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(keep / "bf16" / f, dense / f)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    return dense, text


def test_dense_model_and_broken_files_are_named(demo_run, tmp_path):
    """A dense model in generate or eval, a truncated or foreign safetensors shard, an unparsable tokenizer:
    one line that names the folder or file and what to do, not the library's inner message."""
    dense, text = _dense_llama(demo_run, tmp_path, layers=1)
    keep = demo_run[1]
    result = invoke("generate", dense, "--prompt", "a", "--device", "cpu")  # (after its "loading ..." line)
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert result.exit_code == 1 and "Traceback" not in result.output and len(errors) == 1, result.output
    assert all(w in errors[0] for w in ("has no routed MoE experts", "LlamaForCausalLM", "--dense-as-experts"))
    loads, load = [], run_module.from_pretrained  # eval refuses it before loading the float model
    with mock.patch("experts_int8.run.from_pretrained",
                    side_effect=lambda config, path, **kw: loads.append(kw) or load(config, path, **kw)):
        assert_one_line_error(invoke("eval", dense, "--text", text, "--device", "cpu", "--window", "16", "--stride",
                                     "8"), "has no routed MoE experts", "--dense-as-experts")
    assert [("quantization_config" in kw) for kw in loads] == [True]

    broken = tmp_path / "broken"
    shutil.copytree(keep / "bf16", broken)
    shard = broken / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])  # truncated
    for args in (("generate", broken, "--prompt", "a", "--device", "cpu"), ("quantize", broken, tmp_path / "o")):
        assert_one_line_error(invoke(*args), str(shard), "not a readable safetensors file")
    assert not (tmp_path / "o").exists()
    shard.write_bytes(b"not a checkpoint")
    assert_one_line_error(invoke("generate", broken, "--prompt", "a", "--device", "cpu"), str(shard))

    mismatch = tmp_path / "mismatch"
    shutil.copytree(keep / "bf16", mismatch)
    cfg = json.loads((mismatch / "config.json").read_text())
    (mismatch / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=cfg["intermediate_size"] * 2)))
    assert_one_line_error(invoke("eval", mismatch, "--text", text, "--device", "cpu", "--window", "16", "--stride",
                                 "8"), str(mismatch), "do not fit the model its config.json describes")

    shard.unlink()  # no weights at all: said before anything loads
    assert_one_line_error(invoke("generate", broken, "--prompt", "a", "--device", "cpu"), "has no *.safetensors")

    tok = tmp_path / "tok"
    shutil.copytree(keep / "bf16", tok)
    (tok / "tokenizer.json").write_text("{not json")
    assert_one_line_error(invoke("generate", tok, "--prompt", "a", "--device", "cpu"),
                          str(tok), "tokenizer files do not load")


def test_generate_without_tokenizer(bf16_checkpoint):
    assert_one_line_error(invoke("generate", bf16_checkpoint("mixtral"), "--prompt", "a"), "no tokenizer")


def test_debug_shows_the_traceback(tmp_path):
    result = invoke("quantize", tmp_path / "missing", tmp_path / "o", "--debug")
    assert result.exit_code != 0 and isinstance(result.exception, FileNotFoundError)


def test_eval_compares_float_and_int8(demo_run, tmp_path):
    _, keep = demo_run
    text = tmp_path / "text.txt"
    import pydoc_data.topics

    text.write_text(pydoc_data.topics.topics["for"] * 3)
    result = invoke("eval", keep / "bf16", "--text", text, "--device", "cpu", "--window", "128", "--stride", "64",
                    "--max-tokens", "400")
    assert result.exit_code == 0, result.output
    ppl = re.search(r"perplexity\s+([\d.]+)\s+([\d.]+)", result.output)
    agree = re.search(r"top-1 agreement\s+([\d.]+)%", result.output)
    assert ppl and agree, result.output
    assert abs(float(ppl.group(2)) / float(ppl.group(1)) - 1) < 0.05
    assert float(agree.group(1)) >= 90
    assert "399 tokens of text.txt scored (of 400 read)" in result.output
    # on the first window: the int8 experts' own error (float routing) and the top-k choices that changed
    snr = re.search(r"first window \(128 tokens\), logits SNR: ([\d.]+) dB, ([\d.]+) dB with the float", result.output)
    layers = re.search(r"min ([\d.]+) dB, median ([\d.]+) dB over 4; top-k changed for ([\d.]+)%", result.output)
    assert snr and layers, result.output
    assert float(snr.group(2)) >= 30 and float(layers.group(1)) >= 30
    assert float(snr.group(2)) >= float(snr.group(1))  # flips only lower the free-running SNR
    assert 0 <= float(layers.group(3)) <= 100


def test_generate_and_eval_a_vision_language_checkpoint(demo_run, tmp_path):
    """Qwen3-VL has no causal-LM class: generate and eval load it as image-text-to-text, text prompts only."""

    _, keep = demo_run
    config = tiny_config("qwen3_vl_moe")
    config.text_config.vocab_size = 1024  # the demo's tokenizer
    auto_class("qwen3_vl_moe").from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path / "vl")
    for f in glob.glob(str(keep / "bf16" / "tokenizer*")):
        shutil.copy(f, tmp_path / "vl")
    result = invoke("generate", tmp_path / "vl", "--prompt", "The assert", "--max-new-tokens", "4", "--device", "cpu",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("The assert"), result.output
    text = tmp_path / "text.txt"
    text.write_text("for x in range(10): print(x)\n" * 20)
    result = invoke("eval", tmp_path / "vl", "--text", text, "--device", "cpu", "--window", "64", "--stride", "32")
    assert result.exit_code == 0, result.output
    assert re.search(r"perplexity\s+([\d.]+)\s+([\d.]+)", result.output), result.output


def test_eval_bad_input_one_line(demo_run, tmp_path):
    _, keep = demo_run
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20)
    assert_one_line_error(invoke("eval", keep / "int8", "--text", text), "already an int8 checkpoint")
    assert_one_line_error(invoke("eval", keep / "bf16", "--text", tmp_path / "missing.txt"), "does not exist")
    assert_one_line_error(invoke("eval", keep / "bf16", "--text", text, "--dense-as-experts"), "no dense gated MLP")
    assert_one_line_error(invoke("eval", keep / "bf16", "--text", text, "--device", "meta"),
                          "device 'meta': experts_int8 runs on cuda, cuda:N or cpu")


def test_int8_weights_under_a_float_config_are_refused(demo_run, tmp_path):
    """The int8 checkpoint's weights beside the float one's config.json: eval scored a "float" model built from
    the raw int8 values (their scales dropped) with only transformers' hidden load report, and generate called
    it a float checkpoint."""
    _, keep = demo_run
    mixed = tmp_path / "mixed"
    shutil.copytree(keep / "bf16", mixed)
    for f in glob.glob(str(mixed / "*.safetensors")):
        os.remove(f)
    for f in glob.glob(str(keep / "int8" / "*.safetensors*")):
        shutil.copy(f, mixed)
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20)
    for command in (("eval", mixed, "--text", text), ("generate", mixed, "--prompt", "a")):
        assert_one_line_error(invoke(*command, "--device", "cpu"), "config.json has no quantization_config, but the "
                              "weights hold int8 tensors (e.g. model.layers.", "put back the config.json")
    config = json.loads((keep / "int8" / "config.json").read_text())
    config["quantization_config"] = "experts_int8"
    (mixed / "config.json").write_text(json.dumps(config))
    assert_one_line_error(invoke("generate", mixed, "--prompt", "a", "--device", "cpu"),
                          "quantization_config is a JSON str, not an object")


def test_eval_window_alone_sets_the_stride(demo_run, tmp_path):
    _, keep = demo_run
    text = tmp_path / "t.txt"
    text.write_text("for x in range(10): print(x)\n" * 40)
    result = invoke("eval", keep / "bf16", "--text", text, "--device", "cpu", "--window", "64", "--max-tokens", "200")
    assert result.exit_code == 0, result.output  # (the default stride, 512, was refused as not below the window)


@pytest.mark.parametrize("arch, damage, message", [
    ("gpt_oss", "drop", "experts.down_proj_bias is missing"),
    ("mixtral", "add", "expert biases are supported for GPT-OSS only"),
])
def test_quantize_checks_expert_biases(bf16_checkpoint, tmp_path, arch, damage, message):
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint(arch) if arch == "gpt_oss" else _fused_checkpoint(tmp_path, arch), src)
    (path,) = glob.glob(str(src / "*.safetensors"))
    state = load_file(path)
    if damage == "drop":
        del state[next(k for k in state if k.endswith("layers.1.mlp.experts.down_proj_bias"))]
    else:
        key = next(k for k in state if k.endswith("experts.down_proj"))
        state[key + "_bias"] = torch.zeros(state[key].shape[:2], dtype=state[key].dtype)
    save_file(state, path, metadata={"format": "pt"})
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"), message)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arch, changes, message", [
    ("mellum", {"hidden_act": "relu"}, "is none of the kernel's activations"),  # (what loading says too)
    ("mixtral", {"model_type": "no_such_model"}, "transformers cannot build model_type 'no_such_model'"),
    # a dense model's config over MoE weights: its model has nowhere to put the experts (loading would fail)
    ("mixtral", {"model_type": "llama", "num_local_experts": None},
     "config.json's model_type 'llama' builds a model without routed experts, but the weights hold experts tensors"),
])
def test_quantize_refuses_experts_outside_the_table_that_loading_refuses(bf16_checkpoint, tmp_path, arch, changes,
                                                                          message):
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint(arch), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **changes}))
    assert_one_line_error(invoke("quantize", src, tmp_path / "o", "--no-progress"), message)
    assert not (tmp_path / "o").exists()


def test_quantize_refuses_an_moe_whose_experts_are_modules_of_its_own(tmp_path):
    """JetMoE's experts are its own modules: refused as an MoE experts-int8 does not support, as loading refuses it
    (not told it has no experts)."""
    config = transformers.JetMoeConfig(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                       intermediate_size=32, num_hidden_layers=1, kv_channels=16, num_local_experts=4,
                                       num_experts_per_tok=2)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "src")
    assert_one_line_error(invoke("quantize", tmp_path / "src", tmp_path / "o", "--no-progress"),
                          "does not support model_type 'jetmoe': its config declares num_local_experts=4")
    assert not (tmp_path / "o").exists()


def test_a_remote_code_architecture_converts_its_per_expert_keys_and_names_why_not_its_fused_ones(bf16_checkpoint,
                                                                                                   demo_run, tmp_path):
    """Kimi K2's model_type is its own code: its per-expert keys (as released) convert without building the model,
    as its DeepSeek-V3 twin's do, with no prompt on stdin; fused keys need the model's layout, and the error says
    how to get it, as generate's does for the converted checkpoint."""
    from experts_int8.convert import needs_remote_code

    _, keep = demo_run
    code = {"AutoConfig": "configuration.Config"}  # (AutoConfig reads the top level's model_type)
    assert needs_remote_code({"model_type": "kimi_vl", "auto_map": code, "text_config": {"model_type": "deepseek_v3"}})
    assert not needs_remote_code({"model_type": "deepseek_v3", "auto_map": code,
                                  "text_config": {"model_type": "kimi_k2"}})
    remote = {"model_type": "kimi_k2", "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}}
    for src, layout in ((tmp_path / "per_expert", "per-expert"), (_fused_checkpoint(tmp_path, "deepseek_v3"), "fused")):
        if layout == "per-expert":
            shutil.copytree(bf16_checkpoint("deepseek_v3"), src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, **remote}))
        result = invoke("quantize", src, tmp_path / f"o_{layout}", "--no-progress")
        if layout == "fused":
            assert_one_line_error(result, "model_type 'kimi_k2' is the checkpoint's own code",
                                  "set config.json's model_type")
            assert not (tmp_path / "o_fused").exists()
        else:
            assert result.exit_code == 0 and "custom code" not in result.output, result.output
            twin = tmp_path / "twin"
            assert invoke("quantize", bf16_checkpoint("deepseek_v3"), twin, "--no-progress").exit_code == 0
            ours, theirs = tensors(tmp_path / "o_per-expert"), tensors(twin)
            assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(keep / "bf16" / f, tmp_path / "o_per-expert" / f)
            assert_one_line_error(invoke("generate", tmp_path / "o_per-expert", "--prompt", "a", "--device", "cpu"),
                                  "model_type 'kimi_k2' is the checkpoint's own code", "deepseek_v3")


@pytest.mark.parametrize("arch, name", [("gpt_oss", "GPT-OSS"), ("granitemoe", "Granite MoE"),
                                        ("granitemoehybrid", "Granite MoE"),
                                        ("granitemoeshared", "Granite MoE")])
def test_quantize_refuses_an_export_it_cannot_express_with_the_way_that_works(bf16_checkpoint, tmp_path, arch, name):
    result = invoke("quantize", bf16_checkpoint(arch), tmp_path / "o", "--format", "compressed-tensors",
                    "--no-progress")
    assert_one_line_error(result, name, "--format native")
    assert not (tmp_path / "o").exists()


def test_a_missing_optional_dependency_names_the_extra_that_installs_it(monkeypatch):
    """Without the [hf] extra the demo fails in one line that says which pip command adds it."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # (import transformers -> ModuleNotFoundError)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 1
    assert "pip install 'experts-int8[hf]'" in result.output and "Traceback" not in result.output


def test_quantize_shards_are_named_sized_and_indexed_as_transformers_writes_them(bf16_checkpoint, tmp_path):
    """Shards model-0000i-of-0000n (1-based), each within --max-shard-size unless it holds one larger tensor, and
    an index whose total_size is the bytes of every tensor and whose weight_map names each key's shard."""
    dst = tmp_path / "int8"
    result = invoke("quantize", bf16_checkpoint("mixtral"), dst, "--device", "cpu", "--no-progress",
                    "--max-shard-size", "40KB")
    assert result.exit_code == 0, result.output
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in dst.glob("*.safetensors"))
    n = len(files)
    assert n > 1 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    total = 0
    for name in files:
        shard = load_file(str(dst / name))
        sizes = [t.numel() * t.element_size() for t in shard.values()]
        assert sum(sizes) <= 40_000 or len(sizes) == 1, (name, sum(sizes))
        assert all(index["weight_map"][key] == name for key in shard)
        total += sum(sizes)
    assert index["metadata"]["total_size"] == total
    assert len(index["weight_map"]) == len(tensors(dst))


# --- the helpers behind the commands: their refusals ---------------------------------------------

def test_experts_tensor_layouts_refuse_unknown_names():
    from experts_int8.checkpoint import from_fused_layout, to_fused_layout

    w = torch.zeros(2, 4, 6)
    for convert in (to_fused_layout, from_fused_layout):
        with pytest.raises(ValueError, match="unknown experts layout 'interleaved'"):
            convert("interleaved", "down_proj", w)
        with pytest.raises(ValueError, match="unknown experts tensor 'up_proj'"):
            convert("gpt_oss", "up_proj", w)


def test_read_headers_skips_files_other_than_safetensors(tmp_path):
    from experts_int8.checkpoint import read_headers

    save_file({"a": torch.zeros(2, 3, dtype=torch.int8)}, tmp_path / "model.safetensors")
    (tmp_path / "model.bin").write_text("not safetensors")
    assert read_headers([tmp_path / "model.bin", tmp_path / "model.safetensors"]) == {"a": ("I8", (2, 3))}
    assert read_headers(None) == {}


def test_release_decoders_refuse_what_they_cannot_read():
    from experts_int8.releases import float_decoders, release_encoding

    with pytest.raises(ValueError, match="quantization_config is a JSON list"):
        release_encoding({"quantization_config": ["fp8"]}, "src")
    mxfp4 = {"quant_method": "mxfp4"}
    with pytest.raises(ValueError, match="dtype 'int8' is not one of bfloat16, float16, float32"):
        float_decoders(mxfp4, {}, {"dtype": "int8"})
    with pytest.raises(ValueError, match=r"e.down_proj_blocks is U8 \[2, 4, 1, 8\], not MXFP4 blocks"):
        float_decoders(mxfp4, {"e.down_proj_blocks": ("U8", (2, 4, 1, 8)), "e.down_proj_scales": ("U8", (2, 4, 1))},
                       {})
    with pytest.raises(ValueError, match="e.up_proj_scales belongs to no mxfp4 weight"):
        float_decoders(mxfp4, {"e.up_proj_scales": ("U8", (2, 4, 1))}, {})
    headers = {"e.down_proj_blocks": ("U8", (2, 4, 3, 16)), "e.down_proj_scales": ("U8", (2, 4, 3))}
    assert set(float_decoders(mxfp4, headers, {"dtype": "float16"})) == {"e.down_proj"}
    assert headers == {"e.down_proj": ("F16", (2, 96, 4))}
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match=r"e.w1.scale is F8_E8M0 \[4, 2\], not the \[4, 1\] scales .* that FP4 "
                                         r"\(I8, two values a byte\) \[4, 8\] in groups of 32 values a row needs"):
        float_decoders(fp8, {"e.w1.weight": ("I8", (4, 8)), "e.w1.scale": ("F8_E8M0", (4, 2))}, {})
    with pytest.raises(ValueError, match=r"a.weight is F8_E4M3 without its block scales a.weight_scale_inv \(or "
                                         r"a.scale\)"):
        float_decoders(fp8, {"a.weight": ("F8_E4M3", (4, 8))}, {})
    with pytest.raises(ValueError, match=r"e.w2.weight is I8 without its block scales e.w2.weight_scale_inv \(or "
                                         r"e.w2.scale\)"):  # (an FP4 weight without its factors, not int8 values)
        float_decoders(fp8, {"e.w2.weight": ("I8", (4, 8))}, {})
    # (FP4 beside its factors; an int8 tensor without any, and a .scale that is no weight's, left as they are)
    headers = {"e.w1.weight": ("I8", (4, 24)), "e.w1.scale": ("F8_E8M0", (4, 2)), "ids": ("I8", (3,)),
               "norm.scale": ("BF16", (8,))}
    assert set(float_decoders(fp8, headers, {})) == {"e.w1.weight"}
    assert headers == {"e.w1.weight": ("BF16", (4, 48)), "ids": ("I8", (3,)), "norm.scale": ("BF16", (8,))}
    # compressed-tensors' FP8: one scale a tensor ([] or [1]), a row or a block; input scales dropped with their weight
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}}
    ct = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group}}
    headers = {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale": ("F32", ()), "a.input_scale": ("F32", (1,)),
               "b.weight": ("F8_E4M3", (4, 8)), "b.weight_scale": ("BF16", (1,)), "c.weight": ("BF16", (4, 8))}
    assert set(float_decoders(ct, headers, {})) == {"a.weight", "b.weight"}
    assert headers == {"a.weight": ("BF16", (4, 8)), "b.weight": ("BF16", (4, 8)), "c.weight": ("BF16", (4, 8))}
    block = dict(group, weights=dict(group["weights"], strategy="block", block_structure=[3, 8]))
    with pytest.raises(ValueError, match=r"a.weight_scale is F32 \[1, 1\], not the \[2, 1\] scales \(F32, BF16, F16\) "
                                         r"that F8_E4M3 \[4, 8\] with block scales of blocks \[3, 8\] needs"):
        float_decoders(dict(ct, config_groups={"g": block}), {"a.weight": ("F8_E4M3", (4, 8)),
                                                              "a.weight_scale": ("F32", (1, 1))}, {})
    with pytest.raises(ValueError, match=r"a.weight_scale is F8_E8M0 \[\], not the \[\] or \[1\] scales"):
        float_decoders(ct, {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale": ("F8_E8M0", ())}, {})
    with pytest.raises(ValueError, match="c.weight_scale belongs to no compressed-tensors weight"):
        float_decoders(ct, {"c.weight": ("BF16", (4, 8)), "c.weight_scale": ("F32", ())}, {})
    # AutoFP8's per-tensor FP8: one scale a tensor ([] or [1]); input scales dropped with their weight, refused beside
    # a float one; a block release's input and activation scales dropped alike
    autofp8 = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["c"]}
    headers = {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale": ("F32", ()), "a.input_scale": ("F32", ()),
               "b.weight": ("F8_E4M3", (4, 8)), "b.weight_scale": ("F32", (1,)), "c.weight": ("BF16", (4, 8)),
               "other.input_scale": ("F32", ())}
    assert set(float_decoders(autofp8, headers, {"dtype": "float16"})) == {"a.weight", "b.weight"}
    assert headers == {"a.weight": ("F16", (4, 8)), "b.weight": ("F16", (4, 8)), "c.weight": ("BF16", (4, 8)),
                       "other.input_scale": ("F32", ())}  # (an input_scale beside no weight: some other parameter)
    with pytest.raises(ValueError, match=r"a.weight_scale is F32 \[4, 1\], not the \[\] or \[1\] scales \(F32, BF16, "
                                         r"F16\) that F8_E4M3 \[4, 8\] with tensor scales needs"):
        float_decoders(autofp8, {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale": ("F32", (4, 1))}, {})
    with pytest.raises(ValueError, match="a.weight is F8_E4M3 without its scales a.weight_scale or "
                                         "a.weight_scale_inv; the FP8 checkpoint"):
        float_decoders(autofp8, {"a.weight": ("F8_E4M3", (4, 8))}, {})
    # transformers' own per-tensor FP8 (weight_scale_inv): [] or [1], or equal blocks [..., a, b] (a Linear's [1, 1],
    # fused experts' [E, 2, 1] and [E, 1, 1]); a per-expert weight's factors in its merged tensor's name, as
    # transformers saves them, the gate's and up's halves of gate_up_proj's rows; their activation scales dropped
    tf = {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": None}
    headers = {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale_inv": ("F32", ()), "a.activation_scale": ("F32", ()),
               "b.weight": ("F8_E4M3", (4, 8)), "b.weight_scale_inv": ("F32", (1,)),
               "c.weight": ("F8_E4M3", (4, 8)), "c.weight_scale_inv": ("F32", (1, 1)),
               "d.weight": ("F8_E4M3", (4, 8)), "d.weight_scale_inv": ("BF16", (2, 4)),
               "f.experts.gate_up_proj": ("F8_E4M3", (3, 8, 4)),
               "f.experts.gate_up_proj_scale_inv": ("F32", (3, 2, 1)),
               "f.experts.down_proj": ("F8_E4M3", (3, 4, 4)), "f.experts.down_proj_scale_inv": ("F32", (3, 1, 1)),
               "m.experts.1.w1.weight": ("F8_E4M3", (4, 8)), "m.experts.1.w3.weight": ("F8_E4M3", (4, 8)),
               "m.experts.0.w2.weight": ("F8_E4M3", (8, 4)), "m.experts.gate_up_proj_scale_inv": ("F32", (2, 2, 1)),
               "m.experts.down_proj_scale_inv": ("F32", (2, 1, 1)),
               "m.experts.gate_up_proj_activation_scale": ("F32", (2,))}
    decoders = float_decoders(tf, headers, {}, ("w1", "w3", "w2"))
    assert set(decoders) == {"a.weight", "b.weight", "c.weight", "d.weight", "f.experts.gate_up_proj",
                             "f.experts.down_proj", "m.experts.1.w1.weight", "m.experts.1.w3.weight",
                             "m.experts.0.w2.weight"}
    assert headers == {**{f"{m}.weight": ("BF16", (4, 8)) for m in "abcd"},
                       "f.experts.gate_up_proj": ("BF16", (3, 8, 4)), "f.experts.down_proj": ("BF16", (3, 4, 4)),
                       "m.experts.1.w1.weight": ("BF16", (4, 8)), "m.experts.1.w3.weight": ("BF16", (4, 8)),
                       "m.experts.0.w2.weight": ("BF16", (8, 4))}
    w = torch.randn(3, 8, 4).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 2, 1) + 0.5
    assert torch.equal(decoders["f.experts.gate_up_proj"][1](w, scale),
                       (w.float() * scale.repeat_interleave(4, 1)).bfloat16())
    for name, half in (("w1", 0), ("w3", 1)):  # (expert 1's factors, of its half of the rows)
        assert torch.equal(decoders[f"m.experts.1.{name}.weight"][1](w[0, :4], scale[:2]),
                           (w[0, :4].float() * scale[1, half]).bfloat16())
    grid = torch.rand(2, 4) + 0.5  # (d's: blocks of 2 rows and 2 columns)
    assert torch.equal(decoders["d.weight"][1](w[0].t(), grid),
                       (w[0].t().float() * grid.repeat_interleave(2, 0).repeat_interleave(2, 1)).bfloat16())
    with pytest.raises(ValueError, match=r"a.weight_scale_inv is F32 \[3, 1\], not the scales \(F32, .*\) of equal "
                                         r"blocks that F8_E4M3 \[4, 8\] needs: \[\] or \[1\], or \[..., a, b\]"):
        float_decoders(tf, {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale_inv": ("F32", (3, 1))}, {})
    with pytest.raises(ValueError, match=r"m.experts.gate_up_proj_scale_inv is F32 \[2, 3, 1\], not the scales .* "
                                         r"that F8_E4M3 \[4, 8\] \(expert 1, part 1 of 2 of its rows\) needs"):
        float_decoders(tf, {"m.experts.1.w1.weight": ("F8_E4M3", (4, 8)),
                            "m.experts.gate_up_proj_scale_inv": ("F32", (2, 3, 1))}, {}, ("w1", "w3", "w2"))
    with pytest.raises(ValueError, match=r"m.experts.2.w2.weight is F8_E4M3 without its scales m.experts.2.w2."
                                         r"weight_scale or m.experts.2.w2.weight_scale_inv \(or m.experts."
                                         r"down_proj_scale_inv\)"):
        float_decoders(tf, {"m.experts.2.w2.weight": ("F8_E4M3", (8, 4))}, {}, ("w1", "w3", "w2"))
    headers = {"k.weight": ("F8_E4M3", (4, 8)), "k.weight_scale": ("F32", ()), "k.output_scale": ("F32", ()),
               "o.output_scale": ("F32", ())}  # (an FP8 KV cache's scale dropped with its weight)
    assert set(float_decoders(autofp8, headers, {})) == {"k.weight"}
    assert headers == {"k.weight": ("BF16", (4, 8)), "o.output_scale": ("F32", ())}
    for stray in ("c.weight_scale", "c.input_scale", "c.output_scale"):
        with pytest.raises(ValueError, match=f"{stray} belongs to no fp8 weight"):
            float_decoders(autofp8, {"c.weight": ("BF16", (4, 8)), stray: ("F32", ())}, {})
    headers = {"a.weight": ("F8_E4M3", (4, 8)), "a.weight_scale_inv": ("F32", (1, 1)), "a.input_scale": ("F32", ()),
               "b.weight": ("F8_E4M3", (4, 8)), "b.weight_scale_inv": ("F32", (1, 1)),
               "b.activation_scale": ("F32", ())}
    assert set(float_decoders(dict(fp8, activation_scheme="static"), headers, {})) == {"a.weight", "b.weight"}
    assert headers == {"a.weight": ("BF16", (4, 8)), "b.weight": ("BF16", (4, 8))}


def test_checkpoint_kind_offers_conversion_only_for_a_release_it_reads():
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    with pytest.raises(ValueError, match="'fp8'.*convert this release first"):
        run_module.checkpoint_kind({"quantization_config": fp8})
    with pytest.raises(ValueError, match="'gptq'; experts-int8 loads float checkpoints") as info:
        run_module.checkpoint_kind({"quantization_config": {"quant_method": "gptq", "bits": 4}})
    assert "convert this release" not in str(info.value)
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}
    ct = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group}}
    for scheme in ("static", "dynamic"):  # (AutoFP8's per-tensor FP8)
        with pytest.raises(ValueError, match="'fp8'.*convert this release first"):
            run_module.checkpoint_kind({"quantization_config": {"quant_method": "fp8", "activation_scheme": scheme}})
    with pytest.raises(ValueError, match="'fp8'; experts-int8 loads float checkpoints") as info:
        run_module.checkpoint_kind({"quantization_config": {"quant_method": "fp8"}})
    assert "convert this release" not in str(info.value)
    with pytest.raises(ValueError, match="'compressed-tensors'.*convert this release first"):
        run_module.checkpoint_kind({"quantization_config": ct})
    with pytest.raises(ValueError, match="'compressed-tensors'; experts-int8 loads float checkpoints") as info:
        run_module.checkpoint_kind({"quantization_config": dict(ct, format="pack-quantized")})
    assert "convert this release" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_cuda_device_refused_without_cuda(tmp_path):
    with pytest.raises(ValueError, match="--device cuda:1: CUDA is not available on this machine"):
        run_module.check_device("cuda:1")


def test_load_model_refuses_a_folder_without_weights(tmp_path):
    tiny_config("mixtral").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has no \\*.safetensors weights"):
        run_module.load_model(tmp_path)


def test_read_tokens_reads_more_until_it_has_enough():
    """A text of few tokens per character: the first read gives too few, so it reads twice as much, and again."""
    import tempfile

    from experts_int8.run import read_tokens

    read = []

    def tokenizer(text):  # one id per 32 characters
        read.append(len(text))
        return type("Encoding", (), {"input_ids": list(range(len(text) // 32))})()

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("x" * 1_000_000)
    try:
        assert read_tokens(tokenizer, f.name, 1000) == list(range(1000))
        assert read == [16_000, 32_000, 64_000]
    finally:
        os.remove(f.name)


def test_model_dir_and_converter_helpers_refuse_bad_input(tmp_path):
    from experts_int8.convert import _snr_db, format_bytes, pack_int8, read_model_dir

    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="file is a file; expected a model directory"):
        read_model_dir(tmp_path / "file")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json holds a JSON list, not a model config's object"):
        read_model_dir(tmp_path / "list")
    with pytest.raises(ValueError, match=r"pack_int8 expects a 2-D int8 tensor, got torch.int8 \(2, 3, 4\)"):
        pack_int8(torch.zeros(2, 3, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match="pack_int8 expects a 2-D int8 tensor, got torch.int32"):
        pack_int8(torch.zeros(2, 4, dtype=torch.int32))
    assert [format_bytes(n) for n in (999, 1500, 2.5e12, 3e15)] == ["999 B", "1.5 KB", "2.5 TB", "3000.0 TB"]
    # A value that rounds up to 1000 of a unit is printed in the next one.
    assert [format_bytes(n) for n in (999.6, 999949, 999960)] == ["1.0 KB", "999.9 KB", "1.0 MB"]
    assert _snr_db(1.0, 0.0) == float("inf") and _snr_db(0.0, 1.0) == float("-inf") and _snr_db(10.0, 1.0) == 10.0


def test_eval_of_a_dense_model_as_1_expert_layers(demo_run, tmp_path):
    dense, text = _dense_llama(demo_run, tmp_path, layers=2)
    result = invoke("eval", dense, "--text", text, "--device", "cpu", "--dtype", "fp32", "--window", "32",
                    "--dense-as-experts")
    assert result.exit_code == 0, result.output
    assert "2 dense MLPs as 1-expert int8 layers" in result.output and "first window" not in result.output
    assert re.search(r"perplexity\s+[\d.]+\s+[\d.]+", result.output), result.output


def test_eval_refusals_before_loading(demo_run, tmp_path):
    _, keep = demo_run
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20)
    result = invoke("eval", keep / "bf16", "--text", text, "--window", "16", "--stride", "16")
    assert result.exit_code == 2 and "--stride" in result.output and "must be smaller than --window (16)" in \
        result.output, result.output
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(keep / "bf16", no_tokenizer)
    for f in run_module.TOKENIZER_FILES:
        (no_tokenizer / f).unlink(missing_ok=True)
    assert_one_line_error(invoke("eval", no_tokenizer, "--text", text), "has no tokenizer files")
    short = tmp_path / "short.txt"
    short.write_text("")
    assert_one_line_error(invoke("eval", keep / "bf16", "--text", short, "--device", "cpu"),
                          "short.txt gives fewer than 2 tokens")


def test_generate_refuses_an_empty_prompt(demo_run):
    _, keep = demo_run
    assert_one_line_error(invoke("generate", keep / "int8", "--prompt", "", "--device", "cpu"),
                          "the prompt is empty after tokenization")


@pytest.mark.parametrize("exc", [BrokenPipeError, KeyboardInterrupt])
def test_debug_shows_a_broken_pipe_and_a_ctrl_c_as_they_are(exc, tmp_path):
    with mock.patch("experts_int8.convert.quantize_checkpoint", side_effect=exc()):
        result = invoke("quantize", tmp_path / "src", tmp_path / "dst", "--device", "cpu", "--debug")
    if exc is BrokenPipeError:
        assert isinstance(result.exception, BrokenPipeError)
    else:  # (click's own answer to a Ctrl-C it sees, not ours: "Interrupted.", status 130)
        assert result.exit_code == 1 and "Aborted!" in result.output and "Interrupted." not in result.output


def test_commands_run_outside_the_main_thread(tmp_path):
    """A command called from a thread (a notebook's worker, a server) takes no signal handlers, and still fails
    with its own one-line error."""
    import threading

    results = []
    thread = threading.Thread(target=lambda: results.append(invoke("quantize", tmp_path / "missing", tmp_path / "o")))
    thread.start()
    thread.join()
    assert_one_line_error(results[0], "missing: no such file or directory")


def test_install_hint_names_what_installs_a_missing_module():
    from experts_int8.cli import install_hint

    assert "need Linux" in install_hint(ModuleNotFoundError("No module named 'triton'", name="triton"))
    assert install_hint(ModuleNotFoundError("No module named 'accelerate.x'", name="accelerate.x")) == \
        "; install it with: pip install 'experts-int8[hf]'"
    assert install_hint(ModuleNotFoundError("No module named 'foo'", name="foo")) == ""
    assert install_hint(ModuleNotFoundError("no name")) == install_hint(ValueError("x")) == ""


def test_locked_folder_removes_the_folders_it_made_when_the_block_fails(tmp_path):
    from experts_int8.files import locked_folder

    with pytest.raises(RuntimeError, match="boom"), locked_folder(tmp_path / "a" / "b" / "c") as folder:
        assert folder.is_dir()
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="boom"), locked_folder(tmp_path / "a" / "b" / "c") as folder:
        (folder.parent / "other").write_text("")  # (another writer's file: kept, with the folders above it)
        raise RuntimeError("boom")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["a", "a/b", "a/b/other"]
    with locked_folder(tmp_path / "d") as folder:
        (folder / "f").write_text("x")
    assert (tmp_path / "d" / "f").read_text() == "x"


def test_signals_held_leaves_a_threads_handlers_alone(python_sigint):
    import threading

    from experts_int8.files import signals_held

    seen = []

    def held():
        with signals_held():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=held)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]
    with signals_held():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_output_folder_without_write_permission_is_refused(tmp_path, monkeypatch):
    from experts_int8.files import check_writable_dir

    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)  # (root writes anywhere)
    with pytest.raises(ValueError, match=f"--out {tmp_path}/x/y: {tmp_path} is not writable; choose another"):
        check_writable_dir(tmp_path / "x" / "y", "--out")
    check_writable_dir(tmp_path.parent / "elsewhere", "--out")


@pytest.mark.parametrize("headers, layout, hidden, match", [
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.down_proj": ("BF16", (2, 8, 4))}, "fused", None,
     "both per-expert and fused keys"),
    ({"m.experts.gate_up_proj": ("BF16", (2, 8, 8)), "m.experts.up_proj": ("BF16", (2, 4, 8)),
      "m.experts.down_proj": ("BF16", (2, 8, 4))}, "fused", None, "both gate_up_proj and up_proj"),
    ({"m.experts.gate_up_proj": ("I8", (2, 8, 8)), "m.experts.down_proj": ("BF16", (2, 8, 4))}, "fused", None,
     "m.experts.gate_up_proj is I8, not a float tensor"),
    ({"m.experts.gate_up_proj": ("BF16", (16, 8)), "m.experts.down_proj": ("BF16", (2, 8, 4))}, "fused", None,
     r"fused experts tensors of 3 dims, got \[16, 8\] and \[2, 8, 4\]"),
    ({"m.experts.gate_up_proj": ("BF16", (2, 8, 8)), "m.experts.down_proj": ("BF16", (2, 4, 8)),
      "m.experts.gate_up_proj_bias": ("BF16", (2, 8)), "m.experts.down_proj_bias": ("BF16", (2, 4))}, "gpt_oss",
     None, r"expert biases of shapes \[2, 8\] and \[2, 4\] do not match"),
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.2.w1.weight": ("BF16", (4, 8))}, "fused", None,
     r"expert indices are not 0..1 \(found \[0, 2\]"),
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.0.w3.weight": ("BF16", (4, 8)),
      "m.experts.0.w2.weight": ("BF16", (8, 4)), "m.experts.1.w1.weight": ("BF16", (4, 8)),
      "m.experts.1.w2.weight": ("BF16", (8, 4))}, "fused", None, "expert 1 has no up projection"),
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.0.w3.weight": ("BF16", (4, 8)),
      "m.experts.0.w2.weight": ("BF16", (8, 4)), "m.experts.1.w1.weight": ("BF16", (4, 8)),
      "m.experts.1.w3.weight": ("BF16", (6, 8)), "m.experts.1.w2.weight": ("BF16", (8, 4))}, "fused", None,
     r"up projections differ in shape across experts: \[\(4, 8\), \(6, 8\)\]"),
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.0.w3.weight": ("BF16", (4, 8)),
      "m.experts.0.w2.weight": ("BF16", (8, 6))}, "fused", None,
     r"inconsistent expert shapes gate \[4, 8\], up \[4, 8\], down \[8, 6\]"),
    ({"m.experts.0.w1.weight": ("BF16", (4, 8)), "m.experts.0.w3.weight": ("BF16", (4, 8)),
      "m.experts.0.w2.weight": ("BF16", (8, 4))}, "fused", 16, "inconsistent expert shapes"),
])
def test_converter_refuses_experts_tensors_that_do_not_fit_together(headers, layout, hidden, match):
    from experts_int8.convert import _check_group, plan_groups

    (group,) = plan_groups(headers, layout).values()
    with pytest.raises(ValueError, match=match):
        _check_group(group, headers, hidden)
    assert _check_group(*plan_groups(HEADERS_OK, "fused").values(), HEADERS_OK, 8) == (2, 8, 4)


HEADERS_OK = {f"m.experts.{e}.{p}.weight": ("BF16", s) for e in range(2)
              for p, s in (("w1", (4, 8)), ("w3", (4, 8)), ("w2", (8, 4)))}


def test_quantize_refuses_dst_and_shards_that_clash(bf16_checkpoint, tmp_path):
    from experts_int8.convert import quantize_checkpoint

    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("mixtral"), src)
    with pytest.raises(ValueError, match="DST must differ from SRC"):
        quantize_checkpoint(src, tmp_path / "." / "src", progress=False)
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="taken already exists \\(pass --overwrite to replace it\\)"):
        quantize_checkpoint(src, tmp_path / "taken", progress=False)
    shutil.copy(src / "model.safetensors", src / "model-a.safetensors")  # (two shards, no index: both are read)
    os.replace(src / "model.safetensors", src / "model-b.safetensors")
    with pytest.raises(ValueError, match=r"tensor \S+ appears in both model-a.safetensors and model-b.safetensors"):
        quantize_checkpoint(src, tmp_path / "int8", progress=False)
    for f in src.glob("*.safetensors"):
        f.unlink()
    (src / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"has no \*.safetensors weights \(found pytorch_model.bin; only safetensors"):
        quantize_checkpoint(src, tmp_path / "int8", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["src", "taken"]


def test_quantize_refuses_a_dst_that_holds_the_current_folder(bf16_checkpoint, tmp_path, monkeypatch):
    (tmp_path / "int8" / "sub").mkdir(parents=True)
    (tmp_path / "int8" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "int8" / "sub")
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "int8", "--overwrite"),
                          "holds the current folder, which a rename cannot replace")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["int8", "int8/config.json",
                                                                                "int8/sub"]


def test_quantize_refuses_a_dst_that_is_a_mount_point(bf16_checkpoint, tmp_path, monkeypatch):
    """A rename cannot replace a mount point (EBUSY, after all the work); refused before any. (No mount here: the
    check is told that DST is one.)"""
    (tmp_path / "int8").mkdir()
    (tmp_path / "int8" / "config.json").write_text("{}")
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == tmp_path / "int8" or real(p))
    assert_one_line_error(invoke("quantize", bf16_checkpoint("mixtral"), tmp_path / "int8", "--overwrite"),
                          "is a mount point, which a rename cannot replace; write into a folder in it")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["int8", "int8/config.json"]


def test_a_checkpoint_tensor_of_another_shape_is_refused_in_one_line(tmp_path):
    """transformers refuses a tensor whose shape does not fit the config (its report logged, then "see the above
    report"); the int8 check refuses one in an experts module (transformers 5.17 loaded it, TensorMismatchError).
    Both become one line naming the checkpoint."""
    from experts_int8.integrations.transformers import TensorMismatchError

    path = tmp_path / "int8"
    quantize_(tiny_model("mixtral", dtype=torch.bfloat16)).save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    key = "model.layers.0.self_attn.q_proj.weight"
    weights[key] = weights[key][:-4].clone()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    message = re.escape(f"{path}: its tensors were refused (") + ".*" + re.escape("): some weights' shapes or dtypes "
                                                                                  "do not fit the model")
    with pytest.raises(ValueError, match=message):
        run_module.from_pretrained(config, path)

    class Auto:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise TensorMismatchError("model.layers.0.mlp.experts.down_proj: expected torch.int8 (5, 64, 48), got "
                                      "torch.int8 (5, 64, 44)")

    with mock.patch.object(run_module, "auto_model_class", return_value=Auto):
        with pytest.raises(ValueError, match=re.escape(f"{path}: its tensors were refused (model.layers.0.mlp.")):
            run_module.from_pretrained(config, path)


def test_load_errors_other_than_transformers_report_pass_through(tmp_path):
    """from_pretrained turns transformers' mismatch report into one line; any other RuntimeError is not its to
    rename."""
    class Auto:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise RuntimeError("CUDA error: out of memory")

    with mock.patch.object(run_module, "auto_model_class", return_value=Auto):
        with pytest.raises(RuntimeError, match="^CUDA error: out of memory$"):
            run_module.from_pretrained({}, tmp_path)


@pytest.mark.parametrize("layout", ["per-expert", "fused"])
def test_quantize_keeps_the_experts_modules_to_not_convert_names_float(bf16_checkpoint, tmp_path, layout):
    """--modules-to-not-convert: the same checkpoint save_pretrained writes for a model loaded with
    ExpertsInt8Config(modules_to_not_convert=...), matched against the model's names (Mixtral's block_sparse_moe is
    mlp there), and the same model once reloaded: those experts float, the others int8."""
    from experts_int8.layer import Int8Experts

    src = bf16_checkpoint("mixtral") if layout == "per-expert" else _fused_checkpoint(tmp_path)
    dst = tmp_path / "int8"
    result = invoke("quantize", src, dst, "--device", "cpu", "--no-progress", "--modules-to-not-convert",
                    "model.layers.1.mlp.experts")
    assert result.exit_code == 0, result.output
    assert "kept float (--modules-to-not-convert): 1 experts modules: model.layers.1.mlp.experts" in result.output
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["modules_to_not_convert"] == [
        "model.layers.1.mlp.experts"]
    assert invoke("quantize", src, tmp_path / "fragment", "--device", "cpu", "--no-progress",
                  "--modules-to-not-convert", "layers.1").exit_code == 0

    config = ExpertsInt8Config(modules_to_not_convert=["layers.1"])
    fly = AutoModelForCausalLM.from_pretrained(src, quantization_config=config, dtype=torch.bfloat16)
    fly.save_pretrained(tmp_path / "saved")
    saved, source = tensors(tmp_path / "saved"), tensors(src)
    for out in (dst, tmp_path / "fragment"):
        ours = tensors(out)
        assert set(ours) == set(saved)
        for key in ours:
            assert ours[key].dtype == saved[key].dtype and torch.equal(ours[key], saved[key]), key
    block = "block_sparse_moe" if layout == "per-expert" else "mlp"  # (the fused source: the in-memory names)
    assert ours[f"model.layers.1.{block}.experts.down_proj"].dtype == torch.bfloat16
    assert ours[f"model.layers.0.{block}.experts.down_proj"].dtype == torch.int8
    if layout == "fused":  # copied as the source holds them
        for t in ("gate_up_proj", "down_proj"):
            assert torch.equal(ours[f"model.layers.1.mlp.experts.{t}"], source[f"model.layers.1.mlp.experts.{t}"])

    for out in (dst, tmp_path / "fragment"):
        reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
        assert isinstance(reloaded.model.layers[0].mlp.experts, Int8Experts)
        assert not isinstance(reloaded.model.layers[1].mlp.experts, Int8Experts)
        assert reloaded.model.layers[1].mlp.experts.down_proj.dtype == torch.bfloat16
        ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert torch.equal(reloaded(ids).logits, fly(ids).logits)


@pytest.mark.parametrize("patterns,says", [
    ("layers.1(", "not a valid pattern"),
    ("layers.9", "['layers.9'] names no routed experts module"),
    ("block_sparse_moe", "like model.layers.0.mlp.experts"),  # (the checkpoint's name, not the model's)
    ("layers.0,layers.1", "names every routed experts module"),
    ("experts", "nothing to quantize"),
    (",", "no pattern given"),
    ("layers.1 --format compressed-tensors", "writes the native format only"),
])
def test_quantize_refuses_modules_to_not_convert_that_would_go_wrong(bf16_checkpoint, tmp_path, patterns, says):
    out = tmp_path / "out"
    os.makedirs(out)
    result = invoke("quantize", bf16_checkpoint("mixtral"), out / "int8", "--device", "cpu", "--no-progress",
                    "--modules-to-not-convert", *patterns.split(" "))
    if says == "no pattern given":  # (click's own usage error)
        assert result.exit_code == 2 and says in result.output, result.output
    else:
        assert_one_line_error(result, says)
    assert os.listdir(out) == []


@pytest.mark.parametrize("arch", ["deepseek_v4", "minimax_m3_vl_text", "step3p7"])
def test_quantize_writes_clamped_swiglu_experts_as_loading_does(bf16_checkpoint, tmp_path, arch):
    """Experts with a clamped SwiGLU of their own: the converter's checkpoint reloads to the logits of the same
    model quantized while loading (the clamp comes from the model's class, not the file). Step-3.7 stores its
    experts stacked (moe.gate_proj.weight and moe.up_proj.weight [E, I, H]), which transformers concatenates."""
    from experts_int8.layer import Int8Experts

    src = bf16_checkpoint(arch)
    result = invoke("quantize", src, tmp_path / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    converted = auto_class(arch).from_pretrained(tmp_path / "int8", dtype=torch.float32)
    loaded = auto_class(arch).from_pretrained(src, quantization_config=ExpertsInt8Config(), dtype=torch.float32)
    assert [m.swiglu_options for m in converted.modules() if isinstance(m, Int8Experts)] == \
        [m.swiglu_options for m in loaded.modules() if isinstance(m, Int8Experts)] != []
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, loaded(ids).logits)


def test_quantize_writes_stacked_experts_as_save_pretrained_does(bf16_checkpoint, tmp_path):
    """Step-3.7's stacked experts: the converter writes the tensors save_pretrained writes for the model loaded
    with ExpertsInt8Config (the fused int8 experts under the names transformers gives them), bit for bit."""
    src = bf16_checkpoint("step3p7")
    result = invoke("quantize", src, tmp_path / "int8", "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    auto_class("step3p7").from_pretrained(src, quantization_config=ExpertsInt8Config()).save_pretrained(
        tmp_path / "saved")
    converted, saved = (load_file(tmp_path / d / "model.safetensors") for d in ("int8", "saved"))
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in converted)
    assert not any(".moe.gate_proj." in k or ".moe.up_proj." in k for k in converted)
    assert sorted(converted) == sorted(saved)
    assert all(converted[k].dtype == saved[k].dtype and torch.equal(converted[k], saved[k]) for k in converted)


def test_quantize_refuses_stacked_experts_missing_a_half(bf16_checkpoint, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(bf16_checkpoint("step3p7"), src)
    tensors = load_file(src / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.endswith("layers.1.moe.up_proj.weight")},
              src / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    os.makedirs(out)
    result = invoke("quantize", src, out / "int8", "--device", "cpu", "--no-progress")
    assert_one_line_error(result, "model.layers.1.moe.gate_proj.weight has no model.layers.1.moe.up_proj.weight "
                          "beside it", "download it again")
    assert os.listdir(out) == []


def test_quantize_names_the_load_and_save_path_for_experts_stored_under_other_names(bf16_checkpoint, tmp_path,
                                                                                      monkeypatch):
    """Experts whose model transformers builds from tensors of names the converter does not read (here Step-3.7's
    stacked ones, the renames and the merge they need taken away): it says what reads them."""
    import experts_int8.convert as convert

    monkeypatch.setattr(convert, "_experts_merges", lambda config, headers: {})
    monkeypatch.setattr(convert, "_experts_renames", lambda config: [])
    out = tmp_path / "out"
    os.makedirs(out)
    result = invoke("quantize", bf16_checkpoint("step3p7"), out / "int8", "--device", "cpu", "--no-progress")
    assert_one_line_error(result, "has routed experts, stored under names this converter does not read",
                          "quantization_config=ExpertsInt8Config()")
    assert os.listdir(out) == []
