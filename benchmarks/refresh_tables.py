"""Fold kernel-benchmark measurements back into the shipped config tables (no GPU needed).

Each bench_kernel row records the config that served it and its fraction of the roofline. For every
(shape, weight format, M) row, the config with the best measured fraction across the given runs
replaces the table's entry at M when it beat that entry's own measurement by more than --margin
(fraction points). Entries whose config no run measured are left alone. Then PAIRS is dropped where
the tuner no longer offers it (pairs that often share an expert: see tune.pairs_variants).

    python3 benchmarks/refresh_tables.py benchmarks/results/bench_kernel_A.json benchmarks/results/bench_kernel_B.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import torch  # noqa: E402

from experts_int8 import tune  # noqa: E402
from experts_int8.kernels import configs  # noqa: E402

FORMATS = {"int8": torch.int8, "bf16": torch.bfloat16}


def read_table(path: str) -> dict[int, dict]:
    with open(path) as f:
        return {int(key): value for key, value in json.load(f).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench_kernel JSON files (same GPU)")
    ap.add_argument("--tables", default=str(configs.PACKAGE_DIR), help="folder of the tables to update")
    ap.add_argument("--margin", type=float, default=0.03, help="fraction points a measurement must win by")
    ap.add_argument("--max-m", type=int, default=128, help="only rows up to this M (decode: routing-light)")
    args = ap.parse_args()

    rows: dict[tuple, list[dict]] = {}
    gpus = set()
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        gpus.add(run["gpu"])
        for r in run["rows"]:
            if r["M"] <= args.max_m:
                rows.setdefault((r["E"], r["I"], r["k"], r["dtype"], r["M"]), []).append(r)
    if len(gpus) != 1:
        sys.exit(f"error: runs from {len(gpus)} GPUs ({', '.join(sorted(gpus))}); give runs of one GPU")
    gpu = gpus.pop().replace(" ", "_")  # as configs.device_name spells it in table names

    changed: dict[str, dict] = {}
    for (e, inter, k, dtype, m), measured in sorted(rows.items()):
        name = configs.table_name(e, inter, gpu, configs.weight_format(FORMATS[dtype]))
        path = os.path.join(args.tables, name)
        if not os.path.isfile(path):
            continue
        table = changed.get(path) or read_table(path)
        if m not in table:
            continue
        current = [r["roofline_frac"] for r in measured if r["config"] == table[m]]
        best = max(measured, key=lambda r: r["roofline_frac"])
        if current and best["config"] != table[m] and best["roofline_frac"] > max(current) + args.margin:
            print(f"{name} M={m}: {max(current):.1%} -> {best['roofline_frac']:.1%} of roofline "
                  f"({tune._short(best['config'])})")
            table[m] = configs.check_config(best["config"])
            changed[path] = table

    # Tables name E and N, not top-k: take it from the benchmarked shapes with the same E (the TP shards
    # of a model share its E and k); where those disagree, leave the table's PAIRS alone.
    top_ks: dict[int, set] = {}
    for (e, _, k, _, _) in rows:
        top_ks.setdefault(e, set()).add(k)
    for name in sorted(os.listdir(args.tables)):
        path = os.path.join(args.tables, name)
        if f"device={gpu}," not in name:
            continue
        e = int(name.split(",")[0].split("=")[1])
        table = changed.get(path) or read_table(path)
        ks = top_ks.get(e, set())
        for m, cfg in table.items():
            if (cfg.get("PAIRS") and not cfg.get("DEDUP_PAIRS") and len(ks) == 1
                    and not tune.pairs_fit(m, e, next(iter(ks)))):
                print(f"{name} M={m}: PAIRS (and SUM_TOPK, which needs it) dropped: pairs often share an expert")
                table[m] = configs.check_config(configs.without(cfg, "PAIRS", "SUM_TOPK"))
                changed[path] = table

    for path, table in changed.items():
        for m, cfg in table.items():
            configs.check_config(cfg)  # get_config refuses a table with one bad entry: never write one
        with open(path, "w") as f:
            json.dump({str(m): table[m] for m in sorted(table)}, f, indent=4)
            f.write("\n")
    print(f"{len(changed)} table(s) updated")


if __name__ == "__main__":
    main()
