#!/usr/bin/env python3
"""Kernel benchmark of experts_int8.fused_experts (bf16 vs int8 experts) against the GPU's ceilings.

Runs from a source checkout without installing the package (``src/`` is put on the path); the
same benchmark is ``experts-int8 bench`` once installed. ``--help`` lists the options; the method
is described in ``src/experts_int8/bench.py`` and DESIGN.md ("Measuring speed").
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from experts_int8.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--out", str(ROOT / "benchmarks" / "results"), *sys.argv[1:]]))
