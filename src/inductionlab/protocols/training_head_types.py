"""Head types over training (issue 26, deliverable 4): at every checkpoint of a training run, each head's
induction score, concept / token induction scores and attention CRP with its CMR fit; then which heads cross
each type's threshold and in what order, the CMR-like share per layer, and how concentrated induction is.

Per checkpoint (:func:`checkpoint_scores`, one model state; every draw seeded by ``seed`` alone, so a
checkpoint's values do not depend on which other checkpoints are swept; the sweep over a run's checkpoints, which
reads them from disk, is the ``telemetry`` study's: :mod:`inductionlab.studies.telemetry`):

* ``induction``: :func:`~inductionlab.core.scores.compute_head_scores` on ``[BOS] S S`` (SPEC §3);
* ``concept_copying``, ``token_copying``, ``concept_attention``, ``token_attention``: the dual-route scores
  (Feucht, Wallace & Bau 2025; :mod:`inductionlab.protocols.dual_route`, ``build_prompts`` + ``route_scores``) on
  a few prompts (8 by default). Words come from the run's own tokenizer (:func:`~inductionlab.core.stimuli.
  sample_multi_token_words`); a tokenizer that splits too few of wordfreq's words into 2–5 tokens (a tiny BPE
  vocabulary) leaves these four scores out, recorded as ``"not computed: <reason>"``;
* ``cmr_distance``, ``cmr_beta_enc``, ``cmr_beta_rec``, ``cmr_gamma_ft``: the attention CRP and its CMR fit
  (Ji-An, Zhou, Benna & Mattar 2024; :func:`~inductionlab.protocols.cmr_fit.attention_crp_cmr_fit`), and
  ``crp_range``, the profile's max − min attention probability over the fitted lags −5..5. The CMR distance is
  scale-free (variance-normalised), so a nearly flat profile — an untrained head's — can fit at distance < 0.5;
  ``crp_range`` tells such a head from one that attends by lag.

Crossings (:func:`transition_table`): a head crosses a type's threshold at the first checkpoint where
``induction ≥ t_ind`` (0.4), ``concept_copying ≥ t_cc``, ``token_copying ≥ t_tc`` (both 0.05: a probability gain
of five points on the copied token, well clear of the exact 0 of a head that carries nothing) or
``cmr_distance < 0.5`` (Ji-An et al.'s CMR-like threshold). Concentration (:func:`concentration`): the share
of the positive induction total held by the top k heads, and the effective number of heads
``exp(−Σ p log p)`` with ``p`` the positive induction scores normalised to sum 1.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..errors import InductionLabError
from ..measures.cmr import CMR_LIKE_THRESHOLD
from .configs import HeadTypeParams  # noqa: F401 (the sweep's config, re-exported)

ROUTE_NAMES = ("concept_copying", "token_copying", "concept_attention", "token_attention")
CMR_NAMES = ("cmr_distance", "cmr_beta_enc", "cmr_beta_rec", "cmr_gamma_ft", "crp_range")


def _crp_window(profile: np.ndarray, r: int = 5) -> np.ndarray:
    m = profile.shape[-1] // 2
    return profile[..., m - r:m + r + 1]


def tidy(step: int, scores: dict[str, np.ndarray]) -> pd.DataFrame:
    """The tidy rows ``step, layer, head, score, value`` of one checkpoint's ``{score: [n_layers, n_heads]}``
    grids: by score (in the dict's order), then layer, then head."""
    return pd.DataFrame([{"step": int(step), "layer": l, "head": h, "score": name, "value": float(grid[l, h])}
                         for name, grid in scores.items() for l in range(grid.shape[0]) for h in range(grid.shape[1])],
                        columns=["step", "layer", "head", "score", "value"])


def route_prompts(tokenizer, vocab_size: int, params: HeadTypeParams, pool: np.ndarray | None = None):
    """The dual-route prompts of a sweep (:func:`~inductionlab.protocols.dual_route.build_prompts`, seeded by
    ``params.seed``), or the reason there are none: ``(prompts | None, note)``, note ``"computed"`` or
    ``"not computed: <reason>"`` (e.g. too few words of 2–5 tokens under a tiny tokenizer)."""
    from . import dual_route as DR

    p = params
    try:
        return DR.build_prompts(tokenizer, vocab_size, n_words=p.n_words, n_attention=p.n_attention,
                                seq_len=p.route_seq_len, top_n=p.word_pool, seed=p.seed, pool=pool), "computed"
    except InductionLabError as e:
        return None, f"not computed: {e}"


def measure_checkpoint(model, tokenizer, params: HeadTypeParams, step: int = 0, prompts=None,
                       pool: np.ndarray | None = None) -> tuple[pd.DataFrame, dict]:
    """Every head type score of one model state, as tidy rows (:func:`tidy` of :func:`checkpoint_scores`).

    Returns: (tidy rows ``step, layer, head, score, value``; notes ``{"dual_route": "computed" | "not computed:
    <reason>"}``)."""
    scores, notes = checkpoint_scores(model, tokenizer, params, prompts, pool)
    return tidy(step, scores), notes


def checkpoint_scores(model, tokenizer, params: HeadTypeParams, prompts=None, pool: np.ndarray | None = None
                      ) -> tuple[dict[str, np.ndarray], dict]:
    """Every head type score of one model state.

    Args:
        model: a causal LM (``[n_layers, n_heads]`` query heads); tokenizer: its tokenizer.
        prompts: :func:`route_prompts` of this tokenizer and ``params`` when already built (a sweep builds
            them once: drawing words tokenizes wordfreq's list); None: built here.
        pool: the ids random tokens are drawn from (the training split's:
            :func:`inductionlab.studies.telemetry.study.training_pool`); None: the
            tokenizer's ordinary ids.

    Returns: (``{score: float64 [n_layers, n_heads]}``: ``induction``, the four :data:`ROUTE_NAMES` when the
    dual-route prompts were built, the five :data:`CMR_NAMES`, in that order; notes ``{"dual_route": "computed" |
    "not computed: <reason>"}``).

    Raises:
        InductionLabError: what the induction score or the attention CRP refuse (e.g. a sequence longer than
            the model's context)."""
    from ..core.scores import compute_head_scores
    from . import dual_route as DR
    from .cmr_fit import attention_crp_cmr_fit

    p = params
    scores: dict[str, np.ndarray] = {}
    seqs = p.sequences(None if pool is None else torch.as_tensor(np.asarray(pool, dtype=np.int64)))
    hs = compute_head_scores(model, seqs, tokenizer=tokenizer, names=("induction",), induction_loss=False)
    scores["induction"] = np.asarray(hs.scores["induction"], float)
    built, note = prompts if prompts is not None else route_prompts(tokenizer, model.config.vocab_size, p, pool)
    if built is not None:
        r = DR.route_scores(model, *built, measure_cost=False)
        scores.update({n: r.score(n) for n in ROUTE_NAMES})
    notes = {"dual_route": note}
    cmr = attention_crp_cmr_fit(model, seqs, tokenizer=tokenizer, max_lag=p.max_lag, n_exps=p.n_exps,
                                n_starts=p.n_starts)
    scores.update({"cmr_distance": cmr["distance"], "cmr_beta_enc": cmr["beta_enc"],
                   "cmr_beta_rec": cmr["beta_rec"], "cmr_gamma_ft": cmr["gamma_ft"],
                   "crp_range": np.ptp(_crp_window(cmr["profile"]), axis=-1)})
    return scores, notes


def _crossed(values: pd.Series, threshold: float, direction: str) -> pd.Series:
    return values < threshold if direction == "<" else values >= threshold


def transition_table(tidy: pd.DataFrame, thresholds: dict[str, tuple[float, str]]) -> pd.DataFrame:
    """Per head and score type of ``thresholds`` (present in ``tidy``): the first checkpoint step at which it
    crosses (``first_step``; NaN if never) and ``order``, the rank of that step among the heads of the same
    type that cross (1 = first; ties share the lower rank). NaN values (a flat CRP) never cross.

    Returns: rows ``score, threshold, direction, layer, head, first_step, order``, by score, order, layer, head."""
    out = []
    for score, (thr, direction) in thresholds.items():
        g = tidy[tidy["score"] == score]
        if g.empty:
            continue
        for (layer, head), h in g.groupby(["layer", "head"], sort=True):
            h = h.sort_values("step")
            hit = h.loc[_crossed(h["value"], thr, direction), "step"]
            out.append({"score": score, "threshold": thr, "direction": direction, "layer": int(layer),
                        "head": int(head), "first_step": float(hit.iloc[0]) if len(hit) else math.nan})
    t = pd.DataFrame(out, columns=["score", "threshold", "direction", "layer", "head", "first_step"])
    t["order"] = t.groupby("score")["first_step"].rank(method="min")
    return t.sort_values(["score", "order", "layer", "head"], na_position="last").reset_index(drop=True)


def cmr_share(tidy: pd.DataFrame, threshold: float = CMR_LIKE_THRESHOLD) -> pd.DataFrame:
    """Per checkpoint and layer: the share of the layer's heads that are CMR-like (distance < threshold; a flat
    profile, NaN, is not). Rows ``step, layer, n_heads, n_cmr_like, share``."""
    g = tidy[tidy["score"] == "cmr_distance"].copy()
    g["like"] = (g["value"] < threshold).astype(int)
    s = g.groupby(["step", "layer"], sort=True)["like"].agg(n_heads="size", n_cmr_like="sum").reset_index()
    s["share"] = s["n_cmr_like"] / s["n_heads"]
    return s


def concentration(tidy: pd.DataFrame, top_k: int = 5, score: str = "induction") -> pd.DataFrame:
    """Per checkpoint: how concentrated ``score`` is in few heads. With ``p`` the positive scores (negatives
    clipped to 0) normalised to sum 1: ``top_k_share`` = Σ of the ``top_k`` largest ``p``, ``effective_heads``
    = ``exp(−Σ p log p)`` (1 = one head holds all, N = spread evenly over N); both NaN when no score is
    positive. Rows ``step, n_heads, total, top_k, top_k_share, effective_heads``."""
    out = []
    for step, g in tidy[tidy["score"] == score].groupby("step", sort=True):
        v = np.clip(np.nan_to_num(g["value"].to_numpy(float)), 0, None)
        tot = v.sum()
        if tot > 0:
            p = v / tot
            nz = p[p > 0]
            share, eff = float(np.sort(p)[::-1][:top_k].sum()), float(np.exp(-(nz * np.log(nz)).sum()))
        else:
            share = eff = math.nan
        out.append({"step": int(step), "n_heads": len(v), "total": float(tot), "top_k": int(top_k),
                    "top_k_share": share, "effective_heads": eff})
    return pd.DataFrame(out)


def compare_runs(runs: dict[str, tuple[str, pd.DataFrame]], top_k: int = 5,
                 cmr_threshold: float = CMR_LIKE_THRESHOLD, induction_threshold: float = 0.4
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Head types of several training runs side by side, at each run's last swept checkpoint.

    Args:
        runs: ``{run name: (group, tidy rows of :func:`tidy`, checkpoints concatenated)}``; the group is the arm a run belongs to (e.g. its
            curriculum variant), the unit the second table averages over.

    Returns:
        (per run: ``run, group, step``, ``max_induction``, ``n_induction_heads`` (induction ≥
        ``induction_threshold``), ``top1_share`` and ``top<k>_share`` of the positive induction total, and
        ``effective_heads`` (:func:`concentration`), ``cmr_like_share`` over all heads and ``cmr_like_share_L<l>``
        per layer (:func:`cmr_share`), ``crp_range_cmr_like`` (mean ``crp_range`` of the CMR-like heads: near 0
        when only flat profiles fit) and ``crp_range_all``; per group and measure: ``n_runs, mean, min, max`` over
        its runs.)

    Raises:
        InductionLabError: a run's rows lack the induction score or the CMR fit."""
    rows = []
    for name, (group, tidy) in runs.items():
        have = set(tidy["score"])
        if not {"induction", "cmr_distance", "crp_range"} <= have:
            raise InductionLabError(f"run {name}: the head-type rows lack the induction score or the CMR fit "
                                    f"(have {sorted(have)}); sweep it with `inductionlab telemetry --head-types`")
        last = int(tidy["step"].max())
        t = tidy[tidy["step"] == last]
        ind = t[t["score"] == "induction"]["value"].to_numpy(float)
        c1, ck = concentration(t, 1).iloc[0], concentration(t, top_k).iloc[0]
        share = cmr_share(t, cmr_threshold)
        dist = t[t["score"] == "cmr_distance"].set_index(["layer", "head"])["value"]
        rng = t[t["score"] == "crp_range"].set_index(["layer", "head"])["value"].reindex(dist.index)
        like = dist < cmr_threshold
        row = {"run": name, "group": group, "step": last, "max_induction": float(np.nanmax(ind)),
               "n_induction_heads": int((ind >= induction_threshold).sum()), "top1_share": float(c1["top_k_share"]),
               f"top{top_k}_share": float(ck["top_k_share"]), "effective_heads": float(c1["effective_heads"]),
               "cmr_like_share": float(like.mean()),
               **{f"cmr_like_share_L{int(r.layer)}": float(r.share) for r in share.itertuples()},
               "crp_range_cmr_like": float(rng[like].mean()) if like.any() else math.nan,
               "crp_range_all": float(rng.mean())}
        rows.append(row)
    per_run = pd.DataFrame(rows)
    measures = [c for c in per_run.columns if c not in ("run", "group", "step")]
    long = per_run.melt(id_vars=["run", "group"], value_vars=measures, var_name="measure")
    by_group = (long.groupby(["group", "measure"], sort=False)["value"]
                .agg(n_runs="count", mean="mean", min="min", max="max").reset_index())
    return per_run, by_group


__all__ = ["HeadTypeParams", "ROUTE_NAMES", "CMR_NAMES", "route_prompts", "measure_checkpoint", "checkpoint_scores",
           "tidy", "transition_table", "cmr_share", "concentration", "compare_runs"]
