"""The run directory of a study: :class:`StudyRun` (check out, resumable open, timed pieces, results.json
and timing.json, rank-0 writing) and :class:`Verdict` (one claim decided by a rule) with its one printer,
:func:`format_verdicts`. :func:`inductionlab.studies.engine.run_study` opens and closes every study's run
with them; a study's phases never touch the directory themselves.

``results.json`` is written last but one, atomically, once everything else is there: a run that
fails (a piece, a table, a figure) leaves none. ``timing.json`` is ``{"resumed", "this_session_s":
timings}``: the wall seconds of this call per part, ``total_s`` from ``started`` to results.json.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Mapping

from ..runtime.outputs import inside
from ..runtime.runs import ResumableRun, atomic_write_json, timed


class StudyRun(ResumableRun):
    """A study's run directory: a :class:`~inductionlab.runtime.runs.ResumableRun` (check out, open, pieces,
    rank-0 decisions under torchrun) that also keeps the call's timings and writes the final record.

    Args:
        out, kind, params, overwrite, on_checkpoint, manifest, inputs, dist: as for
            :class:`~inductionlab.runtime.runs.ResumableRun`.
        started: ``time.perf_counter()`` at the start of the study call (default: now), the
            origin of ``timings["total_s"]``.

    Attributes:
        timings: ``<part>_s`` -> wall seconds of this call (:meth:`timed`,
            :meth:`finish`); the same dict all along, so a result or record holding it sees the
            final values.
    """

    def __init__(self, out, kind: str, params: dict, *, started: float | None = None, **kw):
        super().__init__(out, kind, params, **kw)
        self.started = time.perf_counter() if started is None else started
        self.timings: dict[str, float] = {}

    def timed(self, name: str):
        """Context manager: the block's wall seconds added to ``timings[f"{name}_s"]``."""
        return timed(self.timings, name)

    def elapsed(self) -> float:
        """Wall seconds since ``started``."""
        return time.perf_counter() - self.started

    def finish(self, record: dict, write: Callable[[], None] | None = None) -> bool:
        """Close the study on rank 0 (other ranks: nothing, returns False): ``write()`` (tables,
        plots, report.md; timed as ``write_s``), then ``results.json`` = ``record`` and
        ``timing.json``, each atomically. ``timings["total_s"]`` is set before ``write`` (the time so
        far, for a report that quotes it) and again before results.json (the final value).

        Returns:
            True where the files were written (rank 0)."""
        if not self.is_main:
            return False
        self.timings["total_s"] = self.elapsed()
        if write is not None:
            with self.timed("write"):
                write()
        del self.timings["total_s"]                # set again: the final value, listed last
        self.timings["total_s"] = self.elapsed()
        atomic_write_json(inside(self.out, "results.json"), record)
        atomic_write_json(inside(self.out, "timing.json"), {"resumed": self.resumed, "this_session_s": self.timings})
        return True


STATUSES = ("reproduced", "not reproduced", "not testable")


@dataclass(frozen=True)
class Verdict:
    """One claim of a paper, decided on this run by a rule stated before the data.

    Args:
        claim: the claim's id, an upper-case letter as the study's docs name it (``"A"``).
        status: one of :data:`STATUSES`: ``"reproduced"``, ``"not reproduced"``, ``"not testable"``
            (the data cannot decide: too few seeds, a measure at its floor, a piece not run).
        rule: the decision rule, in words.
        evidence: the numbers the rule read (means with CIs), in words.
        text: the claim in words.
        variant: the variant the claim is decided for, where it is decided per variant.
        caveat: what a reader must know beside the status.
        per_k: per-k numbers, for a rule decided over several k (``study temporal``).
        power: for a verdict left undecided ("not testable", or a CI that straddles 0): what n would decide it
            (:func:`~inductionlab.measures.power.power_record`: ``n``, ``sigma``, ``n_needed``, ``unit``,
            ``minutes``, ...); :attr:`power_line` prints it.

    Raises:
        ValueError: ``status`` not one of :data:`STATUSES`, or an empty ``claim``.
    """
    claim: str
    status: str
    rule: str
    evidence: str
    text: str = ""
    variant: str | None = None
    caveat: str | None = None
    per_k: Mapping | None = None
    power: Mapping | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"verdict status {self.status!r} of claim {self.claim!r}: use one of "
                             f"{', '.join(map(repr, STATUSES))}")
        if not self.claim:
            raise ValueError("a verdict needs a claim id (e.g. 'A')")

    def __or__(self, fields: Mapping) -> "Verdict":
        """A copy with ``fields`` replaced, like a dict union: ``v | {"variant": "anti"}``."""
        return replace(self, **fields)

    @property
    def power_line(self) -> str | None:
        """The power line of an undecided verdict (:func:`~inductionlab.measures.power.power_line`), or None."""
        from ..measures.power import power_line
        return None if self.power is None else power_line(dict(self.power))

    def to_dict(self) -> dict:
        """The results.json entry: ``claim, text, verdict`` (the status), ``rule, evidence``, then
        ``variant``, ``caveat``, ``per_k``, ``power`` (with its ``line``) where set."""
        d = asdict(self)
        out = {"claim": d.pop("claim"), "text": d.pop("text"), "verdict": d.pop("status"), "rule": d.pop("rule"),
               "evidence": d.pop("evidence")}
        if d.get("power") is not None:
            d["power"] = {**d["power"], "line": self.power_line}
        return out | {k: v for k, v in d.items() if v is not None}


def format_verdicts(verdicts: Iterable[Verdict]) -> list[str]:
    """One line per verdict, as the CLI prints them: ``(A/induction) reproduced: <text> — <evidence>``
    (``/variant`` where set; ``[caveat]`` at the end where set; ``[power: …]`` for an undecided verdict with a
    power record)."""
    return [f"({v.claim}{'/' + v.variant if v.variant else ''}) {v.status}: {v.text} — {v.evidence}"
            + (f" [{v.caveat}]" if v.caveat else "") + (f" [power: {v.power_line}]" if v.power else "")
            for v in verdicts]


__all__ = ["StudyRun", "Verdict", "STATUSES", "format_verdicts"]
