"""Rewrite the README's speed table from bench_kernel runs: the first run's times (with the fraction of
the measured ceiling: copy bandwidth at M <= 16, matmul rate from M=1024) and speed-ups, then the
speed-up in each further run. Rows and their order are the table's own; each row's marks come from the
int8 entry that ran it (§ register form, ‡ Gluon kernels, † tail pass) and ◦ where either format's entry
was tuned for another M (the rows' config_source). The paragraph above the table
names the runs and their commits: edit it by hand.

    python3 benchmarks/readme_table.py benchmarks/results/bench_kernel_NVIDIA_H200_<new>.json \\
        benchmarks/results/bench_kernel_NVIDIA_H200_<before>.json ...
"""
import argparse
import json
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| shape (E, H, I, k) | M |"


def cell(row: dict) -> str:
    time = f"{row['time_us']:.0f} µs"
    if row["M"] <= 16:
        return f"{time} ({100 * row['bw_frac']:.0f}%)"
    if row["M"] >= 1024:
        return f"{time} ({100 * row['flop_frac']:.0f}%)"
    return time


def marks(int8: dict, bf16: dict) -> str:
    """The int8 entry's kernels (§, ‡) and tail pass (†); ◦ where either format ran an entry tuned for another
    M (the row's ``config_source``, in runs that record it)."""
    config = int8["config"]
    kernel = " §" if config.get("WSRR") else " ‡" if config.get("GLUON") else ""
    borrowed = any(r.get("config_source") not in (None, f"table M={r['M']}") for r in (int8, bf16))
    return kernel + (" †" if config.get("TAIL_ROWS") else "") + (" ◦" if borrowed else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench_kernel JSON files, the table's run first")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args()
    runs = []
    for path in args.runs:
        try:
            with open(path) as f:
                runs.append({(r["shape"], r["M"], r["dtype"]): r for r in json.load(f)["rows"]})
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"{path}: not a bench_kernel JSON ({err})")
    lines = args.readme.read_text().split("\n")
    head = next((i for i, line in enumerate(lines) if line.startswith(HEADER)), None)
    if head is None:
        raise SystemExit(f"{args.readme}: no table starting with {HEADER!r}")
    end, label, out = head + 2, "", []
    while end < len(lines) and lines[end].startswith("|"):
        first, m = (c.strip() for c in lines[end].split("|")[1:3])
        label = first or label  # a shape's label is on its first row only
        shape, m = label.split(" ")[0], int(m.split()[0])
        missing = [p for p, run in zip(args.runs, runs)
                   if (shape, m, "int8") not in run or (shape, m, "bf16") not in run]
        if missing:
            raise SystemExit(f"{shape} M={m} is not in {missing[0]}: the table's rows need every run to have them")
        bf16, int8 = runs[0][(shape, m, "bf16")], runs[0][(shape, m, "int8")]
        others = " / ".join(f"{r[(shape, m, 'bf16')]['time_us'] / r[(shape, m, 'int8')]['time_us']:.2f}x"
                            for r in runs[1:])
        out.append(f"| {first} | {m}{marks(int8, bf16)} | {cell(bf16)} | {cell(int8)} | "
                   f"{bf16['time_us'] / int8['time_us']:.2f}x | {others} |")
        end += 1
    lines[head + 2:end] = out
    args.readme.write_text("\n".join(lines))
    print(f"rewrote {len(out)} rows of {args.readme.name}'s table from {args.runs[0]}")


if __name__ == "__main__":
    main()
