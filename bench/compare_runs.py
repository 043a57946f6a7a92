"""Compare two run directories of `inductionlab analyze` or `inductionlab study temporal` number by number.

Used to show a refactoring changes no result (issue 8): run the same command (fixed seeds, fp32,
CPU) before and after, then

    python bench/compare_runs.py BEFORE_DIR AFTER_DIR [--ignore timings versions ...]

The runs used for issue 8 (tiny random Llama from tests/_tiny.py `tiny_llama_dir(Path(M))`,
OMP_NUM_THREADS=1, mean ablation so the reference batch and batching are exercised):

    inductionlab analyze --model M --out OUT/analyze --dtype float32 --n-permutations 4 --list-length 30 \
        --cue-position 15 --ks 1,2 --n-draws 2 --score-seq-len 10 --score-batch-size 4 --top 3 --quiet \
        --method mean --batch-size 3
    inductionlab study temporal --model M --out OUT/study --dtype float32 --permutations 5 --list-length 30 \
        --cue-position 15 --recall-trials 4 --recall-list-length 6 --shots 2 --ks 1,2 --n-draws 2 \
        --load-bearing-top 2 --load-bearing-permutations 4 --batch-size 3 --no-progress --threads 1 --method mean

Every leaf of results.json is compared exactly (tolerance 0; NaN equals NaN), and every CSV file
(analyze: top level; study: tables/) byte for byte. Prints each difference as a JSON path and
exits 1 if any value differs. Keys ignored by default: timings, versions (they are meant to
differ), params (their layout is compared by eye: see the report of issue 8).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            out += diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore", nargs="*", default=["timings", "versions", "params"],
                    help="top-level keys of results.json to skip")
    args = ap.parse_args()
    a = json.loads((args.before / "results.json").read_text())
    b = json.loads((args.after / "results.json").read_text())
    for k in args.ignore:
        a.pop(k, None), b.pop(k, None)
    problems = diff(a, b)
    csvs = sorted(p.relative_to(args.before) for p in args.before.rglob("*.csv") if "checkpoints" not in p.parts)
    for rel in csvs:
        other = args.after / rel
        if not other.exists():
            problems.append(f"{rel}: missing after")
        elif other.read_bytes() != (args.before / rel).read_bytes():
            problems.append(f"{rel}: differs")
    n_leaves = len(json.dumps(a))
    for p in problems:
        print(p)
    print(f"{'DIFFERENT' if problems else 'IDENTICAL'}: results.json ({n_leaves} characters compared, "
          f"ignoring {', '.join(args.ignore)}) and {len(csvs)} CSV files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
