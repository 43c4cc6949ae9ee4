"""Fold a variant A/B's winners into the tuned tables: for every (shape, M) row of a
``variant_ab_<variant>.json`` where a variant ran at least --min-gain faster than value 0 (the
shipped config), and in every round faster than the shipped config's fastest where the A/B ran
several, the table entry at that M becomes the variant applied to the config the A/B started from.
Run on the GPU the A/B ran on (the tables are per device).

    PYTHONPATH=src python3 benchmarks/fold_ab.py /tmp/gpu_session/variant_ab_gluon.json \
        --out-dir src/experts_int8/kernels/configs
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402
from variant_ab import VARIANTS  # noqa: E402

from experts_int8 import bench, tune  # noqa: E402
from experts_int8.kernels import configs  # noqa: E402

DTYPES = {"int8": torch.int8, "bf16": torch.bfloat16}


def winner(row: dict, variant: str, values, min_gain: float):
    """The fastest value that beats value 0 by at least ``min_gain`` (and, for gluon, really ran); from an
    A/B of several rounds (variant_ab --rounds), only if its slowest round beat the baseline's fastest too
    (one run's noise reaches 6% at some rows: benchmarks/NOTES.md item 112)."""
    base = row.get(f"{variant}={values[0]}_us")
    if base is None:  # the shipped config itself failed the A/B's correctness check: nothing to compare
        return None
    timed = [(row[f"{variant}={v}_us"], v) for v in values[1:]
             if row.get(f"{variant}={v}_ran", True) and f"{variant}={v}_us" in row]
    if not timed:
        return None
    us, value = min(timed)
    rounds, base_rounds = row.get(f"{variant}={value}_us_rounds"), row.get(f"{variant}={values[0]}_us_rounds")
    if rounds and base_rounds and max(rounds) >= min(base_rounds):
        return None
    return value if us <= base * (1 - min_gain) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ab_json")
    ap.add_argument("--out-dir", default=str(configs.PACKAGE_DIR))
    ap.add_argument("--min-gain", type=float, default=0.02)
    args = ap.parse_args()
    with open(args.ab_json) as f:
        ab = json.load(f)
    variant = ab["variant"]
    if variant == "mma_v2":
        sys.exit(f"{variant} is a process-wide switch, not a table entry: nothing to fold")
    apply, values = VARIANTS[variant]
    values = tuple(ab.get("values", values))  # the values the A/B timed, the first its baseline
    if values[0] != 0:
        sys.exit(f"the A/B's baseline is {variant}={values[0]}, not the shipped config (0): nothing to fold")
    device = configs.device_name()
    folded = 0
    for row in ab["rows"]:
        value = winner(row, variant, values, args.min_gain)
        if value is None:
            continue
        _, (e, _h, i, k) = bench.parse_shape(row["shape"])
        m, dtype = row["M"], DTYPES[row["dtype"]]
        base = configs.get_config(m, e, i, k, dtype)
        new = apply(base, value, m, e, i, k, dtype)
        tune.write_table({m: new}, e, i, device, configs.weight_format(dtype), args.out_dir)
        folded += 1
        print(f"{row['shape']:16s} M={m:<5d} {variant}={value}: "
              f"{row[f'{variant}={values[0]}_us']:.1f} -> {row[f'{variant}={value}_us']:.1f} us  {tune._short(new)}")
    print(f"folded {folded} of {len(ab['rows'])} rows")


if __name__ == "__main__":
    main()
