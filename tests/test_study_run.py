"""The study skeleton (study_run.py): StudyRun's timings and final files, Verdict and its printer."""

from __future__ import annotations

import json
import time

import pytest

from inductionlab.studies.run import STATUSES, StudyRun, Verdict, format_verdicts


class Clock:
    """A fake ``time.perf_counter``: each call returns the next value of ``ticks``."""

    def __init__(self, *ticks: float):
        self.ticks = list(ticks)

    def __call__(self) -> float:
        return self.ticks.pop(0)


def test_timed_blocks_accumulate_per_name(tmp_path, monkeypatch):
    run = StudyRun(tmp_path / "run", "study-test", {"seed": 0}, started=0.0)
    # a: 1.0 -> 1.5, b: 2.0 -> 4.0, a again: 10.0 -> 10.25 (also when the block raises)
    monkeypatch.setattr(time, "perf_counter", Clock(1.0, 1.5, 2.0, 4.0, 10.0, 10.25))
    with run.timed("a"):
        pass
    with run.timed("b"):
        pass
    with pytest.raises(KeyboardInterrupt), run.timed("a"):
        raise KeyboardInterrupt
    assert run.timings == {"a_s": 0.75, "b_s": 2.0}


def test_piece_is_timed_and_loaded_on_rerun(tmp_path):
    out = tmp_path / "run"
    from inductionlab.studies.engine import Context
    from inductionlab.studies.spec import RunOptions

    run = StudyRun(out, "study-test", {"seed": 0})
    assert run.open() is False
    calls = []
    value = Context(run, None, RunOptions()).piece("icl/intact", lambda: calls.append(1) or {"x": [1, 2]}, timing="icl")
    assert value == {"x": [1, 2]} and calls == [1]
    assert json.loads((out / "checkpoints" / "icl" / "intact.json").read_text())["value"] == {"x": [1, 2]}
    assert set(run.timings) == {"icl_s"} and run.timings["icl_s"] >= 0
    again = StudyRun(out, "study-test", {"seed": 0})
    assert again.open() is True
    ctx = Context(again, None, RunOptions())
    assert ctx.piece("icl/intact", lambda: calls.append(2)) == {"x": [1, 2]} and calls == [1]   # not recomputed
    assert set(again.timings) == {"icl_intact_s"}                                  # default name: the key
    assert ctx.timing("icl_intact") == again.timings["icl_intact_s"] and ctx.timing("icl") is None


def test_finish_writes_record_and_timing_last(tmp_path, monkeypatch):
    out = tmp_path / "run"
    run = StudyRun(out, "study-test", {"seed": 0}, started=100.0)
    run.open()
    seen = []

    def write():                                   # the study's own files: results.json not there yet
        seen.append((dict(run.timings), (out / "results.json").exists()))
        (out / "report.md").write_text("report")

    # total before write: 101.0 - 100; write from 101.5 to 103.0; final total: 104.0 - 100
    monkeypatch.setattr(time, "perf_counter", Clock(101.0, 101.5, 103.0, 104.0))
    record = {"kind": "study-test", "timings": run.timings}
    assert run.finish(record, write) is True
    assert seen == [({"total_s": 1.0}, False)]
    assert json.loads((out / "results.json").read_text()) == {"kind": "study-test",
                                                              "timings": {"total_s": 4.0, "write_s": 1.5}}
    timing = json.loads((out / "timing.json").read_text())
    assert timing == {"resumed": False, "this_session_s": {"total_s": 4.0, "write_s": 1.5}}
    assert list(timing["this_session_s"]) == ["write_s", "total_s"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_failing_piece_or_write_leaves_no_results(tmp_path):
    out = tmp_path / "run"
    run = StudyRun(out, "study-test", {"seed": 0})
    run.open()

    def broken():
        raise RuntimeError("piece failed")
    from inductionlab.studies.engine import Context
    from inductionlab.studies.spec import RunOptions

    with pytest.raises(RuntimeError, match="piece failed"):
        Context(run, None, RunOptions()).piece("scores", broken)
    assert not (out / "checkpoints" / "scores.json").exists() and "scores_s" in run.timings

    def broken_write():
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        run.finish({"kind": "study-test"}, broken_write)
    assert not (out / "results.json").exists() and not (out / "timing.json").exists()


def test_finish_writes_nothing_off_rank_0(tmp_path):
    class Rank1:
        is_main = False

    out = tmp_path / "run"
    run = StudyRun(out, "study-test", {"seed": 0}, dist=Rank1())
    written = []
    assert run.finish({"kind": "study-test"}, lambda: written.append(1)) is False
    assert written == [] and not out.exists()


def test_verdict_refuses_other_status():
    for status in STATUSES:
        assert Verdict("A", status, "rule", "evidence").status == status
    for bad in ("not testable at this scale", "Reproduced", "maybe", ""):
        with pytest.raises(ValueError, match="use one of 'reproduced', 'not reproduced', 'not testable'"):
            Verdict("A", bad, "rule", "evidence")
    with pytest.raises(ValueError, match="claim id"):
        Verdict("", "reproduced", "rule", "evidence")


def test_verdict_to_dict_shape():
    v = Verdict("B", "not reproduced", "CI > 0", "d = 0.1 [−0.1, 0.3]", text="heads matter")
    assert v.to_dict() == {"claim": "B", "text": "heads matter", "verdict": "not reproduced", "rule": "CI > 0",
                           "evidence": "d = 0.1 [−0.1, 0.3]"}
    w = v | {"variant": "anti", "caveat": "2 seeds", "per_k": {5: {"holds": False}}}
    assert list(w.to_dict()) == ["claim", "text", "verdict", "rule", "evidence", "variant", "caveat", "per_k"]
    assert w.to_dict()["per_k"] == {5: {"holds": False}} and v.variant is None      # | copies
    with pytest.raises(TypeError):
        v | {"colour": "red"}


def test_format_verdicts_lines():
    vs = [Verdict("A", "reproduced", "r", "p(+1) = 0.8", text="peaks at +1"),
          Verdict("A", "not testable", "r", "fewer than 2 seeds", text="heads form", variant="induction"),
          Verdict("C", "not reproduced", "r", "0.1", text="neutral", caveat="probe near its floor")]
    assert format_verdicts(vs) == ["(A) reproduced: peaks at +1 — p(+1) = 0.8",
                                   "(A/induction) not testable: heads form — fewer than 2 seeds",
                                   "(C) not reproduced: neutral — 0.1 [probe near its floor]"]
    assert format_verdicts([]) == []


def test_each_probe_gets_its_own_trials_even_after_another_was_freed(tmp_path):
    """Context caches a probe's trials by id(probe); a probe freed after use must not hand its trials to the next
    probe that CPython places at the same address (a head-types run once gave its lag probe the ICL windows)."""
    import torch

    from inductionlab.protocols.runner import Probe, Trials
    from inductionlab.studies.engine import Context
    from inductionlab.studies.spec import RunOptions

    run = StudyRun(tmp_path / "run", "study-test", {"seed": 0})
    run.open()
    ctx = Context(run, None, RunOptions())
    for i in range(50):
        probe = Probe.of_trials(f"p{i}", Trials({"ids": torch.full((1, 2), i)}), lambda model, batch: {})
        assert int(ctx.trials(probe).tensors["ids"][0, 0]) == i
        del probe
