"""NOTES item 75: the tuner's search at decode with every candidate forced to FP16_DOT on or off, per
shape, same budget: does FP16_DOT find configs the bf16 conversion could not use?"""
import sys
import tempfile

from experts_int8 import bench, tune

orig = tune.search


def forced(value):
    def search(cands, measure, *, refine=None, **kw):
        f = lambda c: dict(c, FP16_DOT=value)  # noqa: E731
        return orig([f(c) for c in cands], measure, refine=(lambda b: [f(c) for c in refine(b)]) if refine else None, **kw)
    return search


for shape in sys.argv[1:]:
    _, (e, h, i, k) = bench.parse_shape(shape)
    for value in (0, 1):
        tune.search = forced(value)
        print(f"=== {shape} FP16_DOT={value}", flush=True)
        tune.tune(e, h, i, k, dtypes=("int8",), ms=[1, 2], out_dir=tempfile.mkdtemp(), budget_s=50,
                  max_candidates=40, progress=False)
