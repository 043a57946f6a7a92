"""The main job: find induction heads and run the lag probe with ablations (``inductionlab analyze``).

Phases: self-check the instrumentation → score every head (SPEC §3) → the attention patterns of the top
induction heads and one random head on one ``[BOS] S S`` sequence (one small forward) → lag probe intact,
with the top-k induction heads ablated and with k random heads ablated (outside the top N, several seeded
draws) for each k (SPEC §4) → tables, plots, report. Run by :func:`inductionlab.studies.engine.run_study`:
the head scores, the patterns and each condition's lag probe are pieces of the run directory, so an
interrupted run continues where it stopped. The smallest complete study: copy its shape (``config.py``
with the spec, this module with ``prepare`` / ``phases`` / ``result`` and ``STUDY``, ``report.py`` with ``write``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ...config import to_dict
from ...core.ablation import random_heads, top_k_heads
from ...core.instrument import attention_patterns, self_check
from ...core.models import LoadedModel, ran_identity
from ...core.placement import execution_device
from ...core.scores import HeadScores, induction_sequence
from ...errors import InductionLabError
from ...measures import serial_position
from ...protocols import lag_probe
from ...protocols.lag_probe import LagProbeConfig, LagProbeResult
from ..configs import check_trial_ids, default_ks
from ..engine import Context, Phase, StudyResult, run_study
from ..spec import RunOptions, Study, StudyPlan, run_options
from .config import SPEC, AnalyzeConfig
from .report import summary, write


@dataclass(kw_only=True)
class Plan(StudyPlan):
    """What :func:`prepare` settles for this model: the ks, the exclusion N, the lag probe's config with the
    job's seed and method, the scores file's columns the selection names, and the run's ``params``."""
    loaded: LoadedModel
    cfg: AnalyzeConfig
    ks: list[int]
    exclude_top_n: int
    lag: LagProbeConfig
    file_scores: dict = field(default_factory=dict)
    self_check: dict = field(default_factory=dict)   # the instrumentation's self-check, run in prepare


#: The attention-pattern figure: the top ``PATTERN_TOP`` induction heads and one seeded random head, on one
#: ``[BOS] S S`` sequence with T = the head scores' seq_len, at most ``PATTERN_MAX_SEQ_LEN`` (one forward of at
#: most 201 tokens; decision: small beside the head scores, and every query fits the figure unwindowed).
PATTERN_TOP = 4
PATTERN_MAX_SEQ_LEN = 100


@dataclass(kw_only=True)
class AnalyzeResult(StudyResult):
    loaded: LoadedModel
    scores: HeadScores
    lag: LagProbeResult
    patterns: dict | None = None      # the piece attention_patterns (:func:`_patterns`); None: not computed


def prepare(loaded: LoadedModel, cfg: AnalyzeConfig) -> Plan:
    """The checks that need the model, before anything is written.

    Raises:
        InductionLabError: k larger than the heads available (or than those left outside the top N),
            ``--top`` beyond the heads, word pool smaller than the list, list longer than the context,
            a tokenizer that is not the model's, cues the architecture cannot take; UnsupportedArchitecture: the
            instrumentation's self-check fails on this model."""
    ident = ran_identity(loaded)
    n_total = ident["n_layers"] * ident["n_heads"]
    ab = cfg.ablation
    N = ab.top_n(n_total)
    ks = list(ab.ks) if ab.ks else default_ks(n_total, N)
    for k in ks:
        if k > n_total:
            raise InductionLabError(f"k={k} heads requested but the model has {n_total}; use k <= {n_total}")
    ab.check_model(ks, n_total)
    file_scores = ab.score_tables((ident["n_layers"], ident["n_heads"]))
    if cfg.top > n_total:
        raise InductionLabError(f"--top {cfg.top} exceeds the model's {n_total} heads")
    lag = cfg.protocol()
    check_trial_ids(lag_probe.build_trials(loaded, replace(lag, n_permutations=2)), loaded, "lag probe")
    lag_probe.check_cues(loaded, lag)
    check = _self_check(loaded, cfg.seed)          # a model the instrumentation cannot reach: refused before writing
    return Plan(loaded=loaded, cfg=cfg, ks=ks, exclude_top_n=N, lag=lag, file_scores=file_scores, self_check=check,
                params={"config": to_dict(cfg), "ks": ks, "exclude_top_n": N, **ab.params()})


def phases(plan: Plan, ctx: Context) -> dict:
    """Head scores, the attention patterns, then the lag probe under every condition (each a piece of the run; the
    self-check ran in prepare)."""
    cfg = plan.cfg
    check = plan.self_check
    scores = ctx.head_scores(cfg.scores, seed=cfg.seed)
    patterns = ctx.arrays("attention_patterns", lambda: _patterns(plan.loaded, scores, cfg))
    conditions = cfg.ablation.conditions({**plan.file_scores, **scores.scores}, plan.ks, seed=cfg.seed,
                                         exclude_top_n=plan.exclude_top_n)
    runs = ctx.measure(Phase("lag", lag_probe.probe(plan.lag), conditions, plan.lag.n_permutations, timing="lag_probe"))
    return {"self_check": check, "scores": scores, "patterns": patterns, "conditions": conditions, "lag": runs["lag"]}


def _patterns(loaded: LoadedModel, scores: HeadScores, cfg: AnalyzeConfig) -> dict:
    """The attention patterns of the top :data:`PATTERN_TOP` induction heads and one random head outside them
    (:func:`~inductionlab.core.ablation.random_heads`, seeded with the job's seed) on the induction score's
    first ``[BOS] S S`` sequence (:func:`~inductionlab.core.scores.induction_sequence`, the job's seed).

    Returns: ``patterns`` float32 ``[n, T, T]``, ``heads`` ``[n, 2]`` (layer, head), ``kind`` (``induction`` /
    ``random``), ``induction`` (each head's induction score), ``input_ids`` ``[T]``, ``tokens`` ``[T]`` (each id
    decoded on its own: the page of ``inductionlab view`` shows them without the model), ``seq_len`` (S's length),
    ``bos`` (1: position 0 is BOS), ``seed``."""
    ind = scores["induction"]
    top = top_k_heads(ind, min(PATTERN_TOP, ind.size))
    rand = random_heads(ind.shape, 1, exclude=top, seed=cfg.seed) if ind.size > len(top) else []
    heads = top + rand
    T = min(cfg.scores.seq_len, PATTERN_MAX_SEQ_LEN)
    ids = induction_sequence(loaded, seq_len=T, seed=cfg.seed)
    bos = int(len(ids) == 2 * T + 1)
    return {"patterns": attention_patterns(loaded.model, ids, heads), "heads": np.asarray(heads, dtype=np.int64),
            "kind": np.asarray(["induction"] * len(top) + ["random"] * len(rand)),
            "induction": np.asarray([ind[l, h] for l, h in heads], dtype=np.float64),
            "input_ids": ids.numpy(), "tokens": np.asarray([loaded.tokenizer.decode([int(i)]) for i in ids], dtype=str),
            "seq_len": np.asarray(T), "bos": np.asarray(bos), "seed": np.asarray(cfg.seed)}


def _self_check(loaded: LoadedModel, seed: int) -> dict:
    """The instrumentation is live and transparent on this model (:func:`~inductionlab.core.instrument.self_check`)."""
    ident = loaded.identity
    device = execution_device(loaded.model)
    gen = torch.Generator().manual_seed(seed)
    V = ident["vocab_size"]
    ids = torch.randint(min(100, V // 2), min(V, 1000), (1, 16), generator=gen).to(device)
    return self_check(loaded.model, ids, atol=1e-2 if ran_identity(loaded).get("dtype") != "float32" else 1e-4)


def result(plan: Plan, pieces: dict) -> AnalyzeResult:
    hs = pieces["scores"]
    lag = LagProbeResult.from_parts(pieces["lag"].arrays, pieces["conditions"], plan.lag, pieces["lag"].words)
    top = top_k_heads(hs["induction"], plan.cfg.top)
    record = {
        "self_check": pieces["self_check"],
        "heads": {**{k: v.tolist() for k, v in hs.scores.items()}, "induction_loss": hs.induction_loss,
                  "score_params": hs.params},
        "top_induction_heads": [{"layer": l, "head": h, "score": float(hs["induction"][l, h])} for l, h in top],
        "attention_patterns": _patterns_record(pieces["patterns"]),
        "lag_probe": lag.to_json(),
        **({"lag_cues": serial_position.cue_json(lag)} if serial_position.has_cues(lag) else {}),
    }
    return AnalyzeResult(loaded=plan.loaded, scores=hs, lag=lag, patterns=pieces["patterns"], record=record)


def _patterns_record(p: dict) -> dict:
    """What results.json says of the pattern figure (the arrays are in attention_patterns.npz)."""
    return {"heads": [{"layer": int(l), "head": int(h), "kind": str(k), "induction": float(s)}
                      for (l, h), k, s in zip(p["heads"], p["kind"], p["induction"])],
            "sequence": "[BOS] S S" if int(p["bos"]) else "S S", "seq_len": int(p["seq_len"]),
            "n_tokens": int(len(p["input_ids"])), "seed": int(p["seed"]),
            "random_head": "random_heads(shape, 1, exclude=the induction heads shown, seed=seed)"}


def analyze(loaded: LoadedModel, cfg: AnalyzeConfig, out: str | Path, opts: RunOptions | None = None,
            **legacy) -> AnalyzeResult:
    """Run (or resume) the main job on ``loaded`` and write the run directory ``out``
    (:func:`~inductionlab.studies.engine.run_study` of :data:`~inductionlab.studies.analyze.config.SPEC`).
    ``legacy``: the run keywords of 0.1's first API (``overwrite``, ``progress``, ``on_checkpoint``, ``dist``,
    ``log``), taken with a DeprecationWarning until 0.2 (:func:`~inductionlab.studies.spec.run_options`).

    Raises:
        InductionLabError: bad config (:meth:`AnalyzeConfig.validate`), what :func:`prepare` refuses, ``out``
            holding another run (other options, or another model: path, weight hashes, dtype that runs).
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not an AnalyzeConfig (a dict included).
    """
    return run_study(SPEC, loaded, cfg, out, run_options(opts, legacy, "analyze"))


STUDY: Study[AnalyzeConfig, Plan, AnalyzeResult] = Study(prepare, phases, result, write, summary)

__all__ = ["AnalyzeResult", "Plan", "prepare", "phases", "result", "analyze", "STUDY"]
