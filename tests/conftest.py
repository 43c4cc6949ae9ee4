"""Test setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here, before any test module
imports experts_int8 (and with it Triton). GPU-only tests carry the ``gpu`` marker and are skipped.
"""

import os
import zlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"

# Under pytest-xdist each worker, and each rank process a test spawns (OMP_NUM_THREADS is inherited), would
# take every core's thread: 14 workers of 16 threads on 16 cores stalled the subprocess tests on the GPU machine
# (benchmarks/NOTES.md item 225). A worker gets its share of the cores instead.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _workers))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # A different but reproducible seed per test: fresh inputs each case, replayable on failure (crc32, not
    # hash(): Python salts str hashes per process, so hash() gave every run new inputs)
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
