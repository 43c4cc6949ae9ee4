"""Experts split over the ranks of a process group (``experts_int8.parallel``): the shards' outputs add up
to the whole layer's, and a model parallelized over real torch.distributed ranks (gloo on CPU, NCCL on
GPUs) gives the single-process model's logits."""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from experts_int8 import ExpertsInt8Config, Int8Experts, quantize_, select_experts
from experts_int8.parallel import ParallelExperts, Split, parallelize_experts, shard_experts, split_while_loading
from models import tiny_model


def experts(e=6, h=32, i=24, bias=False, activation="silu", gated=True):
    kwargs = {}
    rows = 2 * i if gated else i  # (without a gate: up rows only)
    if bias:
        kwargs = dict(gate_up_proj_bias=torch.randn(e, rows), down_proj_bias=torch.randn(e, h))
    return Int8Experts.from_float(torch.randn(e, rows, h) / h**0.5, torch.randn(e, h, i) / i**0.5,
                                  activation=activation, **kwargs)


def _w13(module):
    return getattr(module, module.w13_name)


@pytest.mark.parametrize("mode", ["tp", "ep"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("bias, activation, gated", [(False, "silu", True), (True, "swiglu_oai", True),
                                                     (False, "relu2", False), (True, "relu2", False)])
def test_shards_add_up_to_the_layer(mode, world_size, bias, activation, gated):
    full = experts(bias=bias, activation=activation, gated=gated)
    x = torch.randn(9, 32)
    w, ids = select_experts(torch.randn(9, 6), 2)
    want = full(x, ids, w)
    shards = [shard_experts(full, mode, r, world_size) for r in range(world_size)]
    got = sum(s(x, ids, w) for s in shards)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(full(x, ids, w), want)  # the shards are copies: the whole layer is untouched
    # every int8 value and scale lives on exactly one rank (tp: the down scales on all of them)
    assert sum(_w13(s).numel() for s in shards) == _w13(full).numel()
    assert all(s.has_gate == gated for s in shards)
    assert sum(s.down_proj.numel() for s in shards) == full.down_proj.numel()
    if mode == "tp":
        assert [s.intermediate_size for s in shards] == [len(p) for p in torch.arange(24).tensor_split(world_size)]
        assert all(torch.equal(s.down_proj_scale, full.down_proj_scale) for s in shards)
    else:
        assert [s.num_experts for s in shards] == [len(p) for p in torch.arange(6).tensor_split(world_size)]
        assert all(s.global_num_experts == 6 and s.expert_map.tolist().count(-1) == 6 - s.num_experts for s in shards)


def test_tp_shard_keeps_matching_gate_and_up_rows():
    full = experts(i=4)
    shard = shard_experts(full, "tp", 1, 2)  # columns 2, 3 of I: gate rows 2, 3 and up rows 6, 7
    assert torch.equal(shard.gate_up_proj, full.gate_up_proj[:, [2, 3, 6, 7]])
    assert torch.equal(shard.gate_up_proj_scale, full.gate_up_proj_scale[:, [2, 3, 6, 7]])
    assert torch.equal(shard.down_proj, full.down_proj[:, :, 2:4])
    assert shard.gate_up_proj.is_contiguous() and shard.down_proj.is_contiguous()


def test_tp_shard_of_experts_without_a_gate_keeps_its_up_rows():
    full = experts(i=4, gated=False)
    shard = shard_experts(full, "tp", 1, 2)
    assert not hasattr(shard, "gate_up_proj")
    assert torch.equal(shard.up_proj, full.up_proj[:, 2:4]) and torch.equal(shard.up_proj_scale, full.up_proj_scale[:, 2:4])
    assert torch.equal(shard.down_proj, full.down_proj[:, :, 2:4])
    assert shard.up_proj.is_contiguous()


@pytest.mark.parametrize("args, error, match", [
    (("tp", 0, 2), TypeError, "Int8Experts"),
    (("pp", 0, 2), ValueError, "mode must be one of"),
    (("ep", 2, 2), ValueError, "0 <= rank < world_size"),
    (("ep", 0, 7), ValueError, r"cannot split 6 experts over 7 ranks; use fewer ranks or mode 'tp' \(--parallel tp\)"),
    (("tp", True, 2), ValueError, "0 <= rank < world_size"),
    (("tp", 0, 25), ValueError, "cannot split 24 columns of I over 25 ranks"),
])
def test_shard_errors(args, error, match):
    module = torch.nn.Linear(2, 2) if error is TypeError else experts()
    with pytest.raises(error, match=match):
        shard_experts(module, *args)


@pytest.mark.parametrize("mode, world_size", [("ep", 6), ("tp", 24)])
def test_as_many_ranks_as_experts_or_columns_of_i(mode, world_size):
    """The most ranks a split takes: one expert each (ep over E ranks), one column of I each (tp over I)."""
    full = experts()
    x = torch.randn(5, 32)
    w, ids = select_experts(torch.randn(5, 6), 2)
    shards = [shard_experts(full, mode, r, world_size) for r in range(world_size)]
    assert all((s.num_experts if mode == "ep" else s.intermediate_size) == 1 for s in shards)
    torch.testing.assert_close(sum(s(x, ids, w) for s in shards), full(x, ids, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["tp", "ep"])
def test_shard_reads_scales_and_biases_saved_in_the_model_dtype(mode):
    """A checkpoint saved from a model cast to bf16 before 4124398 holds its scales and expert biases in bf16:
    split_while_loading's part of it holds them as fp32, as a whole load does (it was refused)."""
    full = experts(bias=True, activation="swiglu_oai")
    for name, b in full.named_buffers():  # the values the cast kept, in fp32
        b.copy_(b.to(torch.bfloat16))
    saved = {t: getattr(full, t) for t in full.tensor_names()}
    saved = {t: v.to(torch.bfloat16) if v.is_floating_point() else v for t, v in saved.items()}
    part = Split(mode, 1, 2).shard(full, saved.__getitem__, torch.device("cpu"))
    want = shard_experts(full, mode, 1, 2)
    for t in full.tensor_names():
        assert getattr(part, t).dtype == getattr(want, t).dtype and torch.equal(getattr(part, t), getattr(want, t)), t

@pytest.mark.parametrize("first", ["tp", "ep"])
@pytest.mark.parametrize("second", ["tp", "ep"])
def test_shard_of_a_shard_and_no_process_group(first, second):
    # A tp shard has no expert_map: split again it gave wrong sums without a word.
    with pytest.raises(ValueError, match=f"already rank 1's {first} part of a split over 2 ranks; split whole"):
        shard_experts(shard_experts(experts(), first, 1, 2), second, 0, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        parallelize_experts(experts())


def test_parallel_experts_wraps_only_a_shard_of_its_mode():
    """ParallelExperts' forward and repr read the split its part belongs to: around a whole module, printing the
    model failed with "'NoneType' object has no attribute 'world_size'" (the forward likewise on 'rank')."""
    whole = experts()
    with pytest.raises(ValueError, match="wraps one rank's tp part .* made by shard_experts .*got a whole Int8Experts"):
        ParallelExperts(whole, "tp")
    with pytest.raises(ValueError, match="got rank 0's ep part of a split over 2 ranks"):
        ParallelExperts(shard_experts(whole, "ep", 0, 2), "tp")
    assert "mode=tp, world_size=2" in repr(ParallelExperts(shard_experts(whole, "tp", 0, 2), "tp"))


def test_device_arguments_are_typed_as_the_docs_pass_them():
    """The docs pass devices as strings (``parallelize_experts(model, mode="tp", device=f"cuda:{rank}")``), and
    every one of these takes a string, but their annotations said ``torch.device`` alone, so a type checker
    refused the documented calls."""
    import typing

    from experts_int8.parallel import split_while_loading

    shard = shard_experts(experts(), "tp", 0, 2, device="cpu")  # (a string works: only the annotation said not)
    assert shard.down_proj.device == torch.device("cpu") and Int8Experts(2, 4, 4, device="cpu").down_proj.is_cpu
    for f in (Int8Experts.__init__, shard_experts, split_while_loading, parallelize_experts):
        assert str in typing.get_args(typing.get_type_hints(f)["device"]), f.__qualname__


# --------------------------------------------------------------------------------------------------
# Real ranks: one process each (torch.multiprocessing), a TCP rendezvous on localhost
# --------------------------------------------------------------------------------------------------
# plain; biases + clamped SwiGLU; shared experts + grouped routing; experts tensors renamed from the checkpoint's
# (Granite); a vision-language model's text model
ARCHS = ("mixtral", "gpt_oss", "deepseek_v2", "granitemoe", "qwen3_vl_moe", "nemotron_h")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_group(rank: int, worker, world_size: int, port: int, backend: str, out_dir: str, where: str) -> None:
    """One rank's process: join the group, run ``worker(rank, device, out_dir) -> dict``, write it as
    rank<r>.json. ``where``: "cpu", "gpu" (GPU r for rank r) or "one_gpu" (every rank on GPU 0)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device({"cpu": "cpu", "gpu": f"cuda:{rank}", "one_gpu": "cuda:0"}[where])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # (a bounded wait: a rank left out of a collective fails the test instead of holding it for half an hour)
    dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device if backend == "nccl" else None,
                            timeout=datetime.timedelta(seconds=300))
    try:
        result = worker(rank, device, out_dir)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()  # (rank 0 hosts the store: leaving first broke a slower rank's group set-up, "Broken pipe")
    finally:
        dist.destroy_process_group()


def _run_ranks(worker, world_size: int, tmp_path, backend: str = "gloo", where: str = "cpu") -> list[dict]:
    mp.spawn(_in_group, args=(worker, world_size, _free_port(), backend, str(tmp_path), where), nprocs=world_size,
             join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


def _models_match(rank: int, device: torch.device, out_dir: str) -> dict:
    """Each architecture's logits before and after its experts are split, both modes. fp32 activations on
    GPUs too: in bf16 each rank rounds its partial sum before the all-reduce, which moves a tiny random
    model's logits by up to 2% (tp, measured; NOTES item 179) and would hide a wrong shard."""
    results = {}
    for arch in ARCHS:
        for mode in ("tp", "ep"):
            model = tiny_model(arch, seed=0)  # the same weights on every rank
            quantize_(model)
            model.to(device)
            with torch.no_grad():
                want, full_bytes = _logits(model, device), _experts_bytes(model)
                parallelize_experts(model, mode)
                results[f"{arch}/{mode}"] = _split_result(model, device, want, full_bytes)
    return results


def _logits(model, device) -> torch.Tensor:
    tokens = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(1)).to(device)
    return model(tokens).logits.float()


def _experts_bytes(model) -> int:
    return sum(_w13(m).numel() + m.down_proj.numel() for m in model.modules() if isinstance(m, Int8Experts))


def _split_result(model, device, want: torch.Tensor, full_bytes: int) -> dict:
    """A split model against the whole one's logits: its error, its parts and their expert bytes and device."""
    parts = [m for m in model.modules() if isinstance(m, ParallelExperts)]
    got = _logits(model, device)
    return {"err": ((got - want).norm() / want.norm()).item(), "parts": len(parts),
            "local_bytes": _experts_bytes(model), "full_bytes": full_bytes,
            "on_device": all(_w13(p.local).device == device for p in parts)}


def _compiles(rank: int, device: torch.device, out_dir: str) -> dict:
    """The Triton path (interpreted on CPU) of a lone experts module split over the ranks, eager and under
    ``torch.compile(fullgraph=True)``: the all-reduce traces with the kernel's custom op, no graph break."""
    torch.manual_seed(0)  # the same layer and inputs on every rank
    full = Int8Experts.from_float(torch.randn(4, 64, 32) / 32**0.5, torch.randn(4, 32, 32) / 32**0.5,
                                  backend="triton").to(device)
    x = torch.randn(5, 32, device=device)
    w, ids = select_experts(torch.randn(5, 4, device=device), 2)
    want = full(x, ids, w)
    errors = {}
    for mode in ("tp", "ep"):
        part = parallelize_experts(full, mode)
        compiled = torch.compile(part, fullgraph=True, backend="aot_eager")
        errors[mode] = [(part(x, ids, w) - want).abs().max().item(), (compiled(x, ids, w) - want).abs().max().item()]
    return errors


def _bench_e2e(rank: int, device: torch.device, out_dir: str) -> dict:
    """``bench_e2e.run(parallel="tp")`` on a tiny Mixtral: every rank runs it, rank 0 reports and writes."""
    from experts_int8 import bench_e2e

    torch.manual_seed(rank)  # different weights drawn on each rank: the run takes rank 0's
    built = []
    random_model = bench_e2e.random_model
    bench_e2e.random_model = lambda *a, **k: built.append(random_model(*a, **k)) or built[-1]
    lines = []
    result = bench_e2e.run("mixtral-8x7b", device="cpu", batches=(2,), prompt_len=6, new_tokens=3, reps=1,
                           cache="dynamic", columns=("ours-bf16", "ours-int8"), out=os.path.join(out_dir, "json"),
                           log=lines.append, parallel="tp",
                           overrides=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
    (model,) = [m for m in built if m.device.type != "meta"]  # (check_fits builds one on meta first)
    return dict(rows=[r["column"] for r in result["rows"]], world_size=result["world_size"],
                parallel=result["parallel"], logged=len(lines),
                embed=model.get_input_embeddings().weight.double().sum().item(),
                parts=sum(isinstance(m, ParallelExperts) for m in model.modules()))


def _checkpoints(tmp_path) -> None:
    """A float and an int8 checkpoint of each architecture, under tmp_path/<arch>/{float,int8}."""
    for arch in ARCHS:
        model = tiny_model(arch, seed=0)
        model.save_pretrained(tmp_path / arch / "float")
        quantize_(model).save_pretrained(tmp_path / arch / "int8")


def _loads_split(rank: int, device: torch.device, out_dir: str) -> dict:
    """``load_model(parallel=mode)`` of each architecture's int8 checkpoint (read split) and float one (loaded
    whole, then split), against the one-process model; each rank's experts bytes."""
    from experts_int8.run import load_model

    dtype = torch.float32  # fp32 on GPUs too: see _models_match
    results = {}
    for arch in ARCHS:
        with torch.no_grad():
            whole, _ = load_model(os.path.join(out_dir, arch, "int8"), device=device, dtype=dtype)
            want, full_bytes = _logits(whole, device), _experts_bytes(whole)
            for kind in ("int8", "float"):
                for mode in ("tp", "ep"):
                    model, _ = load_model(os.path.join(out_dir, arch, kind), device=device, dtype=dtype, parallel=mode)
                    results[f"{arch}/{kind}/{mode}"] = _split_result(model, device, want, full_bytes)
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_load_model_split_matches_one_process(world_size, tmp_path):
    _checkpoints(tmp_path)
    ranks = _run_ranks(_loads_split, world_size, tmp_path)
    _check(ranks, world_size, tol=1e-5, kinds=("int8", "float"))
    assert all(r["on_device"] for results in ranks for r in results.values())


def test_split_while_loading_errors(tmp_path):
    from transformers import AutoModelForCausalLM

    from experts_int8.parallel import split_while_loading

    with pytest.raises(RuntimeError, match="init_process_group"), split_while_loading("tp"):
        pass
    tiny_model("mixtral").save_pretrained(tmp_path)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="this one is float. Quantize it once"), split_while_loading("tp"):
            AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=ExpertsInt8Config())
        with pytest.raises(ValueError, match="mode must be one of"), split_while_loading("pp"):
            pass
        with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup"), \
                split_while_loading("tp", group=[0]):
            pass
        # Without ExpertsInt8Config a float checkpoint loads past our quantizer, whole on every rank.
        with pytest.raises(ValueError, match="split_while_loading split no experts"), split_while_loading("tp"):
            AutoModelForCausalLM.from_pretrained(tmp_path)
        quantize_(tiny_model("mixtral")).save_pretrained(tmp_path / "int8")
        with split_while_loading("tp"):
            model = AutoModelForCausalLM.from_pretrained(tmp_path / "int8")
        # A split model carried into a group of another size (pickled over 2 ranks, say) ran its part alone.
        carried = copy.deepcopy(model)
        parts = [m for m in carried.modules() if isinstance(m, ParallelExperts)]
        for part in parts:
            part.local.part_of = Split("tp", 1, 2)
        with pytest.raises(RuntimeError, match=r"hold rank 1's tp part of a split over 2 ranks, but this process is "
                                               r"rank 0 of 1"):
            carried(torch.tensor([[3, 4, 5]]))
        # Split again, it summed wrong parts; saved, it wrote rank 0's slice as the checkpoint.
        with pytest.raises(ValueError, match=r"experts\.local is already rank 0's tp part of a split over 1 ranks"):
            parallelize_experts(model, "ep")
        for split_model in (model, parallelize_experts(quantize_(tiny_model("mixtral")), "tp")):
            with pytest.raises(ValueError, match=r"experts hold only rank 0's tp part .* Save the model before"):
                split_model.save_pretrained(tmp_path / "partial")
            assert not (tmp_path / "partial").exists()  # nothing written
        with pytest.raises(ValueError, match=r"experts hold only rank 0's ep part .* Save the model before"):
            parallelize_experts(quantize_(tiny_model("mixtral")), "ep").state_dict()  # outside save_pretrained too
    finally:
        dist.destroy_process_group()


def _auto_over_two_gpus(rank: int, device: torch.device, out_dir: str) -> dict:
    """device_map="auto" inside split_while_loading, as if two GPUs were visible to each rank."""
    from transformers import AutoModelForCausalLM

    from experts_int8.parallel import split_while_loading

    torch.cuda.device_count = lambda: 2  # (this rank's process only)
    try:
        with split_while_loading("tp"):
            AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "int8"), device_map="auto")
        return {"error": None}
    except ValueError as e:
        return {"error": str(e)}


def test_split_while_loading_refuses_one_device_map_for_every_rank(tmp_path):
    quantize_(tiny_model("mixtral")).save_pretrained(tmp_path / "int8")
    for rank in _run_ranks(_auto_over_two_gpus, 2, tmp_path):
        assert rank["error"].startswith("split_while_loading over 2 ranks: device_map='auto' spreads each rank's "
                                        "model over all 2 visible GPUs. Give each rank its own")


def test_split_while_loading_refuses_experts_a_gpu_map_offloads_to_the_cpu(tmp_path):
    """A GPU map with a layer on the CPU: accelerate offloads that layer when it dispatches the model, before
    split_while_loading reads the experts' parts, which stayed on the CPU without a hook: the first forward handed
    them GPU hidden states. Refused before anything is read (on a machine without a GPU too, where transformers
    failed later on the GPU entries); without split_while_loading the same map loads (tests/test_transformers.py)."""
    from transformers import AutoModelForCausalLM

    quantize_(tiny_model("mixtral")).save_pretrained(tmp_path / "int8")
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
                  "model.rotary_emb": 0, "lm_head": 0}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"split_while_loading: the device map offloads model\.layers\.1\.mlp\."
                                             r"experts to the CPU while the model runs on 0"):
            with split_while_loading("tp"):
                AutoModelForCausalLM.from_pretrained(tmp_path / "int8", device_map=device_map)
    finally:
        dist.destroy_process_group()


def _transformers_expert_parallel(rank: int, device: torch.device, out_dir: str) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    fields = DistributedConfig.__dataclass_fields__  # (ep_size from transformers 5.21; before: the flag)
    config = (DistributedConfig(tp_size=2, ep_size=2) if "ep_size" in fields
              else DistributedConfig(tp_size=2, enable_expert_parallel=True))
    try:
        AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "bf16"), quantization_config=ExpertsInt8Config(),
                                             distributed_config=config)
        return {"error": None}
    except ValueError as e:
        return {"error": str(e)}


def test_transformers_expert_parallelism_is_refused_with_the_way_that_works(tmp_path, monkeypatch):
    """transformers' own expert parallelism does not split int8 experts: it failed late with a shape error."""
    tiny_model("qwen3_moe", dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    # The ranks see no GPU: transformers sets up its tensor parallelism (before any quantizer runs) on the
    # machine's accelerator, one GPU per rank by torchrun's LOCAL_RANK, which these spawned gloo ranks lack
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for rank in _run_ranks(_transformers_expert_parallel, 2, tmp_path):
        assert rank["error"] is not None and "does not split int8 experts" in rank["error"], rank["error"]
        assert "experts_int8.parallel" in rank["error"]


def _outside_the_group(rank: int, device: torch.device, out_dir: str) -> dict:
    group = dist.new_group([1])  # (every rank makes it; only rank 1 is in it)
    model = quantize_(tiny_model("mixtral", seed=0))
    try:
        parallelize_experts(model, "tp", group)
        return {"error": None, "parts": sum(isinstance(m, ParallelExperts) for m in model.modules())}
    except ValueError as e:
        return {"error": str(e), "parts": 0}


def test_a_rank_outside_the_group_is_told_so(tmp_path):
    outside, inside = _run_ranks(_outside_the_group, 2, tmp_path)
    assert outside["error"].startswith("parallelize_experts: this process (global rank 0) is not in the group given")
    assert inside["error"] is None and inside["parts"] == tiny_model("mixtral").config.num_hidden_layers


def test_split_while_loading_alone_registers_the_quantizer(tmp_path):
    """The README's example imports only experts_int8.parallel: that must be enough to read an int8 checkpoint."""
    quantize_(tiny_model("mixtral")).save_pretrained(tmp_path)
    script = f"""
import os, torch.distributed as dist
from transformers import AutoModelForCausalLM
from experts_int8.parallel import ParallelExperts, split_while_loading
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{_free_port()}")
dist.init_process_group("gloo", rank=0, world_size=1)
with split_while_loading("ep"):
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})
print(sum(isinstance(m, ParallelExperts) for m in model.modules()))
dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(tiny_model("mixtral").config.num_hidden_layers)


def _check(ranks: list[dict], world_size: int, tol: float, kinds: tuple = ()) -> None:
    """Every rank's results: ``arch[/kind]/mode`` -> the split's error and expert bytes."""
    middles = [f"/{k}" for k in kinds] or [""]
    for results in ranks:
        assert set(results) == {f"{a}{k}/{m}" for a in ARCHS for k in middles for m in ("tp", "ep")}
        for name, r in results.items():
            assert r["parts"] >= 1, name
            assert r["err"] < tol, (name, r["err"])
            # each rank holds about 1/W of the expert weights (a whole expert more or less under ep)
            assert r["local_bytes"] < r["full_bytes"] * (1 / world_size + 0.35), (name, r)
    for name in ranks[0]:  # and the ranks hold the whole, once
        assert sum(results[name]["local_bytes"] for results in ranks) == ranks[0][name]["full_bytes"], name


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_on_cpu_match_one_process(world_size, tmp_path):
    _check(_run_ranks(_models_match, world_size, tmp_path), world_size, tol=1e-5)


def _gradients(rank: int, device: torch.device, out_dir: str) -> dict:
    """The embedding's gradient through a split model against the whole one's, both modes: every rank's part
    sees the same inputs, so their gradients are summed over the ranks, and the summed output's is not."""
    results = {}
    for mode in ("tp", "ep"):
        model = tiny_model("mixtral", seed=0)
        quantize_(model)
        grads = []
        for split in (False, True):
            if split:
                parallelize_experts(model, mode)
            model.zero_grad()
            _logits(model, device).square().mean().backward()
            grads.append(model.get_input_embeddings().weight.grad.clone())
        results[mode] = ((grads[1] - grads[0]).norm() / grads[0].norm()).item()
    return results


def test_gradients_through_a_split_model_are_the_whole_models(tmp_path):
    for errors in _run_ranks(_gradients, 2, tmp_path):
        assert set(errors) == {"tp", "ep"} and max(errors.values()) < 1e-5, errors


def _gradients_with_an_idle_rank(rank: int, device: torch.device, out_dir: str) -> dict:
    """ep, every pair routed to rank 0's experts: rank 1's part is zeros linked to nothing, and its backward must
    still join the inputs' all-reduce (it hung there, and rank 1's gradients lacked rank 0's part)."""
    torch.manual_seed(0)  # the same layer and inputs on every rank
    full = experts(e=4, h=32, i=24)
    x = torch.randn(5, 32)
    ids = torch.randint(0, 2, (5, 2))  # experts 0 and 1: rank 0's of 2
    w = torch.rand(5, 2)
    grads = []
    for module in (full, parallelize_experts(full, "ep")):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        (xg + module(xg, ids, wg)).square().sum().backward()
        grads.append((xg.grad, wg.grad))
    return {"x": ((grads[1][0] - grads[0][0]).norm() / grads[0][0].norm()).item(),
            "w": ((grads[1][1] - grads[0][1]).norm() / grads[0][1].norm()).item()}


def test_gradients_reach_every_rank_when_one_gets_no_tokens(tmp_path):
    for errors in _run_ranks(_gradients_with_an_idle_rank, 2, tmp_path):
        assert max(errors.values()) < 1e-5, errors


def _disagreeing(rank: int, device: torch.device, out_dir: str) -> dict:
    """Ranks asked to split different things: another mode, or another checkpoint's experts."""
    said = {}
    for case in ("mode", "shapes"):
        model = tiny_model("mixtral", seed=0, **({"intermediate_size": 32 + 16 * rank} if case == "shapes" else {}))
        quantize_(model)
        try:
            parallelize_experts(model, ("tp", "ep")[rank] if case == "mode" else "tp")
            said[case] = None
        except ValueError as e:
            said[case] = str(e)
    return said


def test_ranks_that_would_split_different_things_are_refused(tmp_path):
    """The all-reduce needs only equal output shapes: without the check, such ranks gave wrong logits silently."""
    for said in _run_ranks(_disagreeing, 2, tmp_path):
        assert "ranks 0 and 1 disagree" in said["mode"] or "ranks 1 and 0 disagree" in said["mode"], said
        assert "mode 'tp' against 'ep'" in said["mode"] or "mode 'ep' against 'tp'" in said["mode"]
        assert "disagree" in said["shapes"] and "of shapes" in said["shapes"], said


def _one_rank_refuses(rank: int, device: torch.device, out_dir: str) -> dict:
    """Rank 1 alone refused (its own model or device map); rank 0 went on into the exchange of shapes."""
    from transformers import AutoModelForCausalLM

    from experts_int8.parallel import split_while_loading

    said = {}
    model = tiny_model("mixtral", seed=0)
    try:
        parallelize_experts(quantize_(model) if rank == 0 else model, "tp")  # rank 1's: never quantized
        said["parallelize"] = None
    except ValueError as e:
        said["parallelize"] = str(e)
    gpu_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
               "model.rotary_emb": 0, "lm_head": 0}
    try:
        with split_while_loading("tp"):
            AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "int8"), device_map=(None, gpu_map)[rank])
        said["loading"] = None
    except ValueError as e:
        said["loading"] = str(e)
    return said


def test_a_refusal_of_one_rank_reaches_the_others(tmp_path):
    """A rank refused alone raised at once while the others waited for it in the exchange of shapes until the
    process group timed out (here 300 s; NCCL's default is 10 minutes); they now raise with its reason."""
    quantize_(tiny_model("mixtral")).save_pretrained(tmp_path / "int8")
    start = time.monotonic()
    first, second = _run_ranks(_one_rank_refuses, 2, tmp_path)
    assert time.monotonic() - start < 120
    assert second["parallelize"].startswith("MixtralForCausalLM has no Int8Experts modules")
    assert first["parallelize"].startswith("parallelize_experts: rank 1 refused, so no rank splits anything: "
                                           "MixtralForCausalLM has no Int8Experts modules")
    assert second["loading"].startswith("split_while_loading: the device map offloads model.layers.1.mlp.experts")
    assert first["loading"].startswith("split_while_loading: rank 1 refused, so no rank splits anything: "
                                       "split_while_loading: the device map offloads model.layers.1.mlp.experts")


def _ranks_fail_differently(rank: int, device: torch.device, out_dir: str) -> dict:
    """Failures inside split_while_loading that are not our refusals: each rank's own, at another point."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    from experts_int8.parallel import split_while_loading

    def load(case: str, path: str, **kwargs) -> None:
        try:
            with split_while_loading("tp"):
                AutoModelForCausalLM.from_pretrained(path, **kwargs)
                if case == "after" and rank == 1:
                    raise RuntimeError("the caller's own code failed after the load")
            said[case] = None
        except Exception as e:  # noqa: BLE001 -- the test records each rank's error
            said[case] = f"{type(e).__name__}: {e}"

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory while reading the non-expert weights")

    said, int8 = {}, os.path.join(out_dir, "int8")
    # Rank 1 refuses its device map; rank 0 runs out of memory while transformers reads the other weights.
    kept = PreTrainedModel._load_pretrained_model
    if rank == 0:
        PreTrainedModel._load_pretrained_model = staticmethod(out_of_memory)
    try:
        gpu_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
                   "model.rotary_emb": 0, "lm_head": 0}
        load("mid_load", int8, device_map=(None, gpu_map)[rank])
    finally:
        PreTrainedModel._load_pretrained_model = kept
    # Rank 1 fails before any load starts (a folder with no model); rank 0 loads and waits in the exchange of shapes.
    empty = os.path.join(out_dir, f"empty{rank}")
    os.makedirs(empty)
    load("before", (int8, empty)[rank])
    # Both load; rank 1's own code fails afterwards, when no rank waits for it.
    load("after", int8)
    # The same after a second load in the context that splits nothing (every experts module kept float)
    try:
        with split_while_loading("tp"):
            AutoModelForCausalLM.from_pretrained(int8)
            AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "float_experts"))
            if rank == 1:
                raise RuntimeError("the caller's own code failed after the loads")
        said["after_nothing_split"] = None
    except Exception as e:  # noqa: BLE001 -- the test records each rank's error
        said["after_nothing_split"] = f"{type(e).__name__}: {e}"
    # Rank 0 loads a checkpoint to split, rank 1 one with nothing to split: both refused at the exchange of shapes
    load("mixed", (int8, os.path.join(out_dir, "float_experts"))[rank])
    return said


def test_ranks_failing_differently_inside_split_while_loading_all_raise_at_once(tmp_path):
    """A rank that failed outside our refusals (out of memory while transformers read the other weights, a folder
    with no model) raised alone: the others waited in the exchange of shapes until the process group timed out
    (300 s here), or met there a refusal left from an earlier load and raised it in the wrong load. Each now
    raises at once: a rank with its own error, a rank that waited with that rank's reason."""
    quantize_(tiny_model("mixtral")).save_pretrained(tmp_path / "int8")
    kept = ExpertsInt8Config(modules_to_not_convert=["experts"], allow_no_experts=True)
    quantize_(tiny_model("mixtral"), kept).save_pretrained(tmp_path / "float_experts")
    start = time.monotonic()
    first, second = _run_ranks(_ranks_fail_differently, 2, tmp_path)
    assert time.monotonic() - start < 120
    assert first["mid_load"] == "OutOfMemoryError: out of memory while reading the non-expert weights", first
    assert second["mid_load"].startswith("ValueError: split_while_loading: the device map offloads"), second
    assert "empty1" in second["before"] and "config.json" in second["before"], second  # (transformers' words)
    assert first["before"] == ("ValueError: split_while_loading: rank 1 refused, so no rank splits anything: "
                               + second["before"].split(": ", 1)[1]), first
    assert first["after"] is None
    assert second["after"] == "RuntimeError: the caller's own code failed after the load"
    assert first["after_nothing_split"] is None
    assert second["after_nothing_split"] == "RuntimeError: the caller's own code failed after the loads"
    for said in (first, second):
        assert said["mixed"].startswith("ValueError: split_while_loading: ranks ") and "disagree" in said["mixed"], said


def _one_rank_fails_after_the_exchange_of_shapes(rank: int, device: torch.device, out_dir: str) -> dict:
    """Failures of rank 1 alone after the ranks agreed on the shapes, and before a load split (its copy of the files
    missing): each rank's error, and how many experts modules each model holds whole and split."""
    from transformers import AutoModelForCausalLM

    from experts_int8.parallel import Split
    from experts_int8.run import load_model

    said = {}

    def attempt(case: str, run) -> None:
        try:
            run()
            said[case] = None
        except Exception as e:  # noqa: BLE001 -- the test records each rank's error
            said[case] = f"{type(e).__name__}: {e}"

    # Rank 1 runs out of memory making its part of the second experts module (after the first one's)
    model = quantize_(tiny_model("mixtral", seed=0))
    take, calls = Split.take, []

    def out_of_memory(self, *args, **kwargs):
        calls.append(1)
        if rank == 1 and len(calls) > len(Int8Experts.tensor_names(model.model.layers[0].mlp.experts)):
            raise torch.OutOfMemoryError("out of memory making the second part")
        return take(self, *args, **kwargs)

    Split.take = out_of_memory
    try:
        attempt("parallelize", lambda: parallelize_experts(model, "tp"))
    finally:
        Split.take = take
    said["kept"] = [type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")]

    def load(path: str, **kwargs):
        with split_while_loading("tp", **kwargs):
            AutoModelForCausalLM.from_pretrained(path)

    # One checkpoint whose scales are corrupt in rank 1's slice only (rank 0's parts check out); a device rank 1 lacks
    attempt("corrupt", lambda: load(os.path.join(out_dir, "corrupt")))
    attempt("device", lambda: load(os.path.join(out_dir, "int8"), device=(None, "cuda:99")[rank]))
    # load_model of a float checkpoint (loaded whole, then split) whose files rank 1 lacks
    attempt("load_model", lambda: load_model(os.path.join(out_dir, ("float", "missing")[rank]), device="cpu",
                                             dtype=torch.float32, parallel="tp"))
    return said


def test_a_failure_of_one_rank_after_the_exchange_of_shapes_reaches_the_others(tmp_path):
    """A rank that failed alone after the exchange of shapes (making or reading its parts, checking them), or before a
    whole load that parallelize_experts then split, raised alone: the others went on, split (or into the exchange,
    for the whole load and for a device the rank lacked, which failed before it), and waited for it in their first
    forward's all-reduce until the process group timed out; that rank kept a model split halfway. Every rank now
    raises at once, the waiting ones with its reason, and no rank splits anything."""
    from safetensors.torch import load_file, save_file

    model = tiny_model("mixtral", seed=0)
    model.save_pretrained(tmp_path / "float")
    quantize_(model).save_pretrained(tmp_path / "int8")
    quantize_(tiny_model("mixtral", seed=0)).save_pretrained(tmp_path / "corrupt")
    (weights,) = (tmp_path / "corrupt").glob("*.safetensors")
    tensors = load_file(weights)
    scale = next(k for k in tensors if ".layers.1." in k and k.endswith("gate_up_proj_scale"))
    tensors[scale][0, tensors[scale].shape[1] // 2 - 1] = float("nan")  # the last gate row: rank 1's of 2 (tp)
    save_file(tensors, weights, metadata={"format": "pt"})
    start = time.monotonic()
    first, second = _run_ranks(_one_rank_fails_after_the_exchange_of_shapes, 2, tmp_path)
    assert time.monotonic() - start < 120
    assert second["parallelize"] == "OutOfMemoryError: out of memory making the second part", second
    assert "holds non-finite or non-positive scales" in second["corrupt"], second
    assert "missing" in second["load_model"] and "no such file" in second["load_model"], second
    assert first["load_model"].startswith("ValueError: parallelize_experts: rank 1 refused, so no rank splits "
                                          "anything: "), first
    for case, what in (("parallelize", "parallelize_experts"), ("corrupt", "split_while_loading"),
                       ("device", "split_while_loading")):
        assert first[case] == (f"ValueError: {what}: rank 1 refused, so no rank splits anything: "
                               + second[case].split(": ", 1)[1]), (case, first)
    assert first["kept"] == second["kept"] == ["Int8Experts"] * 2  # whole on both ranks


def test_hooks_on_an_experts_module_move_to_its_split():
    """A user's hooks on an experts module keep running on the module split in its place (one rank: the split's
    output is the whole layer's), and the handle they hold still removes them."""
    model = quantize_(tiny_model("mixtral", seed=0))
    name = next(n for n, m in model.named_modules() if isinstance(m, Int8Experts))
    seen = []
    handle = model.get_submodule(name).register_forward_hook(lambda m, args, out: seen.append(out.clone()))
    tokens = torch.randint(3, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with torch.no_grad():
            model(tokens)
            parallelize_experts(model, "tp")
            assert isinstance(model.get_submodule(name), ParallelExperts)
            model(tokens)
            handle.remove()
            model(tokens)
    finally:
        dist.destroy_process_group()
    assert len(seen) == 2
    torch.testing.assert_close(seen[1], seen[0])


def test_a_lone_experts_module_split_keeps_none_of_its_parts_hooks():
    """parallelize_experts on a lone Int8Experts returns its wrapped part and leaves the whole module to the caller:
    the part shared the whole one's hook dicts, so the part's refusal to be saved ran on the whole module too (its
    state_dict failed on 'local'), and a hook registered on the part ran on the whole module's forward."""
    whole = experts()
    seen = []
    whole.register_forward_hook(lambda m, args, out: seen.append(("moved", type(m).__name__)))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        part = parallelize_experts(whole, "tp")
        part.register_forward_hook(lambda m, args, out: seen.append(("later", type(m).__name__)))
        assert set(whole.state_dict()) == set(experts().state_dict())
        x, ids = torch.randn(3, 32), torch.randint(0, 6, (3, 2))
        with torch.no_grad():
            whole(x, ids, torch.rand(3, 2))
            assert seen == []
            part(x, ids, torch.rand(3, 2))
    finally:
        dist.destroy_process_group()
    assert seen == [("moved", "ParallelExperts"), ("later", "ParallelExperts")]
    with pytest.raises(ValueError, match="hold only"):
        part.state_dict()


def test_experts_offloaded_by_accelerate_are_refused_before_anything_is_split():
    """Experts accelerate offloads (a 'cpu' entry of a GPU model's device map: their tensors on the meta device, the
    hook's copy brought in for each forward) were split as meta tensors: parallelize_experts returned, and the next
    forward failed on meta experts, the model split already. Refused now, naming the offload, with the model left
    whole and running as before; shard_experts refuses such a module too."""
    accelerate = pytest.importorskip("accelerate")
    model = quantize_(tiny_model("mixtral", seed=0))
    accelerate.cpu_offload(model.model.layers[1], execution_device=torch.device("cpu"))
    offloaded = model.model.layers[1].mlp.experts
    assert offloaded.down_proj.device.type == "meta"
    tokens = torch.randint(3, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(tokens).logits
    with pytest.raises(ValueError, match="this experts module is offloaded by accelerate"):
        shard_experts(offloaded, "tp", 0, 1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts is offloaded by accelerate"):
            parallelize_experts(model, "tp")
        with pytest.raises(ValueError, match="offloaded by accelerate"):
            parallelize_experts(offloaded, "ep")
    finally:
        dist.destroy_process_group()
    assert [type(m).__name__ for n, m in model.named_modules() if n.endswith("experts")] == ["Int8Experts"] * 2
    assert model.hf_quantizer.split is None
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, before)


def test_experts_offloaded_through_a_chain_of_accelerate_hooks_are_refused_as_offloaded():
    """cpu_offload of the experts module itself chains its device hook and its offload hook (a SequentialHook): the
    refusal named the offload only for a lone hook, and said "not loaded" of loaded experts behind a chain."""
    accelerate = pytest.importorskip("accelerate")
    model = quantize_(tiny_model("mixtral", seed=0))
    experts = model.model.layers[1].mlp.experts
    accelerate.cpu_offload(experts, execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match="this experts module is offloaded by accelerate"):
        shard_experts(experts, "tp", 0, 1)
    with pytest.raises(ValueError, match=r"^this experts module's gate_up_proj is on the meta device \(not loaded\)"):
        shard_experts(quantize_(tiny_model("mixtral", seed=0)).model.layers[1].mlp.experts.to("meta"), "tp", 0, 1)


def test_a_split_model_prints_and_refuses_a_second_quantize_without_a_process_group():
    model = tiny_model("mixtral", seed=0)
    quantize_(model)
    name, module = next((n, m) for n, m in model.named_modules() if isinstance(m, Int8Experts))
    model.set_submodule(name, ParallelExperts(shard_experts(module, "tp", 0, 2), "tp"))
    assert "mode=tp, world_size=2" in repr(model.get_submodule(name))  # (no call into a process group)
    with pytest.raises(ValueError, match="split over ranks.*quantize_ the whole model before splitting it"):
        quantize_(model)


def test_load_model_refuses_a_split_before_loading_anything(tmp_path):
    from experts_int8.run import load_model

    with pytest.raises(RuntimeError, match="load_model needs torch.distributed initialized"):
        load_model(tmp_path / "not even read", parallel="tp")


def test_ranks_compile_fullgraph(tmp_path):
    # Triton's interpreter runs only where there is no GPU: there, both ranks share GPU 0 (gloo moves CUDA tensors)
    where = "one_gpu" if torch.cuda.is_available() else "cpu"
    for errors in _run_ranks(_compiles, 2, tmp_path, where=where):
        assert set(errors) == {"tp", "ep"}
        assert all(max(pair) < 1e-3 for pair in errors.values()), errors


def test_bench_e2e_parallel_over_two_ranks(tmp_path):
    ranks = _run_ranks(_bench_e2e, 2, tmp_path)
    for r in ranks:
        assert r["rows"] == ["ours-bf16", "ours-int8"] and r["world_size"] == 2 and r["parallel"] == "tp"
        assert r["parts"] == 2  # both MoE layers' int8 experts split
    assert ranks[0]["embed"] == ranks[1]["embed"]  # one model: rank 0's weights
    assert ranks[0]["logged"] > 0 and ranks[1]["logged"] == 0  # rank 0 reports
    assert len(list((tmp_path / "json").glob("bench_e2e_*.json"))) == 1


def _bench_e2e_too_many_ranks(rank: int, device: torch.device, out_dir: str) -> dict:
    """``bench_e2e.run(parallel="ep")`` over more ranks than experts: refused before any column runs."""
    from experts_int8 import bench_e2e

    lines = []
    try:
        bench_e2e.run("mixtral-8x7b", device="cpu", batches=(1,), prompt_len=4, new_tokens=2, reps=1,
                      cache="dynamic", columns=("ours-bf16", "ours-int8"), out=None, log=lines.append, parallel="ep",
                      overrides=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_local_experts=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=128))
    except ValueError as e:
        return {"error": str(e), "timed": [line for line in lines if "batch" in line]}
    return {"error": None}


def test_bench_e2e_refuses_more_ranks_than_experts_before_timing_anything(tmp_path):
    for r in _run_ranks(_bench_e2e_too_many_ranks, 3, tmp_path):
        assert r["error"] and "cannot split 2 experts over 3 ranks" in r["error"] and r["timed"] == [], r


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ranks_on_two_gpus_match_one_gpu(tmp_path):
    _check(_run_ranks(_models_match, 2, tmp_path, "nccl", "gpu"), 2, tol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("backend, where", [("gloo", "one_gpu"), ("nccl", "gpu")])
def test_load_model_split_on_gpus(backend, where, tmp_path):
    if where == "gpu" and torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    _checkpoints(tmp_path)
    ranks = _run_ranks(_loads_split, 2, tmp_path, backend, where)
    _check(ranks, 2, tol=1e-4, kinds=("int8", "float"))
    assert all(r["on_device"] for results in ranks for r in results.values())


@pytest.mark.gpu
def test_ranks_sharing_one_gpu_match_one_process(tmp_path):
    """The split's CUDA path on a one-GPU machine: two ranks on GPU 0, gloo adding their CUDA tensors (NCCL
    refuses two ranks on one device). The Triton kernel runs the shards' shapes and the expert map."""
    _check(_run_ranks(_models_match, 2, tmp_path, "gloo", "one_gpu"), 2, tol=1e-4)
