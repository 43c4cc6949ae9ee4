"""Benchmark and tuning tooling: config override, tuner search space, tables, bench math, CLI.

Everything here runs on CPU (Triton's interpreter for the one kernel run); the end-to-end runs of
``bench`` and ``tune`` on a real GPU carry the ``gpu`` marker.
"""

import json
import math
import os
import re
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest
import torch

import experts_int8
from experts_int8 import reference
from experts_int8.kernels import configs, fused_moe
from experts_int8.files import check_writable_dir

from conftest import DEVICE, HAS_CUDA

PINNED = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)


# --- config override -------------------------------------------------------------------------------

def test_override_config_is_honoured_by_fused_experts(monkeypatch):
    seen = []
    launch_meta = fused_moe._launch_meta

    def spy(config, num_pairs):
        seen.append(dict(config))
        return launch_meta(config, num_pairs)

    monkeypatch.setattr(fused_moe, "_launch_meta", spy)
    m, e, h, i, k = 5, 3, 48, 40, 2
    x = torch.randn(m, h, dtype=torch.float16, device=DEVICE)
    w13, w13_scale = experts_int8.quantize_weights(torch.randn(e, 2 * i, h, device=DEVICE))
    w2, w2_scale = experts_int8.quantize_weights(torch.randn(e, h, i, device=DEVICE))
    weights, ids = experts_int8.select_experts(torch.randn(m, e, device=DEVICE), k)
    with configs.override_config(PINNED) as cfg:
        assert cfg == PINNED
        assert configs.get_config(4096, 128, 768, 8, torch.int8) == PINNED
        out = experts_int8.fused_experts(x, w13, w2, weights, ids, w13_scale=w13_scale, w2_scale=w2_scale,
                                         backend="triton")
    assert seen == [PINNED, PINNED]  # both GEMMs launched with the forced config
    ref = reference.fused_experts(x, w13, w2, weights, ids, w13_scale=w13_scale, w2_scale=w2_scale)
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2 * scale, rtol=1e-2)
    assert configs.get_config(1, 8, 64, 2, torch.int8) != PINNED  # restored after the block


def test_override_config_nests_and_restores():
    inner = dict(PINNED, BLOCK_SIZE_M=64)
    before = configs.get_config(16, 8, 64, 2, torch.bfloat16)
    with configs.override_config(PINNED):
        with configs.override_config(inner):
            assert configs.get_config(16, 8, 64, 2, torch.bfloat16)["BLOCK_SIZE_M"] == 64
        assert configs.get_config(16, 8, 64, 2, torch.bfloat16) == PINNED
    assert configs.get_config(16, 8, 64, 2, torch.bfloat16) == before


@pytest.mark.parametrize("bad, words", [
    ({k: v for k, v in PINNED.items() if k != "num_stages"}, "needs the keys"),
    (dict(PINNED, BLOCK_SIZE_Q=16), "needs the keys"),
    (dict(PINNED, SWAP_AB=2), "SWAP_AB"),
    (dict(PINNED, down=dict(BLOCK_SIZE_M=32)), "needs the keys"),
    (dict(PINNED, down=dict(BLOCK_SIZE_N=24)), "power of two"),
    (dict(PINNED, BLOCK_SIZE_N=48), "power of two"),
    (dict(PINNED, BLOCK_SIZE_K=8), "power of two"),
    (dict(PINNED, BLOCK_SIZE_M=1024), "from 16 to 256"),
    (dict(PINNED, down=dict(BLOCK_SIZE_K=512)), "from 16 to 256"),
    (dict(PINNED, num_warps=0), "positive int"),
    (dict(PINNED, GROUP_SIZE_M=1.5), "positive int"),
])
def test_override_config_rejects_bad_configs(bad, words):
    with pytest.raises(ValueError, match=words):
        with configs.override_config(bad):
            pass


# --- bench accounting ----------------------------------------------------------------------------

from experts_int8 import bench  # noqa: E402


def test_bench_bytes_and_flops_accounting():
    e, h, i, k = bench.SHAPES["mixtral-8x7b"]
    assert bench.expert_bytes(h, i, "bf16") == 3 * 4096 * 14336 * 2
    assert bench.expert_bytes(h, i, "int8") == 3 * 4096 * 14336
    assert bench.layer_bytes(e, h, i, "bf16") == 8 * 3 * 4096 * 14336 * 2
    assert bench.moe_flops(16, k, h, i) == 2 * 16 * 2 * 3 * 4096 * 14336
    assert bench.weight_bytes_read(2.5, h, i, "int8") == 2.5 * 3 * 4096 * 14336
    assert bench.distinct_experts(torch.tensor([[3, 1], [1, 3], [7, 3]])) == 3
    # experts without a gate: up and down only
    assert bench.expert_bytes(h, i, "int8", gated=False) == 2 * 4096 * 14336
    assert bench.layer_bytes(e, h, i, "bf16", gated=False) == 8 * 2 * 4096 * 14336 * 2
    assert bench.moe_flops(16, k, h, i, gated=False) == 2 * 16 * 2 * 2 * 4096 * 14336
    r = bench.row_metrics(m=16, hidden=h, inter=i, top_k=k, dtype="int8", time_s=1e-4, distinct=3,
                          copy_bytes_per_s=4e12, matmul_flops_per_s=800e12, gated=False)
    assert (r["weight_bytes"], r["flops"]) == (3 * 2 * 4096 * 14336, bench.moe_flops(16, k, h, i, gated=False))


def test_bench_row_metrics_against_hand_numbers():
    # 2 experts of H=1024, I=512 in int8 read in 1 ms, M=4, k=2: 3 MiB... worked out by hand.
    r = bench.row_metrics(m=4, hidden=1024, inter=512, top_k=2, dtype="int8", time_s=1e-3, distinct=2,
                          copy_bytes_per_s=4e12, matmul_flops_per_s=800e12)
    nbytes = 2 * 3 * 1024 * 512
    flops = 2 * 4 * 2 * 3 * 1024 * 512
    assert r["weight_bytes"] == nbytes and r["flops"] == flops
    assert r["time_us"] == pytest.approx(1000.0)
    assert r["weight_GBps"] == pytest.approx(nbytes / 1e-3 / 1e9)
    assert r["bw_frac"] == pytest.approx(nbytes / 1e-3 / 4e12)
    assert r["tflops"] == pytest.approx(flops / 1e-3 / 1e12)
    assert r["flop_frac"] == pytest.approx(flops / 1e-3 / 800e12)
    assert r["floor_us"] == pytest.approx(max(nbytes / 4e12, flops / 800e12) * 1e6)
    assert r["roofline_frac"] == pytest.approx(r["floor_us"] / 1000.0)
    assert r["bound"] == "memory"
    big = bench.row_metrics(m=8192, hidden=1024, inter=512, top_k=2, dtype="int8", time_s=1e-3, distinct=8,
                            copy_bytes_per_s=4e12, matmul_flops_per_s=800e12)
    assert big["bound"] == "compute"


def test_bench_speedups_pair_int8_with_bf16():
    rows = [dict(shape="s", M=1, dtype="bf16", time_us=30.0), dict(shape="s", M=1, dtype="int8", time_us=20.0),
            dict(shape="s", M=2, dtype="int8", time_us=20.0), dict(shape="s", M=4, dtype="bf16", error="x"),
            dict(shape="s", M=4, dtype="int8", time_us=5.0)]
    bench.add_speedups(rows)
    assert rows[1]["speedup_vs_bf16"] == pytest.approx(1.5)
    assert "speedup_vs_bf16" not in rows[2] and "speedup_vs_bf16" not in rows[4]


def test_bench_pool_reaches_past_l2_within_budget():
    l2 = 50 * 2**20
    for name, (e, h, i, k) in bench.SHAPES.items():
        for dtype in bench.DTYPES:
            n = bench.layers_for_pool(e, h, i, k, dtype, l2_bytes=l2, budget_bytes=4e9)
            pool = n * bench.layer_bytes(e, h, i, dtype)
            assert n >= 1
            assert n == 1 or pool <= 4e9, name
            assert n * k * bench.expert_bytes(h, i, dtype) > 4 * l2, (name, dtype)  # M=1 reads leave L2 behind
    # a tiny shape stops at the layer cap; a huge one never goes below one layer
    assert bench.layers_for_pool(8, 64, 64, 2, "int8", l2_bytes=l2, max_layers=16) == 16
    assert bench.layers_for_pool(8, 8192, 32768, 2, "bf16", l2_bytes=l2, budget_bytes=1e9) == 1


def test_tune_pools_reach_past_l2_as_the_benchs_do():
    """The tuner's weight pools are the bench's: its budget by default, so each candidate reads from HBM where
    the bench's row does. With 2 GB qwen3-30b-a3b's bf16 pool held one layer (1.2 GB): 8 experts, 75 MB a
    sweep at M=1, 1.4x L2, against the bench's three layers (4.3x L2)."""
    import inspect

    from experts_int8 import tune

    l2 = 50 * 2**20
    pool_gb = inspect.signature(tune.tune).parameters["pool_gb"].default
    assert pool_gb == bench.Settings.pool_gb
    for name, (e, h, i, k) in bench.SHAPES.items():
        for dtype in bench.DTYPES:
            n = bench.pool_layers_that_fit(e, h, i, k, dtype, l2_bytes=l2, budget_bytes=pool_gb * 1e9,
                                           free_bytes=140e9)
            assert n == bench.layers_for_pool(e, h, i, k, dtype, l2_bytes=l2, budget_bytes=4e9)
            assert n * k * bench.expert_bytes(h, i, dtype) > 4 * l2, (name, dtype)
    # a device with little free memory still gets one layer, and never more than 60% of what is free
    assert bench.pool_layers_that_fit(128, 2048, 768, 8, "bf16", l2_bytes=l2, budget_bytes=4e9, free_bytes=1e9) == 1
    assert bench.pool_layers_that_fit(128, 2048, 768, 8, "int8", l2_bytes=l2, budget_bytes=4e9, free_bytes=2.5e9) == 2


def test_tune_times_as_many_calls_a_replay_as_the_bench(monkeypatch):
    """A candidate's graph holds the bench's calls per replay (calls_per_graph), not one sweep of the pool: a
    one-layer pool made each replay a single call, its launch gap and the PDL overlap between calls unlike
    the bench's rows."""
    from experts_int8 import tune

    seen = {}

    def time_calls(x, layers, routing, num_calls, **kw):
        seen["calls"], seen["warm_s"] = num_calls, kw["warm_s"]
        return 1e-5, "cuda_graph"

    monkeypatch.setattr(bench, "time_calls", time_calls)
    monkeypatch.setattr(tune, "checked_call", lambda *a, **kw: None)
    layers = bench.make_layers(1, 4, 32, 16, "bf16", "cpu")
    routing = bench.routing_draws(2, 4, 2, device="cpu")
    x = torch.randn(2, 32, dtype=torch.bfloat16)
    calls = bench.calls_per_graph(1, 5e-6, draws=len(routing))
    assert calls > 1
    measure = tune._gpu_measure(x, layers, routing, 3, "silu", calls)
    assert measure(dict(PINNED), math.inf) == 1e-5 and seen == {"calls": calls, "warm_s": 0.0}
    # with warm_s, each candidate's timed replays follow untimed ones, as the bench's rows do
    assert tune._gpu_measure(x, layers, routing, 3, "silu", calls, warm_s=0.5)(dict(PINNED), math.inf) == 1e-5
    assert seen["warm_s"] == 0.5


def test_bench_layer_pool_sizes_the_pool_for_the_shape():
    l2 = 2**20
    shape, layers = bench.layer_pool("4:64:32:2", "int8", l2, budget_bytes=1e6, device="cpu")
    assert shape == (4, 64, 32, 2)
    assert len(layers) == bench.layers_for_pool(4, 64, 32, 2, "int8", l2_bytes=l2, budget_bytes=1e6) > 1
    assert layers[0].w13.shape == (4, 64, 64) and layers[0].w13.dtype == torch.int8
    assert layers[0].w2.shape == (4, 64, 32) and layers[0].w2_scale.shape == (4, 64)
    # without a gate: 2HI an expert, so a tighter budget holds as many layers
    ungated = bench.layer_pool("4:64:32:2", "int8", l2, budget_bytes=1e6 * 2 / 3, device="cpu", gated=False)[1]
    assert len(ungated) == len(layers) and ungated[0].w13.shape == (4, 32, 64)


def test_bench_calls_per_graph_whole_sweeps():
    assert bench.calls_per_graph(3, floor_s=1e-2) == 3  # long calls: one sweep
    n = bench.calls_per_graph(4, floor_s=10e-6, target_s=1e-3)
    assert n % 4 == 0 and n * 10e-6 >= 1e-3
    assert bench.calls_per_graph(5, floor_s=1e-9, max_calls=128) == 125


def test_bench_parsing():
    assert bench.parse_shape("qwen3-30b-a3b") == ("qwen3-30b-a3b", (128, 2048, 768, 8))
    assert bench.parse_shape("8:256:512:2") == ("E8-H256-I512-k2", (8, 256, 512, 2))
    with pytest.raises(ValueError, match="unknown shape"):
        bench.parse_shape("mixtral")
    with pytest.raises(ValueError, match="k <= E"):
        bench.parse_shape("2:256:512:4")
    assert bench.parse_int_list(["1,2", "4"]) == [1, 2, 4]
    with pytest.raises(ValueError, match="positive"):
        bench.parse_int_list(["0"])
    assert bench.parse_dtypes(["int8,bf16", "int8"]) == ["int8", "bf16"]
    with pytest.raises(ValueError, match="unknown dtype"):
        bench.parse_dtypes(["fp8"])


def _fake_result():
    rows = []
    for dtype, t in (("bf16", 40.0), ("int8", 25.0)):
        r = dict(shape="mixtral-8x7b", E=8, H=4096, I=14336, k=2, M=1, dtype=dtype)
        r.update(bench.row_metrics(m=1, hidden=4096, inter=14336, top_k=2, dtype=dtype, time_s=t * 1e-6,
                                   distinct=2, copy_bytes_per_s=4.3e12, matmul_flops_per_s=790e12))
        rows.append(r)
    rows.append(dict(shape="mixtral-8x7b", E=8, H=4096, I=14336, k=2, M=2, dtype="int8", error="boom"))
    bench.add_speedups(rows)
    return dict(benchmark="bench_kernel", command="python3 benchmarks/bench_kernel.py --quick", gpu="NVIDIA H200",
                commit="abc", time_utc="2026-01-01T00:00:00+00:00", rows=rows,
                ceilings=dict(copy_GBps=4300.0, matmul_TFLOPs=790.0))


def test_bench_table_and_json(tmp_path):
    result = _fake_result()
    table = bench.format_table(result)
    assert "mixtral-8x7b" in table and "1.60x" in table and "failed" in table and "without a gate" not in table
    ungated = dict(result, rows=[dict(r, gated=False) for r in result["rows"]])
    assert "experts without a gate" in bench.format_table(ungated).splitlines()[0]
    paths = bench.write_results(result, tmp_path, plot=False)
    assert [p.suffix for p in paths] == [".json"] and "NVIDIA_H200" in paths[0].name
    back = json.loads(paths[0].read_text())
    assert back["command"].startswith("python3 benchmarks/bench_kernel.py") and len(back["rows"]) == 3


def test_results_on_a_full_disk_leave_nothing(tmp_path, monkeypatch):
    """A result file appears whole or not at all, and the folders made for it go again: a full disk left a
    0-byte JSON (bench, bench-e2e) and the folders it made. An older file of the same name stays as it was."""
    import errno

    from experts_int8 import files

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        bench.write_results(_fake_result(), tmp_path / "a" / "b", plot=False)
    assert os.listdir(tmp_path) == []
    old = tmp_path / "table.json"
    old.write_text("old")
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(old, "new")
    assert os.listdir(tmp_path) == ["table.json"] and old.read_text() == "old"
    monkeypatch.undo()
    assert files.write_atomic(old, "new").read_text() == "new" and os.listdir(tmp_path) == ["table.json"]
    assert oct(old.stat().st_mode & 0o777) == oct(0o644)


def test_bench_plot_names_the_gpu_the_commit_and_the_command(tmp_path, monkeypatch):
    """The PNG carries the GPU, the library commit and the command that made it (the spec's plot), not
    only the JSON: a plot passed around alone must say how to make it again."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    texts = []
    real = Figure.savefig

    def savefig(fig, *args, **kw):
        texts.extend(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))
        return real(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    paths = bench.write_results(dict(_fake_result(), dirty=True), tmp_path)
    assert [p.suffix for p in paths] == [".json", ".png"]
    text = "\n".join(texts)
    assert "NVIDIA H200" in text and "abc" in text and "dirty" in text
    assert "python3 benchmarks/bench_kernel.py --quick" in text


def test_bench_plot_leaves_the_callers_matplotlib_as_it_was(tmp_path):
    """write_results is a library function: it switched the caller's backend to Agg for good (a notebook's inline
    plots stopped showing), and a plot that failed left its figure open in pyplot (memory, in a process that goes
    on)."""
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # (a backend of the caller's own)
    try:
        assert [p.suffix for p in bench.write_results(_fake_result(), tmp_path)] == [".json", ".png"]
        broken = _fake_result()
        del broken["ceilings"]
        with pytest.raises(KeyError):
            bench.write_results(broken, tmp_path / "broken")
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == []
    finally:
        plt.close("all")
        matplotlib.use(before)


def test_bench_plot_is_skipped_with_a_log_line_without_matplotlib(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib -> ImportError)
    paths = bench.write_results(_fake_result(), tmp_path)
    assert [p.suffix for p in paths] == [".json"] and "matplotlib is not installed" in caplog.text


def test_bench_commit_is_reported(monkeypatch):
    monkeypatch.delenv("EXPERTS_INT8_COMMIT", raising=False)  # (the GPU sessions set it, to a short sha)
    commit, _ = bench.library_commit()
    assert commit == "unknown" or len(commit) == 40
    monkeypatch.setenv("EXPERTS_INT8_COMMIT", "a4e6ac9")  # a copied tree's commit, as given
    assert bench.library_commit() == ("a4e6ac9", None)


def test_bench_script_parses_options():
    args = bench.build_parser().parse_args(["--quick", "--shapes", "qwen3-30b-a3b", "8:64:32:2", "--m", "1,4", "16",
                                            "--dtypes", "int8"])
    s = bench.settings_from_args(args)
    assert (s.reps, s.ms, s.dtypes, s.shapes) == (5, [1, 4, 16], ["int8"], ["qwen3-30b-a3b", "8:64:32:2"])
    full = bench.settings_from_args(bench.build_parser().parse_args([]))
    assert len(full.shapes) * len(full.ms) * len(full.dtypes) == 5 * 14 * 2 and full.reps == 20
    assert full.settle_s == 1.0 and bench.settings_from_args(bench.build_parser().parse_args(
        ["--settle-s", "0"])).settle_s == 0
    assert full.warm_s == 0.5 and bench.settings_from_args(bench.build_parser().parse_args(
        ["--warm-s", "0"])).warm_s == 0
    assert full.settle_every_row and not bench.settings_from_args(bench.build_parser().parse_args(
        ["--no-settle-every-row"])).settle_every_row
    assert full.gated and not bench.settings_from_args(bench.build_parser().parse_args(["--no-gate"])).gated


@pytest.mark.parametrize("option", ["--settle-s", "--warm-s"])
@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "61", "soon"])
def test_bench_settle_and_warm_must_be_seconds(option, bad, capsys):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args([option, bad])
    assert option in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("gated, activation, biases, every_row", [(True, "silu", False, False),
                                                                  (False, "relu2", False, False),
                                                                  (True, "swiglu_oai", True, True)])
def test_bench_runs_on_gpu(tmp_path, monkeypatch, gated, activation, biases, every_row):
    settled, timed = [], []
    monkeypatch.setattr(bench, "settle", settled.append)
    real_timing = bench._median_event_time

    def timing(fn, reps, warmup):  # each row: its probe, then its timed replays after the untimed ones
        timed.append((reps, warmup, real_timing(fn, reps, warmup)))
        return timed[-1][2]

    monkeypatch.setattr(bench, "_median_event_time", timing)
    settings = bench.Settings.quick(shapes=["8:512:256:2"], ms=[1, 64], out_dir=str(tmp_path), pool_gb=0.1,
                                    settle_s=0.25, settle_every_row=every_row, warm_s=0.05, gated=gated,
                                    activation=activation, biases=biases)
    result = bench.run_benchmark(settings, command="pytest")
    rows = [(timed[i], timed[i + 1]) for i in range(len(timed) - 1) if timed[i][0] == 1]  # (probes: one replay)
    assert len(rows) == 4 and all(run[1] == math.ceil(0.05 / probe[2]) for probe, run in rows)
    assert all("time_us" in r and r["gated"] is gated for r in result["rows"]) and len(result["rows"]) == 4
    assert result["rows"][0]["weight_bytes"] == result["rows"][0]["distinct_experts"] * (3 if gated else 2) * 512 * 256 * 2
    # once a (shape, dtype) section, or before each of its two rows
    assert settled == [0.25] * (4 if every_row else 2) and result["settings"]["settle_s"] == 0.25
    assert result["ceilings"]["copy_GBps"] > 100 and list(tmp_path.glob("*.json"))
    # where each row's entry came from (no H200 table has this shape: the heuristic unless a user tuned it)
    assert all(r["config_source"] == "heuristic" or r["config_source"].startswith("table M=") for r in result["rows"])


# --- tuner -----------------------------------------------------------------------------------------

from experts_int8 import tune  # noqa: E402


@pytest.mark.parametrize("shape", list(bench.SHAPES))
def test_tune_search_space_is_pruned(shape):
    e, h, i, k = bench.SHAPES[shape]
    union = set()
    for m in tune.DEFAULT_MS:
        for wdtype in (torch.int8, torch.bfloat16):
            cands = tune.candidate_configs(m, e, h, i, k, wdtype)
            assert cands[0] == configs.heuristic_config(m, e, k, wdtype, "cuda")  # default first
            assert 1 < len(cands) <= 32 + 1
            assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
            rows = m * k / e
            for cfg in cands[1:]:
                assert configs.check_config(cfg) == cfg
                assert cfg["BLOCK_SIZE_M"] <= max(16, 2 * rows)
                assert not (rows > 64 and cfg["BLOCK_SIZE_M"] == 16)
                assert tune.smem_bytes(cfg, wdtype.itemsize) <= tune.DEFAULT_SMEM
                assert 2 * cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_N"] / (32 * cfg["num_warps"]) <= tune.MAX_ACC_REGS
            if rows <= 8:
                assert {c["BLOCK_SIZE_M"] for c in cands[1:]} == {16}  # decode: smallest block only
            union |= {json.dumps(c, sort_keys=True) for c in cands}
    # Samples nest across M, so the distinct configs (what Triton compiles) stay few.
    assert len(union) <= 2 * 80


def test_tune_search_space_holds_the_decode_pipelines_that_fit_hopper():
    """A decode block (16 rows: mma.sync) keeps num_stages - 1 stages in shared memory: 16 x 128 x 256 int8 and
    16 x 64 x 256 bf16 in 4 stages compile to 216 KB for sm_90 (tests/test_smem_estimate.py), under its 227 KB;
    5 stages (288 KB) do not fit."""
    bns, bks = list(tune.BLOCK_N), list(tune.BLOCK_K)
    for wbytes, bn in ((1, 128), (2, 64)):
        space = tune._space(16, bns, bks, wbytes, tune.DEFAULT_SMEM)
        fits = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=4)
        assert fits in space and dict(fits, num_stages=5) not in space
    # (the space of 16-row blocks: 51 int8 and 39 bf16 configs where counting every stage left 46 and 32)
    assert len(tune._space(16, bns, bks, 1, tune.DEFAULT_SMEM)) == 51
    assert len(tune._space(16, bns, bks, 2, tune.DEFAULT_SMEM)) == 39


def test_tune_candidates_are_deterministic_and_budgeted():
    a = tune.candidate_configs(1024, 8, 4096, 14336, 2, torch.int8, max_candidates=12)
    assert a == tune.candidate_configs(1024, 8, 4096, 14336, 2, torch.int8, max_candidates=12)
    assert len(a) <= 13 and {c["BLOCK_SIZE_M"] for c in a[1:4]} == {32, 64, 128}  # interleaved over BLOCK_M
    smaller = tune.candidate_configs(1024, 8, 4096, 14336, 2, torch.int8, max_candidates=6)
    assert all(c in a for c in smaller)  # prefixes nest
    tight = tune.candidate_configs(1, 8, 4096, 14336, 2, torch.int8, smem_limit=48 * 1024)
    assert all(tune.smem_bytes(c, 1) <= 48 * 1024 for c in tight[1:])


def test_tune_group_variants_only_when_experts_span_blocks():
    cfg = dict(PINNED, BLOCK_SIZE_M=64, GROUP_SIZE_M=1)
    assert tune.group_variants(cfg, m=16, num_experts=8, top_k=2) == []
    assert [c["GROUP_SIZE_M"] for c in tune.group_variants(cfg, m=4096, num_experts=8, top_k=2)] == [8, 16]


def test_tune_search_keeps_fastest_and_skips_failures():
    cands = [dict(PINNED, BLOCK_SIZE_N=n) for n in (16, 32, 64, 128)]
    times = {16: 3.0, 32: 1.0, 128: 2.0}

    def measure(cfg, best):
        n = cfg["BLOCK_SIZE_N"]
        if n == 64:
            raise RuntimeError("out of resource: shared memory, Required: 300000")
        return times[n]

    steps = []
    r = tune.search(cands, measure, refine=lambda best: [dict(best, GROUP_SIZE_M=8)], on_step=steps.append)
    assert r.best == cands[1] and r.best_s == 1.0 and r.default_s == 3.0
    assert r.timed == 4 and dict(r.skipped) == {"RuntimeError": 1} and len(steps) == 5
    assert "out of resource" in r.first_error


def test_tune_skips_a_config_whose_output_is_wrong(monkeypatch):
    """A candidate is checked against the torch reference before it is timed: a kernel variant that
    computes the wrong layer is skipped as WrongResult, never written to a table."""
    from experts_int8 import ops, quantize_weights, select_experts
    from experts_int8 import tune as tune_module

    q13, s13 = quantize_weights(torch.randn(4, 64, 32) / 32**0.5)
    q2, s2 = quantize_weights(torch.randn(4, 32, 32) / 32**0.5)
    x = torch.randn(9, 32, dtype=torch.float16)
    weights, ids = select_experts(torch.randn(9, 4), 2)
    kw = dict(w13_scale=s13.to(DEVICE), w2_scale=s2.to(DEVICE))
    x, q13, q2, weights, ids = (t.to(DEVICE) for t in (x, q13, q2, weights, ids))

    def call(backend="triton"):
        return experts_int8.fused_experts(x, q13, q2, weights, ids, backend=backend, **kw)

    expected = call("torch")
    good = dict(PINNED, BLOCK_SIZE_M=16, num_stages=2)
    tune_module.checked_call(good, call, expected)  # the Triton kernels agree with the reference
    real = ops.invoke_down
    monkeypatch.setattr(ops, "invoke_down", lambda h, *a, **k: real(h.flip(0), *a, **k))  # rows mixed up
    with pytest.raises(tune_module.WrongResult, match="differs from the reference"):
        tune_module.checked_call(good, call, expected)
    r = tune_module.search([good, dict(good, BLOCK_SIZE_N=32)],
                           lambda cfg, best: tune_module.checked_call(cfg, call, expected) or 1.0
                           if cfg["BLOCK_SIZE_N"] == 16 else 1.0)
    assert dict(r.skipped) == {"WrongResult": 1} and r.best["BLOCK_SIZE_N"] == 32


def test_tune_checks_one_wrong_token_and_every_candidate(monkeypatch):
    from experts_int8 import tune as tune_module

    expected = torch.randn(512, 64)
    wrong_row = expected.clone()
    wrong_row[7] = -wrong_row[7]  # one token of 512: ~6% of the total norm, but its whole row
    tune_module.checked_call(PINNED, lambda: expected + 1e-3 * torch.randn_like(expected), expected)
    with pytest.raises(tune_module.WrongResult, match="worst token"):
        tune_module.checked_call(PINNED, lambda: wrong_row, expected, tol=0.1)

    # _gpu_measure checks each candidate before timing it
    from experts_int8 import bench
    checked = []
    monkeypatch.setattr(tune_module, "checked_call", lambda cfg, call, exp: checked.append(cfg))
    monkeypatch.setattr(bench, "time_calls", lambda *a, **k: (1.0, "eager"))
    monkeypatch.setattr(experts_int8.ops, "fused_experts", lambda *a, **k: torch.zeros(2, 4))
    layer = bench.Layer(torch.zeros(1), torch.zeros(1), None, None)
    measure = tune_module._gpu_measure(torch.zeros(2, 4), [layer], [(torch.ones(2, 1), torch.zeros(2, 1))], reps=1)
    assert measure(PINNED, 1.0) == 1.0 and checked == [PINNED]


def test_tune_search_keeps_the_default_unless_a_config_beats_it_clearly():
    """The fastest of many single noisy timings beats the default by chance: with 40 configs as fast as the
    default and 1% noise, one of them took the entry 40 times in 41 (0 of 50 searches kept the default). A
    replacement must be 2% faster in fresh timings of both, alternated."""
    import random as _random

    rng = _random.Random(0)
    cands = [dict(PINNED, BLOCK_SIZE_N=16)] + [dict(PINNED, BLOCK_SIZE_N=32, GROUP_SIZE_M=g) for g in range(1, 41)]
    kept = sum(tune.search(cands, lambda cfg, best: 100.0 * (1 + 0.01 * rng.gauss(0, 1))).best == cands[0]
               for _ in range(50))
    assert kept >= 45  # (the default, or a config within the noise of it, as timed)
    times = {16: 100.0, 32: 99.0, 64: 97.0}
    cands = [dict(PINNED, BLOCK_SIZE_N=n) for n in (16, 32)]
    r = tune.search(cands, lambda cfg, best: times[cfg["BLOCK_SIZE_N"]])
    assert r.best == cands[0] and r.best_s == 100.0 == r.default_s  # 1% is noise
    r = tune.search(cands + [dict(PINNED, BLOCK_SIZE_N=64)], lambda cfg, best: times[cfg["BLOCK_SIZE_N"]])
    assert r.best == dict(PINNED, BLOCK_SIZE_N=64) and r.best_s == 97.0  # 3% replaces it
    assert tune.search(cands, lambda cfg, best: times[cfg["BLOCK_SIZE_N"]], min_gain=0).best == cands[1]


def test_tune_search_refines_a_winning_variant_once_more():
    """Two variants that each help meet in one entry: the second round refines the first round's
    winner; a config is never timed twice (before the winner's confirmation, off here), and a round whose
    variants all lose ends the refinement."""
    def refine(best):
        return [dict(best, GROUP_SIZE_M=8), dict(best, PDL=2)]

    def measure(cfg, best):
        timed.append(cfg)
        return 10.0 - 3 * (cfg["GROUP_SIZE_M"] == 8) - 2 * (cfg.get("PDL") == 2)

    timed = []
    r = tune.search([PINNED], measure, refine=refine, confirm_rounds=0)
    assert r.best == dict(PINNED, GROUP_SIZE_M=8, PDL=2) and r.best_s == 5.0
    assert len(timed) == 4 == len({json.dumps(c, sort_keys=True) for c in timed})  # the winner is its own GROUP_SIZE_M=8 variant
    timed = []
    assert tune.search([PINNED], measure, refine=refine, refine_rounds=1, confirm_rounds=0).best_s == 7.0 and len(timed) == 3
    timed = []  # a search past its deadline refines its winner once, not twice
    assert tune.search([PINNED], measure, refine=refine, deadline=0.5, clock=lambda: 1.0, confirm_rounds=0).best_s == 7.0
    assert len(timed) == 3


def test_tune_search_announces_its_refine_rounds():
    """The progress bar's total counted the first candidates only, and ran to 45/34: each round now says how
    many variants it adds (a variant given twice, or timed before, is not counted)."""
    def refine(best):
        return [dict(best, GROUP_SIZE_M=8), dict(best, GROUP_SIZE_M=8), dict(best, PDL=2), dict(PINNED)]

    steps, more = [], []
    tune.search([PINNED], lambda cfg, best: 10.0 - 3 * (cfg["GROUP_SIZE_M"] == 8), refine=refine,
                on_step=steps.append, on_more=more.append)
    assert more == [2, 1] and len(steps) == 1 + sum(more)  # round 2 refines GROUP_SIZE_M=8: only its PDL=2 is new
    bar = tune._Progress(1, enabled=True, log=print)
    bar.extend(2)
    assert bar._total == 3 and (bar._bar is None or bar._bar.total == 3)
    bar.close()


def test_tune_and_bench_refuse_an_output_folder_they_cannot_write_before_any_gpu_work(tmp_path, monkeypatch):
    """A file (or a read-only folder) given as the output folder failed only when the results were written,
    after minutes of GPU time; nothing is created on the way."""
    from experts_int8 import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"the tables' folder .*/file/sub: .*/file is a file, not a folder"):
        tune.tune(8, 64, 64, 2, ms=[1], out_dir=tmp_path / "file" / "sub")
    settings = bench.Settings(shapes=["8:64:64:2"], ms=[1], dtypes=["int8"], out_dir=str(tmp_path / "file"))
    with pytest.raises(ValueError, match=r"the output folder .*/file: .*/file is a file, not a folder"):
        bench.run_benchmark(settings)
    if os.geteuid() != 0:  # (root writes anywhere)
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(ValueError, match=r"/ro is not writable; choose another folder"):
            check_writable_dir(tmp_path / "ro" / "a" / "b", "the output folder")
    check_writable_dir(tmp_path / "new" / "sub", "the output folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] + (["ro"] if os.geteuid() != 0 else [])


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), ("Yes", True), ("y", True),
                                       ("0", False), ("false", False), ("off", False), ("", False), ("2", False)])
def test_tune_and_bench_refuse_triton_interpret_as_triton_reads_it(tmp_path, monkeypatch, value, on):
    """Only "1" was refused, while Triton also turns its interpreter on for true, on, yes, y (any case)."""
    from experts_int8 import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", value)
    (tmp_path / "file").write_text("")  # past the check, the output folder stops them before any GPU work
    says = f"TRITON_INTERPRET={value} is set, so Triton would not compile for the GPU" if on else "is a file"
    with pytest.raises((RuntimeError, ValueError), match=says):
        tune.tune(8, 64, 64, 2, ms=[1], out_dir=tmp_path / "file" / "sub")
    with pytest.raises((RuntimeError, ValueError), match=says):
        bench.run_benchmark(bench.Settings(shapes=["8:64:64:2"], ms=[1], dtypes=["int8"],
                                           out_dir=str(tmp_path / "file")))


def test_tune_search_stops_at_its_deadline_and_raises_when_nothing_runs():
    clock = iter(range(100)).__next__
    r = tune.search([dict(PINNED, BLOCK_SIZE_N=n) for n in (16, 32, 64, 128)], lambda cfg, best: 1.0,
                    deadline=0.5, clock=clock)
    assert r.timed == 2 and r.not_tried == 2  # the default always runs, then one more before the deadline
    with pytest.raises(RuntimeError, match="all 2 candidate configs failed"):
        tune.search([PINNED, PINNED], lambda cfg, best: 1 / 0)


def test_tune_search_stops_on_cuda_faults():
    def measure(cfg, best):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        tune.search([PINNED, PINNED], measure)


def test_tune_table_is_written_merged_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")  # no shipped table
    monkeypatch.setattr(configs, "max_shared_memory", lambda index: 228 * 1024)  # the heuristic's fit, no GPU
    monkeypatch.setattr(configs, "compute_capability", lambda index: (9, 0))
    configs.clear_table_cache()
    small = dict(PINNED, BLOCK_SIZE_M=16)
    big = dict(PINNED, BLOCK_SIZE_M=128, num_warps=8)
    path = tune.write_table({1: small, 1024: big}, 8, 14336, "Fake_GPU", "int8_w8a16")
    assert path == tmp_path / "configs" / "E=8,N=14336,device=Fake_GPU,dtype=int8_w8a16.json"
    assert list(json.loads(path.read_text())) == ["1", "1024"]
    try:
        assert configs.get_config(3, 8, 14336, 2, torch.int8) == small  # the tuned M below
        assert configs.get_config(8192, 8, 14336, 2, torch.int8) == big
        assert configs.get_config(3, 8, 14336, 2, torch.bfloat16, torch.device("cuda", 0)) != small  # no table
        mid = dict(PINNED, BLOCK_SIZE_M=64)
        tune.write_table({256: mid, 1: big}, 8, 14336, "Fake_GPU", "int8_w8a16")  # merge, clears the cache
        assert list(json.loads(path.read_text())) == ["1", "256", "1024"]
        assert configs.get_config(256, 8, 14336, 2, torch.int8) == mid
        assert configs.get_config(300, 8, 14336, 2, torch.int8) == mid  # a prefill config keeps its M
        assert configs.get_config(1, 8, 14336, 2, torch.int8) == big
        with pytest.raises(ValueError, match="power of two"):
            tune.write_table({1: dict(PINNED, BLOCK_SIZE_N=48)}, 8, 14336, "Fake_GPU", "int8_w8a16")
    finally:
        configs.clear_table_cache()


def test_a_tune_of_some_token_counts_keeps_the_shipped_entries_of_the_others(tmp_path, monkeypatch):
    """The user's table overrides the package's per M: a tune of M=1 and 16 alone took the shipped table's place
    whole, and its decode entry then served every prefill M."""
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "NVIDIA_H200")
    configs.clear_table_cache()
    name = configs.table_name(8, 14336, "NVIDIA_H200", "int8_w8a16")
    shipped = configs.read_table(configs.PACKAGE_DIR / name)
    assert {1, 16, 4096} <= set(shipped)
    mine = dict(PINNED, BLOCK_SIZE_M=16)
    try:
        tune.write_table({1: mine, 16: mine}, 8, 14336, "NVIDIA_H200", "int8_w8a16")
        assert configs.get_config(1, 8, 14336, 2, torch.int8) == mine
        assert configs.get_config(16, 8, 14336, 2, torch.int8) == mine
        for m in (256, 4096):
            assert configs.get_config(m, 8, 14336, 2, torch.int8) == shipped[m]
    finally:
        configs.clear_table_cache()


def test_two_writers_of_one_table_at_once_keep_both_entries(tmp_path, monkeypatch):
    """write_table reads the table, merges and replaces it: two tunes of one shape at once (other token counts, or
    two GPUs of one kind) each wrote the table it had read, and the entries of the one that wrote first were lost.
    Here the second writer is started while the first is about to write; it must wait for the first."""
    import threading

    first, second = dict(PINNED, BLOCK_SIZE_M=16), dict(PINNED, BLOCK_SIZE_M=64)
    real = tune.write_atomic
    others = []

    def write_atomic(path, text):
        if not others:  # the first writer, its table read and merged: a second one starts now
            others.append(threading.Thread(target=tune.write_table,
                                           args=({2: second}, 8, 14336, "Fake_GPU", "int8_w8a16", tmp_path)))
            others[0].start()
            others[0].join(timeout=1.0)  # (it finishes meanwhile unless it waits for the first)
        return real(path, text)

    monkeypatch.setattr(tune, "write_atomic", write_atomic)
    path = tune.write_table({1: first}, 8, 14336, "Fake_GPU", "int8_w8a16", tmp_path)
    others[0].join()
    assert configs.read_table(path) == {1: first, 2: second}
    assert list(tmp_path.iterdir()) == [path]  # no lock or temporary file left
    configs.clear_table_cache()


@pytest.mark.parametrize("text, says", [
    ("", "not a readable JSON table"), ('{"1": {"BLOCK_SIZE_M": 16', "not a readable JSON table"),
    ("[]", "a table maps token counts to configs"), ("{}", "a table maps token counts to configs"),
    ('{"abc": {}}', "'abc' is not a token count"), ('{"0": {}}', "'0' is not a token count"),
    ('{"016": {}}', "'016' is not a token count"), ('{"4": {"BLOCK_SIZE_M": 3}}', "M=4: a MoE config needs"),
    ("[" * 100_000 + "]" * 100_000, "not a readable JSON table"),  # (a RecursionError: past the warning)
])
def test_a_broken_cached_table_is_named_and_ignored_and_a_tune_replaces_it(text, says, tmp_path, monkeypatch,
                                                                          caplog):
    """A cached table that does not read made every MoE layer raise (a bare JSON error naming no file), and
    stopped the tune that would rewrite it; its invalid entries were merged back into the new table."""
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "NVIDIA_H200")
    configs.clear_table_cache()
    name = configs.table_name(8, 14336, "NVIDIA_H200", "int8_w8a16")
    path = tmp_path / "configs" / name
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{path}") + ".*" + re.escape(says)):
        configs.read_table(path)
    try:
        with caplog.at_level("WARNING"):
            assert configs.get_config(1, 8, 14336, 2, torch.int8) == configs.read_table(configs.PACKAGE_DIR / name)[1]
        assert f"ignoring {path}" in caplog.text and "delete it or run `experts-int8 tune` again" in caplog.text
        mine = dict(PINNED, BLOCK_SIZE_M=16)
        tune.write_table({2: mine}, 8, 14336, "NVIDIA_H200", "int8_w8a16")
        assert configs.read_table(path) == {2: mine}
        assert not [p for p in path.parent.iterdir() if p != path]  # no temporary file left
        assert configs.get_config(2, 8, 14336, 2, torch.int8) == mine
    finally:
        configs.clear_table_cache()


def test_device_names_become_file_names(monkeypatch):
    for name, want in (("NVIDIA H200", "NVIDIA_H200"), ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
                       ("NVIDIA A100-SXM4-80GB", "NVIDIA_A100-SXM4-80GB"),
                       ("AMD Instinct MI300X/VF", "AMD_Instinct_MI300X_VF")):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index, name=name: name)
        assert configs._cuda_name.__wrapped__(0) == want


def test_table_entries_need_a_launchable_warp_count():
    for bad in (3, 48, 64):
        with pytest.raises(ValueError, match="num_warps'] must be a power of two up to 32"):
            configs.check_config(dict(PINNED, num_warps=bad))
        with pytest.raises(ValueError, match="num_warps'] must be a power of two up to 32"):
            configs.check_config(dict(PINNED, down={"num_warps": bad}))
    assert configs.check_config(dict(PINNED, num_warps=16, down={"num_warps": 2}))["num_warps"] == 16


def test_experts_without_a_gate_have_tables_of_their_own(tmp_path, monkeypatch):
    """A table tuned without a gate serves only experts without one, and a gated table only gated ones: the
    best blocks differ (one weight tile a K step), and an ungated entry may not fit a gated layer's kernels.
    The kernel asks for its layer's form."""
    from test_fused_experts import check

    from experts_int8 import ops

    asked = []
    real = ops.get_config
    monkeypatch.setattr(ops, "get_config", lambda *a, **k: asked.append(a[6]) or real(*a, **k))
    check(5, 4, 64, 32, 2, torch.float32, "triton", gated=False)
    check(5, 4, 64, 32, 2, torch.float32, "triton")
    assert asked == [False, True]
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")  # no shipped table
    monkeypatch.setattr(configs, "max_shared_memory", lambda index: 228 * 1024)  # the heuristic's fit, no GPU
    monkeypatch.setattr(configs, "compute_capability", lambda index: (9, 0))
    configs.clear_table_cache()
    gated, ungated = dict(PINNED, BLOCK_SIZE_M=128, num_warps=8), dict(PINNED, BLOCK_SIZE_N=256, num_warps=8)
    cuda = torch.device("cuda", 0)
    try:
        path = tune.write_table({1024: ungated}, 8, 1856, "Fake_GPU", "int8_w8a16", gated=False)
        assert path.name == "E=8,N=1856,device=Fake_GPU,dtype=int8_w8a16,no_gate.json"
        assert configs.get_config(1024, 8, 1856, 2, torch.int8, cuda, gated=False) == ungated
        assert configs.config_source(1024, 8, 1856, 2, torch.int8, cuda) == "heuristic"
        tune.write_table({1024: gated}, 8, 1856, "Fake_GPU", "int8_w8a16")
        assert configs.get_config(1024, 8, 1856, 2, torch.int8, cuda) == gated
        assert configs.get_config(1024, 8, 1856, 2, torch.int8, cuda, gated=False) == ungated
        assert configs.tail_config(gated, 8, 1856, 2, torch.int8, cuda, gated=False) == ungated  # 64 pairs an expert
    finally:
        configs.clear_table_cache()


def test_config_source_names_the_tuned_m_that_serves_a_row(tmp_path, monkeypatch):
    """configs.config_source: the table key get_config's entry comes from (another M's entry shows as such),
    the heuristic where no table exists, the override inside override_config."""
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")  # no shipped table
    monkeypatch.setattr(configs, "max_shared_memory", lambda index: 228 * 1024)  # the heuristic's fit, no GPU
    configs.clear_table_cache()
    small, big = dict(PINNED, BLOCK_SIZE_M=16), dict(PINNED, BLOCK_SIZE_M=128, num_warps=8)
    tune.write_table({1: small, 1024: big}, 8, 14336, "Fake_GPU", "int8_w8a16")
    try:
        assert configs.config_source(1, 8, 14336, 2, torch.int8) == "table M=1"
        assert configs.config_source(4, 8, 14336, 2, torch.int8) == "table M=1"  # 1 row an expert: M=1's blocks
        assert configs.config_source(256, 8, 14336, 2, torch.int8) == "table M=1024"  # 64 rows: the key above
        assert configs.config_source(8192, 8, 14336, 2, torch.int8) == "table M=1024"
        assert configs.config_source(1, 8, 14336, 2, torch.bfloat16, torch.device("cuda", 0)) == "heuristic"
        with configs.override_config(small):
            assert configs.config_source(1, 8, 14336, 2, torch.int8) == "override"
        for m in (1, 4, 256, 8192):  # the entry get_config returns is the one the source names
            key = int(configs.config_source(m, 8, 14336, 2, torch.int8).split("=")[1])
            assert configs.get_config(m, 8, 14336, 2, torch.int8) == {1: small, 1024: big}[key]
    finally:
        configs.clear_table_cache()


def test_tune_and_bench_refuse_a_gpu_older_than_the_kernel_needs(tmp_path, monkeypatch):
    """On a T4 (sm_75) fused_experts runs the torch path: the tuner timed it for every candidate and wrote a table
    of it, the bench timed it as the kernel. Both refuse first, saying why."""
    from experts_int8 import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    says = r"Tesla T4 \(compute capability 7\.5\) is older than the fused kernel needs \(8\.0, Ampere\)"
    with pytest.raises(RuntimeError, match=says):
        tune.tune(8, 64, 64, 2, ms=[1], out_dir=tmp_path)
    with pytest.raises(RuntimeError, match=says):
        bench.run_benchmark(bench.Settings(shapes=["8:64:64:2"], ms=[1], dtypes=["int8"], out_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_tune_refuses_without_gpu():
    if HAS_CUDA:
        pytest.skip("checks the CPU-only message")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        tune.tune(8, 64, 64, 2, ms=[1])


def test_layers_without_a_gate_hold_up_rows_only():
    for fmt in ("int8", "bf16"):
        layer = bench.make_layers(1, 4, 16, 8, fmt, "cpu", gated=False)[0]
        assert layer.w13.shape == (4, 8, 16) and layer.w2.shape == (4, 16, 8)
        assert layer.w13_scale is None if fmt == "bf16" else layer.w13_scale.shape == (4, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("gated, activation, biases, clamp", [
    (True, "silu", False, None), (False, "relu2", False, None), (True, "swiglu_oai", True, None),
    (True, "silu", False, dict(swiglu_limit=0.5, limit_after_act=True)),  # (every candidate checked with it)
])
def test_tune_runs_on_gpu(tmp_path, monkeypatch, gated, activation, biases, clamp):
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    settled = []
    monkeypatch.setattr(bench, "settle", settled.append)
    lines = []
    paths = tune.tune(8, 512, 256, 2, dtypes=("int8",), ms=[1, 256], max_candidates=4, reps=2, progress=False,
                      settle_s=0.5, gated=gated, activation=activation, biases=biases, clamp=clamp,
                      log=lines.append)
    assert ("clamped at 0.5 after the activation" in lines[0]) == (clamp is not None)
    table = json.loads(paths["int8"].read_text())
    winners = [line for line in lines if "int8 M=" in line]
    assert len(winners) == 2 and "M=1 " in winners[0] and "M=256" in winners[1]
    assert lines.index(winners[1]) + 1 == lines.index(f"wrote {paths['int8']}")  # the format's lines, then its table
    assert set(table) == {"1", "256"} and settled == [0.5]  # after the pool's fill, before M=1
    assert paths["int8"].name.endswith("int8_w8a16.json" if gated else "int8_w8a16,no_gate.json")
    assert configs.get_config(1, 8, 256, 2, torch.int8, torch.device("cuda"), gated) == table["1"]
    configs.clear_table_cache()


def test_tune_progress_lines_reach_the_log_with_or_without_a_bar():
    """The tuner's winners are logged while its bar runs (each format's as its table is written), through
    the bar's write mode so the bar is redrawn under them, not torn."""
    for enabled in (False, True):
        lines = []
        progress = tune._Progress(3, enabled, lines.append)
        progress.write("  int8 M=1  winner")
        progress.step("best 1.0 us")
        progress.write("wrote table.json")
        progress.close()
        assert lines[0] == "  int8 M=1  winner" and lines[-1] == "wrote table.json"


# --- command line ----------------------------------------------------------------------------------

from click.testing import CliRunner  # noqa: E402

from experts_int8 import cli  # noqa: E402


def _run(*args):
    return CliRunner().invoke(cli.main, list(args))


@pytest.mark.parametrize("args, words", [
    ([], ["bench", "tune"]),
    (["bench"], ["--shapes", "--quick", "--settle-s", "--debug", "Examples", "experts-int8 bench --quick"]),
    (["tune"], ["--shape", "--model-config", "--debug", "Examples", "experts-int8 tune --shape 8,4096,14336,2"]),
])
def test_cli_help(args, words):
    r = _run(*args, "--help")
    assert r.exit_code == 0, r.output
    for word in words:
        assert word in r.output


def test_cli_help_says_where_tables_go_and_which_commit_is_recorded():
    """tune's help named ~/.cache only (the code reads $XDG_CACHE_HOME too); $EXPERTS_INT8_COMMIT was in no help."""
    text = " ".join(_run("tune", "--help").output.split())
    assert ("configs/ under $EXPERTS_INT8_CACHE, else under $XDG_CACHE_HOME/experts_int8 or "
            "~/.cache/experts_int8") in text
    for command in ("bench", "bench-e2e"):
        text = " ".join(_run(command, "--help").output.split())
        assert "$EXPERTS_INT8_COMMIT when set" in text, command


def test_cli_errors_are_one_clean_line():
    r = _run("bench", "--shapes", "not-a-model")
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: unknown shape 'not-a-model'")
    assert "Traceback" not in r.output
    r = _run("bench", "--shapes", "8,4096,14336,2")  # tune's comma form: bench's commas separate shapes
    assert r.exit_code == 1 and "unknown shape '8'" in r.output and "8:4096:14336:2" in r.output
    r = _run("bench", "--shapes", ",")
    assert r.exit_code == 2 and "no shapes given" in r.output and "--shapes" in r.output
    r = _run("tune", "--shape", "8,64")
    assert r.exit_code == 2 and "E,H,I,k" in r.output
    r = _run("tune")
    assert r.exit_code == 2 and "exactly one of" in r.output
    r = _run("bench", "--settle-s", "-1")
    assert r.exit_code == 2 and "--settle-s" in r.output and "Traceback" not in r.output


def test_cli_bench_takes_experts_without_a_gate(monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_benchmark", lambda settings, command: ran.append(settings))
    assert _run("bench", "--shapes", "128:2688:1856:6", "--m", "1,4096", "--no-gate").exit_code == 0
    assert _run("bench", "--shapes", "qwen3-30b-a3b", "--quick").exit_code == 0
    assert [(s.shapes, s.ms, s.gated) for s in ran] == [(["128:2688:1856:6"], [1, 4096], False),
                                                        (["qwen3-30b-a3b"], list(bench.DEFAULT_MS), True)]


def test_cli_bench_takes_the_idle_and_warm_up_options(monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_benchmark", lambda settings, command: ran.append(settings))
    assert _run("bench", "--settle-s", "2", "--no-settle-every-row", "--warm-s", "0").exit_code == 0
    assert _run("bench").exit_code == 0
    assert [(s.settle_s, s.settle_every_row, s.warm_s) for s in ran] == [(2, False, 0), (1, True, 0.5)]


def test_cli_bench_takes_the_experts_activation_and_biases(monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_benchmark", lambda settings, command: ran.append(settings))
    r = _run("bench", "--shapes", "32:2880:2880:4", "--activation", "swiglu_oai", "--biases")
    assert r.exit_code == 0 and [(s.activation, s.biases, s.gated) for s in ran] == [("swiglu_oai", True, True)]
    r = _run("bench", "--activation", "swiglu_oai", "--no-gate")  # no form without a gate: refused before the GPU
    assert r.exit_code == 1 and "needs gate and up rows" in r.output and len(ran) == 1
    r = _run("bench", "--activation", "tanh")
    assert r.exit_code == 1 and "unknown activation 'tanh'" in r.output and len(ran) == 1
    args = bench.build_parser().parse_args(["--activation", "relu2", "--no-gate", "--biases"])
    s = bench.settings_from_args(args)
    assert (s.activation, s.gated, s.biases) == ("relu2", False, True)
    with pytest.raises(ValueError, match="needs gate and up rows"):
        bench.settings_from_args(bench.build_parser().parse_args(["--activation", "swiglu_oai", "--no-gate"]))


def test_bench_layers_with_biases():
    layer = bench.make_layers(1, 4, 16, 8, "int8", "cpu", biases=True)[0]
    assert layer.w13_bias.shape == (4, 16) and layer.w2_bias.shape == (4, 16)
    assert bench.make_layers(1, 4, 16, 8, "bf16", "cpu", gated=False, biases=True)[0].w13_bias.shape == (4, 8)
    assert bench.make_layers(1, 4, 16, 8, "bf16", "cpu")[0].w13_bias is None


def test_cli_debug_shows_the_exception():
    r = _run("bench", "--shapes", "not-a-model", "--debug")
    assert r.exit_code == 1 and isinstance(r.exception, ValueError)


def test_cli_tune_takes_the_experts_activation_and_biases(monkeypatch):
    from experts_int8 import tune as tune_module

    with pytest.raises(ValueError, match="unknown activation"):  # before the GPU check
        tune_module.tune(8, 64, 64, 2, activation="tanh")
    asked = []
    monkeypatch.setattr(tune_module, "tune", lambda *a, **kw: asked.append((a, kw)))
    r = _run("tune", "--shape", "32,2880,2880,4", "--activation", "swiglu_oai", "--biases", "--m", "1")
    assert r.exit_code == 0, r.output
    (args, kw), = asked
    assert args == (32, 2880, 2880, 4) and (kw["activation"], kw["biases"], kw["gated"]) == ("swiglu_oai", True, True)
    assert kw["warm_s"] == 0.0
    r = _run("tune", "--shape", "8,64,64,2", "--warm-s", "0.5")
    assert r.exit_code == 0, r.output
    assert asked[-1][1]["warm_s"] == 0.5
    r = _run("tune", "--shape", "8,64,64,2", "--warm-s", "-1")
    assert r.exit_code == 2 and "--warm-s" in r.output and len(asked) == 2
    r = _run("tune", "--shape", "8,64,64,2", "--activation", "swiglu_oai", "--no-gate")
    assert r.exit_code == 1 and "needs gate and up rows" in r.output and len(asked) == 2


def test_cli_without_gpu_says_so():
    if HAS_CUDA:
        pytest.skip("checks the CPU-only message")
    r = _run("tune", "--shape", "8,64,64,2", "--m", "1")
    assert r.exit_code == 1 and r.output.startswith("Error: tuning needs a CUDA GPU")


def test_cli_new_commands_get_debug_and_clean_errors():
    @cli.command("boom-test")
    def boom():
        """Fails on purpose."""
        raise KeyError("no such model: foo\nsecond line")

    try:
        r = _run("boom-test")
        assert r.exit_code == 1 and r.output.count("\n") == 1 and "no such model: foo second line" in r.output
        assert isinstance(_run("boom-test", "--debug").exception, KeyError)
    finally:
        cli.main.commands.pop("boom-test")


@pytest.mark.parametrize("cfg, shape", [
    (dict(num_local_experts=8, hidden_size=4096, intermediate_size=14336, num_experts_per_tok=2), (8, 4096, 14336, 2)),
    (dict(num_experts=128, hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144,
          num_experts_per_tok=8), (128, 2048, 768, 8)),
    (dict(n_routed_experts=64, hidden_size=2048, moe_intermediate_size=1408, intermediate_size=10944,
          num_experts_per_tok=6), (64, 2048, 1408, 6)),
    (dict(text_config=dict(num_local_experts=16, hidden_size=5120, intermediate_size=8192, num_experts_per_tok=1)),
     (16, 5120, 8192, 1)),
])
def test_cli_shape_from_model_config(tmp_path, cfg, shape):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert cli.shape_from_model_config(str(tmp_path)) == shape
    assert cli.shape_from_model_config(str(tmp_path / "config.json")) == shape


@pytest.mark.parametrize("text, words", [
    ("{num_local_experts: 8}", ["is not valid JSON", "config.json"]),
    ("[8, 4096, 14336, 2]", ["holds a JSON list"]),
    ('{"num_local_experts": "eight", "hidden_size": 64}', ["num_local_experts is 'eight', not an integer"]),
    ('{"text_config": {"num_experts": {"a": 1}}}', ["num_experts is {'a': 1}, not an integer"]),
    ('{"num_local_experts": 0, "hidden_size": 64, "intermediate_size": 64, "num_experts_per_tok": 2}',
     ["E=0", "not one to tune"]),
    ('{"num_local_experts": 4, "hidden_size": 64, "intermediate_size": 64, "num_experts_per_tok": 6}',
     ["k=6", "k <= E"]),
])
def test_cli_tune_names_what_is_wrong_with_a_model_config(tmp_path, text, words):
    (tmp_path / "config.json").write_text(text)
    r = _run("tune", "--model-config", str(tmp_path))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert str(tmp_path / "config.json") in r.output and all(w in r.output for w in words), r.output


def test_cli_tune_shape_errors_name_the_option():
    for bad in ("8,4096", "a,b,c,d", "0,64,64,1", "2,64,64,3"):
        r = _run("tune", "--shape", bad)
        assert r.exit_code == 2 and "--shape" in r.output, r.output


def test_cli_shape_from_every_supported_architecture_config(tmp_path):
    """Each architecture names E, I and k its own way (ERNIE's moe_k, Hunyuan's moe_topk, a vision-language
    model's text_config): the shape read from its config.json is its experts module's and router's."""
    pytest.importorskip("transformers")
    from models import ARCH_NAMES, VISION_LANGUAGE_NAMES, tiny_config, tiny_model

    from experts_int8.integrations.transformers import _arch, find_experts, to_fused_layout

    for arch in ARCH_NAMES + VISION_LANGUAGE_NAMES:
        tiny_config(arch).save_pretrained(tmp_path / arch)
        model = tiny_model(arch)
        name, experts = find_experts(model)[0]
        e, h, i = to_fused_layout(_arch(model).layout, "down_proj", experts.down_proj).shape
        block = model.get_submodule(name.rpartition(".")[0])
        top_k = getattr(getattr(block, _arch(model).router), "top_k", None) or block.top_k  # (5.17's Jamba: block)
        assert cli.shape_from_model_config(str(tmp_path / arch)) == (e, h, i, top_k), arch


def test_cli_tunes_the_experts_in_their_form(tmp_path, monkeypatch):
    """A model config's experts are tuned in their own form, read from the model's modules: without a gate and
    ReLU² (NemotronH), clamped SwiGLU with biases (GPT-OSS), SiLU (Mixtral). An option that agrees is fine; one
    against the model's form is refused (it would tune a table the model never reads), naming what the model has."""
    pytest.importorskip("transformers")
    from models import tiny_config

    calls = []
    monkeypatch.setattr(tune, "tune", lambda *a, **k: calls.append((k["gated"], k["activation"], k["biases"])))
    for arch in ("nemotron_h", "gpt_oss", "mixtral"):
        tiny_config(arch).save_pretrained(tmp_path / arch)
        r = _run("tune", "--model-config", str(tmp_path / arch / "config.json"))
        assert r.exit_code == 0, r.output
        assert ("tuning that form" in r.output) == (arch != "mixtral")
    assert calls == [(False, "relu2", False), (True, "swiglu_oai", True), (True, "silu", False)]
    del calls[:]
    r = _run("tune", "--model-config", str(tmp_path / "gpt_oss"), "--activation", "swiglu_oai", "--biases")
    assert r.exit_code == 0 and calls[-1] == (True, "swiglu_oai", True)
    r = _run("tune", "--model-config", str(tmp_path / "mixtral" / "config.json"), "--activation", "gelu", "--biases")
    assert r.exit_code == 2 and len(calls) == 1
    assert "--activation gelu (its experts' is silu); --biases (its experts have none)" in r.output
    r = _run("tune", "--model-config", str(tmp_path / "mixtral"), "--no-gate")
    assert r.exit_code == 2 and "--no-gate (its experts have a gate)" in r.output and len(calls) == 1


@pytest.mark.parametrize("arch, says, clamp", [
    ("deepseek_v4", "clamped at 1", dict(swiglu_limit=1.0)),
    # (Step-3.7's tiny model: layer 1's experts clamp after the activation at 0.5)
    ("step3p7", "clamped at 0.5 after the activation", dict(swiglu_limit=0.5, limit_after_act=True)),
    ("minimax_m3_vl_text", "swiglu_oai, clamped at 1 (slope 1.702)", dict(swiglu_limit=1.0, swiglu_alpha=1.702)),
])
def test_cli_tunes_clamped_experts_with_their_clamp(tmp_path, monkeypatch, arch, says, clamp):
    """A model config whose experts clamp their SwiGLU: the candidates are timed and checked with that clamp."""
    pytest.importorskip("transformers")
    from models import tiny_config

    calls = []
    monkeypatch.setattr(tune, "tune", lambda *a, **k: calls.append(k["clamp"]))
    tiny_config(arch).save_pretrained(tmp_path / arch)
    r = _run("tune", "--model-config", str(tmp_path / arch))
    assert r.exit_code == 0, r.output
    assert f"the model's experts: {says}: tuning that form" in r.output
    assert calls == [clamp]


def test_tune_checks_the_clamp_before_any_work():
    with pytest.raises(ValueError, match="swiglu_alpha is swiglu_oai's sigmoid slope"):
        tune.tune(8, 64, 32, 2, clamp=dict(swiglu_limit=1.0, swiglu_alpha=1.5))


def test_cli_model_config_with_per_layer_shapes_says_to_tune_each(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(num_experts=64, hidden_size=4096, moe_topk=[8, 8],
                                                          moe_intermediate_size=[3072, 1536])))
    r = _run("tune", "--model-config", str(tmp_path))
    assert r.exit_code == 1 and "moe_intermediate_size differs between layers ([1536, 3072])" in r.output


def test_cli_model_config_without_experts_is_a_clean_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(hidden_size=576, intermediate_size=1536)))
    r = _run("tune", "--model-config", str(tmp_path))
    assert r.exit_code == 1 and "is not an MoE model config" in r.output


def test_shipped_tables_are_valid_configs():
    tables = sorted(configs.PACKAGE_DIR.glob("*.json"))
    assert tables, "the package ships tuned tables"
    for path in tables:
        raw = json.loads(path.read_text())
        assert raw and all(int(m) >= 1 for m in raw)
        for cfg in raw.values():
            configs.check_config(cfg)


def test_heuristics_fit_the_shared_memory_of_smaller_gpus():
    for m in (1, 64, 512, 8192):
        for dtype in (torch.int8, torch.bfloat16):
            cfg = configs.heuristic_config(m, 8, 2, dtype, "NVIDIA_A10")
            fitted = configs.fit_shared_memory(cfg, dtype.itemsize, 99 * 1024)  # sm_86: ~99 KB per block
            assert configs.pipeline_smem_bytes(fitted, dtype.itemsize) <= 99 * 1024
            assert fitted["num_stages"] >= 2 and fitted["BLOCK_SIZE_M"] == cfg["BLOCK_SIZE_M"]
            configs.check_config(fitted)
            # Hopper's 227 KB takes the defaults unchanged.
            assert configs.fit_shared_memory(cfg, dtype.itemsize, 227 * 1024) == cfg
    # Two stages are the floor (a pipeline); past it the K tiles shorten: 16x256 bf16 + 2 x 256x64 int8 a stage
    # is 40 KB, of which a decode block's two stages hold one (mma.sync: num_stages - 1 in shared memory), three
    # stages two; so 64 KB takes two stages of K tiles of 256, and 32 KB two stages of 128
    cfg = configs.heuristic_config(1, 8, 2, torch.int8, "NVIDIA_H200")
    assert (cfg["BLOCK_SIZE_K"], cfg["num_stages"]) == (256, 3)
    assert configs.fit_shared_memory(cfg, 1, 64 * 1024) == dict(cfg, num_stages=2)
    assert configs.fit_shared_memory(cfg, 1, 32 * 1024) == dict(cfg, num_stages=2, BLOCK_SIZE_K=128)
    # at ~99 KB the decode heuristics keep 3 stages (80 KB int8, 72 KB bf16 compiled for sm_86), not 2
    for dtype in (torch.int8, torch.bfloat16):
        cfg = configs.heuristic_config(1, 8, 2, dtype, "NVIDIA_A10")
        assert configs.fit_shared_memory(cfg, dtype.itemsize, 99 * 1024) == dict(cfg, num_stages=3)


def test_heuristic_decode_config_streams_long_int8_k_tiles():
    cfg = configs.heuristic_config(1, 8, 2, torch.int8, "NVIDIA_H200")
    assert cfg["BLOCK_SIZE_M"] == 16 and cfg["BLOCK_SIZE_K"] == 256
    prefill = configs.heuristic_config(4096, 8, 2, torch.int8, "NVIDIA_H200")
    gate_up, down = configs.split_config(prefill)
    assert gate_up["BLOCK_SIZE_N"] == 64 and down["BLOCK_SIZE_N"] == 128
    # by the rows each expert expects (M * k / E): up to 16 one 16-row block, then 32, 64 (int8 up to 256), 128
    rows = {m: configs.heuristic_config(m, 8, 2, torch.int8, "NVIDIA_H200")["BLOCK_SIZE_M"]
            for m in (64, 65, 128, 129, 1024, 1025)}
    assert rows == {64: 16, 65: 32, 128: 32, 129: 64, 1024: 64, 1025: 128}
    assert configs.heuristic_config(1025, 8, 2, torch.bfloat16, "NVIDIA_H200")["BLOCK_SIZE_M"] == 128
    assert configs.heuristic_config(129, 8, 2, torch.bfloat16, "NVIDIA_H200")["BLOCK_SIZE_M"] == 128


def test_int8_prefill_heuristic_runs_the_register_form_on_hopper(monkeypatch):
    """device_heuristic (no table): int8 weights on sm_90 take the register-form kernels (WSRR) over the Triton
    heuristic's blocks (which run where they do not apply) from HEURISTIC_WSRR_TILES' rows an expert on, on its
    tile for that many rows; fewer rows, other GPUs and float weights keep the Triton heuristic alone."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")
    monkeypatch.setattr(configs, "max_shared_memory", lambda index: 227 * 1024)
    (big_start, big), (small_start, small) = configs.HEURISTIC_WSRR_TILES
    assert big == 256 and small == 128 and small_start < big_start
    for major in (8, 9, 10):
        monkeypatch.setattr(configs, "compute_capability", lambda index, major=major: (major, 0))
        for rows, tile in ((big_start, 256), (big_start - 1, 128), (small_start, 128)):
            m = rows * 8 // 2  # that many rows an expert on E=8, k=2
            cfg = configs.device_heuristic(m, 8, 2, torch.int8, cuda)
            assert bool(cfg.get("WSRR")) == (major == 9)
            assert cfg.get("WSRR_ROWS", 256 if cfg.get("WSRR") else None) == (tile if major == 9 else None)
            assert configs.without(cfg, *configs.WSRR_KEYS) == configs.heuristic_config(m, 8, 2, torch.int8, "Fake_GPU")
            assert configs.check_config(cfg) == cfg
            assert "WSRR" not in configs.device_heuristic(m, 8, 2, torch.bfloat16, cuda)
        m = small_start * 8 // 2
        assert "WSRR" not in configs.device_heuristic(m - 4, 8, 2, torch.int8, cuda)  # one row an expert fewer


def test_table_key_takes_the_m_below_unless_its_blocks_are_too_short():
    small, big = dict(PINNED, BLOCK_SIZE_M=16), dict(PINNED, BLOCK_SIZE_M=128)
    table = {1: small, 16: small, 256: big, 4096: big}
    mixtral, qwen3 = (8, 2), (128, 8)  # (experts, top_k)
    assert configs.table_key(table, 1, *mixtral) == 1
    assert configs.table_key(table, 15, *mixtral) == 1
    assert configs.table_key(table, 64, *mixtral) == 16  # 16 rows per expert fit one 16-row block
    assert configs.table_key(table, 128, *mixtral) == 256  # 32 rows: M=16's blocks would read weights twice
    qwen3_table = {1: small, 16: small, 1024: big}
    assert configs.table_key(qwen3_table, 256, *qwen3) == 16  # 16 rows per expert of 128
    assert configs.table_key(qwen3_table, 512, *qwen3) == 1024  # 32 rows
    assert configs.table_key(table, 2048, *mixtral) == 256  # a prefill config (BLOCK_SIZE_M 128) keeps its M
    decode32 = {16: dict(PINNED, BLOCK_SIZE_M=32), 1024: big}
    assert configs.table_key(decode32, 128, *mixtral) == 16  # 32 rows fit one 32-row block
    assert configs.table_key(decode32, 256, *mixtral) == 1024  # 64 rows: two passes
    assert configs.table_key(table, 100000, *mixtral) == 4096  # nothing above: the largest
    assert configs.table_key({8: small}, 1, *mixtral) == 8  # nothing below: the smallest
    assert configs.table_key({64: big, 8: small, 4096: big}, 1, *mixtral) == 8
    rows64 = {16: dict(PINNED, BLOCK_SIZE_M=64), 1024: big}  # 64-row blocks are a prefill config: kept past them
    assert configs.table_key(rows64, 512, *mixtral) == 16


def test_library_commit_prefers_the_given_commit(monkeypatch):
    """A copied tree can carry a stale .git: an explicit EXPERTS_INT8_COMMIT wins."""
    monkeypatch.setenv("EXPERTS_INT8_COMMIT", "0123abcd")
    assert bench.library_commit() == ("0123abcd", None)


def test_split_k_variants_only_for_few_down_tiles():
    best = dict(PINNED, BLOCK_SIZE_N=64, down=dict(BLOCK_SIZE_N=64))
    # mixtral decode: 2 experts x 4096/64 tiles = 128 < 2 x 132 SMs -> try SPLIT_K 2 and 4 on the down GEMM
    variants = tune.split_k_variants(best, 1, 8, 4096, 2, num_sms=132)
    assert [v["down"]["SPLIT_K"] for v in variants] == [2, 4]
    assert all(v["down"]["BLOCK_SIZE_N"] == 64 and configs.check_config(v) for v in variants)
    assert tune.split_k_variants(best, 4096, 8, 4096, 2, num_sms=132) == []  # prefill: tiles enough
    assert tune.split_k_variants(variants[0], 1, 8, 4096, 2, num_sms=132) == []  # already split


def test_fuse_variants_for_int8_tensor_core_tiles_only():
    big = dict(PINNED, BLOCK_SIZE_M=128)
    assert tune.fuse_variants(big, "int8") == [dict(big, FUSE_GATE_UP=1)]
    assert configs.check_config(tune.fuse_variants(big, "int8")[0])
    assert tune.fuse_variants(big, "bf16") == []
    assert tune.fuse_variants(dict(big, SWAP_AB=1), "int8") == []
    assert tune.fuse_variants(dict(PINNED, BLOCK_SIZE_M=16), "int8") == []


def test_pairs_variants_where_pairs_rarely_share_an_expert():
    dedup = dict(PINNED, PAIRS=1, DEDUP_PAIRS=1)
    assert tune.pairs_variants(PINNED, 1, 8, 2) == [dict(PINNED, PAIRS=1)]  # M = 1: k distinct experts
    assert configs.check_config(tune.pairs_variants(PINNED, 2, 64, 6)[0])  # 12 pairs, 11.4 distinct
    assert tune.pairs_variants(PINNED, 2, 64, 6)[1] == dedup
    assert tune.pairs_variants(PINNED, 2, 8, 2) == [dedup]  # 4 pairs, 3.5 distinct on average: re-reads
    assert tune.pairs_variants(PINNED, 3, 128, 8) == [dedup]
    assert tune.pairs_variants(PINNED, 64, 128, 8) == []  # 512 pairs: past DEDUP_MAX_PAIRS
    assert tune.pairs_variants(dict(PINNED, BLOCK_SIZE_M=64), 8, 8, 2) == []  # not a decode winner
    assert tune.pairs_variants(dict(PINNED, PAIRS=1), 1, 8, 2) == []
    dedup_winner = tune.sum_topk_variants(dedup, 1, 8, 2)[0]  # SUM_TOPK excludes DEDUP_PAIRS
    assert "DEDUP_PAIRS" not in dedup_winner and configs.check_config(dedup_winner)
    with_sum = dict(PINNED, down={"SUM_TOPK": 1, "BLOCK_SIZE_N": 32})
    assert configs.check_config(tune.pairs_variants(with_sum, 4, 8, 2)[0])["down"] == {"BLOCK_SIZE_N": 32}
    assert tune.expected_distinct_experts(1, 8, 2) == pytest.approx(2)
    assert tune.expected_distinct_experts(2, 8, 2) == pytest.approx(3.5)


def test_without_drops_keys_at_both_levels():
    cfg = dict(PINNED, PAIRS=1, down={"SUM_TOPK": 1})
    assert configs.without(cfg, "PAIRS", "SUM_TOPK") == PINNED  # the emptied "down" goes too
    assert configs.without(dict(PINNED, down={"SPLIT_K": 2, "BLOCK_SIZE_N": 32}), "SPLIT_K") == dict(
        PINNED, down={"BLOCK_SIZE_N": 32})
    assert cfg["down"] == {"SUM_TOPK": 1}  # a copy: the argument is untouched


def test_dequant_variants_at_prefill_sizes_of_int8():
    float_cfg = dict(PINNED, BLOCK_SIZE_M=128)
    assert tune.dequant_variants(PINNED, 4096, "int8", float_cfg) == [dict(float_cfg, DEQUANT_ONCE=1)]
    assert configs.check_config(tune.dequant_variants(PINNED, 1024, "int8", float_cfg)[0])
    assert tune.dequant_variants(PINNED, 512, "int8", float_cfg) == []
    assert tune.dequant_variants(PINNED, 4096, "bf16", float_cfg) == []
    assert tune.dequant_variants(dict(PINNED, DEQUANT_ONCE=1), 4096, "int8", float_cfg) == []


def test_tma_variants_where_the_device_has_tma():
    cfg = dict(PINNED, down={"SPLIT_K": 2})
    both, down_only = tune.tma_variants(cfg, True)
    assert both == dict(cfg, TMA=1) and down_only == dict(PINNED, down={"SPLIT_K": 2, "TMA": 1})
    assert all(configs.check_config(v) == v for v in (both, down_only))
    assert tune.tma_variants(cfg, False) == []
    assert tune.tma_variants(both, True) == []
    assert tune.tma_variants(dict(cfg, GLUON=1), True) == []  # the Gluon kernels do not read the key
    float_cfg = dict(PINNED, BLOCK_SIZE_M=128)
    assert tune.dequant_variants(PINNED, 4096, "int8", float_cfg, True) == [
        dict(float_cfg, DEQUANT_ONCE=1), dict(float_cfg, DEQUANT_ONCE=1, TMA=1)]
    assert "TMA" in tune._short(both)


@pytest.mark.parametrize("blocks, inter, block_n, slots, sms", [
    (2, 14336, 64, 2, 132), (8, 768, 64, 1, 132), (6, 1408, 64, 2, 132), (2, 16384, 128, 1, 132), (16, 768, 32, 6, 132),
    (3, 100, 16, 4, 7), (1, 8, 32, 1, 132), (40, 5000, 128, 3, 20)])
def test_wave_tile_n_fills_whole_waves(blocks, inter, block_n, slots, sms):
    """TILE_N: no wider than the dot's tile, a multiple of 8 below it, and a grid of no more waves of
    ``slots`` programs a SM than BLOCK_SIZE_N-wide programs take, filling the last of them more."""
    import math
    tile_n = tune.wave_tile_n(blocks, inter, block_n, slots, sms)
    assert 8 <= tile_n <= block_n and (tile_n == block_n or tile_n % 8 == 0)
    capacity = slots * sms
    waves = math.ceil(blocks * math.ceil(inter / block_n) / capacity)
    programs = blocks * math.ceil(inter / tile_n)
    assert math.ceil(inter / block_n) * blocks <= programs <= waves * capacity
    # no wider multiple of 8 narrower than block_n would also fit those waves with more programs' worth of columns
    assert tile_n in (8, block_n) or blocks * math.ceil(inter / (tile_n - 8)) > waves * capacity
    if (blocks, inter, block_n, slots) == (2, 14336, 64, 2):  # 8x7b at M=1: 448 programs (1.7 waves) -> 512
        assert (tile_n, programs) == (56, 512)


def test_wave_variants_for_pairs_winners():
    pairs = dict(PINNED, BLOCK_SIZE_N=64, PAIRS=1)
    got = tune.wave_variants(pairs, 1, 2, 14336, 132)
    assert [v["TILE_N"] for v in got] == [56, 40] and all(configs.check_config(v) == v for v in got)
    assert tune.wave_variants(PINNED, 1, 2, 14336, 132) == []  # the align path's block count depends on routing
    for other in (dict(DEDUP_PAIRS=1), dict(TMA=1), dict(TILE_N=56)):
        assert tune.wave_variants(dict(pairs, **other), 1, 2, 14336, 132) == []
    assert tune.tma_variants(got[0], True) == []  # TMA loads whole tiles
    assert "TILE_N=56" in tune._short(got[0])


def test_late_epilogue_variants():
    got = tune.late_epilogue_variants(dict(PINNED, down=dict(SPLIT_K=2)))
    assert [(v["LATE_EPILOGUE"], v["down"].get("LATE_EPILOGUE")) for v in got] == [(1, None), (1, 0)]
    assert all(configs.check_config(v) == v and v["down"]["SPLIT_K"] == 2 for v in got)
    for other in (dict(LATE_EPILOGUE=1), dict(GLUON=1), dict(WSRR=1), dict(DEQUANT_ONCE=1)):
        assert tune.late_epilogue_variants(dict(PINNED, **other)) == []
    assert "LATE_EPILOGUE" in tune._short(got[0])  # the tuner's summary shows the key


def test_fp16_dot_variants_at_prefill_sizes_of_int8():
    assert tune.fp16_dot_variants(PINNED, 256, "int8") == [dict(PINNED, FP16_DOT=1)]
    assert configs.check_config(tune.fp16_dot_variants(dict(PINNED, GLUON=1), 2048, "int8")[0])
    assert tune.fp16_dot_variants(PINNED, 64, "int8") == []  # decode: a tie in the tuner's bursts
    # a search timed under the power cap (tune --warm-s) tries it at decode too, where it won 1-3% (item 233)
    assert tune.fp16_dot_variants(PINNED, 4, "int8", steady=True) == [dict(PINNED, FP16_DOT=1)]
    assert tune.fp16_dot_variants(PINNED, 4, "bf16", steady=True) == []
    assert tune.fp16_dot_variants(PINNED, 256, "bf16") == []
    assert tune.fp16_dot_variants(dict(PINNED, DEQUANT_ONCE=1), 4096, "int8") == []  # float weights
    assert tune.fp16_dot_variants(dict(PINNED, FP16_DOT=1), 256, "int8") == []


def test_tail_variants_at_prefill_sizes_where_the_path_takes_them():
    big = dict(PINNED, BLOCK_SIZE_M=128)
    assert [v["TAIL_ROWS"] for v in tune.tail_variants(big, 512, 2)] == [16, 32, 64]
    assert [v["TAIL_ROWS"] for v in tune.tail_variants(dict(PINNED, BLOCK_SIZE_M=64), 512, 2)] == [16, 32]
    assert tune.tail_variants(big, 128, 2) == []  # decode sizes
    assert tune.tail_variants(dict(big, PAIRS=1), 4096, 2) == []
    assert tune.tail_variants(dict(big, DEQUANT_ONCE=1), 4096, 2) == []
    assert tune.tail_variants(dict(big, TAIL_ROWS=32), 4096, 2) == []


def test_tail_config_is_the_small_entry_even_under_an_override(monkeypatch):
    """The tail pass of a TAIL_ROWS candidate runs the table's entry for TAIL_ENTRY_ROWS rows an expert
    (16 unless the entry says), not the forced main entry, without decode modes or main-pass keys."""
    asked = []
    entry = dict(PINNED, PAIRS=1, GLUON=1, WSRR=1, TAIL_ROWS=8, down=dict(SUM_LAST=1))
    monkeypatch.setattr(configs, "_lookup", lambda m, *a: asked.append(m) or (dict(entry), None))
    main = dict(PINNED, BLOCK_SIZE_M=128, TAIL_ROWS=32)
    with configs.override_config(main):
        got = configs.tail_config(main, 8, 256, 2, torch.int8, torch.device("cpu"))
        configs.tail_config(dict(main, TAIL_ENTRY_ROWS=128), 8, 256, 2, torch.int8, torch.device("cpu"))
    assert asked == [16 * 8 // 2, 128 * 8 // 2]
    assert got == dict(PINNED, GLUON=1)  # the Gluon kernels may run the tail pass; not WSRR or a decode mode


def test_swap_variants_for_decode_winners_only():
    cfg = dict(PINNED, BLOCK_SIZE_M=16, down={"BLOCK_SIZE_K": 256})
    swapped = tune.swap_variants(cfg)
    assert [c.get("SWAP_AB") for c in swapped] == [1, 1]
    assert swapped[1]["down"] == {"BLOCK_SIZE_K": 256, "SWAP_AB": 0}  # gate_up swapped, down not
    assert all(configs.check_config(c) == c for c in swapped)
    assert tune.swap_variants(dict(PINNED, BLOCK_SIZE_M=64)) == []
    assert tune.swap_variants(swapped[0]) == []


def test_down_tile_variants_give_the_down_gemm_its_own_tile_at_decode():
    cfg = dict(PINNED, BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, down={"SUM_LAST": 1}, PAIRS=1)
    variants = tune.down_tile_variants(cfg, 1, tune.DEFAULT_SMEM)
    assert [v["down"] for v in variants] == [{"SUM_LAST": 1, "BLOCK_SIZE_N": n} for n in (64, 128, 256)]
    assert all(v["BLOCK_SIZE_N"] == 32 and configs.check_config(v) == v for v in variants)  # gate_up as it was
    own = dict(cfg, down={"BLOCK_SIZE_N": 128})
    assert [v["down"]["BLOCK_SIZE_N"] for v in tune.down_tile_variants(own, 1, tune.DEFAULT_SMEM)] == [64, 256]
    assert tune.down_tile_variants(dict(PINNED, BLOCK_SIZE_M=64), 1, tune.DEFAULT_SMEM) == []  # prefill: not here


def test_down_tile_variants_offer_the_tiles_that_fit_shared_memory():
    """The 256-wide down tile of a 16 x 64 x 256 int8 decode winner in 4 stages takes 216 KB compiled for sm_90
    (three stages of 16 x 256 bf16 + 256 x 256 int8: mma.sync keeps num_stages - 1 of them), which fits Hopper's
    227 KB; in bf16 weights (408 KB), or on a GPU of ~99 KB, it does not, nor does the 128-wide one there (120 KB)."""
    best = dict(PINNED, BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, num_stages=4)
    down = configs.split_config(configs.with_down(best, BLOCK_SIZE_N=256))[1]
    assert tune.smem_bytes(down, 1, weight_tiles=1) - 221184 in range(0, 129)  # 216 KB, as compiled
    assert [v["down"] for v in tune.down_tile_variants(best, 1, tune.DEFAULT_SMEM)] == [
        dict(BLOCK_SIZE_N=128), dict(BLOCK_SIZE_N=256)]
    assert [v["down"] for v in tune.down_tile_variants(best, 2, tune.DEFAULT_SMEM)] == [dict(BLOCK_SIZE_N=128)]
    assert tune.down_tile_variants(best, 1, 99 * 1024) == []


def test_tune_candidates_fit_the_shared_memory_of_smaller_gpus():
    """On sm_86/sm_89 (~99 KB a block) the heuristic is timed as get_config fits it, not as Hopper takes it (bf16
    decode's 16x64x128 in 4 stages compiles to 108 KB there: a candidate that cannot launch); where get_config
    serves that fitted heuristic (no table), it is one candidate, not two."""
    limit = 99 * 1024
    for m in (1, 64, 4096):
        for wdtype in (torch.int8, torch.bfloat16):
            fitted = configs.fit_shared_memory(configs.heuristic_config(m, 8, 2, wdtype, "cuda"), wdtype.itemsize,
                                               limit)
            for default in (None, fitted):
                cands = tune.candidate_configs(m, 8, 4096, 14336, 2, wdtype, smem_limit=limit, default=default)
                assert cands[0] == fitted and fitted not in cands[1:]
                assert all(tune.smem_bytes(c, wdtype.itemsize) <= limit for c in cands)


def test_tune_candidates_start_from_the_config_serving_m():
    current = dict(PINNED, BLOCK_SIZE_M=16, SWAP_AB=1, down={"SWAP_AB": 0})
    cands = tune.candidate_configs(1, 8, 4096, 14336, 2, torch.int8, max_candidates=8, default=current)
    assert cands[0] == current and current not in cands[1:]
    heuristic = configs.heuristic_config(1, 8, 2, torch.int8, "cuda")
    assert cands[1] == heuristic and heuristic not in cands[2:]  # the heuristic is always timed too
    assert tune.candidate_configs(1, 8, 4096, 14336, 2, torch.int8, max_candidates=8)[0] == heuristic



def test_bench_routing_draws_are_seeded_and_vary_at_decode_sizes():
    """Both weight formats route the same draws (seeded by M, E, k and the draw); at decode sizes a row cycles
    through several, so its time and the table tuned on it are not one draw's luck: on the single draw the
    rows used, two tokens of jamba's shape (top-2 of 16) shared no expert, which a quarter of steps do."""
    a, b = bench.routing_draws(2, 16, 2, device="cpu"), bench.routing_draws(2, 16, 2, device="cpu")
    assert len(a) == bench.ROUTING_DRAWS > 1
    assert all(torch.equal(wa, wb) and torch.equal(ia, ib) for (wa, ia), (wb, ib) in zip(a, b))
    assert len({tuple(ids.flatten().tolist()) for _, ids in a}) > 1  # the draws differ
    assert {bench.distinct_experts(ids) for _, ids in a} == {3, 4}  # (some draws share an expert)
    assert not torch.equal(bench.routing_draws(3, 16, 2, device="cpu")[0][1][:2], a[0][1])
    # past the decode sizes every draw hits (nearly) every expert: one draw, as before
    big = bench.routing_draws(bench.DRAWS_UP_TO_M * 2, 8, 2, device="cpu")
    assert len(big) == 1 and bench.distinct_experts(big[0][1]) == 8
    # draw 0 keeps the seed of the one-draw rows ("M,E,k"), so rows past the decode sizes route as results
    # recorded before the draws did; later draws add their index
    for m, draw in ((2, 0), (2, 1), (bench.DRAWS_UP_TO_M * 2, 0)):
        seed = f"{m},16,2" + (f",{draw}" if draw else "")
        logits = torch.randn(m, 16, generator=torch.Generator().manual_seed(zlib.crc32(seed.encode())))
        want_w, want_ids = experts_int8.select_experts(logits, 2)
        got_w, got_ids = bench.routing_draws(m, 16, 2, device="cpu")[draw]
        assert torch.equal(got_ids, want_ids) and torch.equal(got_w, want_w)


def test_bench_calls_cycle_the_layers_and_the_draws_apart(monkeypatch):
    """Every replay takes each draw equally often whatever the pool's layers (an int8 pool holds twice a bf16
    one's), so both formats of a row do the same work."""
    seen = []
    layers = [types.SimpleNamespace(w13=n, w2=None, w13_scale=None, w2_scale=None, w13_bias=None, w2_bias=None)
              for n in range(3)]
    routing = [(None, d) for d in range(4)]
    calls = bench.calls_per_graph(len(layers), floor_s=1e-3, draws=len(routing))
    assert calls == 12  # one sweep of both: lcm(3, 4)
    monkeypatch.setattr(experts_int8.ops, "fused_experts",
                        lambda x, w13, w2, weights, ids, **kw: seen.append((w13, ids)))
    bench._layer_calls(None, layers, routing, calls)()
    assert sorted(seen) == sorted((n, d) for n in range(3) for d in range(4))  # every pairing once
    for num_layers in (1, 2, 3, 6, 7):
        n = bench.calls_per_graph(num_layers, floor_s=1e-6, draws=16)
        assert n % 16 == 0 and n % num_layers == 0
    # a row's plan, as the bench, the tuner and the A/B script take it: the draws' mean experts, whole sweeps
    draws = bench.routing_draws(2, 16, 2, device="cpu")
    plan = dict(m=2, top_k=2, dtype="int8", copy_bytes_per_s=4e12, matmul_flops_per_s=8e14)
    distinct, n = bench.row_plan(draws, 3, hidden=4096, inter=14336, **plan)
    assert distinct == sum(bench.distinct_experts(ids) for _, ids in draws) / len(draws)
    assert n == 48  # lcm(3 layers, 16 draws): one sweep of both already lasts past 1 ms
    assert bench.row_plan(draws, 3, hidden=64, inter=32, **plan)[1] == 96  # tiny calls: sweeps up to 128 calls


def test_pdl_only_on_cuda_devices_of_capability_9(monkeypatch):
    cuda, form2 = torch.device("cuda", 0), dict(PINNED, PDL=2)
    monkeypatch.setattr(fused_moe, "_capability", lambda device: (9, 0))
    assert fused_moe.pdl_meta(PINNED, cuda) == {"PDL": 0}  # the entry's key: off without it
    assert fused_moe.pdl_meta(form2, cuda) == {"PDL": 2, "launch_pdl": True}
    assert fused_moe.pdl_meta(dict(PINNED, PDL=1), cuda) == {"PDL": 1, "launch_pdl": True}
    assert fused_moe.pdl_meta(form2, torch.device("cpu")) == {"PDL": 0}  # the interpreter ignores it
    assert fused_moe.pdl_supported(cuda) and not fused_moe.pdl_supported(torch.device("cpu"))
    monkeypatch.setattr(fused_moe, "_capability", lambda device: (8, 9))
    assert fused_moe.pdl_meta(form2, cuda) == {"PDL": 0} and not fused_moe.pdl_supported(cuda)


def test_device_capability_is_asked_once_a_gpu(monkeypatch):
    """The launchers ask it on every call (PDL, TMA, the align kernel's trigger): one query a device."""
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (9, 0))
    fused_moe._capability_of.cache_clear()
    try:
        for _ in range(3):
            assert fused_moe._capability(torch.device("cuda", 1)) == (9, 0)
        assert asked == [1]
    finally:
        fused_moe._capability_of.cache_clear()


@pytest.mark.parametrize("bad, words", [(dict(PDL=3), "0 .off., 1 or 2"), (dict(PDL=1, GLUON=1), "Triton GEMMs")])
def test_pdl_config_key_is_checked(bad, words):
    from experts_int8.kernels.configs import check_config

    assert check_config(dict(PINNED, PDL=2))["PDL"] == 2
    with pytest.raises(ValueError, match=words):
        check_config(dict(PINNED, **bad))


def test_pdl_variants_at_decode_sizes_on_the_triton_kernels():
    assert tune.pdl_variants(PINNED, m=2, top_k=2, pdl_ok=True) == [dict(PINNED, PDL=1), dict(PINNED, PDL=2)]
    assert tune.pdl_variants(PINNED, m=2, top_k=2, pdl_ok=False) == []  # before sm_90
    assert tune.pdl_variants(PINNED, m=16, top_k=8, pdl_ok=True) != []  # 128 pairs: still decode
    assert tune.pdl_variants(PINNED, m=256, top_k=2, pdl_ok=True) == []  # prefill: nothing to gain
    with_form = dict(PINNED, PDL=2)  # already a form: the down GEMM's early wait with one K tile asked of L2
    assert tune.pdl_variants(with_form, m=1, top_k=8, pdl_ok=True) == [dict(with_form, down={"PDL_PREFETCH": 1})]
    assert configs.check_config(dict(with_form, down={"PDL_PREFETCH": 1}))
    assert tune.pdl_variants(dict(with_form, down={"PDL_PREFETCH": 1}), m=1, top_k=8, pdl_ok=True) == []
    assert tune.pdl_variants(dict(PINNED, GLUON=1), m=1, top_k=8, pdl_ok=True) == []  # other kernels


def test_sum_topk_variants_where_pairs_fit():
    cfg = dict(PINNED, BLOCK_SIZE_M=16, down={"SPLIT_K": 4, "BLOCK_SIZE_K": 64})
    (v,) = tune.sum_topk_variants(cfg, 1, 8, 2)
    assert v["PAIRS"] == 1 and v["down"] == {"BLOCK_SIZE_K": 64, "SUM_TOPK": 1}  # SPLIT_K dropped
    assert configs.check_config(v) == v
    assert tune.sum_topk_variants(cfg, 2, 8, 2) == []  # pairs share experts: re-reads
    assert tune.sum_topk_variants(cfg, 1, 8, 1) == []  # nothing to sum
    assert tune.sum_topk_variants(v, 1, 8, 2) == []


def test_split_k_variants_not_with_sum_topk():
    cfg = dict(PINNED, BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, PAIRS=1)  # 2 experts x 64 tiles < 2 x 132 SMs
    assert [v["down"]["SPLIT_K"] for v in tune.split_k_variants(cfg, 1, 8, 4096, 2, 132)] == [2, 4]
    assert tune.split_k_variants(dict(cfg, down={"SUM_TOPK": 1}), 1, 8, 4096, 2, 132) == []


def test_refresh_tables_folds_measurements_and_keeps_tables_loadable(tmp_path, monkeypatch):
    import runpy
    import sys

    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    faster = dict(base, num_stages=4)
    table = {"1": dict(base, PAIRS=1, down={"SUM_TOPK": 1}), "2": dict(base, PAIRS=1, down={"SUM_TOPK": 1}),
             "4": dict(base, PAIRS=1, DEDUP_PAIRS=1), "16": base}
    name = configs.table_name(8, 14336, "Fake_GPU", "int8_w8a16")
    (tmp_path / name).write_text(json.dumps(table))
    row = dict(E=8, H=4096, I=14336, k=2, dtype="int8")
    runs = [dict(gpu="Fake GPU", rows=[dict(row, M=16, config=base, roofline_frac=0.80)]),
            dict(gpu="Fake GPU", rows=[dict(row, M=16, config=faster, roofline_frac=0.90)])]
    paths = []
    for j, run in enumerate(runs):
        paths.append(tmp_path / f"run{j}.json")
        paths[-1].write_text(json.dumps(run))
    script = str(Path(__file__).parent.parent / "benchmarks" / "refresh_tables.py")
    monkeypatch.setattr(sys, "argv", [script, *map(str, paths), "--tables", str(tmp_path)])
    runpy.run_path(script, run_name="__main__")
    got = json.loads((tmp_path / name).read_text())
    assert got["16"] == faster  # measured 10 points faster than the entry's own config
    assert got["1"] == table["1"]  # M = 1: pairs never share an expert
    assert got["2"] == base  # M = 2 on 8 experts: PAIRS dropped, and SUM_TOPK with it
    assert got["4"] == table["4"]  # DEDUP_PAIRS reads each expert once: kept
    assert all(configs.check_config(cfg) == cfg for cfg in got.values())


def test_gluon_variants_at_prefill_sizes_of_int8_where_gluon_runs():
    from experts_int8 import ops
    from experts_int8 import tune as tune_module

    if ops.gluon_moe is None:
        pytest.skip("this Triton has no Gluon")
    smem = 227 * 1024
    base = dict(PINNED, BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_stages=4,
                DEQUANT_ONCE=1)
    variants = tune_module.gluon_variants(base, 1024, 2, "int8", True, smem)
    assert variants[0] == dict(configs.without(base, "DEQUANT_ONCE", "num_stages"), num_stages=3, GLUON=1,
                               FUSE_GATE_UP=1)
    assert [(v["BLOCK_SIZE_M"], v["BLOCK_SIZE_N"], v["num_warps"], v["num_stages"]) for v in variants[1:]] == [
        (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 3)]
    for v in variants:  # valid entries the Gluon kernels take, gate and up as one wgmma, none dequantizing first
        assert configs.check_config(v) == v and v["GLUON"] == 1 and v["FUSE_GATE_UP"] == 1 and "DEQUANT_ONCE" not in v
        assert ops.gluon_moe.blocks_ok(v, smem) and v["GROUP_SIZE_M"] == 16
    # the 8-warp tiles' rings (160 and 192 KB) do not fit 128 KB of shared memory; the others' (80, 104 KB) do
    assert tune_module.gluon_variants(base, 1024, 2, "int8", True, 128 * 1024) == [variants[0], variants[3]]
    assert tune_module.gluon_variants(base, 255, 2, "int8", True, smem) == []  # decode and small prefill
    assert tune_module.gluon_variants(base, 1024, 2, "bf16", True, smem) == []
    assert tune_module.gluon_variants(base, 1024, 2, "int8", False, smem) == []  # not sm_90
    # an entry already on the Gluon kernels: the other tiles only
    assert tune_module.gluon_variants(variants[1], 1024, 2, "int8", True, smem) == [variants[2], variants[3]]
    assert tune_module.gluon_variants(variants[0], 1024, 2, "int8", True, smem) == variants[1:]
    # a swapped winner's blocks go to the Gluon kernels unswapped (they have no swapped form)
    assert "SWAP_AB" not in tune_module.gluon_variants(dict(base, SWAP_AB=1), 1024, 2, "int8", True, smem)[0]
    # experts without a gate: the same tiles, then each twice as wide in gate_up (one accumulator, one tile)
    ungated = tune_module.gluon_variants(base, 1024, 2, "int8", True, smem, gated=False)
    assert ungated[:4] == variants
    assert [(v["BLOCK_SIZE_N"], v["num_warps"], v["down"]["BLOCK_SIZE_N"]) for v in ungated[4:]] == [
        (256, 8, 256), (256, 8, 256), (128, 4, 128)]
    assert all(ops.gluon_moe.blocks_ok(v, smem, gated=False) for v in ungated)
    assert not any(ops.gluon_moe.blocks_ok(v, smem) for v in ungated[4:])  # too wide for gate and up


def test_sum_last_variants_at_decode_sizes():
    from experts_int8 import tune as tune_module

    pairs = dict(PINNED, PAIRS=1, down={"SPLIT_K": 2})
    got = tune_module.sum_last_variants(pairs, 1, 8, 2)  # the winner's split first, then the others
    assert [v["down"] for v in got] == [{"SUM_LAST": 1, "SPLIT_K": 2}, {"SUM_LAST": 1},
                                        {"SUM_LAST": 1, "SPLIT_K": 4}]
    assert all(v["PAIRS"] == 1 and configs.without(v, "SUM_LAST", "SPLIT_K") == dict(PINNED, PAIRS=1) for v in got)
    summed = dict(PINNED, PAIRS=1, down={"SUM_TOPK": 1})  # SUM_TOPK gives way
    assert tune_module.sum_last_variants(summed, 1, 8, 2)[0] == dict(PINNED, PAIRS=1, down={"SUM_LAST": 1})
    assert tune_module.sum_last_variants(PINNED, 1, 8, 2)[0] == dict(PINNED, PAIRS=1, down={"SUM_LAST": 1})
    # experts shared: PAIRS does not fit, PAIRS + DEDUP_PAIRS does (align and sum launches both gone)
    assert tune_module.sum_last_variants(PINNED, 16, 8, 2)[0] == dict(PINNED, PAIRS=1, DEDUP_PAIRS=1,
                                                                       down={"SUM_LAST": 1})
    # and on the align path itself, with the winner's split (2 where it has none)
    assert [v for v in tune_module.sum_last_variants(PINNED, 16, 8, 2) if not v.get("PAIRS")] == [
        dict(PINNED, down={"SUM_LAST": 1}), dict(PINNED, down={"SUM_LAST": 1, "SPLIT_K": 2})]
    assert [v for v in tune_module.sum_last_variants(dict(PINNED, down={"SPLIT_K": 4}), 100, 8, 2)
            if not v.get("PAIRS")] == [dict(PINNED, down={"SUM_LAST": 1, "SPLIT_K": 4})]
    assert tune_module.sum_last_variants(PINNED, 200, 8, 2) == []  # 400 pairs: past DEDUP_MAX_PAIRS
    assert tune_module.sum_last_variants(dict(PINNED, BLOCK_SIZE_M=64), 16, 8, 2) == []  # a prefill block
    deduped = tune_module.sum_last_variants(dict(pairs, DEDUP_PAIRS=1), 4, 64, 6)
    assert [v["down"] for v in deduped][0] == {"SUM_LAST": 1, "SPLIT_K": 2} and all(v["DEDUP_PAIRS"] for v in deduped)
    # one expert per token: only a split of I leaves something to add
    assert [(v.get("PAIRS"), v["down"]) for v in tune_module.sum_last_variants(PINNED, 1, 8, 1)] == [
        (1, {"SUM_LAST": 1, "SPLIT_K": 2}), (1, {"SUM_LAST": 1, "SPLIT_K": 4}), (None, {"SUM_LAST": 1, "SPLIT_K": 2})]
    for v in got + deduped + tune_module.sum_last_variants(summed, 1, 8, 2):
        assert configs.check_config(v) == v and tune_module.sum_last_variants(v, 1, 8, 2) == []


def test_user_config_dir_expands_the_home_folder(monkeypatch):
    """A quoted EXPERTS_INT8_CACHE='~/foo' reaches the process unexpanded: it named a folder called '~'."""
    home = os.path.expanduser("~")
    monkeypatch.setenv("EXPERTS_INT8_CACHE", "~/foo")
    assert configs.user_config_dir() == Path(home, "foo", "configs")
    monkeypatch.delenv("EXPERTS_INT8_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert configs.user_config_dir() == Path(home, "xdg", "experts_int8", "configs")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert configs.user_config_dir() == Path(home, ".cache", "experts_int8", "configs")


def test_fold_ab_folds_only_measured_winners(tmp_path, monkeypatch):
    """benchmarks/fold_ab.py: a variant that ran >= 2% faster than the shipped entry replaces it; one
    that did not run on its kernels, a gain under 2%, or a row whose baseline failed its check, not."""
    import runpy
    import sys

    base = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)
    name = configs.table_name(8, 14336, "Fake_GPU", "int8_w8a16")
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    tables = configs.user_config_dir()
    tables.mkdir(parents=True)
    (tables / name).write_text(json.dumps({"1024": base, "2048": base, "4096": base}))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")
    configs.clear_table_cache()
    row = dict(shape="mixtral-8x7b", dtype="int8")
    ab = dict(variant="gluon", values=[0, 2, 3], rows=[
        dict(row, M=1024, **{"gluon=0_us": 100.0, "gluon=2_us": 90.0, "gluon=2_ran": True, "gluon=3_us": 95.0,
                             "gluon=3_ran": True}),
        dict(row, M=2048, **{"gluon=0_us": 100.0, "gluon=2_us": 99.0, "gluon=2_ran": True, "gluon=3_us": 80.0,
                             "gluon=3_ran": False}),
        dict(row, M=4096, **{"gluon=0_wrong": "differs", "gluon=2_us": 50.0, "gluon=2_ran": True})])
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    script = str(Path(__file__).parent.parent / "benchmarks" / "fold_ab.py")
    # (A/B files that do not record the entries they timed: the variant re-applied to the current entry)
    argv = [script, str(tmp_path / "ab.json"), "--out-dir", str(tables), "--unrecorded-base"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="1 round"):  # one round's noise alone: refused
        runpy.run_path(script, run_name="__main__")
    monkeypatch.setattr(sys, "argv", argv + ["--allow-few-rounds"])
    runpy.run_path(script, run_name="__main__")
    got = json.loads((tables / name).read_text())
    assert got["1024"] == dict(base, num_stages=3, GLUON=1)  # 3 stages on the Gluon kernels: 10% faster
    assert got["2048"] == base and got["4096"] == base
    (tmp_path / "ab.json").write_text(json.dumps(dict(ab, values=[2, 3])))  # no shipped baseline: refused
    with pytest.raises(SystemExit):
        runpy.run_path(script, run_name="__main__")
    # an A/B of rounds: a median 10% faster whose slowest round overlaps the baseline's fastest is noise
    (tables / name).write_text(json.dumps({"1024": base, "2048": base, "4096": base}))
    configs.clear_table_cache()
    rounds = dict(variant="gluon", values=[0, 2], rows=[
        dict(row, M=1024, **{"gluon=0_us": 100.0, "gluon=0_us_rounds": [100.0, 96.0, 104.0], "gluon=2_us": 90.0,
                             "gluon=2_us_rounds": [90.0, 88.0, 97.0], "gluon=2_ran": True}),
        dict(row, M=2048, **{"gluon=0_us": 100.0, "gluon=0_us_rounds": [100.0, 96.0, 104.0], "gluon=2_us": 90.0,
                             "gluon=2_us_rounds": [90.0, 88.0, 95.0], "gluon=2_ran": True})])
    (tmp_path / "ab.json").write_text(json.dumps(rounds))
    monkeypatch.setattr(sys, "argv", argv)  # (three rounds: no flag needed)
    runpy.run_path(script, run_name="__main__")
    got = json.loads((tables / name).read_text())
    assert got["1024"] == base and got["2048"] == dict(base, num_stages=3, GLUON=1)
    configs.clear_table_cache()


def test_fold_ab_writes_the_entry_the_ab_timed_onto_the_entry_it_started_from(tmp_path, monkeypatch, capsys):
    """benchmarks/fold_ab.py writes the entry the A/B timed for the winning value (variant_ab.py records it with
    the entry it started from), and only where the table still serves that entry: a table changed since the A/B
    (another variant folded first, a tune) would get the variant on top of the change, a combination never
    timed (PDL 2 on an entry that had since taken SPLIT_K 2, say). An A/B from another GPU is refused, and so is
    one that records no entries (unless --unrecorded-base)."""
    import runpy
    import sys

    base = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    split = configs.with_down(base, SPLIT_K=2)  # M=4's entry after a split_k fold that came after the pdl A/B
    name = configs.table_name(8, 14336, "Fake_GPU", "int8_w8a16")
    monkeypatch.setenv("EXPERTS_INT8_CACHE", str(tmp_path))
    tables = configs.user_config_dir()
    tables.mkdir(parents=True)
    (tables / name).write_text(json.dumps({"2": base, "4": split}))
    monkeypatch.setattr(configs, "device_name", lambda device=None: "Fake_GPU")
    configs.clear_table_cache()
    row = dict(shape="mixtral-8x7b", dtype="int8", base_config=base)
    timed = {"pdl=0_us": 100.0, "pdl=1_us": 99.0, "pdl=2_us": 90.0, "pdl=0_config": base,
             "pdl=1_config": dict(base, PDL=1), "pdl=2_config": dict(base, PDL=2)}
    ab = dict(variant="pdl", values=[0, 1, 2], gpu="Fake GPU", rows=[dict(row, M=2, **timed), dict(row, M=4, **timed)])
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    script = str(Path(__file__).parent.parent / "benchmarks" / "fold_ab.py")
    monkeypatch.setattr(sys, "argv", [script, str(tmp_path / "ab.json"), "--out-dir", str(tables),
                                      "--allow-few-rounds"])
    try:
        runpy.run_path(script, run_name="__main__")
        got = json.loads((tables / name).read_text())
        assert got["2"] == dict(base, PDL=2)  # the entry timed 10% faster
        assert got["4"] == split  # not PDL 2 on SPLIT_K 2, which nobody timed
        assert "no longer the one the A/B started from" in capsys.readouterr().out
        (tables / name).write_text(json.dumps({"2": base, "4": split}))
        configs.clear_table_cache()
        (tmp_path / "ab.json").write_text(json.dumps(dict(ab, gpu="NVIDIA H100 80GB HBM3")))
        with pytest.raises(SystemExit, match="ran on NVIDIA H100"):
            runpy.run_path(script, run_name="__main__")
        legacy = [{key: v for key, v in r.items() if not key.endswith("config")} for r in ab["rows"]]
        (tmp_path / "ab.json").write_text(json.dumps(dict(ab, rows=legacy)))
        with pytest.raises(SystemExit, match="does not record"):
            runpy.run_path(script, run_name="__main__")
        assert json.loads((tables / name).read_text()) == {"2": base, "4": split}
    finally:
        configs.clear_table_cache()


@pytest.mark.parametrize("programs,block", [(1, 64), (3, 64), (7, 128), (64, 64)])
def test_stream_floor_reads_every_element_once(programs, block):
    """benchmarks/stream_floor.py's read kernel: the chunks tile the buffer exactly (an uneven tail, more
    programs than blocks), so the time it reports is for reading those bytes, no more, no fewer."""
    import runpy

    script = str(Path(__file__).parent.parent / "benchmarks" / "stream_floor.py")
    floor = runpy.run_path(script, run_name="stream_floor")
    src = torch.randint(-1000, 1000, (1000,), dtype=torch.int32, device=DEVICE)
    out = torch.zeros(programs, dtype=torch.int32, device=DEVICE)
    floor["stream_read"](src, out, programs, block, 4)
    assert int(out.sum()) == int(src.sum())
    chunk = -(-(-(-src.numel() // programs)) // block) * block
    for p in range(programs):
        assert int(out[p]) == int(src[p * chunk:(p + 1) * chunk].sum())


@pytest.mark.parametrize("m, top_k, tiles", [
    (1, 2, ((32, 64, 4), (16, 64, 4, 1))),
    (3, 2, ((16, 32, 4), (16, 32, 4, 3))),  # I and H not multiples of the tiles; an uneven split of I
    (2, 1, ((64, 128, 4), (32, 128, 4, 2)))])
def test_gemv_decode_probe_matches_the_reference(m, top_k, tiles):
    """benchmarks/gemv_decode_probe.py: the two GEMV launches and the sum compute the layer (SiLU(gate)
    * up, per-row scales, routing weights on the output, splits of I), rows and K tails masked, with
    either int8 -> fp32 conversion (both exact: the layer matches the reference to 1e-4)."""
    import runpy

    probe = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "gemv_decode_probe.py"),
                           run_name="gemv_decode_probe")
    gen = torch.Generator().manual_seed(m * 10 + top_k)
    e, h, i = 4, 80, 72
    w13, s13 = experts_int8.quantize_weights(torch.randn(e, 2 * i, h, generator=gen) / h ** 0.5)
    w2, s2 = experts_int8.quantize_weights(torch.randn(e, h, i, generator=gen) / i ** 0.5)
    x = torch.randn(m, h, generator=gen)
    weights, ids = experts_int8.select_experts(torch.randn(m, e, generator=gen), top_k)
    layer = probe["bench"].Layer(w13.to(DEVICE), w2.to(DEVICE), s13.to(DEVICE), s2.to(DEVICE))
    want = reference.fused_experts(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)
    for bit_trick in (True, False):  # the integer-add conversion and plain int8 -> fp32
        got = probe["gemv_layer"](x.to(DEVICE), layer, weights.to(DEVICE), ids.to(DEVICE), tiles, bit_trick).cpu()
        assert ((got - want).norm() / want.norm()).item() < 1e-4


def test_down_pipeline_variants_change_only_the_down_gemm():
    """At decode the down GEMM gets its own depth or K tile; gate_up's stay, the down GEMM's other
    overrides stay, what does not fit shared memory is not offered, prefill and other kernels get none."""
    from experts_int8 import tune as tune_module

    best = dict(PINNED, BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, num_stages=4, PDL=2,
                down={"SUM_LAST": 1})
    got = tune_module.down_pipeline_variants(best, 1, tune_module.DEFAULT_SMEM)
    assert [v["down"] for v in got] == [dict(SUM_LAST=1, num_stages=s) for s in (2, 3, 5)] + [
        dict(SUM_LAST=1, BLOCK_SIZE_K=k) for k in (64, 128)]
    assert all(configs.split_config(v)[0] == configs.split_config(best)[0] for v in got)  # gate_up as it was
    assert all(configs.check_config(v) == v for v in got)
    # 16 x 256 activation + 256 x 256 bf16 weight tiles: 136 KB a stage, of which a decode block's pipeline holds
    # num_stages - 1 (mma.sync), so 2 stages fit 200 KB and 3 do not; a K tile of 64 takes 34 KB a stage, its
    # 4 stages fit (102 KB), one of 128 68 KB a stage (204 KB) does not
    wide = dict(best, down={"BLOCK_SIZE_N": 256})
    assert [v["down"] for v in tune_module.down_pipeline_variants(wide, 2, 200 * 1024)] == [
        dict(BLOCK_SIZE_N=256, num_stages=2), dict(BLOCK_SIZE_N=256, BLOCK_SIZE_K=64)]
    assert tune_module.down_pipeline_variants(dict(best, BLOCK_SIZE_M=64), 1, tune_module.DEFAULT_SMEM) == []
    assert tune_module.down_pipeline_variants(dict(best, GLUON=1), 1, tune_module.DEFAULT_SMEM) == []


def test_refine_variants_of_shipped_entries_are_valid_configs():
    """Every variant the tuner derives from a winner (here: every shipped entry, at the shapes' top-k
    and hidden sizes) is a valid config: an invalid one would only be skipped at tuning time, as a
    ValueError, and never timed (SUM_TOPK on a SUM_LAST winner was, before it dropped SUM_LAST)."""
    from experts_int8 import tune as tune_module

    folder = Path(configs.__file__).parent / "configs"
    checked = 0
    for path in folder.glob("*.json"):
        num_experts = int(path.name.split(",")[0].removeprefix("E="))
        for m, cfg in json.loads(path.read_text()).items():
            m = int(m)
            for top_k, hidden in ((2, 4096), (6, 2048), (8, 2048)):
                for v in (tune_module.group_variants(cfg, m, num_experts, top_k)
                          + tune_module.split_k_variants(cfg, m, num_experts, hidden, top_k, 132)
                          + tune_module.down_tile_variants(cfg, 1, tune_module.DEFAULT_SMEM)
                          + tune_module.down_pipeline_variants(cfg, 1, tune_module.DEFAULT_SMEM)
                          + tune_module.fuse_variants(cfg, "int8")
                          + tune_module.pairs_variants(cfg, m, num_experts, top_k)
                          + tune_module.sum_topk_variants(cfg, m, num_experts, top_k) + tune_module.swap_variants(cfg)
                          + tune_module.sum_last_variants(cfg, m, num_experts, top_k)
                          + tune_module.tail_variants(cfg, m, top_k)):
                    assert configs.check_config(v) == v
                    checked += 1
    assert checked > 100


def test_wsrr_variant_at_prefill_sizes_of_int8_where_gluon_runs(monkeypatch):
    from experts_int8 import ops
    from experts_int8 import tune as tune_module

    if ops.gluon_moe is None:
        pytest.skip("this Triton has no Gluon")
    smem = 227 * 1024
    base = dict(PINNED, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_stages=3, GLUON=1)
    monkeypatch.setattr(tune_module, "TUNED_WSRR_ROWS", (256,))
    monkeypatch.setattr(tune_module, "TUNED_WSRR_STAGES", (4,))
    assert tune_module.wsrr_variants(base, 1024, 2, "int8", True, smem) == [dict(base, WSRR=1)]
    monkeypatch.setattr(tune_module, "TUNED_WSRR_STAGES", (4, 5, 6))
    # rings of 5 fit both tiles in 227 KB, 6 only the 128-row one's (the 256-row one's would take 241 KB)
    assert tune_module.wsrr_variants(base, 1024, 2, "int8", True, smem) == [dict(base, WSRR=1),
                                                                           dict(base, WSRR=1, WSRR_STAGES=5)]
    monkeypatch.setattr(tune_module, "TUNED_WSRR_STAGES", (4, 5))
    monkeypatch.setattr(tune_module, "TUNED_WSRR_ROWS", (256, 128))
    variants = tune_module.wsrr_variants(base, 1024, 2, "int8", True, smem)
    # both tiles on both rings, each tile's own ring (4 and 5) left implicit; the winner's keys kept (where
    # WSRR does not apply they run)
    assert variants == [dict(base, WSRR=1), dict(base, WSRR=1, WSRR_STAGES=5),
                        dict(base, WSRR=1, WSRR_ROWS=128, WSRR_STAGES=4), dict(base, WSRR=1, WSRR_ROWS=128)]
    assert all(configs.check_config(v) == v for v in variants)
    for on in variants:  # a winner already on one tile and ring (a table's or the heuristic's entry): the others
        assert tune_module.wsrr_variants(on, 1024, 2, "int8", True, smem) == [v for v in variants if v != on]
    assert tune_module.wsrr_variants(base, 255, 2, "int8", True, smem) == []  # decode and small prefill
    assert tune_module.wsrr_variants(base, 1024, 2, "bf16", True, smem) == []  # float weights
    assert tune_module.wsrr_variants(base, 1024, 2, "int8", False, smem) == []  # not sm_90
    # 128 KB of shared memory: only the 128-row tile's rings (82 and 103 KB) fit, not the 256-row one's
    assert tune_module.wsrr_variants(base, 1024, 2, "int8", True, 128 * 1024) == variants[2:]


def test_readme_table_is_rewritten_from_bench_runs(tmp_path):
    """benchmarks/readme_table.py: each row from the first run (time, fraction of the ceiling that applies
    at its M, speed-up, the int8 entry's kernel marks), then each further run's speed-up; rows as listed."""
    script = Path(__file__).parent.parent / "benchmarks" / "readme_table.py"
    readme = tmp_path / "README.md"
    readme.write_text("before\n\n| shape (E, H, I, k) | M | bf16 | int8 | x | runs before |\n|---|---|---|---|---|---|\n"
                      "| qwen3 (1) | 1 | old | old | 1x | 1x |\n|  | 2048 § | old | old | 1x | 1x |\n\nafter\n")

    def run(scale, wsrr):
        rows = [dict(shape="qwen3", M=m, dtype=d, time_us=t * scale, bw_frac=0.5, flop_frac=0.25,
                     config=dict(WSRR=1) if wsrr and m > 16 else {})
                for m, d, t in ((1, "bf16", 30.0), (1, "int8", 20.0), (2048, "bf16", 500.0), (2048, "int8", 400.0))]
        for row in rows if wsrr else ():  # this run records where each entry came from: M=2048's bf16 borrowed
            row["config_source"] = "table M=1024" if (row["M"], row["dtype"]) == (2048, "bf16") else f"table M={row['M']}"
        path = tmp_path / f"run{scale}.json"
        path.write_text(json.dumps(dict(rows=rows)))
        return str(path)

    new, old = run(1.0, False), run(2.0, True)
    done = subprocess.run([sys.executable, str(script), new, old, "--readme", str(readme)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert readme.read_text().split("\n")[4:6] == ["| qwen3 (1) | 1 | 30 µs (50%) | 20 µs (50%) | 1.50x | 1.50x |",
                                                   "|  | 2048 | 500 µs (25%) | 400 µs (25%) | 1.25x | 1.25x |"]
    assert readme.read_text().startswith("before\n") and readme.read_text().endswith("\nafter\n")
    subprocess.run([sys.executable, str(script), old, new, "--readme", str(readme)], check=True, capture_output=True)
    assert readme.read_text().split("\n")[4:6] == ["| qwen3 (1) | 1 | 60 µs (50%) | 40 µs (50%) | 1.50x | 1.50x |",
                                                   "|  | 2048 § ◦ | 1000 µs (25%) | 800 µs (25%) | 1.25x | 1.25x |"]
    missing = subprocess.run([sys.executable, str(script), new, str(tmp_path / "nothing.json"), "--readme",
                              str(readme)], capture_output=True, text=True)
    assert missing.returncode != 0 and "not a bench_kernel JSON" in missing.stderr


def test_variant_ab_retuned_takes_the_fresh_tables_entry(tmp_path, monkeypatch):
    """variant_ab's ``retuned`` value 1: the entry a tune wrote for that M into $RETUNED_TABLES, the
    shipped one where it wrote none (no folder, no table for the shape, no entry at M)."""
    import runpy

    variant = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "variant_ab.py"),
                             run_name="variant_ab")["retuned"]
    shipped = dict(PINNED)
    fresh = dict(PINNED, BLOCK_SIZE_N=128, num_stages=2)
    name = configs.table_name(64, 1408, configs.device_name(), configs.weight_format(torch.int8))
    (tmp_path / name).write_text(json.dumps({"256": fresh}))
    monkeypatch.delenv("RETUNED_TABLES", raising=False)
    assert variant(shipped, 1, 256, 64, 1408, 6, torch.int8) == shipped
    monkeypatch.setenv("RETUNED_TABLES", str(tmp_path))
    assert variant(shipped, 1, 256, 64, 1408, 6, torch.int8) == configs.check_config(fresh)
    assert variant(shipped, 0, 256, 64, 1408, 6, torch.int8) == shipped
    assert variant(shipped, 1, 512, 64, 1408, 6, torch.int8) == shipped  # no entry at M
    assert variant(shipped, 1, 256, 128, 768, 8, torch.int8) == shipped  # no table for the shape


def test_variant_ab_float_entry_runs_int8_on_the_bf16_tables_entry(monkeypatch):
    """variant_ab's ``float_entry``: value 1 the entry get_config gives bf16 weights of the same shape and M,
    2 with FP16_DOT, 3 with DEQUANT_ONCE; float weights and value 0 as shipped."""
    import runpy

    variant = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "variant_ab.py"),
                             run_name="variant_ab")["float_entry"]
    float_entry = dict(PINNED, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, TMA=1)
    asked = []
    monkeypatch.setattr(configs, "get_config", lambda *args: asked.append(args) or dict(float_entry))
    shipped = dict(PINNED, GLUON=1)
    assert variant(shipped, 0, 4096, 64, 1408, 6, torch.int8) == shipped
    assert variant(shipped, 1, 4096, 64, 1408, 6, torch.int8, "cuda:0") == float_entry
    assert asked == [(4096, 64, 1408, 6, torch.bfloat16, "cuda:0")]
    assert variant(shipped, 2, 4096, 64, 1408, 6, torch.int8) == dict(float_entry, FP16_DOT=1)
    assert variant(shipped, 3, 4096, 64, 1408, 6, torch.int8) == dict(float_entry, DEQUANT_ONCE=1)
    assert variant(shipped, 1, 4096, 64, 1408, 6, torch.bfloat16) == shipped
    assert all(configs.check_config(variant(shipped, v, 4096, 64, 1408, 6, torch.int8)) for v in (1, 2, 3))


def test_variant_ab_pdl_and_dedup_values_are_valid_entries():
    """variant_ab's ``pdl`` (0 off, 1 and 2 its forms) and ``dedup`` (1 without the align launch, 2 and 3 with
    PDL form 2 or 1 as well) as table entries a fold would write."""
    import runpy

    module = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "variant_ab.py"), run_name="variant_ab")
    pdl, dedup = module["pdl"], module["dedup"]
    assert pdl(dict(PINNED, PDL=2), 0) == PINNED and pdl(PINNED, 1)["PDL"] == 1 and pdl(PINNED, 2)["PDL"] == 2
    assert dedup(PINNED, 0) == PINNED
    forms = [dedup(PINNED, v) for v in (1, 2, 3)]
    assert [cfg.get("PDL") for cfg in forms] == [None, 2, 1]
    assert all(cfg["PAIRS"] == cfg["DEDUP_PAIRS"] == 1 and configs.check_config(cfg) == cfg for cfg in forms)


def test_variant_ab_down_pipe_values_set_the_down_gemms_pipeline():
    """variant_ab's ``down_pipe``: 2-5 the down GEMM's num_stages, 64, 128 and 256 its K tile, gate_up as shipped;
    prefill entries and the other kernels' entries stay as shipped."""
    import runpy

    down_pipe = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "variant_ab.py"),
                               run_name="variant_ab")["down_pipe"]
    entry = dict(PINNED, BLOCK_SIZE_M=16, down={"SUM_LAST": 1})
    assert down_pipe(entry, 0) == entry
    assert down_pipe(entry, 3)["down"] == {"SUM_LAST": 1, "num_stages": 3}
    assert down_pipe(entry, 128)["down"] == {"SUM_LAST": 1, "BLOCK_SIZE_K": 128}
    assert all(configs.split_config(down_pipe(entry, v))[0] == configs.split_config(entry)[0] for v in (2, 5, 256))
    assert all(configs.check_config(down_pipe(entry, v)) == down_pipe(entry, v) for v in (2, 3, 4, 5, 64, 128, 256))
    assert down_pipe(entry, 64)["down"] == {"SUM_LAST": 1, "BLOCK_SIZE_K": 64}
    assert down_pipe(dict(entry, BLOCK_SIZE_M=64), 3) == dict(entry, BLOCK_SIZE_M=64)


def test_with_down_adds_to_the_down_overrides_only():
    entry = dict(PINNED, TMA=1, down={"SUM_LAST": 1})
    assert configs.with_down(entry, BLOCK_SIZE_K=64) == dict(PINNED, TMA=1, down={"SUM_LAST": 1, "BLOCK_SIZE_K": 64})
    assert configs.with_down(PINNED, SPLIT_K=2) == dict(PINNED, down={"SPLIT_K": 2})
    assert entry == dict(PINNED, TMA=1, down={"SUM_LAST": 1})  # the entry itself unchanged


def test_variant_ab_pdl_prefetch_values_are_valid_entries():
    """variant_ab's ``pdl_prefetch``: the down GEMM's PDL_PREFETCH at 1-16 K tiles, PDL form 2 added where the
    entry has no PDL and kept where it has one, or one tile in form 1 (101) or 2 (201); prefill entries and the
    other kernels' entries as shipped."""
    import runpy

    pdl_prefetch = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "variant_ab.py"),
                                  run_name="variant_ab")["pdl_prefetch"]
    entry = dict(PINNED, BLOCK_SIZE_M=16, down={"SUM_LAST": 1})
    assert pdl_prefetch(entry, 0) == entry
    assert pdl_prefetch(entry, 2) == dict(entry, PDL=2, down={"SUM_LAST": 1, "PDL_PREFETCH": 2})
    assert pdl_prefetch(dict(entry, PDL=1), 16)["PDL"] == 1
    assert all(configs.check_config(pdl_prefetch(entry, v)) == pdl_prefetch(entry, v) for v in (1, 2, 4, 16))
    assert pdl_prefetch(dict(entry, BLOCK_SIZE_M=64), 2) == dict(entry, BLOCK_SIZE_M=64)
    assert pdl_prefetch(dict(entry, GLUON=1), 2) == dict(entry, GLUON=1)
    assert pdl_prefetch(dict(entry, PDL=2), 101) == dict(entry, PDL=1, down={"SUM_LAST": 1, "PDL_PREFETCH": 1})
    assert pdl_prefetch(entry, 201) == dict(entry, PDL=2, down={"SUM_LAST": 1, "PDL_PREFETCH": 1})


def test_no_matplotlib_is_one_log_line_that_says_what_to_do(monkeypatch, tmp_path, caplog):
    """Not a Python warning pointing into the library: one line naming the install and --no-plot."""
    import warnings

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        assert bench.plot_results({"rows": []}, tmp_path / "plot.png") is None
    assert not raised and not (tmp_path / "plot.png").exists()
    assert "pip install matplotlib" in caplog.text and "--no-plot" in caplog.text


def test_cli_tune_splits_the_intermediate_size_over_tp_and_refuses_an_uneven_split(tmp_path, monkeypatch):
    from experts_int8 import tune as tune_module

    asked = []
    monkeypatch.setattr(tune_module, "tune", lambda *a, **kw: asked.append((a, kw)))
    r = _run("tune", "--shape", "8,64,96,2", "--tp", "2")
    assert r.exit_code == 0 and asked[-1][0] == (8, 64, 48, 2), r.output
    r = _run("tune", "--shape", "8,64,96,2", "--tp", "5")
    assert r.exit_code == 2 and "the intermediate size 96 is not divisible by --tp 5" in r.output and len(asked) == 1
    # A config.json whose model transformers cannot build: its shape, in the default form (nothing to say about it)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-moe", "num_local_experts": 4,
                                                      "hidden_size": 32, "intermediate_size": 48,
                                                      "num_experts_per_tok": 2}))
    assert cli.experts_form(str(tmp_path)) is None
    r = _run("tune", "--model-config", str(tmp_path), "--m", "1")
    assert r.exit_code == 0 and "the model's experts" not in r.output, r.output
    assert asked[-1][0] == (4, 32, 48, 2) and (asked[-1][1]["activation"], asked[-1][1]["gated"]) == ("silu", True)


def test_cli_bench_passes_reps(monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "run_benchmark", lambda settings, command: ran.append(settings))
    for args, reps in ((["--reps", "7"], 7), (["--quick", "--reps", "3"], 3), ([], bench.Settings().reps)):
        r = _run("bench", "--shapes", "8:64:64:2", "--m", "1", *args)
        assert r.exit_code == 0 and ran[-1].reps == reps, r.output


def test_bench_reads_reps_and_refuses_no_dtypes():
    assert bench.settings_from_args(bench.build_parser().parse_args(["--reps", "9"])).reps == 9
    assert bench.settings_from_args(bench.build_parser().parse_args(["--quick"])).reps == bench.Settings.quick().reps
    assert bench.parse_dtypes(["int8, ,int8", "bf16"]) == ["int8", "bf16"]
    with pytest.raises(ValueError, match="no dtypes given"):
        bench.parse_dtypes([" , "])


def test_reference_activation_refuses_what_ungated_experts_cannot_take():
    h = torch.randn(3, 4)
    assert torch.equal(reference.activate(h, "relu2", gated=False), torch.relu(h).square())
    with pytest.raises(ValueError, match="'swiglu_oai' needs gate and up rows; these experts have no gate"):
        reference.activate(h, "swiglu_oai", gated=False)
    with pytest.raises(ValueError, match="activation must be one of .*, got 'tanh'"):
        reference.activate(h, "tanh", gated=False)
