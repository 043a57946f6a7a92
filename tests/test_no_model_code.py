"""Issue 28, kind 1: no code that comes with a model or tokenizer folder ever runs.

A folder whose ``config.json`` / ``tokenizer_config.json`` names its own Python (``auto_map``) would make
transformers ask "Do you wish to run the custom code? [y/N]". Every command refuses such a folder with one
``error:`` line (exit 2, nothing written) before transformers reads it, with ``y`` on stdin and on a
pseudo-terminal alike; every transformers load passes ``trust_remote_code=False``.

The payload (``evil.py``) creates a marker file when imported; the first test shows that transformers does
import it when trusted, so the other tests' "no marker" means something.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from inductionlab.errors import InductionLabError
from test_bad_inputs import ANALYZE_FAST, TEMPORAL_FAST, model_dir  # noqa: F401 (fixture)

PAYLOAD = """from pathlib import Path
Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilConfig(LlamaConfig):
    pass
class EvilModel(LlamaForCausalLM):
    pass
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _plant(d: Path, marker: Path, *, config: bool = True, tokenizer: bool = True) -> Path:
    """Give folder ``d`` an ``evil.py`` that writes ``marker`` and an ``auto_map`` naming it."""
    (d / "evil.py").write_text(PAYLOAD.format(marker=str(marker)))
    if config:
        c = json.loads((d / "config.json").read_text())
        c["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
        (d / "config.json").write_text(json.dumps(c))
    if tokenizer:
        f = d / "tokenizer_config.json"
        c = json.loads(f.read_text()) if f.is_file() else {}
        c["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
        f.write_text(json.dumps(c))
    return d


@pytest.fixture
def evil(tmp_path, model_dir):  # noqa: F811
    """(folders by name, marker): a model folder whose config and tokenizer both name ``evil.py``; one whose
    tokenizer alone does; a tokenizer-only folder (no tokenizer.json: transformers would build it)."""
    marker = tmp_path / "MARKER"
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    both = _plant(Path(shutil.copytree(model_dir, inputs / "both")), marker)
    tok = _plant(Path(shutil.copytree(model_dir, inputs / "tokenizer")), marker, config=False)
    bare = inputs / "bare-tokenizer"
    bare.mkdir()
    (bare / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    _plant(bare, marker, config=False)
    return {"both": both, "tokenizer": tok, "bare-tokenizer": bare}, marker


def _env(tmp_path: Path) -> dict:
    # transformers copies trusted modules into HF_MODULES_CACHE: keep it inside the test's folder
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _snapshot(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "modules" not in p.parts)


def test_the_payload_runs_when_trusted(tmp_path, evil):
    """The control: transformers told to trust the folder imports evil.py (the marker appears)."""
    folders, marker = evil
    code = ("from transformers import AutoConfig\n"
            "try:\n    AutoConfig.from_pretrained(%r, trust_remote_code=True)\nexcept Exception:\n    pass\n"
            % str(folders["both"]))
    subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, timeout=120)
    assert marker.read_text() == "ran"


COMMANDS = {
    "analyze": lambda d, out: ["analyze", "--model", d, "--out", out, *ANALYZE_FAST],
    "evaluate": lambda d, out: ["evaluate", d, "--out", out, "--prompts", "2", "--quiet"],
    "study temporal": lambda d, out: ["study", "temporal", "--model", d, "--out", out, *TEMPORAL_FAST],
    "corpus prepare": lambda d, out: ["corpus", "prepare", Path(d).parent / "src.txt", "--out", out,
                                      "--tokenizer", d, "--heldout-fraction", "0"],
}
CASES = [("analyze", "both"), ("analyze", "tokenizer"), ("evaluate", "both"), ("study temporal", "both"),
         ("corpus prepare", "tokenizer"), ("corpus prepare", "bare-tokenizer")]


def _run_piped(args, env) -> tuple[int, str]:
    """The CLI with ``y`` lines on stdin (a pipe): (exit status, stdout + stderr)."""
    r = subprocess.run([sys.executable, "-m", "inductionlab.cli", *map(str, args)], input="y\n" * 8,
                       capture_output=True, text=True, env=env, timeout=300)
    return r.returncode, r.stdout + r.stderr


def _run_on_terminal(args, env) -> tuple[int, str]:
    """The CLI on a pseudo-terminal (stdin, stdout and stderr a tty) that answers ``y`` to anything:
    (exit status, what the terminal showed)."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[3] &= ~termios.ECHO                    # the terminal does not echo the answers typed ahead
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    p = subprocess.Popen([sys.executable, "-m", "inductionlab.cli", *map(str, args)], stdin=slave, stdout=slave,
                         stderr=slave, env=env, close_fds=True)
    os.close(slave)
    os.write(master, b"y\n" * 8)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 300)
        if not ready:
            p.kill()
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:                          # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
        if b"[y/N]" in shown:                    # a prompt: answer it again, as a user at the terminal would
            os.write(master, b"y\n")
    os.close(master)
    return p.wait(timeout=300), shown.decode(errors="replace").replace("\r", "")


@pytest.mark.parametrize("how", ["stdin", "terminal"])
@pytest.mark.parametrize("command, folder", CASES, ids=[f"{c}-{f}" for c, f in CASES])
def test_a_folder_asking_for_its_code_is_refused(tmp_path, evil, command, folder, how):
    folders, marker = evil
    d = folders[folder]
    (d.parent / "src.txt").write_text("hello world\n\nanother paragraph here\n")
    out = tmp_path / "out"
    before = _snapshot(tmp_path)
    run = _run_piped if how == "stdin" else _run_on_terminal
    rc, shown = run(COMMANDS[command](d, out), _env(tmp_path))
    assert not marker.exists(), f"the folder's code ran:\n{shown}"
    assert rc == 2, shown
    lines = [line for line in shown.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), shown
    assert "custom code" in lines[0] and "auto_map" in lines[0], lines[0]
    assert "[y/N]" not in shown
    assert not out.exists() and _snapshot(tmp_path) == before


# -- API: every loader refuses before transformers is called ---------------------------------------------------

def _no_transformers_load(monkeypatch):
    """Make any transformers Auto* load fail loudly: a refusal must come before it."""
    import transformers

    def boom(*a, **k):
        raise AssertionError("transformers was called")
    for name in ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", boom)


def test_load_model_and_load_tokenizer_refuse_before_transformers(tmp_path, evil, monkeypatch):
    from inductionlab.core.models import checkpoint_tokenizer, load_model
    from inductionlab.data.tokenizer import load_tokenizer

    folders, marker = evil
    _no_transformers_load(monkeypatch)
    for d in folders.values():
        if (d / "config.json").is_file():
            with pytest.raises(InductionLabError, match="custom code .*auto_map"):
                load_model(d, dtype="float32")
        with pytest.raises(InductionLabError, match="custom code .*auto_map"):
            load_tokenizer(d)
    with pytest.raises(InductionLabError, match="custom code"):
        load_tokenizer(folders["tokenizer"] / "tokenizer.json")     # its folder's config names code
    with pytest.raises(InductionLabError, match="tokenizer_config.json names custom code"):
        checkpoint_tokenizer(folders["tokenizer"])
    assert not marker.exists()


def test_a_gguf_beside_a_folder_config_asking_for_code_is_refused(tmp_path, evil, monkeypatch):
    from inductionlab.core.models import load_model

    folders, marker = evil
    _no_transformers_load(monkeypatch)
    g = folders["both"] / "model.gguf"
    g.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(InductionLabError, match="custom code"):
        load_model(g, dtype="float32")
    assert not marker.exists()


def test_a_cached_hub_model_asking_for_code_is_refused(tmp_path, evil, monkeypatch):
    """A hub id found in the local cache: its snapshot's files are checked the same way."""
    import huggingface_hub
    from inductionlab.core.models import load_model
    from inductionlab.data.tokenizer import load_tokenizer

    folders, marker = evil
    _no_transformers_load(monkeypatch)
    snap = tmp_path / "hub" / "models--someone--evil" / "snapshots" / ("0" * 40)
    shutil.copytree(folders["both"], snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(InductionLabError, match="custom code"):
        load_model("someone/evil", dtype="float32")
    with pytest.raises(InductionLabError, match="custom code"):
        load_tokenizer("someone/evil")
    assert not marker.exists()


def test_a_nested_auto_map_is_found_and_plain_folders_pass(tmp_path, model_dir):  # noqa: F811
    from inductionlab.runtime.model_specs import refuse_custom_code

    refuse_custom_code(model_dir)                                  # the plain tiny model: no refusal
    d = Path(shutil.copytree(model_dir, tmp_path / "nested"))
    c = json.loads((d / "config.json").read_text())
    c["text_config"] = {"auto_map": {"AutoModel": "x.Y"}}
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(InductionLabError, match=r"config\.json names custom code \('auto_map'\)"):
        refuse_custom_code(d)
    (d / "config.json").write_text("[" * 100000 + "]" * 100000)    # not this check's to read: the load says it
    refuse_custom_code(d)
