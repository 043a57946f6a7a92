"""The bad-input sweep (issue 11 §3): each KIND of bad input, run against every sub-command that
shares it, must give exit status 2, exactly one ``error:`` line naming the problem, no traceback,
and nothing on disk (the ``--out`` path and its parent unchanged, no hidden partial folders).

Sub-commands that load a model are listed in :data:`MODEL_COMMANDS` (name -> argument list of a
tiny, fast run); a new one (``evaluate``, ``study bi-induct``) joins every model-side kind by adding
an entry there. Sub-commands that write an output are in :data:`OUTPUT_COMMANDS`.

The training/data side's own option ranges are in test_cli_train_data.py; this module covers the
kinds every command shares and the model commands' options.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from _tiny import tiny_llama_dir
from inductionlab.studies.engine import kept
from inductionlab.studies.analyze import AnalyzeConfig
from inductionlab.cli import main
from inductionlab.errors import InductionLabError
from inductionlab.studies.temporal import TemporalStudyConfig
from test_train_helpers import make_corpus, run_cli, tiny_flags

READ_ONLY = "/proc/inductionlab-test/out"     # /proc refuses new entries, even to root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama (2 layers x 4 heads = 8 heads, context 512) and its word tokenizer."""
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "llama", n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_lines=600)


ANALYZE_FAST = ["--n-permutations", "3", "--list-length", "30", "--cue-position", "15", "--ks", "1,2", "--n-draws", "2",
                "--score-seq-len", "8", "--score-batch-size", "2", "--top", "3", "--quiet", "--dtype", "float32"]
TEMPORAL_FAST = ["--permutations", "3", "--list-length", "30", "--cue-position", "15", "--ks", "1,2", "--n-draws", "2",
                 "--score-seq-len", "8", "--score-batch-size", "2", "--recall-trials", "2", "--recall-list-length", "5",
                 "--recall-shots", "1", "--load-bearing-top", "2", "--dtype", "float32", "--no-progress"]

# name -> callable(model, out) -> arguments. Hook: a new command that loads a model (`evaluate`) adds its tiny
# fast run here and then shares every output-path, model-input and device case below; one built from the
# shared study options also joins STUDY_COMMANDS; one that writes without a model joins OUTPUT_COMMANDS.
MODEL_COMMANDS = {
    "analyze": lambda model, out: ["analyze", "--model", model, "--out", out, *ANALYZE_FAST],
    "study temporal": lambda model, out: ["study", "temporal", "--model", model, "--out", out, *TEMPORAL_FAST],
    "evaluate": lambda model, out: ["evaluate", model, "--out", out, "--prompts", "2", "--quiet"],
}


def _snapshot(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.is_dir() or p.lstat().st_size) for p in root.rglob("*"))


def refused(args, pattern: str, root: Path) -> str:
    """Run ``inductionlab ARGS`` in-process; assert exit 2, one error line matching ``pattern``
    (a regex, case-insensitive), no traceback, and nothing new or changed under ``root``.
    A value click's own parameter type refuses gives click's usage message, also exit 2."""
    before = _snapshot(root)
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), f"traceback: {r.exception!r}\n{r.output}"
    assert "Traceback" not in r.output, r.output
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    if lines[0].startswith("Usage:"):
        lines = [line for line in lines if line.startswith("Error: ")]
    errors = [line for line in lines if line.lower().startswith("error:")]
    assert len(errors) == 1 and len(lines) == 1, r.output
    assert re.search(pattern, errors[0], re.I), f"{pattern!r} not in {errors[0]!r}"
    assert _snapshot(root) == before, "something was written"
    return errors[0]


def _args(command, model, out):
    return [str(a) for a in MODEL_COMMANDS[command](str(model), str(out))]


# -- numeric ranges, zero, negative, NaN: every numeric option of the model commands -------------------

SHARED_NUMERIC = [
    (["--score-seq-len", "0"], "--score-seq-len"), (["--score-seq-len", "1"], "--score-seq-len"),
    (["--score-seq-len", "-5"], "--score-seq-len"), (["--score-batch-size", "0"], "--score-batch-size"),
    (["--score-batch-size", "-1"], "--score-batch-size"),
    (["--n-draws", "-1"], "--n-draws"), (["--n-draws", "0"], "--n-draws"),
    (["--n-permutations", "0"], "permutations"), (["--n-permutations", "1"], "permutations"),
    (["--n-permutations", "-3"], "permutations"), (["--n-permutations", "nan"], "not a valid integer"),
    (["--list-length", "0"], "list length"), (["--list-length", "1"], "list length"),
    (["--list-length", "-4"], "list length"),
    (["--cue-position", "0"], "cue position"), (["--cue-position", "-1"], "cue position"),
    (["--cue-position", "31"], "cue position 31 is outside a list of 30"),
    (["--batch-size", "0"], "batch size"), (["--batch-size", "-2"], "batch size"),
    (["--ks", "0"], "ks"), (["--ks", "-1"], "ks"), (["--ks", "1,1"], "repeats a k"), (["--ks", "a,b"], "--ks"),
    (["--ks", ","], "ks"), (["--ks", "99"], "k=99"), (["--ks", "5"], "k=5"),
    (["--exclude-top-n", "-1"], "--exclude-top-n"), (["--exclude-top-n", "8"], "exclude-top-n"),
    (["--exclude-top-n", "1000"], "exclude-top-n"),
    (["--seed", "-1"], "--seed"), (["--seed", str(2 ** 70)], "--seed"),
    (["--cue-position", "1"], "cue needs a word before and after"),
    (["--cue-position", "30"], "cue needs a word before and after"),
    (["--threads", str(2 ** 70)], "--threads"), (["--threads", str((os.cpu_count() or 1) + 1)], "--threads"),
    (["--threads", "0"], "--threads"), (["--threads", "-2"], "--threads"),
    (["--method", "bogus"], "invalid value for '--method'"), (["--dtype", "int8"], "invalid value for '--dtype'"),
    (["--list-length", "5000", "--cue-position", "10"], "word pool too small"),
    (["--list-length", "600", "--cue-position", "10"], "context"),
    (["--instruction", "the " * 600], "context"),
    (["--n-permutations", str(10 ** 12)], "--n-permutations .* GiB"),
    (["--score-batch-size", str(10 ** 12)], "--score-batch-size .* GiB"),
]
ANALYZE_NUMERIC = [(["--top", "0"], "--top"), (["--top", "-1"], "--top"), (["--top", "99"], "--top 99")]
TEMPORAL_NUMERIC = [
    (["--recall-trials", "0"], "recall"), (["--recall-trials", "-1"], "recall"),
    (["--recall-list-length", "1"], "recall"), (["--recall-list-length", "0"], "recall"),
    (["--recall-shots", "-1"], "shots"), (["--recall-list-length", "3000"], "word pool too small"),
    (["--recall-list-length", "200"], "context"),
    (["--load-bearing-top", "-1"], "load.bearing.top"), (["--recall-trials", str(10 ** 12)], "--recall-trials .* GiB"),
    (["--load-bearing-permutations", "1"], "load.bearing.permutations"),
    (["--load-bearing-permutations", "0"], "load.bearing.permutations"),
    (["--load-bearing-permutations", "99"], "load.bearing.permutations"),
]
# the commands built from the shared study options (head scores, ablation, lag probe): a new study that
# uses cli_options' groups joins here too
STUDY_COMMANDS = ["analyze", "study temporal"]
NUMERIC = ([(c, a, m) for c in STUDY_COMMANDS for a, m in SHARED_NUMERIC]
           + [("analyze", a, m) for a, m in ANALYZE_NUMERIC] + [("study temporal", a, m) for a, m in TEMPORAL_NUMERIC])


@pytest.mark.parametrize("command, extra, pattern", NUMERIC,
                         ids=[f"{c}:{' '.join(a)[:40]}" for c, a, _ in NUMERIC])
def test_numeric_options(tmp_path, model_dir, command, extra, pattern):
    refused(_args(command, model_dir, tmp_path / "out") + extra, pattern, tmp_path)


# -- huge numbers: beyond a 64-bit integer, or a plan larger than the machine's memory ---------------------

HUGE = [
    ("train", ["--seed", str(2 ** 70)], "--seed .* 64-bit"),
    ("train", ["--tokens", str(2 ** 70)], "--tokens .* 64-bit"),
    ("train", ["--tokens", str(2 ** 62)], "plan needs .* GiB"),
    ("curriculum preview", ["--total-tokens", str(10 ** 15)], "plan needs .* GiB"),
]


@pytest.mark.parametrize("command, extra, pattern", HUGE, ids=[f"{c}:{a[0]}={a[1]}" for c, a, _ in HUGE])
def test_huge_numbers(tmp_path, corpus, command, extra, pattern):
    if command == "train":
        args = ["train", *tiny_flags(corpus, tmp_path / "out"), *extra]
    else:
        args = ["curriculum", "preview", corpus, "--seq-len", "64", "--batch-size", "2", *extra]
    refused(args, pattern, tmp_path)


# -- the config dataclasses check themselves: the API refuses what the CLI refuses ---------------------

@pytest.mark.parametrize("config", [AnalyzeConfig, TemporalStudyConfig])
@pytest.mark.parametrize("kw, pattern", [
    ({"scores.seq_len": 0}, "score.seq.len"), ({"scores.batch_size": 0}, "score.batch.size"),
    ({"ablation.n_draws": -1}, "n.draws"), ({"ablation.ks": (0,)}, "ks"), ({"ablation.ks": (5, 5)}, "repeats a k"),
    ({"seed": -1}, "seed"), ({"ablation.exclude_top_n": -1}, "exclude.top.n"), ({"ablation.method": "bogus"}, "method"),
])
def test_configs_validate_themselves(config, kw, pattern):
    from inductionlab.config import from_dict

    with pytest.raises(InductionLabError, match=re.compile(pattern, re.I)):
        from_dict(config, kw).validate()


# -- output paths: checked before anything is loaded, for every command that writes ---------------------

def _output_command(name, tmp_path, model, corpus, out):
    if name in MODEL_COMMANDS:
        return _args(name, model, out)
    txt = tmp_path / "src.txt"
    if not txt.exists():
        txt.write_text("hello world\n\nanother paragraph here\n")
    if name == "corpus prepare":
        return ["corpus", "prepare", txt, "--out", out, "--vocab-size", "300"]
    if name == "train":
        return ["train", *tiny_flags(corpus, out)]
    if name == "telemetry":
        return ["telemetry", corpus, "--out", out]   # the output check comes before the run is read
    if name == "curriculum preview --plot":
        return ["curriculum", "preview", corpus, "--seq-len", "64", "--batch-size", "2", "--total-tokens", "4096",
                "--plot", out]
    raise AssertionError(name)


OUTPUT_COMMANDS = [*MODEL_COMMANDS, "corpus prepare", "train", "telemetry", "curriculum preview --plot"]


@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
@pytest.mark.parametrize("case", ["existing file", "under a file", "read-only", "not empty", "dangling link"])
def test_output_paths(tmp_path, model_dir, corpus, command, case):
    is_plot = command.endswith("--plot")
    if case == "not empty" and (is_plot or command == "train"):
        pytest.skip("a plot replaces its file; train resumes its own run (test_cli_train_data)")
    f = tmp_path / "a_file"
    f.write_text("x")
    d = tmp_path / "full"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "x")
    out = {"existing file": tmp_path if is_plot else f, "under a file": f / "out", "read-only": READ_ONLY,
           "not empty": d, "dangling link": link}[case]
    pattern = {"existing file": "is a directory" if is_plot else "is a file", "under a file": "is a file",
               "read-only": "cannot write", "not empty": "already exists", "dangling link": "dangling"}[case]
    refused(_output_command(command, tmp_path, model_dir, corpus, out), pattern, tmp_path)


# -- an output that is (or holds) an input: --overwrite would delete the user's model / corpus / run ------

@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
@pytest.mark.parametrize("case", ["is the input", "holds the input"])
def test_output_is_not_an_input(tmp_path, model_dir, corpus, command, case):
    import shutil

    work = tmp_path / "work"
    inp = {"corpus prepare": tmp_path / "srcdir", "train": corpus, "telemetry": tmp_path / "run",
           "curriculum preview --plot": corpus}.get(command, model_dir)
    if command == "corpus prepare":
        inp.mkdir()
        (inp / "a.txt").write_text("\n\n".join(f"paragraph {i} with words" for i in range(50)))
    if command == "telemetry":
        inp.mkdir()
        (inp / "run.json").write_text("{}")
    if inp in (model_dir, corpus):                 # a copy: the shared fixture must survive a failure
        inp = Path(shutil.copytree(inp, work / inp.name))
    if command == "curriculum preview --plot":
        out = inp / "manifest.json" if case == "is the input" else inp / "tokens_train.bin"
        out = out if out.exists() else next(p for p in inp.iterdir() if p.is_file())
    else:
        out = inp if case == "is the input" else inp.parent
    args = _output_command(command, tmp_path, inp, inp, out) + ["--overwrite"] * (not command.endswith("--plot"))
    if command == "corpus prepare":
        args[2] = inp
    refused(args, "the input", tmp_path)


# -- corrupt or mismatched model inputs -------------------------------------------------------------------

def _gguf_truncated(tmp: Path) -> Path:
    from inductionlab.core.models import EMBEDDED, _embedded_path
    src = _embedded_path(EMBEDDED["smollm2-135m"])
    p = tmp / "truncated.gguf"
    with open(src, "rb") as f:
        p.write_bytes(f.read(1 << 20))
    return p


def _file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


MODEL_CASES = {
    "truncated gguf": (_gguf_truncated, r"corrupt or truncated.*reinstall|corrupt or truncated.*download"),
    "empty gguf": (lambda t: _file(t / "empty.gguf", b""), r"is empty: corrupt or truncated"),
    "random-bytes gguf": (lambda t: _file(t / "noise.gguf", os.urandom(4096)), r"not a GGUF file"),
    "gguf magic then noise": (lambda t: _file(t / "short.gguf", b"GGUF" + os.urandom(300)), r"corrupt or truncated"),
    "a directory named .gguf": (lambda t: (t / "dir.gguf").mkdir() or t / "dir.gguf", r"not a file"),
    "non-model directory": (lambda t: (t / "notes").mkdir() or t / "notes", r"not a model directory"),
    "a text file": (lambda t: _file(t / "model.txt", b"hi"), r"not a model directory"),
    "garbage config.json": (lambda t: _file(t / "bad" / "config.json", b"{nope").parent, r"could not load model"),
    "config without weights": (None, r"could not load model|no weights"),
    "truncated weights": ("truncate", r"weights .* are corrupt or truncated"),
    "empty weights": ("empty", r"weights .* are corrupt or truncated"),
    "tokenizer past the vocabulary": ("small-vocab", r"token id \d+ but the model's vocabulary has 100"),
    "unknown name": (lambda t: "no-such-model-xyz", r"unknown model"),
    "missing path": (lambda t: t / "missing" / "dir", r"does not exist"),
}


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_bad_models(tmp_path, model_dir, command, case):
    make, pattern = MODEL_CASES[case]
    if command == "evaluate" and case == "tokenizer past the vocabulary":
        # the 700-word test tokenizer has too few items for the ICL tasks: that one-line error comes first
        pattern = rf"(?:{pattern})|only \d+ items"
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    if make is None:                          # a real config.json, no weights
        d = inputs / "noweights"
        d.mkdir()
        (d / "config.json").write_text((model_dir / "config.json").read_text())
        model = d
    elif isinstance(make, str):               # a copy of the tiny model, then damaged
        import shutil

        model = Path(shutil.copytree(model_dir, inputs / make))
        w = model / "model.safetensors"
        if make == "small-vocab":             # a model of 100 ids under the 700-word tokenizer
            from transformers import LlamaConfig, LlamaForCausalLM
            cfg = LlamaConfig.from_pretrained(model_dir)
            cfg.vocab_size = 100
            LlamaForCausalLM(cfg).save_pretrained(model)
            extra = {"analyze": ["--list-length", "200", "--cue-position", "100"],
                     "study temporal": ["--recall-list-length", "40"]}.get(command, [])
            work = tmp_path / "work"
            work.mkdir()
            refused(_args(command, model, work / "out") + extra, pattern, tmp_path)
            return
        w.write_bytes(w.read_bytes()[:5000] if make == "truncate" else b"")
    else:
        model = make(inputs)
    work = tmp_path / "work"
    work.mkdir()
    refused(_args(command, model, work / "out"), pattern, tmp_path)


# -- devices: one shared check for every command that takes --device -------------------------------------

DEVICES = [(["--device", "cuda"], "no CUDA device"), (["--device", "cuda:3"], "no CUDA device"),
           (["--device", "tpu"], "--device"), (["--device", "cuda:x"], "--device"), (["--device", "mps"], "--device")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("extra, pattern", DEVICES, ids=[d[0][1] for d in DEVICES])
def test_devices(tmp_path, model_dir, command, extra, pattern):
    refused(_args(command, model_dir, tmp_path / "out") + extra, pattern, tmp_path)


def test_train_takes_no_device_flag(tmp_path, corpus):
    """train picks its device itself (CUDA when there, else CPU): no --device to check."""
    refused(["train", *tiny_flags(corpus, tmp_path / "out"), "--device", "cuda"], "no such option", tmp_path)


# -- options that depend on each other: refused before any file, then the corrected command runs -----------

@pytest.mark.parametrize("command, bad", [
    ("analyze", ["--list-length", "600", "--cue-position", "10"]),
    ("study temporal", ["--recall-list-length", "200"]),
])
def test_corrected_command_accepted(tmp_path, model_dir, command, bad):
    out = tmp_path / "out"
    refused(_args(command, model_dir, out) + bad, "context", tmp_path)
    r = CliRunner().invoke(main, _args(command, model_dir, out))
    assert r.exit_code == 0, r.output
    assert (out / "results.json").exists()


def test_run_dir_without_finished_piece_is_taken_over(tmp_path, model_dir):
    """A run that died before its first piece left only its manifest: another command may use it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"kind": "analyze", "params": {"seed": 123}}))
    (out / "checkpoints").mkdir()
    r = CliRunner().invoke(main, _args("analyze", model_dir, out))
    assert r.exit_code == 0, r.output


# -- API misuse with silent wrong results: the record says what ran -------------------------------------

def test_analyze_records_the_dtype_that_ran(tmp_path, model_dir):
    from inductionlab.studies.analyze import analyze
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.core.models import load_model

    loaded = load_model(str(model_dir), dtype="float32")
    loaded.model.to(torch.bfloat16)           # the identity still says float32
    from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
    from inductionlab.studies.spec import RunOptions

    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), top=2, scores=HeadScoreConfig(seq_len=8, batch_size=2),
                        lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10))
    res = analyze(loaded, cfg, tmp_path / "out", RunOptions(progress=False))
    rec = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rec["model"]["dtype"] == "bfloat16" and res.record["model"]["dtype"] == "bfloat16"
    assert "dtype" not in rec["params"] or rec["params"]["dtype"] == "bfloat16"


# -- interrupted writes: SIGTERM cleans up like SIGINT; stale partial folders are removed ----------------

def _kill_during_write(args, patch: str, ready: Path, timeout: float = 120):
    import subprocess
    import sys

    code = f"{patch}\nfrom inductionlab.cli import main\nmain()"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.time()
    while not ready.exists():
        assert p.poll() is None, p.communicate()
        assert time.time() - t0 < timeout, "the write never started"
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    return p.returncode, err


SLOW_FSYNC = """
import os, time, pathlib
_fsync = os.fsync
def _slow(fd):
    pathlib.Path({ready!r}).touch()
    time.sleep(60)
os.fsync = _slow
"""


@pytest.mark.parametrize("command", ["corpus prepare", "analyze"])
def test_sigterm_during_a_write_leaves_nothing_half_written(tmp_path, model_dir, command):
    ready = tmp_path / "ready"
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    if command == "corpus prepare":
        txt = tmp_path / "src.txt"
        txt.write_text("\n\n".join(f"paragraph {i} with some words in it" for i in range(200)))
        args = ["corpus", "prepare", txt, "--out", out, "--vocab-size", "300", "--heldout-fraction", "0"]
    else:
        args = _args("analyze", model_dir, out)
    rc, err = _kill_during_write(args, SLOW_FSYNC.format(ready=str(ready)), ready)
    assert rc == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "terminated" in err
    leftovers = [p.name for p in work.rglob("*") if p.name.startswith(".")]
    assert leftovers == [], leftovers
    if command == "corpus prepare":
        assert not out.exists()


def test_stale_partial_folders_removed_on_next_run(tmp_path):
    from inductionlab.runtime.runs import staged_run_dir

    import socket
    host = socket.gethostname()
    dead = tmp_path / f".out.partial-{2 ** 22 + 12345}-{host}-abc"    # beyond pid_max: no such process
    alive = tmp_path / f".out.partial-{os.getpid()}-{host}-def"        # a live run's folder is kept
    other = tmp_path / ".other.partial-1-x-y"                           # another output's folder is kept
    for d in (dead, alive, other):
        d.mkdir()
        (d / "half.bin").write_bytes(b"x")
    with staged_run_dir(tmp_path / "out") as stage:
        (stage / "done.txt").write_text("ok")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([alive.name, other.name, "out"])


def test_resumed_run_removes_a_dead_writers_temporary_files(tmp_path):
    """SIGKILL mid atomic write leaves ``.<name>.partial-<pid>-<host>-*.tmp``; the resumed run removes it."""
    import socket

    from inductionlab.runtime.runs import ResumableRun

    run = ResumableRun(tmp_path / "out", "toy", {"a": 1})
    assert run.open() is False
    kept(run, "scores", lambda: {"x": 1}, json=True)
    host = socket.gethostname()
    dead = run.dir / f".lag.npz.partial-{2 ** 22 + 7}-{host}-q1.tmp"
    live = run.dir / f".lag.npz.partial-{os.getpid()}-{host}-q2.tmp"
    for f in (dead, live):
        f.write_bytes(b"half")
    again = ResumableRun(tmp_path / "out", "toy", {"a": 1})
    assert again.open() is True
    assert not dead.exists() and live.exists() and run.done("scores", "json")
