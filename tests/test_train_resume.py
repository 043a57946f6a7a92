"""Crash safety: a SIGKILLed run resumes to bit-identical final weights; a kill during a checkpoint
write leaves the previous checkpoint intact; corrupt checkpoints and foreign output directories are
refused; a checkpoint reloads through load_model with the logits the trainer saw."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from inductionlab.train.checkpoint import CheckpointManager
from test_train_helpers import losses, make_corpus, run_cli, tiny_flags

STEPS = 16
# save_every=2 adds rolling resume points; the log schedule is 0, 1, 4, 16 (3 log-spaced + 0)
OVER = dict(tokens=1024 * STEPS, save_every=2, log_checkpoints=3)

# SIGKILL this very process when the trainer logs step 9 (checkpoints exist up to step 8)
KILL_AT_STEP_9 = """
import os, signal
from inductionlab.train import metrics
_log = metrics.MetricsLogger.log
def log(self, row):
    _log(self, row)
    if row["step"] == 9:
        self.fh.flush(); os.kill(os.getpid(), signal.SIGKILL)
metrics.MetricsLogger.log = log
"""

# SIGKILL this process in the middle of writing checkpoint 8: after the weights and the trainer
# state are in the staging directory, before meta.json and the publishing rename
KILL_IN_WRITE_8 = """
import os, signal, torch
_save = torch.save
def save(obj, f, *a, **k):
    _save(obj, f, *a, **k)
    if isinstance(obj, dict) and obj.get("step") == 8 and "optimizer" in obj:
        os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    data = make_corpus(tmp)
    ref = run_cli(["train", *tiny_flags(data, tmp / "ref", **OVER)])
    assert ref.returncode == 0, ref.stderr
    return tmp, data


def _final_weights(run):
    return load_file(run / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors")


def _assert_same_run(a, b):
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k              # bit-identical
    assert losses(a) == losses(b) and len(losses(a)) == STEPS


def test_sigkill_then_resume_is_bit_identical(runs):
    tmp, data = runs
    out = tmp / "killed"
    p = run_cli(["train", *tiny_flags(data, out, **OVER)], prelude=KILL_AT_STEP_9)
    assert p.returncode == -signal.SIGKILL
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert CheckpointManager(out).latest_resumable()[0] == 8
    assert len(losses(out)) == 9                        # step 9 was logged, never checkpointed
    p = run_cli(["train", *tiny_flags(data, out, **OVER)])
    assert p.returncode == 0, p.stderr
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "complete" and rec["resumed_from_step"] == 8
    _assert_same_run(tmp / "ref", out)
    # rolling checkpoints are gone, scheduled ones stay; optimizer state only in the newest two
    ck = CheckpointManager(out)
    assert [s for s, _, _ in ck.list()] == [0, 1, 4, 16]
    assert [s for s, _, m in ck.list() if m["resumable"]] == [4, 16]


def test_kill_during_checkpoint_write_keeps_last_good(runs):
    tmp, data = runs
    out = tmp / "torn"
    p = run_cli(["train", *tiny_flags(data, out, **OVER)], prelude=KILL_IN_WRITE_8)
    assert p.returncode == -signal.SIGKILL
    ck = CheckpointManager(out)
    assert not ck.path(8).exists() and list(ck.dir.glob(".step_00000008.partial-*"))
    step, path, meta = ck.latest_resumable()             # verified against its checksums
    assert step == 6
    p = run_cli(["train", *tiny_flags(data, out, **OVER)])
    assert p.returncode == 0, p.stderr
    assert not list(ck.dir.glob(".step_*"))
    _assert_same_run(tmp / "ref", out)


def test_corrupt_checkpoint_and_foreign_output_are_refused(runs):
    import shutil

    from click.testing import CliRunner

    from inductionlab.cli import main

    tmp, data = runs
    out = tmp / "corrupt"
    shutil.copytree(tmp / "ref", out)                    # the reference run, as if it had crashed at the end
    rec = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**rec, "status": "running"}))
    f = out / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors"
    b = bytearray(f.read_bytes())
    b[-3] ^= 0xFF
    f.write_bytes(bytes(b))
    cli = CliRunner()
    r = cli.invoke(main, ["train", *tiny_flags(data, out, **OVER)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith(
        f"error: checkpoint {out}/checkpoints/step_{STEPS:08d} is corrupt (model.safetensors fails its checksum)")
    # the same directory with a different recipe is a different run
    r = cli.invoke(main, ["train", *tiny_flags(data, out, **OVER, lr=5e-4)])
    assert r.exit_code == 2 and "holds a different run (config.lr is 0.001 there vs 0.0005 now)" in r.output
    (tmp / "foreign").mkdir()
    (tmp / "foreign" / "notes.txt").write_text("x")
    r = cli.invoke(main, ["train", *tiny_flags(data, tmp / "foreign", **OVER)])
    assert r.exit_code == 2 and "not empty and holds no training run" in r.output
    # a budget below one update, and a typo in a config file
    r = cli.invoke(main, ["train", *tiny_flags(data, tmp / "small", tokens=1000)])
    assert r.exit_code == 2 and "smaller than one update" in r.output and not (tmp / "small").exists()
    (tmp / "typo.yaml").write_text("lr: 1e-3\nmin_lr_ration: 0.1\n")
    r = cli.invoke(main, ["train", "--config", str(tmp / "typo.yaml"), *tiny_flags(data, tmp / "typo")])
    assert r.exit_code == 2 and "unknown config key 'min_lr_ration'; did you mean 'min_lr_ratio'?" in r.output


def test_checkpoint_reloads_through_load_model(runs):
    from inductionlab.data.shards import TokenShards
    from inductionlab.core.models import load_model
    from inductionlab.train.telemetry import heldout_loss
    from transformers import LlamaForCausalLM

    tmp, data = runs
    ck = tmp / "ref" / "checkpoints" / f"step_{STEPS:08d}"
    loaded = load_model(str(ck), dtype="float32")
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and loaded.tokenizer.vocab_size == 300
    shards = TokenShards.open(data)
    ids = torch.from_numpy(np.asarray(shards.heldout[:64], dtype=np.int64))[None]
    assert loaded.tokenizer.decode(ids[0].tolist()) == shards.decode(ids[0].tolist())
    # identical logits to a model rebuilt from the raw safetensors weights
    plain = LlamaForCausalLM(loaded.model.config)
    plain.load_state_dict(load_file(ck / "model.safetensors"))
    with torch.no_grad():
        assert torch.equal(loaded.model.eval()(input_ids=ids).logits, plain.eval()(input_ids=ids).logits)
    # and the held-out loss the trainer measured on its in-memory model at this step
    tel = json.loads((ck / "telemetry.json").read_text())
    got = heldout_loss(loaded.model, shards.heldout, seq_len=64, n_tokens=1024)
    assert got == pytest.approx(tel["heldout_loss"], rel=1e-6)
