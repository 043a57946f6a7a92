"""The evaluation study (``inductionlab evaluate MODEL``, SPEC §8): how well a model learns in
context, and how much of that rests on its top induction heads compared with matched random heads.

A study in the shape of :mod:`inductionlab.studies.pieces`; every piece is checkpointed in
``<out>/checkpoints/`` through :class:`~inductionlab.runtime.runs.ResumableRun` (atomic writes; the same
command continues an interrupted run from its finished pieces). The measures are protocols of
:func:`inductionlab.protocols.runner.run_conditions` run as phases over condition sets
(:func:`inductionlab.studies.pieces.run_phases`: ``<phase>/<condition>.npz``), so under torchrun every
one is sharded by batch (``dist``; rank 0 alone writes); a method that needs a reference value
(``mean``) gets the first 8 induction-loss sequences ``[BOS] S S`` in every measure:

1. head scores (SPEC §3) → ``scores.json``;
2. function-style ICL probes, intact (:mod:`inductionlab.protocols.icl_tasks`, :mod:`inductionlab.protocols.function_probes`):
   HITS@1 / HITS@3 on the first answer token per task at every number of shots (default 0, 1,
   10) and the label-permutation control (k ≥ 2) → ``hits/intact.npz``;
3. ICL score on natural held-out text (Olsson et al. 2022, :mod:`inductionlab.protocols.icl_score`; only with
   ``shards``: windows from the MD5 held-out split that start at document starts — without
   shards the ICL score is skipped and the report says so), the induction loss on repeated
   random tokens and associative recall → ``icl/``, ``induction/``, ``recall/`` ``<condition>.npz``
   (per-position losses and top-1 hits; intact and under every ablation);
4. perplexity guard on the held-out split (:mod:`inductionlab.protocols.perplexity`; only with ``shards``,
   whose tokenizer must be the model's: a mismatch is refused before anything is written) →
   ``perplexity.json``;
5. load-bearing test (SPEC §3, §8): for each ablation variant — ``per-layer-<p>pct`` (per layer the
   top ``ceil(p·heads)`` induction heads, at least one: :func:`~inductionlab.core.ablation.per_layer_top_p`)
   against ``n_draws`` seeded draws of matched random heads (the same number per layer, never a
   chosen head: :func:`~inductionlab.core.ablation.matched_random_heads`), and ``top-<k>`` (global top-k
   against k random heads outside the top N = min(300, heads/2), as in the temporal study) —
   the probes at ``load_bearing.shots`` (default 10; intact prompts, no control), the ICL
   benefit and the induction benefit, each condition → ``hits_ablated/<condition>.npz`` (and the
   token losses above);
6. lm-evaluation-harness (optional, :mod:`inductionlab.protocols.lm_eval_tasks`): our probes exported as
   offline lm-eval tasks (``inductionlab_icl``, ``inductionlab_icl_<task>``) and/or installed
   lm-eval tasks by name → ``lm_eval.json``.

Then ``results.json``, ``tables/*.csv``, ``plots/*.png`` and ``report.md``.

Measures of the load-bearing test (each larger = better, per unit, paired across conditions):
HITS@1 of every prompt at ``load_bearing.shots`` shots (all tasks pooled), the ICL benefit
``loss(early) − loss(late)`` of every held-out window, the induction benefit ``loss(first copy)
− loss(second copy)`` of every random sequence. Their relative change ``mean(ablated) /
mean(intact) − 1`` with a paired delta-method 95% CI and the papers' headline form ("−22.6%")
come from :func:`inductionlab.measures.load_bearing_eval.drops_table`; random draws are pooled per unit.

This module holds :func:`run_evaluate` (the list of its phases, each a small function below it) and
:class:`EvaluateResult`; it imports the config (:mod:`~inductionlab.studies.evaluate.config`), the tidy
tables (:mod:`~inductionlab.studies.evaluate.tables`) and the writer of the run directory
(:mod:`~inductionlab.studies.evaluate.report`) of its folder, the protocols and the shared skeleton.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ...protocols import function_probes, icl_score

from ...core.ablation import Condition
from ...core.models import LoadedModel, agree_dtype, announce_dtype, params_identity, ran_identity, with_dtype_choice
from ...core.scores import HeadScores
from ...core.stimuli import random_sequences
from ...errors import InductionLabError
from ...measures.load_bearing_eval import score_concentration
from ...protocols.function_probes import probe_rows
from ...protocols.icl_score import (heldout_windows, icl_positions, icl_summary, induction_summary, model_context, recall_sequences,
                        recall_summary, scaled_positions)
from ...protocols.icl_tasks import TASK_NAMES, Prompt, build_tasks, make_all_prompts
from ...protocols.runner import REFERENCE_TRIALS, Trials
from ...runtime.distributed import Dist
from ...runtime.runs import ResumableRun, versions
from ..pieces import Phase, check_call, head_scores_piece, run_phases
from ..run import StudyRun
from .config import EvaluateConfig
from .report import write_evaluate_outputs
from .tables import drops_by_measure, hits_table, icl_table, load_bearing_conditions, per_sequence

KIND = "evaluate"


# -- result ---------------------------------------------------------------------------------
@dataclass
class EvaluateResult:
    """Everything a finished evaluation computed (also written to the run directory).

    Attributes:
        probe_rows: one row per prompt and condition (``condition, variant, task, shots, control,
            index, rank, hits1, hits3, p_target``).
        hits: :func:`~inductionlab.protocols.function_probes.summarize_hits` by condition × shots × control
            (random draws also pooled per variant as ``random-<variant>``), macro rows included.
        icl: ``"intact"`` -> ``{"icl": icl_score dict | None, "induction": induction_loss dict, "recall":
            associative recall dict}``; each ablated condition -> its per-sequence values of every
            :data:`~inductionlab.studies.evaluate.tables.SEQUENCE_MEASURES` (None without held-out windows).
        icl_summary: :func:`icl_table` (ICL score, ICL and induction benefits with CIs per condition).
        drops: :func:`~inductionlab.measures.load_bearing_eval.drops_table` rows with a ``measure`` column.
        concentration: :func:`~inductionlab.measures.load_bearing_eval.score_concentration` of the induction score.
        notes: what was skipped and why.
        record: the content of results.json.
        pool: LongTensor of the ids random probe tokens were drawn from (:func:`token_pool`).
    """
    loaded: LoadedModel
    config: EvaluateConfig
    scores: HeadScores
    conditions: list[Condition]
    variants: dict[str, str]
    probe_rows: pd.DataFrame
    hits: pd.DataFrame
    icl: dict[str, dict]
    icl_summary: pd.DataFrame
    perplexity: dict | None
    drops: pd.DataFrame
    concentration: dict
    lm_eval: dict | None
    notes: list[str]
    record: dict
    timings: dict = field(default_factory=dict)
    pool: torch.Tensor | None = None


# -- the study ------------------------------------------------------------------------------
def _is_ours(name: str) -> bool:
    from ...protocols.lm_eval_tasks import PREFIX, TAG
    return name == TAG or name.startswith(PREFIX)


def _export_lm_eval(d: Path, cfg: EvaluateConfig, tokenizer) -> Path | None:
    """Export the local lm-eval tasks named in ``cfg.lm_eval.tasks`` into ``d`` (None: none named)."""
    from ...protocols.lm_eval_tasks import PREFIX, TAG, export_lm_eval_tasks

    names = cfg.lm_eval.tasks
    if not any(_is_ours(n) for n in names):
        return None
    ours = list(cfg.probes.tasks or TASK_NAMES) if TAG in names else []
    ours += [n.removeprefix(PREFIX) for n in names if n.startswith(PREFIX) and n.removeprefix(PREFIX) not in ours]
    export_lm_eval_tasks(d, tasks=ours, tokenizer=tokenizer, seed=cfg.seed)
    return d


def _check_lm_eval(cfg: EvaluateConfig, tokenizer) -> None:
    """Every lm-eval task name known and its dataset on disk (one-line error otherwise), nothing written."""
    if not cfg.lm_eval.tasks:
        return
    from ...protocols.lm_eval_tasks import load_lm_eval_tasks

    with tempfile.TemporaryDirectory(prefix="inductionlab-lm-eval-") as d:
        load_lm_eval_tasks(cfg.lm_eval.tasks, include_path=_export_lm_eval(Path(d), cfg, tokenizer))


def _open_shards(shards, loaded: LoadedModel):
    from ...data.shards import TokenShards
    from ...protocols.perplexity import check_tokenizer_match

    s = TokenShards.open(shards)
    check_tokenizer_match(s, loaded.tokenizer, loaded.identity.get("vocab_size"))
    return s


def _windows(cfg: EvaluateConfig, loaded: LoadedModel, shards, bos_id):
    """Held-out windows of ``late + 1`` tokens (or the model's context), from document starts."""
    ctx = model_context(loaded.model)
    length = cfg.icl.late + 1 if not ctx else min(cfg.icl.late + 1, int(ctx))
    icl_positions(length, cfg.icl.late, cfg.icl.early)     # a context too short: error now
    return heldout_windows(shards.heldout, shards.eos_id, cfg.icl.n_sequences, length, seed=cfg.seed, bos_id=bos_id)


LOGITS_BYTES = 1 << 30   # full-sequence passes (ICL score, perplexity) keep float32 logits under ~1 GiB per batch


def _fit_batch(requested: int, tokens: int, vocab: int) -> int:
    """``requested`` sequences per forward, lowered so that float32 logits ``[b, tokens, vocab]`` stay
    under :data:`LOGITS_BYTES` (Gemma's 262k vocabulary: one 1,024-token window is 1 GiB)."""
    return max(1, min(int(requested), LOGITS_BYTES // max(1, tokens * vocab * 4)))


def _params(loaded: LoadedModel, cfg: EvaluateConfig, shards) -> dict:
    """What defines the result (batch sizes change nothing but speed: left out)."""
    config = asdict(cfg)
    for k in ("probes", "icl", "induction", "recall", "perplexity", "lm_eval"):
        config[k].pop("batch_size", None)
    shard_id = None
    if shards is not None:
        m = shards.manifest
        shard_id = {"path": str(shards.path), "corpus_sha256": m.get("corpus_sha256"),
                    "heldout_sha256": m["splits"]["heldout"].get("sha256"),
                    "tokenizer": m.get("tokenizer", {}).get("spec")}
    return {"config": config, "shards": shard_id,
            "model": params_identity(ran_identity(loaded))}   # the dtype that runs


def _probe_arrays(run: ResumableRun, key: str, arrays: dict, prompts: list[Prompt]) -> dict:
    """One condition's probe measures in the order of ``prompts``; refuses a piece made with other prompts."""
    df = probe_rows(prompts, arrays)
    if len(df) != len(prompts) or not np.array_equal(np.asarray(arrays["target_id"])[np.argsort(arrays["order"])],
                                                     [p.target_id for p in prompts]):
        raise InductionLabError(f"checkpoint {run.path(key, 'npz')} was made with other prompts; delete it or use "
                                "--overwrite")
    return df


def _rows(prompts: list[Prompt], arrays: dict, condition: str, variant: str, run: ResumableRun, key: str) -> pd.DataFrame:
    df = _probe_arrays(run, key, arrays, prompts)
    df.insert(0, "variant", variant)
    df.insert(0, "condition", condition)
    return df


def token_pool(loaded, cfg: EvaluateConfig, shards=None):
    """LongTensor of the ids random probe tokens are drawn from (``cfg.token_pool``).

    Raises: InductionLabError for ``"shards"`` without shards."""
    from ...core.models import attention_shape
    from ...core.stimuli import ordinary_token_ids

    tok = loaded.tokenizer
    vocab = ordinary_token_ids(attention_shape(loaded.model.config)["vocab_size"], (), tok)
    if cfg.token_pool == "vocab":
        return vocab
    if shards is None:
        raise InductionLabError("token pool 'shards' needs --shards (a corpus tokenised with the model's tokenizer)")
    ids = torch.as_tensor(shards.token_pool(), dtype=torch.long)
    return ids[torch.isin(ids, vocab)]


@dataclass
class _Measure:
    """One measure of the evaluation as a protocol of :func:`~inductionlab.studies.pieces.run_phases`
    (which reads ``build_trials`` / ``measure_batch`` / ``batch_size`` of a protocol and ``method``
    of its config: this object is both). Its trials are built before the phases, with the
    load-bearing test's reference batch (:func:`_reference_ids`)."""
    trials: Trials
    measure: Callable
    size: int
    method: str

    def build_trials(self, loaded, cfg) -> Trials:
        return self.trials

    def measure_batch(self, model, batch, cfg):
        return self.measure(model, batch)

    def batch_size(self, loaded, cfg, trials) -> int:
        return self.size


def _bos_ids(loaded, cfg: EvaluateConfig) -> tuple[int | None, int | None]:
    """``(bos, induction_bos)``: the BOS of probes and associative recall (None without
    ``cfg.probes.bos``) and that of the induction sequences (the tokenizer's BOS then, as in
    :func:`~inductionlab.protocols.icl_score.induction_loss`)."""
    tok = loaded.tokenizer
    bos = tok.bos_token_id if cfg.probes.bos else None
    return bos, bos if bos is not None else tok.bos_token_id


def _measures(loaded, cfg: EvaluateConfig, prompts: list[Prompt], ab_prompts: list[Prompt], windows, pool
              ) -> dict[str, _Measure]:
    """The protocols of the evaluation: ``probes`` (every prompt), ``probes_ablated`` (the prompts of
    the load-bearing test), ``icl`` (the held-out windows, only with them), ``induction``, ``recall``."""
    from ...core.scores import build_sequences

    bos, ibos = _bos_ids(loaded, cfg)
    vocab = loaded.identity.get("vocab_size", 1)
    ref = _reference_ids(loaded, cfg, pool)
    pad = function_probes.default_pad_id(loaded.tokenizer)
    hits = partial(icl_score.measure_batch, hits=True)

    def measure(trials: Trials, fn, size: int) -> _Measure:
        trials.reference = ref
        return _Measure(trials, fn, size, cfg.load_bearing.method)

    out = {"probes": measure(function_probes.build_trials(prompts, pad), function_probes.measure_batch,
                             cfg.probes.batch_size),
           "probes_ablated": measure(function_probes.build_trials(ab_prompts, pad), function_probes.measure_batch,
                                     cfg.probes.batch_size)}
    if windows is not None:
        lt, _ = scaled_positions(loaded.model, windows, cfg.icl.late, cfg.icl.early)
        out["icl"] = measure(Trials({"ids": windows[:, :lt + 1]}), icl_score.measure_batch,
                             _fit_batch(cfg.icl.batch_size, windows.shape[1], vocab))
    S = random_sequences(pool, cfg.induction.n_sequences, cfg.induction.seq_len, cfg.seed)
    out["induction"] = measure(Trials({"ids": build_sequences(S, "induction", ibos)}), hits,
                               _fit_batch(cfg.induction.batch_size, 2 * cfg.induction.seq_len + 1, vocab))
    out["recall"] = measure(Trials({"ids": recall_sequences(pool, cfg.recall.n_sequences, cfg.recall.n_pairs, cfg.seed,
                                                            bos)}), hits,
                            _fit_batch(cfg.recall.batch_size, 4 * cfg.recall.n_pairs + 1, vocab))
    return out


def _phases(measures: dict) -> list[Phase]:
    """Intact probes on every prompt; ICL (with windows), induction and recall intact and under every
    ablation; the probes of the load-bearing test under every ablation."""
    return [Phase("hits", "probes", "intact"), *(Phase(k, k, "all") for k in ("icl", "induction", "recall")
                                                 if k in measures),
            Phase("hits_ablated", "probes_ablated", "ablation")]


def _icl_results(parts: dict, conditions: Sequence[Condition], cfg: EvaluateConfig, loaded, windows) -> dict:
    """``"intact"`` -> the ICL score (None without windows), induction loss and associative recall
    summaries; each ablated condition -> its per-sequence values of every :data:`~.tables.SEQUENCE_MEASURES`."""
    bos, ibos = _bos_ids(loaded, cfg)
    pos = scaled_positions(loaded.model, windows, cfg.icl.late, cfg.icl.early) if windows is not None else None

    def summaries(name: str) -> dict:
        ind, rec = parts["induction"][name], parts["recall"][name]
        return {"icl": icl_summary(parts["icl"][name]["nll"], *pos, cfg.icl.window) if pos else None,
                "induction": induction_summary(ind["nll"], ind["hits"], cfg.induction.seq_len, ibos is not None),
                "recall": recall_summary(rec["nll"], rec["hits"], cfg.recall.n_pairs, bos is not None)}

    return {"intact": summaries("intact"), **{c.name: per_sequence(summaries(c.name)) for c in conditions}}


def _reference_ids(loaded, cfg: EvaluateConfig, pool):
    """The reference batch of a method that needs one (``mean``; the runner asks for it by the
    method's table entry): the first 8 induction-loss sequences ``[BOS] S S``, shared by every
    measure."""
    from ...core.scores import build_sequences

    S = random_sequences(pool, REFERENCE_TRIALS, cfg.induction.seq_len, cfg.seed)
    return build_sequences(S, "induction", _bos_ids(loaded, cfg)[0])


def run_evaluate(loaded: LoadedModel, cfg: EvaluateConfig, out: str | Path, *, shards: str | Path | None = None,
                 overwrite: bool = False, progress: bool = True, on_checkpoint=None, dist=None,
                 log=None) -> EvaluateResult:
    """Run (or resume) the evaluation study on one model and write the run directory ``out``.

    Args:
        loaded: the model (:func:`inductionlab.core.models.load_model`; a trainer checkpoint loads too).
        cfg: :class:`EvaluateConfig` (validated here).
        out: run directory; holding a run with the same parameters, its finished pieces are reused.
        shards: a prepared corpus (``inductionlab corpus prepare``) tokenised with the model's
            tokenizer: the ICL score's natural text and the perplexity guard (None: both skipped).
        overwrite: delete ``out`` first and start afresh.
        on_checkpoint: optional callable(key) after each piece is written (tests interrupt here).
        dist: a :class:`~inductionlab.runtime.distributed.Dist` of several processes (torchrun; every rank
            calling with the same arguments): head scores, probes, token losses and perplexity are
            sharded by batch; every rank returns the same result and rank 0 alone writes ``out``.
        log: optional callable(str) (the CLI: ``click.echo``) given the line saying which dtype runs
            and why, once the checks have passed (:func:`inductionlab.core.models.announce_dtype`).

    Returns: :class:`EvaluateResult` (``.record`` = results.json).

    Raises:
        TypeError: ``loaded`` not a LoadedModel, ``cfg`` not an EvaluateConfig (a dict included).
        InductionLabError — before anything is written: bad config, ``out`` unusable or holding
        another run, shards from another tokenizer or without a long enough document, a task
        with too few well-defined items for the shots, an ablation larger than the model allows,
        an unknown lm-eval task or one whose dataset is not on disk.
    """
    t_start = time.perf_counter()
    check_call(loaded, cfg, EvaluateConfig, "run_evaluate")
    out = Path(out)
    inputs = [loaded.identity.get("path"), shards]   # never under --out (--overwrite would delete them)
    StudyRun.check_out(out, overwrite, inputs=inputs)
    agree_dtype(loaded, dist)             # torchrun: every rank in rank 0's dtype (after every rank's check_out)
    inp = _inputs(loaded, cfg, shards)    # model-dependent checks, before any file is written

    run = StudyRun(out, KIND, _params(loaded, cfg, inp.shards), overwrite=overwrite,
                   on_checkpoint=on_checkpoint, inputs=inputs, dist=dist, started=t_start)
    run.open()
    announce_dtype(ran_identity(loaded), log, run.is_main)

    hs, conditions, variants = _head_scores_and_conditions(run, loaded, cfg, inp.pool, progress)
    ppl = _perplexity(run, loaded, cfg, inp.shards)
    probe_rows, icl = _probes_and_losses(run, loaded, cfg, inp, conditions, variants, progress)
    lm = _lm_eval(run, loaded, cfg, out)
    res = _result(run, loaded, cfg, inp, hs, conditions, variants, probe_rows, icl, ppl, lm)
    if not run.is_main:
        return res
    run.finish(res.record, lambda: write_evaluate_outputs(out, res))
    return res


# -- the phases of run_evaluate ---------------------------------------------------------------
@dataclass
class _Inputs:
    """What the evaluation reads besides the model, made and checked before any file is written
    (:func:`_inputs`)."""
    shards: object | None                 # TokenShards (None without shards)
    windows: torch.Tensor | None          # held-out windows of the ICL score [n, T] (None without shards)
    pool: torch.Tensor                    # ids of the random tokens (:func:`token_pool`)
    prompts: list[Prompt]                 # every probe prompt (all tasks, shots and controls)
    bos: int | None                       # the probes' BOS (None without ``cfg.probes.bos``)
    notes: list[str]                      # what was skipped and why


def _inputs(loaded: LoadedModel, cfg: EvaluateConfig, shards) -> _Inputs:
    """Open the shards, draw the held-out windows, the token pool and the prompts, and refuse (one
    InductionLabError, nothing written) whatever does not fit the model."""
    tok = loaded.tokenizer
    bos = _bos_ids(loaded, cfg)[0]
    notes: list[str] = []
    shard_obj = _open_shards(shards, loaded) if shards is not None else None
    windows = _windows(cfg, loaded, shard_obj, bos) if shard_obj is not None else None
    pool = token_pool(loaded, cfg, shard_obj)
    for what, need in (("induction loss", cfg.induction.seq_len), ("head scores", cfg.score_seq_len),
                       ("associative recall", 2 * cfg.recall.n_pairs)):
        if need > len(pool):
            raise InductionLabError(f"{what} needs {need} distinct tokens but the token pool ({cfg.token_pool}) has "
                                    f"{len(pool)}; lower it or use another pool")
    prompts = make_all_prompts(build_tasks(cfg.probes.tasks), tok, shots=cfg.probes.shots,
                               n_prompts=cfg.probes.n_prompts, seed=cfg.seed, permuted=cfg.probes.permutation_control,
                               bos_id=bos)
    _check_fits_model(loaded, cfg, prompts)
    _check_lm_eval(cfg, tok)
    if shard_obj is None:
        notes.append("no --shards: the ICL score (natural held-out text) and the perplexity guard were skipped")
    return _Inputs(shard_obj, windows, pool, prompts, bos, notes)


def _check_fits_model(loaded: LoadedModel, cfg: EvaluateConfig, prompts: list[Prompt]) -> None:
    """The probes' token ids within the model's vocabulary, ``[BOS] S S`` within its context and the
    ablation variants within its heads (InductionLabError otherwise)."""
    ident = loaded.identity
    top = max((max(p.input_ids + [p.target_id]) for p in prompts), default=-1)
    if ident.get("vocab_size") and top >= ident["vocab_size"]:
        raise InductionLabError(f"the probes use token id {top} but the model's vocabulary has {ident['vocab_size']} "
                                "ids: the tokenizer is not the model's own; load the model with its tokenizer")
    ctx = model_context(loaded.model)
    for what, T, opt in (("head scores", cfg.score_seq_len, "score_seq_len (--score-seq-len)"),
                         ("induction loss", cfg.induction.seq_len, "induction.seq_len")):
        if ctx and 2 * T + 1 > int(ctx):
            raise InductionLabError(f"{what}: [BOS] S S of 2 x {T} + 1 tokens exceeds the model's context of {ctx}; "
                                    f"lower {opt} to <= {(int(ctx) - 1) // 2}")
    load_bearing_conditions(np.zeros((ident["n_layers"], ident["n_heads"])), cfg.load_bearing, cfg.seed)  # sizes


def _head_scores_and_conditions(run: StudyRun, loaded: LoadedModel, cfg: EvaluateConfig, pool, progress: bool
                                ) -> tuple[HeadScores, list[Condition], dict[str, str]]:
    """The head scores (piece ``head_scores``) and from them the ablation conditions of the
    load-bearing test with ``condition name -> variant``."""
    with run.timed("head_scores"):
        hs = head_scores_piece(run, loaded, seq_len=cfg.score_seq_len, batch_size=cfg.score_batch_size,
                               seed=cfg.seed, progress=progress, pool=None if cfg.token_pool == "vocab" else pool)
    pairs = load_bearing_conditions(hs["induction"], cfg.load_bearing, cfg.seed)
    return hs, [c for _, c in pairs], {c.name: v for v, c in pairs}


def _perplexity(run: StudyRun, loaded: LoadedModel, cfg: EvaluateConfig, shards) -> dict | None:
    """The perplexity guard on the held-out split (piece ``perplexity``; None without shards)."""
    if shards is None:
        return None
    from ...protocols.perplexity import heldout_perplexity

    ctx = model_context(loaded.model)
    window = cfg.perplexity.context or min(int(ctx or 1024), 1024)   # heldout_perplexity's default
    bs = _fit_batch(cfg.perplexity.batch_size, window, loaded.identity.get("vocab_size", 1))
    return run.piece("perplexity", lambda: heldout_perplexity(
        loaded.model, shards, tokenizer=loaded.tokenizer, context=cfg.perplexity.context,
        max_tokens=cfg.perplexity.max_tokens, batch_size=bs, dist=run.dist))


def _probes_and_losses(run: StudyRun, loaded: LoadedModel, cfg: EvaluateConfig, inp: _Inputs,
                       conditions: list[Condition], variants: dict[str, str], progress: bool
                       ) -> tuple[pd.DataFrame, dict]:
    """The probes (intact, and at ``load_bearing.shots`` under every ablation), the ICL score,
    induction loss and associative recall (intact and under every ablation) as phases over condition
    sets (:func:`_phases`). Returns ``(probe_rows, icl)``: one row per prompt and condition, and
    :func:`_icl_results`."""
    prompts = inp.prompts
    ab_prompts = [p for p in prompts if p.shots == cfg.load_bearing.shots and p.control == "intact"]
    measures = _measures(loaded, cfg, prompts, ab_prompts, inp.windows, inp.pool)
    phases = _phases(measures)
    parts, _ = run_phases(run, loaded, phases, measures, measures,
                          {"intact": [Condition("intact", "intact")], "ablation": conditions,
                           "all": [Condition("intact", "intact"), *conditions]},
                          {ph.key: len(measures[ph.protocol].trials) for ph in phases}, progress=progress,
                          timings=run.timings)
    rows = [_rows(prompts, parts["hits"]["intact"], "intact", "intact", run, "hits/intact")]
    rows += [_rows(ab_prompts, parts["hits_ablated"][c.name], c.name, variants[c.name], run, f"hits_ablated/{c.name}")
             for c in conditions]
    return pd.concat(rows, ignore_index=True), _icl_results(parts, conditions, cfg, loaded, inp.windows)


def _lm_eval(run: StudyRun, loaded: LoadedModel, cfg: EvaluateConfig, out: Path) -> dict | None:
    """lm-evaluation-harness (piece ``lm_eval``; None when no task is named). Rank 0 alone
    runs it (not sharded); the other ranks read its piece."""
    if not cfg.lm_eval.tasks:
        return None
    from ...protocols.lm_eval_tasks import run_lm_eval

    tok = loaded.tokenizer

    def lm_compute():
        if not run.is_main:           # rank 0 alone runs lm-eval (not sharded); the others read its piece
            return None
        include = _export_lm_eval(out / "lm_eval_tasks", cfg, tok)
        return run_lm_eval(loaded.model, tok, cfg.lm_eval.tasks, include_path=include,
                           num_fewshot=cfg.lm_eval.num_fewshot, batch_size=cfg.lm_eval.batch_size,
                           limit=cfg.lm_eval.limit, seed=cfg.seed)
    return run.piece("lm_eval", lm_compute)


def _result(run: StudyRun, loaded: LoadedModel, cfg: EvaluateConfig, inp: _Inputs, hs: HeadScores,
            conditions: list[Condition], variants: dict[str, str], probe_rows: pd.DataFrame, icl: dict,
            ppl: dict | None, lm: dict | None) -> EvaluateResult:
    """The tidy tables (:mod:`inductionlab.studies.evaluate.tables`) and the record
    (results.json) of the finished pieces, as an :class:`EvaluateResult`."""
    hits = hits_table(probe_rows, conditions, variants)
    drops = drops_by_measure(probe_rows, icl, conditions, variants, cfg.load_bearing.shots)
    conc = score_concentration(hs["induction"])
    icl_summary = icl_table(icl, conditions, variants)
    record = {
        "kind": KIND, "model": with_dtype_choice(run.params["model"], loaded), "params": run.params,
        "versions": versions(),
        "seeds": {"study": cfg.seed, "prompts": "seed_for(seed, crc32(task), shots, index)",
                  "heldout_windows": cfg.seed, "induction_sequences": cfg.seed,
                  "random_draws": "per-layer: seed_for(seed, draw); top-k: seed_for(seed, k, draw)"},
        "head_scores": {**hs.to_dict(), "params": hs.params},
        "concentration": conc,
        "conditions": [{**c.to_dict(), "variant": variants[c.name]} for c in conditions],
        "probes": {"n_prompts": len(inp.prompts), "bos_id": inp.bos, "hits": hits.to_dict(orient="records")},
        "icl": icl_summary.to_dict(orient="records"),
        "perplexity": ppl,
        "load_bearing": {"shots": cfg.load_bearing.shots, "method": cfg.load_bearing.method,
                         "drops": drops.to_dict(orient="records")},
        "lm_eval": lm,
        "notes": inp.notes,
        "resumed": run.resumed,
        "distributed": (run.dist or Dist()).record(),
    }
    return EvaluateResult(loaded, cfg, hs, conditions, variants, probe_rows, hits, icl, icl_summary, ppl, drops, conc,
                          lm, inp.notes, record, run.timings, inp.pool)


__all__ = ["EvaluateResult", "run_evaluate", "token_pool"]
