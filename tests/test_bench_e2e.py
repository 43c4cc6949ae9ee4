"""End-to-end benchmark plumbing on a tiny random Mixtral (CPU): three columns, same generated tokens."""

import json
from types import SimpleNamespace

import pytest
import torch

from experts_int8 import bench_e2e

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128)


def test_three_columns_run_and_report(tmp_path):
    result = bench_e2e.run("mixtral-8x7b", device="cpu", batches=(2,), prompt_len=8, new_tokens=3, reps=1,
                           cache="dynamic", overrides=TINY, out=str(tmp_path), log=lambda s: None)
    assert [r["column"] for r in result["rows"]] == ["hf-bf16", "ours-bf16", "ours-int8"]
    assert all(r["e2e_s"] > 0 and r["prefill_s"] > 0 for r in result["rows"])
    assert len(list(tmp_path.glob("bench_e2e_mixtral-8x7b_*.json"))) == 1
    assert "ours-int8" in bench_e2e.table(result)


def test_random_model_weights_are_seeded_and_leave_the_callers_generator_alone():
    """Every run times the same weights (a column built after another draws the same ones), and the caller's
    global generator goes on as if the model had not been built."""
    def weights(**kw):
        model = bench_e2e.random_model("mixtral-8x7b", "cpu", dtype=torch.float32, overrides=TINY, **kw)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    torch.manual_seed(123)
    expected_next = torch.rand(4)
    torch.manual_seed(123)
    first = weights()
    assert torch.equal(torch.rand(4), expected_next)
    assert torch.equal(weights(), first)
    assert not torch.equal(weights(seed=1), first)


def test_random_models_are_built_without_fork_rngs_warning_on_a_host_of_several_gpus(monkeypatch):
    """fork_rng without its devices warned on every rank of a torchrun over several GPUs (once a process) that it
    initializes every GPU; named, it forks the same generators without a word."""
    import warnings

    from experts_int8.demo import build_model, build_tokenizer

    forked = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": forked.append(device) or torch.zeros(1))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": None)
    monkeypatch.setattr(torch.random, "_fork_rng_warned_already", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bench_e2e.random_model("mixtral-8x7b", "cpu", dtype=torch.float32, overrides=TINY)
        build_model(build_tokenizer())
    assert forked == [0, 1, 0, 1]


def test_random_model_has_full_size_shape_unless_overridden():
    model = bench_e2e.random_model("mixtral-8x7b", "meta", overrides=dict(num_hidden_layers=1))
    assert model.config.hidden_size == 4096 and model.config.num_local_experts == 8
    experts = model.model.layers[0].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (8, 2 * 14336, 4096)


def test_unknown_config_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="choose one of"):
        bench_e2e.random_model("mixtral-9x9b", "cpu")


def test_cli_help_and_bad_config():
    from click.testing import CliRunner

    from experts_int8.cli import main

    runner = CliRunner()
    help_text = runner.invoke(main, ["bench-e2e", "--help"]).output
    assert "--random-weights" in help_text and "Examples" in help_text
    bad = runner.invoke(main, ["bench-e2e", "--config", "nope", "--random-weights"])
    assert bad.exit_code != 0 and "choose one of" in bad.output
    bad = runner.invoke(main, ["bench-e2e", "--config", "mixtral-8x7b", "--random-weights", "--columns", "ours-fp8"])
    assert bad.exit_code != 0 and "--columns" in bad.output and "ours-fp8" in bad.output
    bad = runner.invoke(main, ["bench-e2e", "--config", "mixtral-8x7b", "--random-weights", "--device", "cpu",
                               "--parallel", "tp"])
    assert bad.exit_code != 0 and "--parallel tp needs several ranks: launch with torchrun" in bad.output
    bad = runner.invoke(main, ["bench-e2e", "--config", "mixtral-8x7b", "--random-weights", "--columns", ""])
    assert bad.exit_code != 0 and "--columns" in bad.output  # (an empty list ran all three)


def test_a_config_of_the_folders_own_code_is_refused_without_a_prompt(tmp_path, monkeypatch):
    """A config.json whose model_type is the folder's own code (auto_map) got transformers' "Do you wish to run the
    custom code? [y/N]" on stdin: one keystroke from running it. Loading and quantizing refuse it unasked."""
    (tmp_path / "configuration_evil.py").write_text("raise SystemExit('ran the folder code')\n")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "evil_moe",
                                                      "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("asked on stdin"))
    with pytest.raises(ValueError, match="is the checkpoint's own code .auto_map., which experts-int8 does not run"):
        bench_e2e.model_config(str(tmp_path))


def test_an_output_folder_it_cannot_write_is_refused_before_the_runs(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from experts_int8.cli import main

    ran = []
    monkeypatch.setattr(bench_e2e, "run", lambda *a, **k: ran.append(a))
    (tmp_path / "afile").write_text("")
    bad = CliRunner().invoke(main, ["bench-e2e", "--config", "mixtral-8x7b", "--random-weights", "--device", "cpu",
                                    "--out", str(tmp_path / "afile" / "sub")])
    assert bad.exit_code == 1 and "--out" in bad.output and "afile is a file, not a folder" in bad.output
    assert not ran


def test_bad_input_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    """A model over the device's memory, a config with no MoE experts, a batch size under 1: each one clear
    error before minutes of building or timing."""
    from click.testing import CliRunner
    from transformers import LlamaConfig

    from experts_int8.cli import main

    built = []
    monkeypatch.setattr(bench_e2e, "measure", lambda *a, **k: built.append(a) or {})
    monkeypatch.setattr(bench_e2e.os, "sysconf", lambda key: 1024 if key == "SC_PHYS_PAGES" else 4096)  # 4 MiB
    with pytest.raises(ValueError, match=r"take 87\.0 GiB, more than the 0\.0 GiB of cpu: pass --layers N"):
        bench_e2e.run("mixtral-8x7b", device="cpu")
    monkeypatch.undo()
    monkeypatch.setattr(bench_e2e, "measure", lambda *a, **k: built.append(a) or {})
    LlamaConfig(**TINY).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="no routed MoE experts: bench-e2e times MoE models"):
        bench_e2e.run(str(tmp_path / "llama"), device="cpu", batches=(1,), prompt_len=4, new_tokens=2, reps=1)
    assert built == []  # nothing timed
    for batch in ("0", "-1", ",", "2,a"):
        bad = CliRunner().invoke(main, ["bench-e2e", "--config", "mixtral-8x7b", "--random-weights", "--device",
                                        "cpu", "--batch", batch])
        assert bad.exit_code == 2 and "--batch" in bad.output, (batch, bad.output)


def test_a_decode_lost_in_timing_noise_is_reported_not_nan(tmp_path, monkeypatch):
    """A prefill timed longer than the whole run printed "decode nan tok/s" (and NaN, which is not JSON) with no
    word of why."""
    times = iter([0.010, 0.012])  # the whole run, then the prefill alone
    monkeypatch.setattr(bench_e2e, "_timed", lambda fn, device, reps: next(times))
    lines = []
    result = bench_e2e.run("mixtral-8x7b", device="cpu", batches=(1,), prompt_len=4, new_tokens=2, reps=1,
                           overrides=TINY, columns=("ours-bf16",), out=str(tmp_path), log=lines.append)
    assert result["rows"][0]["decode_tok_s"] is None
    assert "nan" not in "\n".join(lines).lower()
    assert ("decode n/a (the prefill alone took 0.012 s, no less than the whole run's 0.010 s: the decode time could "
            "not be separated from timing noise; give more --new-tokens or --reps)") in lines[0]
    assert bench_e2e.table(result).splitlines()[-2:] == [
        "    1 | 0.010, n/a", "n/a: the decode time could not be separated from timing noise; give more --new-tokens "
                             "or --reps"]
    (written,) = tmp_path.glob("bench_e2e_*.json")
    assert json.loads(written.read_text())["rows"][0]["decode_tok_s"] is None  # (null: strict JSON)


def test_more_layers_or_positions_than_the_model_has_are_refused_before_it_is_built(tmp_path, monkeypatch):
    """--layers 9 on a 4-layer model built 9 layers though the help says "fewer layers"; the default
    --prompt-len 1024 --new-tokens 128 ran past a model's max_position_embeddings unchecked."""
    from click.testing import CliRunner
    from transformers import MixtralConfig

    from experts_int8.cli import main

    built = []
    monkeypatch.setattr(bench_e2e, "random_model", lambda *a, **k: built.append(a))
    MixtralConfig(**dict(TINY, num_hidden_layers=4, max_position_embeddings=1024)).save_pretrained(tmp_path / "m")
    args = ["bench-e2e", "--config", str(tmp_path / "m"), "--random-weights", "--device", "cpu", "--out", ""]
    bad = CliRunner().invoke(main, args + ["--layers", "9", "--prompt-len", "8"])
    assert bad.exit_code == 1 and bad.output.startswith(f"Error: --layers 9 is more than the 4 layers of "
                                                        f"{tmp_path / 'm'}; give at most 4"), bad.output
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code == 1 and ("Error: --prompt-len 1024 and --new-tokens 128 take 1152 positions, past the "
                                   "model's max_position_embeddings (1024)") in bad.output, bad.output
    with pytest.raises(ValueError, match="--layers 33 is more than the 32 layers of mixtral-8x7b"):
        bench_e2e.run("mixtral-8x7b", device="cpu", overrides=dict(num_hidden_layers=33))
    assert built == []


def test_every_column_and_run_times_the_same_prompts():
    """The prompts came from the global generator: each column (and each run) timed other prompts, routed to
    other experts."""
    seen = []

    class Model:
        config = SimpleNamespace(vocab_size=128)

        def generate(self, ids, **kwargs):
            seen.append(ids.clone())
            return ids

    for _ in range(2):
        bench_e2e.measure(Model(), 2, 8, 3, "cpu", reps=1)
        torch.rand(1)  # (what runs between two columns draws from the global generator)
    assert len(seen) == 6 and all(torch.equal(ids, seen[0]) for ids in seen)


def test_columns_run_in_their_order():
    """int8 quantizes the model in place, so a bf16 column after it would time int8 weights: refused."""
    with pytest.raises(ValueError, match="in that order"):
        bench_e2e.run("mixtral-8x7b", device="cpu", columns=("ours-int8", "ours-bf16"))
    with pytest.raises(ValueError, match="non-empty"):
        bench_e2e.run("mixtral-8x7b", device="cpu", columns=())


def test_greedy_decode_gives_generates_tokens():
    """The no-sync loop is the same greedy decoding as transformers' generate (static cache, fp32)."""
    from experts_int8.integrations.transformers import quantize_

    torch.manual_seed(0)
    model = bench_e2e.random_model("mixtral-8x7b", "cpu", dtype=torch.float32, overrides=TINY)
    quantize_(model)
    ids = torch.randint(0, 128, (2, 7))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                         do_sample=False, pad_token_id=0, cache_implementation="static")[:, 7:]
    got = bench_e2e.greedy_decode(model, ids, 6)
    assert got.shape == (2, 6)
    assert torch.equal(got, ref)


def test_loop_decode_runs_and_is_recorded(tmp_path):
    result = bench_e2e.run("mixtral-8x7b", device="cpu", batches=(1,), prompt_len=6, new_tokens=3, reps=1,
                           decode="loop", overrides=TINY, columns=("ours-int8",), out=str(tmp_path),
                           log=lambda s: None)
    assert result["decode"] == "loop" and result["rows"][0]["decode"] == "loop"
    assert len(list(tmp_path.glob("bench_e2e_mixtral-8x7b_loop_*.json"))) == 1
    assert "decode via loop" in bench_e2e.table(result)


def test_loop_decode_needs_static_cache():
    import pytest

    with pytest.raises(ValueError, match="static"):
        bench_e2e.run("mixtral-8x7b", device="cpu", decode="loop", cache="dynamic", overrides=TINY)


def test_greedy_decode_on_qwen3_architecture():
    from experts_int8.integrations.transformers import quantize_

    torch.manual_seed(0)
    tiny = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2,
                vocab_size=128)
    model = bench_e2e.random_model("qwen3-30b-a3b", "cpu", dtype=torch.float32, overrides=tiny)
    quantize_(model)
    ids = torch.randint(0, 128, (3, 5))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                         do_sample=False, pad_token_id=0, cache_implementation="static")[:, 5:]
    assert torch.equal(bench_e2e.greedy_decode(model, ids, 4), ref)


def test_bench_e2e_compile_mode_is_validated_and_recorded(tmp_path):
    """Validation and bookkeeping only: on CPU nothing is compiled."""
    with pytest.raises(ValueError, match="compile_mode"):
        bench_e2e.run("mixtral-8x7b", device="cpu", compile_mode="fastest")
    result = bench_e2e.run("mixtral-8x7b", device="cpu", batches=(1,), prompt_len=4, new_tokens=2, reps=1,
                           overrides=TINY, columns=("ours-bf16",), compile_mode="max-autotune", decode="loop")
    assert result["compile_mode"] == "max-autotune" and len(result["rows"]) == 1


def test_any_models_config_json_runs_through_the_cli(tmp_path):
    """--config takes a model's config.json (or its folder): that architecture with random weights."""
    from click.testing import CliRunner
    from models import tiny_config

    from experts_int8.cli import main

    tiny_config("glm4_moe").save_pretrained(tmp_path / "GLM tiny")
    model = bench_e2e.random_model(str(tmp_path / "GLM tiny" / "config.json"), "meta", overrides={"num_hidden_layers": 1})
    assert model.config.model_type == "glm4_moe" and len(model.model.layers) == 1
    result = CliRunner().invoke(main, ["bench-e2e", "--config", str(tmp_path / "GLM tiny"), "--random-weights",
                                       "--device", "cpu", "--batch", "1", "--prompt-len", "6", "--new-tokens", "3",
                                       "--reps", "1", "--cache", "dynamic", "--columns", "ours-bf16,ours-int8",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (written,) = (tmp_path / "out").glob("bench_e2e_GLM_tiny_generate_*.json")
    assert [r["column"] for r in json.loads(written.read_text())["rows"]] == ["ours-bf16", "ours-int8"]
