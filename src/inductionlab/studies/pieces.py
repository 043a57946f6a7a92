"""Pieces every study shares: head scores as a checkpointed piece, protocol phases over
conditions, the k check. A study's folder (``studies/temporal/``, ``studies/analyze/``) then holds
only its config, its phase list, its tables, verdicts and report.

The shape of a study (``analyze`` and ``study temporal`` follow it; a new study copies this
recipe, not a module)::

    @dataclass
    class MyStudyConfig:                  # 1. config: nests the protocol configs as they are
        lag: LagProbeConfig = field(default_factory=LagProbeConfig)
        seed: int = 0
        def validate(self) -> None: ...   #    needs no model; the CLI and the API both call it

    PHASES = (Phase("lag", "lag", "ablation"),)          # 2. piece folder, protocol, condition set
    PROTOCOLS = {"lag": lag_probe}                       #    modules with build_trials / measure_batch

    def run_my_study(loaded, cfg, out, *, progress=True, overwrite=False, on_checkpoint=None, dist=None) -> MyStudy:
        t_start = time.perf_counter()
        cfg.validate()                                   #    before any file is written
        params = {..., "model": ran_identity(loaded) less "device"}   # a resume never mixes two models
        run = StudyRun(out, "study-mine", params, overwrite=overwrite, on_checkpoint=on_checkpoint,
                       inputs=[loaded.identity.get("path")], dist=dist, started=t_start)  # never under --out
        run.open()                                       # 3. refuses another run; resumes this one
        with run.timed("head_scores"):                   #    timings["head_scores_s"]
            hs = head_scores_piece(run, loaded, seq_len=..., batch_size=..., seed=cfg.seed)
        conditions = ablation_conditions(hs["induction"], ks, ...)
        parts, words = run_phases(run, loaded, PHASES, PROTOCOLS, {"lag": cfg.lag},
                                  {"ablation": conditions}, {"lag": cfg.lag.n_permutations},
                                  timings=run.timings)  #    timings["lag_s"]
        ...                                              # 4. tables and verdicts (pure functions over
                                                         #    measures/; each claim a studies.run.Verdict)
        record = {..., "verdicts": [v.to_dict() for v in verdicts]}
        run.finish(record, write=lambda: ...)            #    rank 0: tables/, plots (plots.py), report.md
                                                         #    (the study's report.py), results.json, timing.json
        return MyStudy(...)                              # 5. a typed result

Each piece (``scores``, ``<phase>/<condition>``) is computed once, written atomically under
``<out>/checkpoints/`` and loaded on a re-run (:class:`inductionlab.runtime.runs.ResumableRun`, which
:class:`inductionlab.studies.run.StudyRun` extends with timings and the final record).
CLI options come from :mod:`inductionlab.cli.options`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..checks import check_draws, check_loaded, check_seed, check_type
from ..core.scores import HeadScores, compute_head_scores
from ..errors import InductionLabError
from ..protocols.runner import residual_cache, run_conditions
from ..runtime.runs import ResumableRun, timed


@dataclass(frozen=True)
class Phase:
    """One protocol under one set of conditions: pieces ``<key>/<condition name>``."""
    key: str          # checkpoint folder, e.g. "lag"
    protocol: str     # key into the study's protocol table, e.g. "lag"
    conditions: str   # key into the study's condition sets, e.g. "ablation" or "single"


def check_call(loaded, cfg, config_type: type, what: str) -> None:
    """The checks a study call opens with, before anything else: ``loaded`` a loaded model
    (:func:`~inductionlab.checks.check_loaded`), ``cfg`` a ``config_type`` (a dict refused), then
    ``cfg.validate()``.

    Raises:
        TypeError: ``loaded`` or ``cfg`` of the wrong type.
        InductionLabError: what ``cfg.validate()`` raises."""
    check_loaded(loaded, what)
    check_type(cfg, config_type, f"{what}: cfg")
    cfg.validate()


def check_study_options(*, ks: Sequence[int] | None, n_draws: int, exclude_top_n: int | None, seed: int,
                        score_seq_len: int, score_batch_size: int) -> None:
    """The options every study shares (ablation and head scores), checked the same way in every
    study's ``validate()`` (so ``analyze`` and ``study temporal`` give the same line for the same
    mistake, from the CLI and from the API). Messages name the CLI flag; the config field is the
    same name with underscores.

    Raises:
        InductionLabError: a k below 1 or repeated, fewer than 1 random draw or more than
            :data:`~inductionlab.checks.MAX_DRAWS`, a negative
            exclusion or seed, a head-score sequence shorter than 2 tokens or an empty batch.
    """
    if ks is not None:
        if not ks or min(ks) < 1:
            raise InductionLabError(f"--ks {','.join(map(str, ks)) or '(empty)'}: give at least one k, each >= 1 "
                                    "(e.g. --ks 5,10,20)")
        if len(set(ks)) != len(ks):
            raise InductionLabError(f"--ks {','.join(map(str, ks))} repeats a k; give each k once")
    check_draws(n_draws, "--n-draws")
    if exclude_top_n is not None and exclude_top_n < 0:
        raise InductionLabError(f"--exclude-top-n {exclude_top_n} must be >= 0 (or left unset for the default)")
    check_seed(seed, "--seed")
    if score_seq_len < 2:
        raise InductionLabError(f"--score-seq-len {score_seq_len}: a head-score sequence needs at least 2 tokens "
                                "per copy; use e.g. 50")
    if score_batch_size < 1:
        raise InductionLabError(f"--score-batch-size {score_batch_size} must be >= 1")
    check_trials_fit(score_batch_size, 2 * score_seq_len + 1, "--score-batch-size")


def check_lag_headline(lag) -> None:
    """A study's headline reads lag +1 and lag −1 of the lag probe: the cue needs a word on both
    sides (cue at the first word: lag −1 would index the list's last word; at the last: no lag +1).

    Raises:
        InductionLabError: ``cue_position`` outside 2 .. list_length − 1."""
    if lag.list_length >= 2 and 1 <= lag.cue_position <= lag.list_length and \
            not 2 <= lag.cue_position <= lag.list_length - 1:
        raise InductionLabError(f"--cue-position {lag.cue_position}: the headline reads lags -1 and +1, so the cue "
                                f"needs a word before and after it; use 2 <= --cue-position <= {lag.list_length - 1} "
                                f"(--list-length {lag.list_length})")


def check_trials_fit(n_trials: int, tokens_per_trial: int, option: str, value: int | None = None) -> None:
    """A protocol's trials (token ids and list ids, int64) must fit in a quarter of memory
    (``value``: the option's own value when ``n_trials`` is a product of it).

    Raises:
        InductionLabError: ``n_trials`` x ``tokens_per_trial`` too large, naming ``option``."""
    from ..runtime.runs import physical_memory

    need, mem = 16 * int(n_trials) * int(tokens_per_trial), physical_memory()
    if mem and need > mem // 4:
        raise InductionLabError(f"{option} {n_trials if value is None else value:,}: {n_trials:,} trials of ~{tokens_per_trial} tokens need "
                                f"{need / 2**30:.1f} GiB, more than a quarter of this machine's {mem / 2**30:.0f} GiB; "
                                f"lower {option}")


def check_trial_ids(trials, loaded, what: str) -> None:
    """The token ids of a protocol's trials are rows of the model's embedding (a tokenizer that is
    not the model's own gives ids past the vocabulary: an index error deep in the forward pass).

    Raises:
        InductionLabError: an id >= the model's vocabulary size."""
    vocab = loaded.identity.get("vocab_size")
    top = int(trials.tensors["ids"].max()) if trials.tensors["ids"].numel() else -1
    if vocab and top >= vocab:
        raise InductionLabError(f"the {what} uses token id {top} but the model's vocabulary has {vocab} ids: the "
                                "tokenizer is not the model's own; load the model with its tokenizer")


def check_ks(ks: Sequence[int], n_total: int, exclude_top_n: int) -> None:
    """Every k must leave room for random draws outside the top N.

    Raises:
        InductionLabError: a k below 1 or above ``n_total − exclude_top_n``."""
    for k in ks:
        if not 1 <= k <= n_total - exclude_top_n:
            raise InductionLabError(f"k={k}: must be between 1 and the {n_total - exclude_top_n} heads left outside "
                                    f"the top {exclude_top_n} (--exclude-top-n) of {n_total} for random draws; "
                                    "lower k or --exclude-top-n")


def head_scores_piece(run: ResumableRun, loaded, *, seq_len: int, batch_size: int, n_batches: int = 1, seed: int = 0,
                      progress: bool = True, pool=None) -> HeadScores:
    """Head scores (SPEC §3) as the piece ``scores``: computed once, then loaded (sharded over
    ``run.dist``'s processes when it has several; the bar shows on rank 0 only). ``pool``: ids to
    draw the random tokens from (None: the tokenizer's ordinary ids)."""
    def compute():
        with tqdm(total=batch_size * n_batches, desc="head scores", unit="seq",
                  disable=not (progress and run.is_main)) as bar:
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, seq_len=seq_len, batch_size=batch_size,
                                     n_batches=n_batches, seed=seed, progress=bar.update, dist=run.dist, pool=pool)
        return {"scores": hs.scores, "induction_loss": hs.induction_loss, "params": hs.params}
    raw = run.json("scores", compute)
    return HeadScores({k: np.asarray(v) for k, v in raw["scores"].items()}, raw["induction_loss"], raw["params"])


def run_phases(run: ResumableRun, loaded, phases: Sequence[Phase], protocols: Mapping[str, ModuleType],
               configs: Mapping[str, object], condition_sets: Mapping[str, list], n_trials: Mapping[str, int], *,
               progress: bool = True, timings: dict | None = None):
    """Every piece ``<phase.key>/<condition>`` of ``phases``, in order: loaded if finished, else
    :func:`~inductionlab.protocols.runner.run_conditions` on the first ``n_trials[phase.key]`` trials
    (sharded over ``run.dist``'s processes when it has several; the bar shows on rank 0 only).

    Args:
        protocols: protocol name -> module with ``build_trials(loaded, cfg)`` and
            ``measure_batch(model, batch, cfg)``; trials are built once per protocol, on first need.
        configs: protocol name -> its config (``method``, ``batch_size``, ``reuse_residual`` are read;
            with reuse, one :class:`~inductionlab.core.reuse.ResidualCache` per protocol serves all its
            phases, though each condition is its own call).
        condition_sets: name -> list of :class:`~inductionlab.core.ablation.Condition`.
        n_trials: phase key -> trials used (the first ones: a phase can reuse the start of a run).
        timings: optional dict; ``<phase>_s`` accumulates the compute time of each phase.

    Returns:
        ``(parts, words)``: phase key -> condition name -> measure -> array ``[n_trials, ...]``;
        protocol name -> the word set of its trials.
    """
    timings = {} if timings is None else timings
    todo = [(ph, c) for ph in phases for c in condition_sets[ph.conditions]]
    pending = [(ph, c) for ph, c in todo if not run.done(f"{ph.key}/{c.name}")]
    trials: dict[str, object] = {}
    caches = {p: residual_cache(loaded.model, [c for ph in phases if ph.protocol == p
                                               for c in condition_sets[ph.conditions]])
              for p, cfg in configs.items() if getattr(cfg, "reuse_residual", False)}
    parts: dict[str, dict[str, dict]] = {ph.key: {} for ph in phases}
    words: dict[str, list[str]] = {}
    with tqdm(total=sum(n_trials[ph.key] for ph, _ in pending), desc="conditions", unit="trial",
              disable=not (progress and run.is_main)) as bar:
        for ph, c in todo:
            key = f"{ph.key}/{c.name}"
            module, cfg = protocols[ph.protocol], configs[ph.protocol]

            def compute():
                with timed(timings, ph.key):
                    bar.set_postfix_str(key)
                    if ph.protocol not in trials:
                        trials[ph.protocol] = module.build_trials(loaded, cfg)
                    tr = trials[ph.protocol].head(n_trials[ph.key])
                    bs = module.batch_size(loaded, cfg, tr) if hasattr(module, "batch_size") else cfg.batch_size
                    arrays = run_conditions(loaded, [c], tr, method=cfg.method, batch_size=bs,
                                            measure_batch=lambda m, b: module.measure_batch(m, b, cfg),
                                            progress=bar.update, dist=run.dist,
                                            reuse=caches.get(ph.protocol) or False)[c.name]
                return {**arrays, "words": np.asarray(tr.words)}

            arrays = dict(run.arrays(key, compute))
            words[ph.protocol] = [str(w) for w in arrays.pop("words")]
            parts[ph.key][c.name] = arrays
    return parts, words
