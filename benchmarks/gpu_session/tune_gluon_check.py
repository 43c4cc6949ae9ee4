"""The tuner's Gluon candidates on the GPU: tune mixtral-8x7b int8 at M = 256 and 8192 (entries that
are not GLUON, so gluon_variants offers its three) with each Gluon candidate's time printed, or why
it was skipped. Tables go to a scratch folder, not the shipped ones.

    PYTHONPATH=src python3 benchmarks/gpu_session/tune_gluon_check.py
"""
import tempfile

import torch

from experts_int8 import tune

print("gluon usable here:", tune.gluon_usable(torch.device("cuda", 0)), flush=True)
real_measure = tune._gpu_measure


def traced_measure(*args, **kwargs):
    measure = real_measure(*args, **kwargs)

    def timed(cfg, best_s):
        try:
            seconds = measure(cfg, best_s)
        except Exception as exc:
            if cfg.get("GLUON"):
                print(f"  GLUON candidate skipped: {type(exc).__name__}: {str(exc)[:200]}  {tune._short(cfg)}")
            raise
        if cfg.get("GLUON"):
            print(f"  GLUON candidate {seconds * 1e6:9.1f} us  {tune._short(cfg)}", flush=True)
        return seconds
    return timed


tune._gpu_measure = traced_measure
with tempfile.TemporaryDirectory() as scratch:
    tune.tune(8, 4096, 14336, 2, dtypes=("int8",), ms=(256, 8192), out_dir=scratch, budget_s=60, progress=False)
