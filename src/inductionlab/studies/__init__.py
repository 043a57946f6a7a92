"""Studies: one folder each (``analyze``, ``temporal``, ``evaluate``, ``bi_induct``), built on one skeleton.

* ``run`` — :class:`~inductionlab.studies.run.StudyRun` (check out, resumable open, timed pieces,
  results.json and timing.json, rank-0 writing) and :class:`~inductionlab.studies.run.Verdict`.
* ``pieces`` — what several studies share: head scores as a piece, protocol phases over conditions.
* ``report`` / ``plots`` — the shared formatting pieces and every figure.

A new study is a new folder ``studies/<name>/`` with ``config.py`` (its config and ``validate()``),
``study.py`` (phases through ``StudyRun``), ``verdicts.py`` (claims decided by rules stated before the
data, when it has claims) and ``report.py`` (its tables and Markdown), its ``__init__`` naming the
public API; then a command in ``cli/study.py``.

Conventions: the folder is the command in snake case (``study bi-induct`` -> ``bi_induct/``); the
run's kind (``StudyRun(out, kind, ...)``, checked on resume) is the command with its spaces as
hyphens (``"analyze"``, ``"evaluate"``, ``"study-temporal"``); claims are lettered A, B, ...
(:class:`~inductionlab.studies.run.Verdict`). The package face (``inductionlab.__init__``) names
only the most used entry points: a new study need not appear there. A study may import every layer
below (``protocols``, ``train``, ``core``, ...) and another study through its ``__init__``
(``bi_induct`` evaluates with ``evaluate``), never ``cli``; the shared modules here never import a study.
"""
