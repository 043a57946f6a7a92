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
(analyze: top level; study: tables/; bi-induct: runs/*/ too) cell for cell. Prints each difference
as a JSON path and exits 1 if any value differs. Ignored by default, because they are meant to
differ: the keys timings, versions and params of results.json (params' layout is compared by eye:
see the report of issue 8), CSV columns and results.json keys of measured seconds (``s`` one of the name's ``_`` words:
``step_time_s``, ``tokens_per_s``, ``train_wall_s_this_call``; ``--seconds`` compares them too), and where the two runs lie: a string that names a path under
either run's parent directory is compared relative to it (``evaluate RUN_DIR`` records its model's path).

Issue 24 (one engine, one results header): runs from before it lack some header keys (``kind`` in analyze,
``resumed`` in analyze and study temporal, ``model`` in bi-induct, ``model.device`` in temporal and evaluate)
and name their evaluation folder by another hash (``eval-<hash>`` of the recipe, now a typed config).
``--header`` compares such runs: a header key (or a ``model`` key) found on one side only is listed as a
note, not a difference, and ``eval-<hash>`` is compared as ``eval-<key>`` in paths and file names.

Issue 16's before/after runs (every job above plus `evaluate` with zero and mean ablation of a tiny
trained checkpoint, a fixed-seed `train`, `study bi-induct --preset tiny`) are the jobs of one script
run once per code version, each into its own OUT; then this script per job directory.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path


def seconds(name) -> bool:
    """A name of a measured time: ``s`` is one of its ``_``-separated words after the first
    (``step_time_s``, ``tokens_per_s``, ``train_wall_s_this_call``, ``train_time_s_total``)."""
    return "s" in str(name).split("_")[1:]


def diff(a, b, path="", skip_seconds: bool = True) -> list[str]:
    """Every leaf that differs, as a JSON path; keys of seconds (:func:`seconds`) skipped unless asked."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            if not (skip_seconds and seconds(k)):
                out += diff(a[k], b[k], f"{path}/{k}", skip_seconds)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]", skip_seconds)]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} != {b!r}"]


def relative_paths(obj, root: str):
    """``obj`` with ``root`` (a directory, as a string) cut from the front of every string that starts with it."""
    if isinstance(obj, dict):
        return {k: relative_paths(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relative_paths(v, root) for v in obj]
    if isinstance(obj, str) and obj.startswith(root):
        return "<runs>" + obj[len(root):]
    return obj


HEADER = ("kind", "model", "params", "versions", "distributed", "resumed", "timings")
EVAL_KEY = re.compile(r"eval-[0-9a-f]{10}")


def header_notes(a: dict, b: dict) -> list[str]:
    """Header keys (and ``model`` keys) on one side only, removed from both (``--header``)."""
    notes = []
    for k in HEADER:
        if (k in a) != (k in b):
            notes.append(f"/{k}: only in {'before' if k in a else 'after'}")
            a.pop(k, None), b.pop(k, None)
    ma, mb = a.get("model"), b.get("model")
    if isinstance(ma, dict) and isinstance(mb, dict):
        for k in sorted(set(ma) ^ set(mb)):
            notes.append(f"/model/{k}: only in {'before' if k in ma else 'after'}")
            ma.pop(k, None), mb.pop(k, None)
    return notes


def eval_keys(obj):
    """``obj`` with every ``eval-<hash>`` in its strings written ``eval-<key>``."""
    if isinstance(obj, dict):
        return {k: eval_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [eval_keys(v) for v in obj]
    return EVAL_KEY.sub("eval-<key>", obj) if isinstance(obj, str) else obj


def csv_differences(a: Path, b: Path, skip_seconds: bool = True) -> list[str]:
    """Columns that differ between two CSV files (columns of seconds skipped unless asked)."""
    if a.read_bytes() == b.read_bytes():
        return []
    import pandas as pd

    x, y = pd.read_csv(a), pd.read_csv(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return ["columns or rows differ"]
    keep = [c for c in x.columns if not (skip_seconds and seconds(c))]
    return [f"column {c}" for c in keep if not x[c].equals(y[c])]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore", nargs="*", default=["timings", "versions", "params"],
                    help="top-level keys of results.json to skip")
    ap.add_argument("--seconds", action="store_true",
                    help="also compare measured times (CSV columns and results.json keys such as step_time_s)")
    ap.add_argument("--header", action="store_true",
                    help="a run from before the one results header: header keys on one side only are notes, and "
                         "eval-<hash> folders are compared by position")
    args = ap.parse_args()
    a = relative_paths(json.loads((args.before / "results.json").read_text()), str(args.before.resolve().parent))
    b = relative_paths(json.loads((args.after / "results.json").read_text()), str(args.after.resolve().parent))
    for k in args.ignore:
        a.pop(k, None), b.pop(k, None)
    notes = header_notes(a, b) if args.header else []
    if args.header:
        a, b = eval_keys(a), eval_keys(b)
    problems = diff(a, b, skip_seconds=not args.seconds)
    after_by = {EVAL_KEY.sub("eval-<key>", str(p.relative_to(args.after))): p for p in args.after.rglob("*.csv")}
    csvs = sorted(p.relative_to(args.before) for p in args.before.rglob("*.csv") if "checkpoints" not in p.parts)
    for rel in csvs:
        other = after_by.get(EVAL_KEY.sub("eval-<key>", str(rel)), args.after / rel) if args.header else args.after / rel
        if not other.exists():
            problems.append(f"{rel}: missing after")
        else:
            problems += [f"{rel}: {d}" for d in csv_differences(args.before / rel, other, not args.seconds)]
    n_leaves = len(json.dumps(a))
    for n in notes:
        print(f"note (header): {n}")
    for p in problems:
        print(p)
    print(f"{'DIFFERENT' if problems else 'IDENTICAL'}: results.json ({n_leaves} characters compared, "
          f"ignoring {', '.join(args.ignore)}) and {len(csvs)} CSV files"
          + ("" if args.seconds else " (measured seconds skipped)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
