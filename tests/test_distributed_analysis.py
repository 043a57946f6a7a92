"""The analysis sharded over 2 CPU processes on gloo gives bit for bit the numbers of one process:
the lag probe (intact, zero- and mean-ablated), serial recall and the head scores through the API,
with trial counts that do not fill the last round of batches, and ``analyze`` end to end under
torchrun (``evaluate``: tests/test_evaluate.py, with :func:`run_sharded`). Also: the batch split
itself, and a refused run ends every rank."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from inductionlab.runtime import distributed as D

HERE = Path(__file__).parent

# 11 trials in batches of 3: 4 batches (3, 3, 3, 2); rank 0 runs batches 0 and 2, rank 1 batches 1 and 3
LAG = dict(n_permutations=11, list_length=24, cue_position=12, batch_size=3)
# 5 prompts in batches of 2: 3 batches, the last of 1, rank 1 gets one batch
RECALL = dict(n_trials=5, list_length=5, n_shots=1, batch_size=2)
# 7 sequences in batches of 2: 4 batches
SCORES = dict(seq_len=8, batch_size=2)
SCORE_SEQS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_batches_cover_every_batch_once():
    one = D.local_batches(11, 3, None)
    assert list(one) == [0, 3, 6, 9]
    split = [list(D.local_batches(11, 3, D.Dist(rank=r, world_size=2))) for r in range(2)]
    assert split == [[0, 6], [3, 9]]
    # rank 0's progress counts the whole round it belongs to: the rounds add up to the trials
    assert sum(D.round_size(s, 11, 3, D.Dist(world_size=2)) for s in split[0]) == 11
    assert D.gather_batches(["a", "b"], 2, None) == ["a", "b"]


def _loaded():
    """A random 2-layer GQA Llama over the word tokenizer of _tiny (its words cover serial recall's
    template), identical in every process."""
    sys.path.insert(0, str(HERE))
    from _tiny import word_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from inductionlab.core.models import LoadedModel, attention_shape

    tok = word_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return LoadedModel(model, tok, {"name": "tiny", "dtype": "float32", **attention_shape(model.config)})


def _measure(dist) -> dict:
    """Everything compared, computed with ``dist`` (None: one process)."""
    from inductionlab.core.ablation import Condition
    from inductionlab.protocols.lag_probe import LagProbeConfig, run_lag_probe
    from inductionlab.core.scores import compute_head_scores
    from inductionlab.protocols.serial_recall import SerialRecallConfig, run_serial_recall

    torch.set_num_threads(1)
    loaded = _loaded()
    conds = [Condition("intact", "intact"), Condition("ablated", "induction", heads=[(1, 0), (1, 3)])]
    out = {}
    for method in ("zero", "mean"):
        lag = run_lag_probe(loaded, conds, LagProbeConfig(**LAG, method=method), dist=dist)
        out[f"lag_{method}"] = {c: {"probs": lag.probs[c], "list_mass": lag.list_mass[c],
                                    "argmax_lag": lag.argmax_lag[c]} for c in lag.probs}
    rec = run_serial_recall(loaded, conds, SerialRecallConfig(**RECALL, method="mean"), dist=dist)
    out["recall"] = rec.data
    hs = compute_head_scores(loaded, **SCORES, n_batches=1, seed=3,
                             sequences=torch.randint(10, 600, (SCORE_SEQS, SCORES["seq_len"]),
                                                     generator=torch.Generator().manual_seed(3)), dist=dist)
    out["scores"] = {**hs.scores, **{f"loss_{k}": np.float64(v) for k, v in hs.induction_loss.items()}}
    return out


def _worker(rank: int, world: int, port: int, path: str, measure) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    d = D.init("cpu", timeout_s=120)
    try:
        res = measure(d)
        with open(f"{path}.{rank}", "wb") as f:      # every rank's result: all must equal one process
            pickle.dump(res, f)
    finally:
        D.shutdown()


def run_sharded(measure, path: str, world: int = 2) -> list:
    """``measure(dist)`` in ``world`` gloo processes (spawned; ``measure`` a module-level function);
    returns every rank's result, in rank order."""
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(world, free_port(), path, measure), nprocs=world, join=True,
                       start_method="spawn")
    return [pickle.load(open(f"{path}.{r}", "rb")) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    sharded = run_sharded(_measure, str(tmp_path_factory.mktemp("dist") / "res"))
    threads = torch.get_num_threads()
    try:
        single = _measure(None)
    finally:
        torch.set_num_threads(threads)
    return single, sharded


def _assert_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_identical(a[k], b[k])
        else:
            x, y = np.asarray(a[k]), np.asarray(b[k])
            assert x.dtype == y.dtype and x.shape == y.shape, k
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k


@pytest.mark.parametrize("part", ["lag_zero", "lag_mean", "recall", "scores"])
def test_two_processes_equal_one_bit_for_bit(runs, part):
    single, sharded = runs
    for rank in range(2):
        _assert_identical(single[part], sharded[rank][part])
    if part.startswith("lag"):
        probs = single[part]["intact"]["probs"]
        assert probs.shape == (LAG["n_permutations"], LAG["list_length"])
        # the ablation changed the numbers (the comparison is not between two intact runs)
        assert not np.array_equal(probs, single[part]["ablated"]["probs"])
    if part == "recall":
        assert len(single["recall"]["intact"]["exact"]) == RECALL["n_trials"]


def _torchrun(args, nproc=2, timeout=240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "-m", "inductionlab.cli", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


FAST = ["--n-permutations", "5", "--list-length", "24", "--cue-position", "12", "--ks", "1", "--n-draws", "1",
        "--score-seq-len", "8", "--score-batch-size", "3", "--batch-size", "2", "--top", "3", "--quiet",
        "--dtype", "float32", "--threads", "1", "--method", "mean"]


def _numbers(res: dict) -> dict:
    """results.json less what differs between two equal runs: times, versions, the processes, a resume."""
    return {k: v for k, v in res.items() if k not in ("timings", "versions", "distributed", "resumed")}


@pytest.mark.slow
def test_analyze_under_torchrun_equals_one_process(tiny_dir, tmp_path):
    from click.testing import CliRunner

    from inductionlab.cli import main

    one = CliRunner().invoke(main, ["analyze", "--model", str(tiny_dir), "--out", str(tmp_path / "one"), *FAST])
    assert one.exit_code == 0, one.output
    p = _torchrun(["analyze", "--model", tiny_dir, "--out", tmp_path / "two", *FAST])
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("Top 3 induction heads") == 1          # rank 0 alone prints
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "results.json").read_text())
    assert b["distributed"]["world_size"] == 2 and b["distributed"]["backend"] == "gloo"
    assert a["distributed"]["world_size"] == 1
    assert _numbers(a) == _numbers(b)
    assert (tmp_path / "one" / "lag_curves.csv").read_text() == (tmp_path / "two" / "lag_curves.csv").read_text()
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]      # no staging leftovers

    # a resumed run (every piece finished) makes the same decisions on both ranks and writes the same
    p = _torchrun(["analyze", "--model", tiny_dir, "--out", tmp_path / "two", *FAST])
    assert p.returncode == 0, p.stderr[-3000:]
    assert _numbers(json.loads((tmp_path / "two" / "results.json").read_text())) == _numbers(a)


@pytest.mark.slow
def test_refused_run_ends_every_rank(tiny_dir, tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    (out / "notes.txt").write_text("not a run")
    p = _torchrun(["analyze", "--model", tiny_dir, "--out", out, *FAST], timeout=180)
    assert p.returncode != 0
    assert "not a resumable run" in p.stderr
    p = _torchrun(["analyze", "--model", tiny_dir, "--out", tmp_path / "x", "--device-map", "auto", *FAST],
                  timeout=180)
    assert p.returncode != 0 and "--device-map with torchrun" in p.stderr
    p = _torchrun(["evaluate", "--model", tiny_dir, "--out", out, "--quiet"], timeout=180)   # evaluate shards too
    assert p.returncode != 0 and "not a resumable run" in p.stderr
    p = _torchrun(["evaluate", "--model", tiny_dir, "--out", tmp_path / "e", "--device-map", "auto"], timeout=180)
    assert p.returncode != 0 and "--device-map with torchrun" in p.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "e").exists()


@pytest.mark.slow
def test_failure_on_one_rank_ends_the_job(tiny_dir, tmp_path):
    """Rank 1 raises inside the lag probe while rank 0 waits in the gather: torchrun stops rank 0
    and the job exits non-zero (well before the collective timeout), leaving no results.json."""
    crash = ("import os\nfrom inductionlab.protocols import lag_probe\n_m = lag_probe.measure_batch\n"
             "def measure_batch(*a, **k):\n    if os.environ['RANK'] == '1':\n"
             "        raise RuntimeError('injected failure on rank 1')\n    return _m(*a, **k)\n"
             "lag_probe.measure_batch = measure_batch\nfrom inductionlab.cli import main\nmain()")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           "--no-python", sys.executable, "-c", crash, "analyze", "--model", str(tiny_dir), "--out",
           str(tmp_path / "run"), *FAST]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode != 0
    assert "injected failure on rank 1" in p.stderr
    assert not (tmp_path / "run" / "results.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "scores.json").exists()   # finished pieces stay for a resume


@pytest.mark.slow
def test_study_temporal_under_torchrun_equals_one_process(tmp_path):
    from click.testing import CliRunner

    from _tiny import tiny_llama_dir
    from inductionlab.cli import main

    model = tiny_llama_dir(tmp_path / "model", n_layers=2)
    args = ["--model", model, "--permutations", "5", "--list-length", "30", "--cue-position", "15",
            "--recall-trials", "3", "--recall-list-length", "6", "--recall-shots", "1", "--ks", "1,2", "--n-draws", "1",
            "--load-bearing-top", "2", "--batch-size", "2", "--score-batch-size", "3", "--dtype", "float32",
            "--threads", "1", "--quiet", "--method", "mean"]
    one = CliRunner().invoke(main, ["study", "temporal", "--out", str(tmp_path / "one"), *map(str, args)])
    assert one.exit_code == 0, one.output
    p = _torchrun(["study", "temporal", "--out", tmp_path / "two", *args])
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("report:") == 1                                   # rank 0 alone prints
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "results.json").read_text())
    assert b["distributed"]["world_size"] == 2
    assert _numbers(a) == _numbers(b)
