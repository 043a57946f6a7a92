"""``runtime/run_dir.TrainRun``, the one reader of a training run directory, on a real tiny run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inductionlab.errors import InductionLabError
from inductionlab.runtime.run_dir import TrainRun
from test_train_helpers import make_corpus

STEPS = 4                       # 4 updates of 1024 tokens; log_checkpoints=2 -> geomspace(1, 4, 2) = {1, 4}
SCHEDULE = [0, 1, 4]            # + step 0 (initialisation) and the last step, always


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus, run dir, TrainResult) of a 4-update cpu-micro run trained in this process."""
    from inductionlab.train import TrainConfig, train

    tmp = tmp_path_factory.mktemp("run_dir")
    data = make_corpus(tmp)
    cfg = TrainConfig(data=str(data), out=str(tmp / "run"), preset="cpu-micro", seq_len=64, tokens_per_update=1024,
                      tokens=1024 * STEPS, micro_batch_size=8, log_checkpoints=2, telemetry_seq_len=12,
                      telemetry_batch=4, eval_tokens=1024, curriculum="induction", deterministic=True,
                      progress=False, tensorboard=False)
    result = train(cfg)
    return data, tmp / "run", result


def _step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


def test_record_budget_and_status_are_the_trainers(trained):
    data, run_dir, result = trained
    run = TrainRun.open(run_dir)
    assert run.record == json.loads((run_dir / "run.json").read_text())
    assert run.record["kind"] == "train" and run.record["config"] == result.record["config"]
    assert run.is_complete and run.record["status"] == "complete"
    assert run.budget == result.record["budget"]
    assert (run.budget["steps"], run.budget["tokens"], run.budget["seq_len"]) == (STEPS, 1024 * STEPS, 64)
    assert run.config["data"] == str(data) and run.corpus == data
    # the thin wrappers kept for their callers read the same
    from inductionlab.train.flops import read_budgets, read_run_record
    assert read_run_record(run_dir) == run.record and read_budgets([run_dir]) == {"run": run.budget}


def test_checkpoints_final_and_telemetry(trained):
    _, run_dir, result = trained
    run = TrainRun(run_dir)
    assert [c.step for c in run.checkpoints()] == SCHEDULE == result.record["checkpoint_steps"]
    assert [c.path for c in run.checkpoints()] == [_step_dir(run_dir, s) for s in SCHEDULE]
    assert run.final_checkpoint() == _step_dir(run_dir, STEPS)
    assert run.telemetry_files() == [_step_dir(run_dir, s) / "telemetry.json" for s in SCHEDULE]
    assert [json.loads(p.read_text())["step"] for p in run.telemetry_files()] == SCHEDULE
    # a checkpoint knows its run; a directory elsewhere has none
    assert TrainRun.of_checkpoint(run.final_checkpoint()).path == run_dir
    assert TrainRun.of_checkpoint(run_dir) is None
    # every other reader goes to the same checkpoint
    from inductionlab.core import models
    from inductionlab.studies.bi_induct import study as study_bi_induct
    assert models.final_checkpoint(run_dir) == study_bi_induct.final_checkpoint(run_dir) == _step_dir(run_dir, STEPS)
    assert models.resolve(str(run_dir))[:2] == ("checkpoint", _step_dir(run_dir, STEPS))


def test_incomplete_checkpoints_are_skipped(trained, tmp_path):
    _, run_dir, _ = trained
    copy = Path(shutil.copytree(run_dir, tmp_path / "run"))
    (_step_dir(copy, STEPS) / "config.json").unlink()           # the last one loses its config: incomplete
    _step_dir(copy, 9).mkdir()                                   # a bare step folder: incomplete
    (copy / "checkpoints" / ".step_00000010.partial-1-h-x").mkdir()   # a writer's staging folder
    (copy / "checkpoints" / "step_notes").mkdir()                # not a step
    run = TrainRun(copy)
    assert [c.step for c in run.checkpoints()] == [0, 1]
    assert run.final_checkpoint() == _step_dir(copy, 1)          # the largest complete step
    assert [c.step for c in run.checkpoints(complete=False)] == [0, 1, STEPS, 9]
    assert len(run.telemetry_files()) == 3                       # telemetry needs no weights
    for c in (_step_dir(copy, 0), _step_dir(copy, 1)):
        (c / "config.json").unlink()
    with pytest.raises(InductionLabError, match=r"has no published checkpoint yet"):
        run.final_checkpoint()


def test_status_of_a_run_in_progress(trained, tmp_path):
    _, run_dir, _ = trained
    copy = Path(shutil.copytree(run_dir, tmp_path / "run"))
    rec = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**rec, "status": "running"}))
    assert not TrainRun(copy).is_complete
    (copy / "run.json").write_text('{"status": "compl')           # a record being written
    assert not TrainRun(copy).is_complete and TrainRun(copy).read_record() is None
    assert not TrainRun(tmp_path / "nothing").is_complete


def test_corpus_named_relative_to_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"config": {"data": "shards"}, "budget": {}}))
    assert TrainRun(run).corpus == Path("shards")                # not in the run directory: as given
    (run / "shards").mkdir()
    assert TrainRun(run).corpus == run / "shards"
    (run / "run.json").write_text(json.dumps({"config": {}, "budget": {}}))
    assert TrainRun(run).corpus is None


@pytest.mark.parametrize("text, pattern", [
    (None, r"is not a training run \(no run\.json\); pass a directory written by `inductionlab train`"),
    ("{not json", r"training run record .*run\.json is damaged \(Expecting property name"),
    ("[]", r"is damaged \(no 'budget' and 'config' objects\)"),
    (json.dumps({"config": {"data": "x"}}), r"is damaged \(no 'budget' and 'config' objects\); restore it"),
])
def test_bad_run_directories_are_refused(tmp_path, text, pattern):
    run = tmp_path / "run"
    run.mkdir()
    if text is not None:
        (run / "run.json").write_text(text)
    with pytest.raises(InductionLabError, match=pattern) as e:
        TrainRun.open(run)
    assert "\n" not in str(e.value)
    with pytest.raises(InductionLabError, match=pattern):
        TrainRun(run).budget                                      # the lazy reader raises the same
