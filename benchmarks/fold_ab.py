"""Fold a variant A/B's winners into the tuned tables: for every (shape, M) row of a
``variant_ab_<variant>.json`` where a variant ran at least --min-gain faster than value 0 (the
shipped config), and in every round faster than the shipped config's fastest where the A/B ran
several, the table entry at that M becomes the variant applied to the config the A/B started from.
Run on the GPU the A/B ran on (the tables are per device; another GPU is refused). The entry written is the
one the A/B timed (recorded per value in its JSON), and only where the table still serves that M the entry
the A/B started from: a table changed since (another fold, a tune) would take a combination never timed.
A/B files without the recorded entries are refused unless --unrecorded-base (then the variant is re-applied
to the current entry, which must be the one the A/B ran on), and so are A/Bs of fewer than 3 rounds unless
--allow-few-rounds (one run's noise reaches 6% at some rows; a winner must beat the baseline in every round).

    PYTHONPATH=src python3 benchmarks/fold_ab.py /tmp/gpu_session/variant_ab_gluon.json \
        --out-dir src/experts_int8/kernels/configs
"""
import argparse
import json
import os
import re
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
    ap.add_argument("--unrecorded-base", action="store_true",
                    help="fold an A/B file that does not record the entries it timed (older variant_ab.py): the "
                         "variant is applied to the table's current entry, unchecked")
    ap.add_argument("--allow-few-rounds", action="store_true",
                    help="fold an A/B of fewer than 3 rounds (variant_ab --rounds), on its --min-gain alone")
    args = ap.parse_args()
    with open(args.ab_json) as f:
        ab = json.load(f)
    rounds = ab.get("rounds") or max((len(v) for row in ab["rows"] for key, v in row.items()
                                      if key.endswith("_us_rounds")), default=1)
    if rounds < 3 and not args.allow_few_rounds:
        sys.exit(f"{args.ab_json} timed each value in {rounds} round(s): re-run variant_ab.py with --rounds 3 (one "
                 f"run's noise reaches 6% at some rows), or pass --allow-few-rounds")
    device = configs.device_name()
    if ab.get("gpu") is not None and re.sub(r"[^\w.-]", "_", ab["gpu"]) != device:
        sys.exit(f"the A/B ran on {ab['gpu']}, this is {device}: fold it on the GPU it measured (tables are per device)")
    variant = ab["variant"]
    if variant == "mma_v2":
        sys.exit(f"{variant} is a process-wide switch, not a table entry: nothing to fold")
    apply, values = VARIANTS[variant]
    values = tuple(ab.get("values", values))  # the values the A/B timed, the first its baseline
    if values[0] != 0:
        sys.exit(f"the A/B's baseline is {variant}={values[0]}, not the shipped config (0): nothing to fold")
    folded = 0
    for row in ab["rows"]:
        value = winner(row, variant, values, args.min_gain)
        if value is None:
            continue
        _, (e, _h, i, k) = bench.parse_shape(row["shape"])
        m, dtype = row["M"], DTYPES[row["dtype"]]
        base = configs.get_config(m, e, i, k, dtype)
        if "base_config" in row:
            if configs.check_config(row["base_config"]) != base:
                print(f"{row['shape']:16s} M={m:<5d} skipped: the table's entry is no longer the one the A/B started "
                      f"from ({tune._short(row['base_config'])} then, {tune._short(base)} now); re-run the A/B")
                continue
            new = row.get(f"{variant}={value}_config")
            if new is None:
                print(f"{row['shape']:16s} M={m:<5d} skipped: the A/B recorded no entry for {variant}={value}")
                continue
        elif args.unrecorded_base:
            new = apply(base, value, m, e, i, k, dtype)
        else:
            sys.exit(f"{args.ab_json} does not record the entries it timed (an older variant_ab.py): re-run the A/B, "
                     f"or pass --unrecorded-base if the tables are as they were when it ran")
        tune.write_table({m: new}, e, i, device, configs.weight_format(dtype), args.out_dir)
        folded += 1
        print(f"{row['shape']:16s} M={m:<5d} {variant}={value}: "
              f"{row[f'{variant}={values[0]}_us']:.1f} -> {row[f'{variant}={value}_us']:.1f} us  {tune._short(new)}")
    print(f"folded {folded} of {len(ab['rows'])} rows")


if __name__ == "__main__":
    main()
