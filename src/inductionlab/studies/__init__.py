"""Studies: one folder each (``analyze``, ``temporal``, ``evaluate``, ``bi_induct``, ``head_types``, ``routes``),
each a spec and one :class:`~inductionlab.studies.spec.Study` value that one engine runs.

* ``spec`` — :class:`~inductionlab.studies.spec.StudySpec` (a study's command, kind, config type, and the name of
  its Study), :class:`~inductionlab.studies.spec.Study` (``prepare``, ``phases``, ``result``, ``write``,
  ``summary``, ``estimate``), :class:`~inductionlab.studies.spec.StudyPlan` (what every plan carries: ``params``,
  ``owned``, ``model``), :class:`~inductionlab.studies.spec.RunOptions`, :func:`~inductionlab.studies.spec.specs`
  (every study folder, found by the command line). No torch.
* ``engine`` — :func:`~inductionlab.studies.engine.run_study` (the opening, each step, the one results header,
  the closing), the :class:`~inductionlab.studies.engine.Context` a study's phases call (``head_scores``,
  ``measure`` of :class:`~inductionlab.studies.engine.Phase` values, ``pieces`` — one resumable piece per item
  under one bar and one timing —, ``piece``, ``arrays``, ``progress``, ``timing``, ``dist``, ``is_main``).
* ``run`` — :class:`~inductionlab.studies.run.StudyRun` (the run directory) and :class:`~inductionlab.studies.run.Verdict`.
* ``configs`` — the configs several studies nest (head scores, ablation conditions) and their shared checks.
* ``report`` / ``plots`` — the shared formatting pieces and every figure.
* ``token_loss`` — the token-loss ICL phase shared by head types (Y2) and routes (R3): the pilot that sizes the
  windows, the confirmatory and sensitivity phases, their record and report section (issue 34).

A new study is a new folder ``studies/<name>/`` (``studies/analyze/`` is the smallest complete one):

* ``config.py`` — its config, a typed tree (:mod:`inductionlab.config`: ``opt`` leaves, ``nested`` protocol
  configs) with ``validate()`` (no model needed; its sub-configs through
  :func:`~inductionlab.config.validate_tree`), and ``SPEC = StudySpec("study <name>", Config, help=...)``;
* ``study.py`` — ``prepare(loaded, cfg)`` (model-dependent checks, nothing written; a plan extending
  :class:`~inductionlab.studies.spec.StudyPlan`), ``phases(plan, ctx)`` (``scores = ctx.head_scores(...)``,
  ``runs = ctx.measure(Phase(key, probe, conditions, n_trials), ...)``, ``ctx.pieces(key, items, compute)``) and
  ``result(plan, pieces)`` (pure: the typed result, a ``StudyResult``, with its ``verdicts`` and ``record``); it
  ends with ``STUDY = Study(prepare, phases, result, write, summary)``;
* ``report.py`` — ``write(out, result)`` (tables, figures, report.md) and, optionally, ``summary(result)``
  (the lines the command prints) and ``estimate(cfg)``;
* ``verdicts.py`` when it has claims (each a :class:`~inductionlab.studies.run.Verdict`, decided by rules
  stated before the data).

The command (``inductionlab study <name>``) and its options are generated from the spec and the config:
no command-line code. Conventions: the folder is the command's last word in snake case (``study bi-induct``
-> ``bi_induct/``); the run's kind is the command with hyphens (``"study-temporal"``); claims are lettered
A, B, ...; a study may import every layer below and another study through its ``__init__`` (``bi_induct``
evaluates with ``evaluate``), never ``cli``; the shared modules here never import a study. A study never reads
the run directory nor imports ``tqdm``: every loop, bar, timing and checkpoint goes through its ``Context``.
"""
