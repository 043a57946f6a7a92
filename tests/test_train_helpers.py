"""Shared helpers for the tests/test_train_*.py files: a tiny prepared corpus and tiny run flags."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

WORDS = ("the a cat dog bird sat ran saw ate on under near red blue green big small house tree river "
         "mountain quickly slowly happy sad man woman child king queen sword ship sea").split()


def make_corpus(tmp: Path, seed: int = 0, n_lines: int = 3000) -> Path:
    """A prepared corpus (BPE vocab 300) of random sentences; returns its directory."""
    from inductionlab.data.shards import prepare_corpus
    r = random.Random(seed)
    lines = [" ".join(r.choice(WORDS) for _ in range(r.randint(5, 15))) + "." for _ in range(n_lines)]
    txt = tmp / "corpus.txt"
    txt.write_text("\n\n".join(lines))
    out = tmp / "shards"
    prepare_corpus(txt, out, vocab_size=300, heldout_fraction=0.05, chunk_chars=2000)
    return out


def tiny_flags(data: Path, out: Path, **over) -> list[str]:
    """CLI flags of a tiny deterministic CPU run (cpu-tiny, 64-token context, 1024 tokens/update)."""
    opts = {"data": data, "out": out, "preset": "cpu-tiny", "seq-len": 64, "tokens-per-update": 1024,
            "tokens": 1024 * 12, "micro-batch-size": 8, "log-checkpoints": 3, "telemetry-seq-len": 12,
            "telemetry-batch": 4, "eval-tokens": 1024, "span-length": 8, "curriculum": "induction"}
    opts.update({k.replace("_", "-"): v for k, v in over.items()})
    flags = [f"--{k}={v}" for k, v in opts.items() if v is not None]
    return flags + ["--deterministic", "--no-progress", "--no-tensorboard"]


def run_cli(args: list[str], prelude: str = "", **kw) -> subprocess.CompletedProcess:
    """Run ``inductionlab ARGS`` in a fresh Python process (``prelude`` runs first, e.g. a patch).

    One OpenMP thread per process: on a shared 2-core machine, spinning OpenMP teams of several
    processes slow a tiny model down by orders of magnitude."""
    code = f"{prelude}\nfrom inductionlab.cli import main\nmain()"
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env, **kw)


def tiny_trained_run(tmp: Path) -> tuple[Path, Path]:
    """(corpus dir, training run dir): a 2-update cpu-micro run (2 layers x 4 heads, context 64)."""
    data = make_corpus(tmp)
    r = run_cli(["train", *tiny_flags(data, tmp / "run", preset="cpu-micro", tokens=2048, log_checkpoints=0)])
    assert r.returncode == 0, r.stderr
    return data, tmp / "run"


def losses(run: Path) -> list[float]:
    """The loss of every logged update of a run, from its metrics.jsonl."""
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_tiny_corpus_opens(tmp_path):
    from inductionlab.data.shards import TokenShards
    s = TokenShards.open(make_corpus(tmp_path))
    assert s.vocab_size == 300 and len(s.train) > 50_000 and len(s.heldout) > 1024
