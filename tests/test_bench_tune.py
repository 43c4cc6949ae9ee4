"""Benchmark and tuning tooling: config override, tuner search space, tables, bench math, CLI.

Everything here runs on CPU (Triton's interpreter for the one kernel run); the end-to-end runs of
``bench`` and ``tune`` on a real GPU carry the ``gpu`` marker.
"""

import json

import pytest
import torch

import experts_int8
from experts_int8 import reference
from experts_int8.kernels import configs, fused_moe

from conftest import DEVICE, HAS_CUDA

PINNED = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=1)


# --- config override -------------------------------------------------------------------------------

def test_override_config_is_honoured_by_fused_experts(monkeypatch):
    seen = []
    launch_meta = fused_moe._launch_meta

    def spy(config):
        seen.append(dict(config))
        return launch_meta(config)

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
    ref = reference.fused_experts(x.float(), w13, w2, weights, ids, w13_scale=w13_scale, w2_scale=w2_scale)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
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
    ({k: v for k, v in PINNED.items() if k != "num_stages"}, "exactly the keys"),
    (dict(PINNED, BLOCK_SIZE_N=48), "power of two"),
    (dict(PINNED, BLOCK_SIZE_K=8), "power of two"),
    (dict(PINNED, num_warps=0), "positive int"),
    (dict(PINNED, GROUP_SIZE_M=1.5), "positive int"),
])
def test_override_config_rejects_bad_configs(bad, words):
    with pytest.raises(ValueError, match=words):
        with configs.override_config(bad):
            pass
