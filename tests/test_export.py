"""``experts-int8 quantize --format compressed-tensors``: checked with the compressed-tensors library itself.

The export must hold exactly our int8 quantization: every expert Linear that compressed-tensors'
own pack-quantized decompressor rebuilds equals ``dequantize_weights`` of our native checkpoint,
bit for bit (fp32 scales are stored as they are). Non-expert tensors are byte-identical to the source.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig  # noqa: E402

from experts_int8.evaluate import routing_quality  # noqa: E402
from experts_int8.integrations.transformers import find_experts  # noqa: E402  (registers experts_int8)
from experts_int8.cli import main  # noqa: E402
from experts_int8.convert import (  # noqa: E402
    PER_EXPERT,
    EXPORT_UNSUPPORTED,
    export_compressed_tensors,
    pack_int8,
    quantize_checkpoint,
)
from experts_int8.quant import dequantize_weights  # noqa: E402

from models import ARCH_NAMES, tiny_model  # noqa: E402

SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
# Fused sources: the export writes the per-expert names transformers merges for the architecture (w1/w3/w2 for the
# Mixtral family, gate_proj/... for most others, up_proj/down_proj without a gate)
FUSED_CASES = [(a, "fused") for a in ("mixtral", "phimoe", "lfm2_moe", "qwen3_moe", "nemotron_h")]
CASES = [(a, "per-expert") for a in ARCH_NAMES if a not in EXPORT_UNSUPPORTED] + FUSED_CASES


def tensors(path) -> dict:
    out = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        out.update(load_file(f))
    return out


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum()))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(arch, layout) -> (src, compressed-tensors dst, native dst, CLI output), each made once."""
    cache = {}

    def make(arch, layout):
        if (arch, layout) in cache:
            return cache[arch, layout]
        root = tmp_path_factory.mktemp(f"{arch}-{layout}")
        model = tiny_model(arch, dtype=torch.bfloat16)
        src = root / "bf16"
        model.save_pretrained(src)
        if layout == "fused":  # the in-memory transformers 5 names: experts.gate_up_proj [E, 2I, H]
            for f in glob.glob(str(src / "*.safetensors")):
                os.remove(f)
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "model.safetensors"),
                      metadata={"format": "pt"})
        dst = root / "ct"
        result = CliRunner().invoke(main, ["quantize", str(src), str(dst), "--format", "compressed-tensors",
                                           "--device", "cpu", "--no-progress", "--max-shard-size", "40KB"])
        assert result.exit_code == 0, result.output
        native = root / "native"
        quantize_checkpoint(src, native, progress=False)
        cache[arch, layout] = (src, dst, native, result.output)
        return cache[arch, layout]

    return make


def native_experts(native_dir) -> dict:
    """Our native checkpoint as {per-expert role key: (q int8 [N, K], scale fp32 [N])}, by (prefix, role, e)."""
    t = tensors(native_dir)
    out = {}
    for key in t:
        if key.endswith((".experts.gate_up_proj", ".experts.up_proj")):  # (up_proj: experts without a gate)
            prefix, _, w13 = key.rpartition(".")
            q13, s13, q2, s2 = (t[f"{prefix}.{n}"] for n in (w13, f"{w13}_scale", "down_proj", "down_proj_scale"))
            i = q2.shape[-1]
            for e in range(q13.shape[0]):
                if w13 == "gate_up_proj":
                    out[prefix, "gate", e] = (q13[e, :i], s13[e, :i])
                out[prefix, "up", e] = (q13[e, -i:], s13[e, -i:])
                out[prefix, "down", e] = (q2[e], s2[e])
    return out


EXPERTS_TENSORS = (".experts.gate_up_proj", ".experts.up_proj", ".experts.down_proj")  # fused, in memory
ROLE = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


@pytest.mark.parametrize("k", [1, 4, 5, 7, 64, 33])
def test_pack_int8_is_the_librarys_packing(k):
    q = torch.randint(-127, 128, (6, k), dtype=torch.int8)
    packed = pack_int8(q)
    assert packed.dtype == torch.int32 and packed.shape == (6, (k + 3) // 4)
    assert torch.equal(packed, pack_to_int32(q, 8))
    assert torch.equal(unpack_from_int32(packed, 8, torch.Size([6, k])), q)


@pytest.mark.parametrize("arch,layout", CASES)
def test_library_decompresses_our_int8_bit_exactly(converted, arch, layout):
    src, dst, native, output = converted(arch, layout)
    assert "format compressed-tensors" in output
    assert len(glob.glob(str(dst / "*.safetensors"))) > 1 and (dst / "model.safetensors.index.json").is_file()

    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    qc = QuantizationConfig.model_validate(config)
    assert qc.quant_method == "compressed-tensors" and qc.format == "pack-quantized"
    assert qc.quantization_status == "compressed"
    (scheme,) = qc.config_groups.values()
    w = scheme.weights
    assert (w.num_bits, w.type, w.symmetric, w.strategy) == (8, "int", True, "channel")
    assert scheme.input_activations is None and scheme.targets == ["Linear"]
    compressor = BaseCompressor.get_value_from_registry(qc.format)

    out, source = tensors(dst), tensors(src)
    ours = native_experts(native)
    modules = {k.rsplit(".", 1)[0] for k in out if k.endswith(".weight_packed")}
    assert len(modules) == len(ours)  # one Linear per expert projection, nothing else quantized
    if layout == "per-expert":  # the source's own per-expert names
        assert {m + ".weight" for m in modules} == {k for k in source if PER_EXPERT.match(k)}
    for module in sorted(modules):
        m = PER_EXPERT.match(module + ".weight")
        assert m, module
        q, scale = ours[m["prefix"], ROLE[m["proj"]], int(m["e"])]
        assert out[f"{module}.weight_scale"].dtype == torch.float32
        assert out[f"{module}.weight_scale"].shape == (q.shape[0], 1)
        assert out[f"{module}.weight_shape"].tolist() == list(q.shape)
        state = compressor.decompress({n: out[f"{module}.{n}"] for n in SUFFIXES}, scheme)
        assert torch.equal(state["weight"], dequantize_weights(q, scale)), module
        assert not any(p in module for p in qc.ignore if p != "lm_head")

    rest = set(out) - {f"{m}.{n}" for m in modules for n in SUFFIXES}
    expert_sources = {k for k in source if PER_EXPERT.match(k) or k.endswith(EXPERTS_TENSORS)}
    assert rest == set(source) - expert_sources
    for key in rest:  # byte-identical copies
        a, b = out[key], source[key]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), key
    linear_like = {k[: -len(".weight")] for k in rest if k.endswith(".weight") and source[k].dim() == 2}
    assert linear_like <= set(qc.ignore) and "lm_head" in qc.ignore
    assert (dst / "tokenizer_config.json").is_file() == (src / "tokenizer_config.json").is_file()


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")  # we do pass dequantize=True on purpose
@pytest.mark.parametrize("arch,layout", CASES)
def test_transformers_loads_the_export(converted, arch, layout):
    if arch == "kimi_linear":
        pytest.skip("transformers' compressed-tensors loader fails to merge Kimi-Linear's attention conv weights "
                    "(a CONVERSION error on self_attn.conv1d.weight, which the export copies unchanged)")
    src, dst, native, _ = converted(arch, layout)
    ct_model, info = AutoModelForCausalLM.from_pretrained(
        dst, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True),
        output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    int8_model = AutoModelForCausalLM.from_pretrained(native, dtype=torch.bfloat16)
    bf16_model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)

    # Decompressed expert weights = our dequantized int8 weights. transformers 5.24 keeps the experts it
    # decompresses in the scales' dtype (fp32 here), so they equal ours bit for bit.
    # (transformers renames some prefixes on load, e.g. Mixtral's block_sparse_moe -> mlp: match by layer)
    nat = tensors(native)
    layer = lambda name: (int(re.search(r"layers\.(\d+)\.", name).group(1)), name.rsplit(".", 1)[1])  # noqa: E731
    stored = {layer(k): k for k in nat if k.endswith(EXPERTS_TENSORS)}
    loaded = {layer(n): p for n, p in ct_model.named_parameters() if n.endswith(EXPERTS_TENSORS)}
    assert set(stored) == set(loaded) and len(stored) == 2 * len(find_experts(int8_model))  # every MoE layer
    for where, key in stored.items():
        w = loaded[where]
        assert w.dtype in (torch.float32, torch.bfloat16)
        assert torch.equal(w, dequantize_weights(nat[key], nat[key + "_scale"], w.dtype)), key

    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    # Same weights, different rounding order (the int8 kernel applies the fp32 scale after the dot), and
    # the same routing: free-running, that rounding can flip a tiny random router's near-tie (LFM2's).
    quality = routing_quality(ct_model, int8_model, ids)
    assert quality["logits_snr_db_reference_routing"] >= 35, quality
    assert min(quality["moe_layer_snr_db_reference_routing"]) >= 35, quality
    with torch.no_grad():
        a, b, c = (m(ids).logits.float() for m in (ct_model, int8_model, bf16_model))
    if not any(quality["tokens_with_changed_topk_per_layer"]):
        assert snr_db(a, b) >= 35
        assert abs(snr_db(a, c) - snr_db(b, c)) < 3


@pytest.mark.parametrize("arch,layout", CASES)
def test_the_ignore_list_names_every_dense_linear_of_the_transformers_model(converted, arch, layout):
    """A default load (dequantize=False) applies the scheme to the model transformers builds, matching the ignore list
    against its module names, which transformers renames from the checkpoint's for some architectures (PhiMoE's
    block_sparse_moe.gate is mlp.router, NemotronH's backbone is model): a dense Linear the list missed was expected
    packed, its weight dropped (a crash in a forward or a init, a random layer)."""
    from compressed_tensors.utils import match_named_modules

    from experts_int8.integrations.transformers import _meta_model

    _, dst, _, _ = converted(arch, layout)
    config = json.loads((dst / "config.json").read_text())
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    model = _meta_model(dst, config)
    (scheme,) = qc.config_groups.values()
    assert [name for name, _ in match_named_modules(model, scheme.targets, qc.ignore)] == []


def test_a_model_whose_experts_are_linears_does_not_ignore_them(converted, tmp_path, monkeypatch):
    """A transformers whose model keeps the experts as per-expert Linears (not its standard experts module) names
    them among the model's Linears: they are the quantized ones, never ignored."""
    import experts_int8.integrations.transformers as integration

    src, _, _, _ = converted("mixtral", "per-expert")
    expert = "model.layers.0.block_sparse_moe.experts.0.w1"
    monkeypatch.setattr(integration, "dense_linear_names", lambda *a: ["model.layers.0.mlp.gate", expert])
    export_compressed_tensors(src, tmp_path / "ct", progress=False)
    ignore = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.0.mlp.gate" in ignore and expert not in ignore


@pytest.mark.parametrize("arch,layout", [(a, "per-expert") for a in ("phimoe", "nemotron_h", "mixtral")])
def test_transformers_loads_the_export_with_its_defaults(converted, arch, layout):
    """No quantization_config: transformers' own choice for a compressed-tensors checkpoint (dequantize=False)."""
    _, dst, native, _ = converted(arch, layout)
    ct_model, info = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.bfloat16, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    int8_model = AutoModelForCausalLM.from_pretrained(native, dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(0))
    quality = routing_quality(ct_model, int8_model, ids)
    assert quality["logits_snr_db_reference_routing"] >= 35, quality


def test_scales_cast_to_the_model_dtype_lose_little(converted):
    """vLLM and compressed-tensors allocate weight_scale in the model dtype: what a bf16 cast costs."""
    _, dst, _, _ = converted("mixtral", "per-expert")
    out = tensors(dst)
    compressor = BaseCompressor.get_value_from_registry("pack-quantized")
    scheme = QuantizationConfig.model_validate(
        json.loads((dst / "config.json").read_text())["quantization_config"]).config_groups["group_0"]
    worst, fp32, bf16 = 0.0, [], []
    for key in sorted(k for k in out if k.endswith(".weight_scale")):
        module = key[: -len(".weight_scale")]
        s = out[key]
        rel = ((s.to(torch.bfloat16).float() - s) / s).abs().max().item()
        worst = max(worst, rel)
        state = {n: out[f"{module}.{n}"] for n in SUFFIXES}
        fp32.append(compressor.decompress(state, scheme)["weight"])
        bf16.append(compressor.decompress({**state, "weight_scale": s.to(torch.bfloat16)}, scheme)["weight"].float())
    assert worst <= 2 ** -8  # round-to-nearest into bf16 (8 significant bits): unit roundoff 2^-8
    # The extra error is a per-row gain change, far below the int8 rounding itself (~40 dB).
    assert snr_db(torch.cat([b.flatten() for b in bf16]), torch.cat([f.flatten() for f in fp32])) > 50


def test_fused_experts_of_an_architecture_read_fused_only_are_refused(tmp_path):
    """Qwen3-VL-MoE's checkpoints hold the experts fused and transformers merges no per-expert keys for it: an
    export under per-expert names loaded with its experts missing (random) and only a load report."""
    src = tmp_path / "src"
    tiny_model("qwen3_vl_moe", dtype=torch.bfloat16).save_pretrained(src)
    with pytest.raises(ValueError, match="holds its experts fused, and transformers reads this architecture's "
                                         "experts fused only.*--format native"):
        export_compressed_tensors(src, tmp_path / "ct", progress=False)
    assert not (tmp_path / "ct").exists()


def test_a_remote_code_architectures_per_expert_keys_export_under_their_own_names(converted, tmp_path):
    """Kimi K2's model_type is its own code, so transformers merges no per-expert names for it: its per-expert keys
    (as released) export under those names, as its DeepSeek-V3 twin's do (it failed with "'NoneType' object is not
    subscriptable" after quantizing the first block)."""
    import shutil

    twin_src, twin, _, _ = converted("deepseek_v3", "per-expert")
    src = tmp_path / "kimi_k2"
    shutil.copytree(twin_src, src)
    config = json.loads((src / "config.json").read_text())
    auto_map = {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}
    (src / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2", "auto_map": auto_map}))
    result = CliRunner().invoke(main, ["quantize", str(src), str(tmp_path / "ct"), "--format", "compressed-tensors",
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    ours, theirs = tensors(tmp_path / "ct"), tensors(twin)
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_python_entry_and_unknown_format(tmp_path, converted):
    src, _, _, _ = converted("qwen3_moe", "per-expert")
    report = export_compressed_tensors(src, tmp_path / "ct", progress=False)
    assert report.snr_summary()[0] > 30
    assert json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["format"] == \
        "pack-quantized"
    with pytest.raises(ValueError, match="unknown format"):
        quantize_checkpoint(src, tmp_path / "x", format="gguf", progress=False)
    assert not (tmp_path / "x").exists()


def test_export_warns_when_transformers_cannot_build_the_model_for_its_names(tmp_path, converted, monkeypatch):
    """The ignore list's second set of names (transformers' own, for its loader) needs the model built on the meta
    device; where that fails the export still completes, with the checkpoint's names, and a warning says so."""
    import experts_int8.integrations.transformers as integration

    src, ct, _, _ = converted("phimoe", "per-expert")

    def cannot_build(*args, **kwargs):
        raise RuntimeError("no such architecture here")

    monkeypatch.setattr(integration, "dense_linear_names", cannot_build)
    with pytest.warns(UserWarning, match=r"could not build the model \(RuntimeError: no such architecture here\)"):
        export_compressed_tensors(src, tmp_path / "ct", progress=False)
    ignore = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["ignore"]
    full = json.loads((ct / "config.json").read_text())["quantization_config"]["ignore"]
    assert set(ignore) < set(full)  # (the model's names for PhiMoE's renamed routers are missing)


@pytest.mark.parametrize("snr_rows, dtype", [(3, torch.bfloat16), (256, torch.bfloat16), (3, torch.float64)])
def test_the_snr_of_transposed_experts_is_the_formulas(tmp_path, monkeypatch, snr_rows, dtype):
    """GPT-OSS's experts reach the SNR sums as transposed views of the fused tensors (each block of rows strided),
    and the sums are dot products of flattened blocks: the rows must pair the weights with their own int8 values
    (a float64 block is not copied to float64: the strided block itself is flattened)."""
    import experts_int8.convert as convert
    from experts_int8.checkpoint import to_fused_layout

    src = tmp_path / "float"
    tiny_model("gpt_oss", dtype=dtype).save_pretrained(src)
    monkeypatch.setattr(convert, "SNR_ROWS", snr_rows)
    reads, real = [], torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: (reads.append(t.numel()), real(t))[1])
    report = quantize_checkpoint(src, tmp_path / "int8", progress=False)
    want, got = tensors(src), tensors(tmp_path / "int8")
    assert len(report.snr_db) == 4
    assert len(reads) == 2 * len(report.snr_db)  # (the sums read once per experts tensor, not per block of rows)
    for layer, value in report.snr_db.items():
        prefix, _, name = layer.rpartition(".")
        ref = to_fused_layout("gpt_oss", name, want[layer]).double()
        expected = snr_db(dequantize_weights(got[layer], got[f"{layer}_scale"], torch.float64), ref)
        assert abs(value - expected) < 1e-6, layer


def test_the_converter_reads_one_file_at_a_time_and_reports_the_whole_tensors_snr(converted, tmp_path,
                                                                                   monkeypatch):
    """Every source file stayed open for the whole conversion, and each page read through a handle stays mapped
    while it is open: the process grew to the size of the source checkpoint, whatever --max-shard-size said. The
    SNR is summed a block of rows at a time (fp64 copies of a whole expert were most of the peak beside it)."""
    import experts_int8.convert as convert

    src, _, _, _ = converted("qwen3_moe", "per-expert")
    open_now, most = [0], [0]
    real = convert.safe_open

    class Counted:
        def __init__(self, *args, **kwargs):
            self.handle = real(*args, **kwargs)

        def __enter__(self):
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            return self.handle.__enter__()

        def __exit__(self, *exc):
            open_now[0] -= 1
            return self.handle.__exit__(*exc)

    monkeypatch.setattr(convert, "safe_open", Counted)
    monkeypatch.setattr(convert, "SNR_ROWS", 3)  # (several blocks a tensor)
    report = quantize_checkpoint(src, tmp_path / "int8", progress=False)
    assert most[0] == 1 and open_now[0] == 0
    layer = next(k for k in report.snr_db if k.endswith("down_proj"))
    prefix = layer.rpartition(".")[0]
    want = {}
    for f in glob.glob(str(src / "*.safetensors")):
        want.update(load_file(f))
    q, s = (load_file(str(tmp_path / "int8" / "model.safetensors"))[f"{layer}{t}"] for t in ("", "_scale"))
    ref = torch.stack([want[f"{prefix}.{e}.down_proj.weight"] for e in range(q.shape[0])]).double()
    expected = snr_db(dequantize_weights(q, s, torch.float64), ref)
    assert abs(report.snr_db[layer] - expected) < 1e-6
