"""The bad-input sweep, second round (issue 18), input/output kinds:

1. no input is ever deleted or changed: ``--out`` equal to, holding or inside any input of the command
   (model, ``--shards``, ``--data``, ``--config``, corpus source, training runs) is refused, also with
   ``--overwrite``, for every command and the Python API;
2. a run's identity includes the model (path, weight hashes, the dtype that runs, architecture): a
   resume with another model or dtype is refused with one line (also under torchrun);
3. a kill (SIGKILL) at any moment never blocks the rerun: our temporaries are recognised and removed;
4. errors of the operating system (full disk, link loop, name too long, a loop in a corpus source)
   are one line naming the path and the cause, nothing half-written, a finished run beside intact.

Same style as tests/test_bad_inputs.py (its helpers are reused): exit status 2, one ``error:`` line,
nothing written; in the API an :class:`InductionLabError`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from inductionlab.studies.configs import AblationConfig, HeadScoreConfig
from inductionlab.studies.spec import RunOptions
from click.testing import CliRunner

from _tiny import tiny_llama_dir
from inductionlab.cli import main
from inductionlab.errors import InductionLabError, os_error
from test_bad_inputs import MODEL_COMMANDS, OUTPUT_COMMANDS, _args, _output_command, _snapshot, refused
from test_train_helpers import make_corpus, run_cli, tiny_flags

DEAD_PID = 2 ** 22 + 4321          # beyond pid_max: no such process


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama (2 layers x 4 heads) and its word tokenizer."""
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny") / "llama", n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """The same architecture with other random weights (another seed): another model."""
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny2") / "llama", n_layers=2, n_heads=4, seed=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_lines=600)


def _bpe_model(path: Path, corpus: Path, seed: int) -> Path:
    """A tiny random Llama over the corpus's BPE tokenizer (the ICL probes of ``evaluate`` need its
    items; the word tokenizer has none)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(corpus)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bpe_models(tmp_path_factory, corpus):
    """Two such models, other random weights (seeds 0 and 1)."""
    return tuple(_bpe_model(tmp_path_factory.mktemp(f"bpe{s}") / "llama", corpus, s) for s in (0, 1))


EVALUATE_FAST = ["--tasks", "copy", "--ablate", "top-2", "--draws", "1", "--induction-seq-len", "12",
                 "--score-seq-len", "12", "--score-batch-size", "4", "--prompts", "2", "--quiet"]


def _run_args(command, model, out) -> list[str]:
    """A tiny run of a model command that finishes (``evaluate`` on a BPE model)."""
    if command == "evaluate":
        return [str(a) for a in ["evaluate", model, "--out", out, *EVALUATE_FAST]]
    return _args(command, model, out)


def _pick(command, model_dir, other_model_dir, bpe_models):
    return bpe_models if command == "evaluate" else (model_dir, other_model_dir)


def _copy(src: Path, dst: Path) -> Path:
    """A private copy of a shared fixture (it must survive a failing test)."""
    return Path(shutil.copytree(src, dst))


def _ok(args) -> None:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)


def _partials(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".partial-" in p.name)


# -- 1. an input is never deleted: --out is not, does not hold and does not lie inside any input ------------

@pytest.mark.parametrize("command", [*MODEL_COMMANDS, "corpus prepare", "train", "curriculum preview --plot"])
def test_output_inside_an_input(tmp_path, model_dir, corpus, command):
    """``--out`` inside the model / corpus / source directory would write into the user's input."""
    inp = {"corpus prepare": tmp_path / "srcdir", "train": corpus, "curriculum preview --plot": corpus}.get(command,
                                                                                                          model_dir)
    if command == "corpus prepare":
        inp.mkdir()
        (inp / "a.txt").write_text("\n\n".join(f"paragraph {i} with words" for i in range(50)))
    else:
        inp = _copy(inp, tmp_path / "work" / inp.name)
    out = inp / ("plot.png" if command.endswith("--plot") else "sub")
    args = _output_command(command, tmp_path, inp, inp, out)
    if command == "corpus prepare":
        args[2] = inp
    refused(args, "lies inside the input", tmp_path)


@pytest.mark.parametrize("case", ["is the input", "holds the input", "inside the input"])
def test_bi_induct_never_deletes_its_shards(tmp_path, corpus, case):
    """The issue's example: ``study bi-induct --shards corp --out corp --overwrite`` deleted the corpus."""
    corp = _copy(corpus, tmp_path / "work" / "corp")
    out = {"is the input": corp, "holds the input": corp.parent, "inside the input": corp / "study"}[case]
    refused(["study", "bi-induct", "--shards", corp, "--out", out, "--overwrite", "--seeds", "1",
             "--variants", "none,induction", "--quiet"], "the input", tmp_path)
    assert (corp / "manifest.json").is_file()


@pytest.mark.parametrize("case", ["is the input", "holds the input", "inside the input"])
def test_evaluate_never_deletes_its_shards(tmp_path, model_dir, corpus, case):
    corp = _copy(corpus, tmp_path / "work" / "corp")
    out = {"is the input": corp, "holds the input": corp.parent, "inside the input": corp / "eval"}[case]
    refused(["evaluate", model_dir, "--shards", corp, "--out", out, "--overwrite", "--prompts", "2", "--quiet"],
            "the input", tmp_path)


def test_train_never_deletes_its_config_file(tmp_path, corpus):
    out = tmp_path / "run"
    out.mkdir()
    cfg = out / "run.yaml"
    cfg.write_text("preset: cpu-tiny\n")
    refused(["train", "--config", cfg, *tiny_flags(corpus, out), "--overwrite"], "contains the input", tmp_path)
    assert cfg.read_text() == "preset: cpu-tiny\n"


@pytest.mark.parametrize("sub", ["checkpoints", "checkpoints/x"])
def test_telemetry_never_writes_over_the_run_it_reads(tmp_path, sub):
    """The default ``RUN/telemetry`` is the command's own; ``RUN/checkpoints`` (read) is not."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000000").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    refused(["telemetry", run, "--out", run / sub, "--overwrite"], "the input", tmp_path)


def test_api_refuses_an_output_holding_an_input(tmp_path, model_dir, corpus):
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.core.models import load_model
    from dataclasses import replace

    from inductionlab.studies.bi_induct import cpu_control, run_bi_induct_study

    model = _copy(model_dir, tmp_path / "work" / "m")
    loaded = load_model(str(model), dtype="float32")
    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), top=2,
                        scores=HeadScoreConfig(seq_len=8, batch_size=2),
                        lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10))
    before = _snapshot(tmp_path)
    with pytest.raises(InductionLabError, match="contains the input"):
        analyze(loaded, cfg, tmp_path / "work", RunOptions(overwrite=True, progress=False))
    corp = _copy(corpus, tmp_path / "c" / "corp")
    before = _snapshot(tmp_path)
    with pytest.raises(InductionLabError, match="is the input"):
        run_bi_induct_study(replace(cpu_control(), shards=str(corp), seeds=1, variants=("none", "induction")), corp,
                            RunOptions(overwrite=True, progress=False))
    assert _snapshot(tmp_path) == before


# -- 2. the model is part of a run's identity: a resume never mixes two models ----------------------------------

def _finished(command, model, out):
    _ok(_run_args(command, model, out))
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
def test_resume_with_another_model_refused(tmp_path, model_dir, other_model_dir, bpe_models, command):
    """The issue's example: ``analyze --model m2`` into m's finished run wrote m2's name over m's numbers."""
    m1, m2 = _pick(command, model_dir, other_model_dir, bpe_models)
    out = tmp_path / "out"
    _finished(command, m1, out)
    before = (out / "results.json").read_bytes()
    refused(_run_args(command, m2, out), r"another model \(.*model\.(path|sha256)", tmp_path)
    assert (out / "results.json").read_bytes() == before


@pytest.mark.parametrize("command", ["analyze", "evaluate"])
def test_resume_with_another_dtype_refused(tmp_path, model_dir, bpe_models, command):
    m = _pick(command, model_dir, None, bpe_models)[0]
    out = tmp_path / "out"
    rec = _finished(command, m, out)           # the default dtype (auto: whatever this CPU's probe chose)
    ran = rec["model"]["dtype"]
    assert ran in ("float32", "bfloat16")
    other = "float32" if ran == "bfloat16" else "bfloat16"
    refused(_run_args(command, m, out) + ["--dtype", other], r"another model \(model\.dtype\)", tmp_path)


def test_api_resume_with_another_model_refused(tmp_path, model_dir, other_model_dir):
    import torch

    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.core.models import load_model

    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), top=2,
                        scores=HeadScoreConfig(seq_len=8, batch_size=2),
                        lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10))
    a = load_model(str(model_dir), dtype="float32")
    first = analyze(a, cfg, tmp_path / "out", RunOptions(progress=False))
    assert first.record["params"]["model"]["sha256"] == a.identity["sha256"]
    with pytest.raises(InductionLabError, match=r"another model \(.*model\.sha256"):
        analyze(load_model(str(other_model_dir), dtype="float32"), cfg, tmp_path / "out", RunOptions(progress=False))
    a.model.to(torch.bfloat16)                  # loaded as float32, cast after: the dtype that runs counts
    with pytest.raises(InductionLabError, match=r"another model \(model\.dtype\)"):
        analyze(a, cfg, tmp_path / "out", RunOptions(progress=False))
    a.model.to(torch.float32)
    assert analyze(a, cfg, tmp_path / "out", RunOptions(progress=False)).record["heads"] == first.record["heads"]   # resumes


@pytest.mark.slow
def test_resume_with_another_model_refused_under_torchrun(tmp_path, model_dir, other_model_dir):
    """Rank 0 decides; every rank raises the same one-line error and the job ends (no hang)."""
    from test_distributed_analysis import FAST, _torchrun

    out = tmp_path / "out"
    _ok(["analyze", "--model", model_dir, "--out", out, *FAST])
    before = (out / "results.json").read_bytes()
    p = _torchrun(["analyze", "--model", other_model_dir, "--out", out, *FAST], timeout=240)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 2 and len(set(lines)) == 1 and "another model" in lines[0], p.stderr[-3000:]
    assert (out / "results.json").read_bytes() == before


# -- 3. a kill at any moment never blocks the rerun ----------------------------------------------------------

def _kill_at_fsync(n: int) -> str:
    """A prelude that SIGKILLs the process at its n-th fsync: inside an atomic write, after its
    temporary file was written and before the rename (the worst moment)."""
    return ("import os, signal\n_fsync, _n = os.fsync, [0]\n"
            "def _kill(fd):\n    _n[0] += 1\n"
            f"    if _n[0] == {n}:\n        os.kill(os.getpid(), signal.SIGKILL)\n    return _fsync(fd)\n"
            "os.fsync = _kill\n")


def _kill_args(command, tmp_path, model_dir, corpus, out, bpe_models=None):
    if command == "corpus prepare":
        txt = tmp_path / "src.txt"
        txt.write_text("\n\n".join(f"paragraph {i} with some words in it" for i in range(200)))
        return ["corpus", "prepare", txt, "--out", out, "--vocab-size", "300", "--heldout-fraction", "0"]
    if command == "train":
        return ["train", *tiny_flags(corpus, out)]
    return _run_args(command, bpe_models[0] if command == "evaluate" else model_dir, out)


@pytest.mark.parametrize("command, n", [("analyze", 1), ("analyze", 3), ("evaluate", 1), ("train", 1),
                                        ("corpus prepare", 1)])
def test_rerun_after_sigkill_mid_write(tmp_path, model_dir, corpus, bpe_models, command, n):
    """The issue's example: SIGKILL while study.json was written left ``.study.json.*.tmp`` and the
    rerun refused the directory. The same command run again must finish and leave no temporary."""
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    args = _kill_args(command, tmp_path, model_dir, corpus, out, bpe_models)
    p = run_cli(args, _kill_at_fsync(n), timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert _partials(work), "the kill left no temporary: the test did not hit a write"
    _ok(args)
    assert _partials(work) == []
    assert (out / ("manifest.json" if command == "corpus prepare" else
                   "run.json" if command == "train" else "results.json")).is_file()


@pytest.mark.parametrize("where", ["study.json", "results.json", "checkpoints/scores.json", "probe folder"])
def test_dead_writers_temporaries_ignored_and_removed(tmp_path, model_dir, where):
    """Any temporary of ours left by a dead process, anywhere in a run directory, before or after
    the run finished: the rerun resumes (or takes the directory over) and removes it."""
    out = tmp_path / "out"
    host = socket.gethostname()
    if where != "study.json":
        _ok(_args("analyze", model_dir, out))
    name = {"probe folder": "inductionlab-probe"}.get(where, Path(where).name)
    parent = out / Path(where).parent if "/" in where else out
    parent.mkdir(parents=True, exist_ok=True)
    left = parent / f".{name}.partial-{DEAD_PID}-{host}-x1{'' if where == 'probe folder' else '.tmp'}"
    left.mkdir() if where == "probe folder" else left.write_bytes(b'{"kind": "ana')
    _ok(_args("analyze", model_dir, out))
    assert not left.exists() and (out / "results.json").is_file()


def test_plot_rewrite_removes_a_dead_writers_temporary(tmp_path, corpus):
    """A file written outside a run directory (``--plot``): its next atomic write removes the
    temporary a killed writer left beside it (a live writer's is kept)."""
    host = socket.gethostname()
    plot = tmp_path / "p.png"
    dead = tmp_path / f".p.png.partial-{DEAD_PID}-{host}-a1.tmp"
    live = tmp_path / f".p.png.partial-{os.getpid()}-{host}-a2.tmp"
    for f in (dead, live):
        f.write_bytes(b"\x89PN")
    _ok(["curriculum", "preview", corpus, "--seq-len", "64", "--batch-size", "2", "--total-tokens", "4096",
         "--plot", plot])
    assert plot.stat().st_size > 1000 and not dead.exists() and live.exists()


# -- 4. errors of the operating system: one line naming the path and the cause ------------------------------------

def _loop(tmp_path: Path) -> Path:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)                         # loop -> loop
    return loop


@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
@pytest.mark.parametrize("case", ["symlink loop", "name too long", "component too long"])
def test_unreachable_output_paths(tmp_path, model_dir, corpus, command, case):
    is_plot = command.endswith("--plot")
    long = "x" * 300
    out = {"symlink loop": _loop(tmp_path) / ("p.png" if is_plot else "out"),
           "name too long": tmp_path / (long + (".png" if is_plot else "")),
           "component too long": tmp_path / long / ("p.png" if is_plot else "out")}[case]
    pattern = {"symlink loop": r"loop.*Too many levels of symbolic links \(ELOOP\)",
               "name too long": r"x{300}.*File name too long \(ENAMETOOLONG\)",
               "component too long": r"File name too long \(ENAMETOOLONG\)"}[case]
    refused(_output_command(command, tmp_path, model_dir, corpus, out), pattern, tmp_path)


@pytest.mark.parametrize("case", ["file linked to itself", "dangling link", "unreadable folder"])
def test_corpus_source_the_system_cannot_read(tmp_path, case):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(f"paragraph {i} with words" for i in range(50)))
    if case == "file linked to itself":
        (src / "b.txt").symlink_to(src / "b.txt")
        pattern = r"b\.txt: Too many levels of symbolic links \(ELOOP\)"
    elif case == "dangling link":
        (src / "b.txt").symlink_to(src / "gone.txt")
        pattern = r"b\.txt: No such file or directory \(ENOENT\)"
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads any folder")
        (src / "sub").mkdir()
        (src / "sub").chmod(0)
        pattern = r"sub: Permission denied \(EACCES\)"
    work = tmp_path / "work"
    work.mkdir()
    refused(["corpus", "prepare", src, "--out", work / "out", "--vocab-size", "300"], pattern, tmp_path)


def test_corpus_source_with_a_folder_loop_is_read_once(tmp_path):
    """A folder linked back to its parent is not followed: the documents are read once, no hang."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(f"paragraph {i} with words" for i in range(50)))
    (src / "again").symlink_to(src)               # src/again -> src
    _ok(["corpus", "prepare", src, "--out", tmp_path / "out", "--vocab-size", "300", "--chunk-chars", "1"])
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["documents"] == 50


def test_os_error_names_path_cause_and_fix():
    e = os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/out/results.json"))
    assert str(e) == (f"/data/out/results.json: {os.strerror(errno.ENOSPC)} (ENOSPC); free space on that file "
                      "system or pass a path on another one")
    e = os_error(OSError(errno.ELOOP, os.strerror(errno.ELOOP)), "--out x/y")
    assert str(e).startswith(f"--out x/y: {os.strerror(errno.ELOOP)} (ELOOP); ")
    assert isinstance(e, InductionLabError)


def test_api_unreachable_output_is_a_clear_error(tmp_path, model_dir):
    from inductionlab.studies.analyze import AnalyzeConfig, analyze
    from inductionlab.protocols.lag_probe import LagProbeConfig
    from inductionlab.core.models import load_model

    cfg = AnalyzeConfig(ablation=AblationConfig(ks=(1,), n_draws=1), top=2,
                        scores=HeadScoreConfig(seq_len=8, batch_size=2),
                        lag=LagProbeConfig(n_permutations=2, list_length=20, cue_position=10))
    with pytest.raises(InductionLabError, match=r"ELOOP"):
        analyze(load_model(str(model_dir), dtype="float32"), cfg, _loop(tmp_path) / "out", RunOptions(progress=False))


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs (a tiny training run takes 18 MiB; we are root in CI); skipped where mounting
    is not allowed."""
    d = tmp_path / "disk"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` until the system says ENOSPC, then free ``leave`` bytes."""
    f = disk / "filler"
    with open(f, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    if leave:
        os.truncate(f, max(0, f.stat().st_size - leave))
    return f


@pytest.mark.parametrize("command", ["analyze", "corpus prepare", "train"])
def test_full_disk(small_disk, tmp_path, model_dir, corpus, command):
    """ENOSPC for real: one line naming the path and the cause; nothing half-written; the finished
    run beside it intact."""
    args = lambda out: _kill_args(command, tmp_path, model_dir, corpus, out)  # noqa: E731
    _ok(args(small_disk / "done"))
    done = {str(p): p.read_bytes() for p in (small_disk / "done").rglob("*") if p.is_file()}
    _fill(small_disk, 0)
    refused(args(small_disk / "new"), rf"{small_disk}/new.*: No space left on device \(ENOSPC\); free space",
            small_disk)
    assert _partials(small_disk) == [] and not (small_disk / "new").exists()
    assert {str(p): p.read_bytes() for p in (small_disk / "done").rglob("*") if p.is_file()} == done


@pytest.mark.parametrize("command, leave", [("analyze", 24 * 1024), ("train", 3 << 20)])
def test_full_disk_mid_run_then_resume(small_disk, tmp_path, model_dir, corpus, command, leave):
    """The disk fills after the first pieces (train: inside a checkpoint's safetensors write): one
    error line, no temporary left, the finished pieces stay; with space again the same command
    resumes and gives the numbers of an uninterrupted run."""
    from test_train_helpers import losses

    args = lambda out: _kill_args(command, tmp_path, model_dir, corpus, out)  # noqa: E731
    _ok(args(tmp_path / "ref"))
    filler = _fill(small_disk, leave)
    out = small_disk / "out"
    r = CliRunner().invoke(main, args(out))
    lines = [x for x in r.output.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error:")]      # the run had started: its first line (the dtype) may precede
    assert r.exit_code == 2 and len(errors) == 1 and lines[-1] == errors[0], r.output + repr(r.exception)
    assert errors[0].startswith(f"error: {out}/") and "No space left on device (ENOSPC)" in errors[0], lines
    assert _partials(small_disk) == [] and out.is_dir()
    if command == "train":
        assert json.loads((out / "run.json").read_text()).get("status") != "complete"
    else:
        assert not (out / "results.json").exists()
    filler.unlink()
    _ok(args(out))
    if command == "train":
        assert losses(out) == losses(tmp_path / "ref")
    else:
        a, b = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "ref", out))
        assert a["heads"] == b["heads"] and a["lag_probe"] == b["lag_probe"]
