"""The temporal-dependencies study's claims A–D: :func:`headline_table` (the paired per-k numbers the
claims are decided on, also the report's headline), :data:`MEASURES` and :func:`verdicts` with the
decision rules, each claim a :class:`~inductionlab.studies.run.Verdict`.

Imports the finished lag-probe and serial-recall results, the CIs of :mod:`inductionlab.measures.stats`
and the CI formatting of :mod:`inductionlab.studies.report`; no model and no run directory.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...measures.power import power_from_ci
from ...measures.stats import ci, ranked_kind
from ...protocols.lag_probe import LagProbeResult
from ...protocols.serial_recall import SerialRecallResult
from ..report import fmt_ci, row_ci
from ..run import Verdict


def _per_trial(lag: LagProbeResult, recall: SerialRecallResult, kind: str, k: int) -> dict[str, np.ndarray]:
    """Per-trial measures of one arm (intact, the ranked arm's k condition such as induction-k, or random-k
    pooled over draws)."""
    if kind == "intact":
        names = ["intact"]
    else:
        names = [c.name for c in lag.conditions if c.kind == kind and c.k == k]
    col = lag.config.cue_position
    out = {"lag_plus1": np.mean([lag.probs[n][:, col] for n in names], axis=0).astype(np.float64)}
    out.update({f"recall_{m}": v for m, v in recall.pooled_measures(names).items()})
    return out


MEASURES = {"lag_plus1": "lag probe p(lag +1)", "recall_accuracy": "serial recall accuracy (teacher-forced)",
            "recall_lag_plus1": "serial recall p(lag +1) (renormalised)", "recall_exact_match": "serial recall exact match"}


def headline_table(lag: LagProbeResult, recall: SerialRecallResult, ks: list[int]) -> pd.DataFrame:
    """One row per (measure, k): intact / induction-k / random-k (pooled draws) means with 95% CIs,
    and paired differences induction − intact, random − intact, random − induction. ``induction`` in the
    column names is the ranked arm's kind (:func:`~inductionlab.measures.stats.ranked_kind`:
    ``previous_token``, ``induction-excl-fv``, ... under another ranking)."""
    rows = []
    a = ranked_kind(lag.conditions)
    intact = _per_trial(lag, recall, "intact", 0)
    for k in ks:
        ind, rnd = _per_trial(lag, recall, a, k), _per_trial(lag, recall, "random", k)
        for m in MEASURES:
            if m not in intact:
                continue
            row = {"measure": m, "k": k}
            for arm, v in (("intact", intact[m]), (a, ind[m]), ("random", rnd[m]),
                           (f"{a}_minus_intact", ind[m] - intact[m]), ("random_minus_intact", rnd[m] - intact[m]),
                           (f"random_minus_{a}", rnd[m] - ind[m])):
                row[arm], row[arm + "_ci_low"], row[arm + "_ci_high"] = ci(v)
            rows.append(row)
    return pd.DataFrame(rows)


def decide(lag: LagProbeResult, recall: SerialRecallResult, head: pd.DataFrame, ks: list[int]) -> list[Verdict]:
    """The four claims A–D, each a :class:`~inductionlab.studies.run.Verdict` (status reproduced or
    not reproduced; B–D with ``per_k``).

    Decision rules (project decisions):

    (A) the intact mean curve's highest lag (lag 0 excluded) is +1 and its 95% CI lies above the
        CI of the next highest lag;
    (B) at k: the paired difference p_random − p_induction has a CI above 0 and the induction drop
        (intact − induction) is positive and at least twice the random drop; reproduced if this
        holds at half of the ks or more and the opposite (random − induction CI below 0) holds at
        none. (Not "at the largest k": at a large fraction of a small model's heads both arms can
        sit at the floor, which is no evidence either way; every k is listed in ``per_k``.)
    (C) at k: random ablation lowers p(+1) by less than 10% of the intact value, or the paired
        difference random − intact is not significantly negative (CI reaches 0); reproduced if it
        holds at every k;
    (D) at k: the paired difference of teacher-forced serial-recall accuracy random − induction
        has a CI above 0; reproduced like (B) (majority of ks, contradicted at none).

    The ranked arm is the run's (:func:`~inductionlab.measures.stats.ranked_kind`): ``induction`` by
    default; under another ranking its label replaces "induction" in the claims' text and ``per_k`` keys.
    """
    arm = ranked_kind(lag.conditions)
    head = head.rename(columns={c: c.replace(arm, "induction") for c in head.columns if arm in c})
    lp = {int(r.k): r for r in head[head.measure == "lag_plus1"].itertuples()}
    ra = {int(r.k): r for r in head[head.measure == "recall_accuracy"].itertuples()}
    out = [_claim_a(lag), *_claims_b_c(lp, ks), _claim_d(ra, ks)]
    n_lag = len(lag.probs["intact"])
    n_rec = len(next(iter(recall.data["intact"].values()))) if recall.data.get("intact") else 0
    out = [_with_power(v, n_lag if v.claim == "B" else n_rec, "lists" if v.claim == "B" else "recall trials", ks)
           if v.claim in ("B", "D") else v for v in out]
    return out if arm == "induction" else [_relabel(v, arm) for v in out]


def _with_power(v: Verdict, n: int, unit: str, ks: list[int]) -> Verdict:
    """A B or D verdict not reproduced whose random − induction CI at the largest k straddles 0, with the n that would
    decide it there (σ from that CI: :func:`~inductionlab.measures.power.power_from_ci`; no cost measured)."""
    m, lo, hi = v.per_k[ks[-1]]["random_minus_induction"]
    if v.status == "reproduced" or not lo <= 0 <= hi or n < 2:
        return v
    return v | {"power": power_from_ci(m, lo, hi, n, unit=unit, what=f"random − induction at k = {ks[-1]}")}


def _relabel(v: Verdict, arm: str) -> Verdict:
    """A claim decided on another ranking's arm, with that ranking's label in place of "induction"."""
    swap = lambda t: t.replace("induction", arm)  # noqa: E731
    return Verdict(v.claim, text=swap(v.text), status=v.status, rule=swap(v.rule), evidence=swap(v.evidence),
                   per_k=None if v.per_k is None else {k: {swap(n): x for n, x in d.items()} for k, d in v.per_k.items()},
                   power=None if v.power is None else {**v.power, "what": swap(str(v.power.get("what")))})


def _majority(per_k: dict, ks: list[int]) -> bool:
    """Holds at half of the ks or more, and random − induction is significantly negative at none."""
    hold = [per_k[k]["holds"] for k in ks]
    against = [per_k[k]["random_minus_induction"][2] < 0 for k in ks]
    return bool(sum(hold) * 2 >= len(hold) and not any(against))


def _triple(r, name: str) -> list[float]:
    return [getattr(r, name), getattr(r, f"{name}_ci_low"), getattr(r, f"{name}_ci_high")]


def _status(reproduced: bool) -> str:
    return "reproduced" if reproduced else "not reproduced"


def _claim_a(lag: LagProbeResult) -> Verdict:
    s = lag.summary()
    cur = s[(s.condition == "intact") & (s.lag != 0)].sort_values("mean", ascending=False)
    best, second = cur.iloc[0], cur.iloc[1]
    p1 = cur[cur.lag == 1].iloc[0]
    runner = second if best.lag == 1 else best
    return Verdict("A", text="the intact lag curve peaks at lag +1",
                   status=_status(best.lag == 1 and p1.ci_low > second.ci_high),
                   rule="highest lag (0 excluded) is +1 and its CI lies above the next highest lag's CI",
                   evidence=f"p(+1) = {fmt_ci(p1['mean'], p1.ci_low, p1.ci_high)}; highest other lag "
                            f"{int(runner.lag):+d}: {fmt_ci(runner['mean'], runner.ci_low, runner.ci_high)}")


def _per_k_evidence(rows: dict, ks: list[int], per: dict, intact: str) -> str:
    """``<intact> <row at the largest k>; k=…: induction …, random …; held at n/len(ks) ks``."""
    return (f"{intact} {row_ci(rows[ks[-1]], 'intact')}; "
            + "; ".join(f"k={k}: induction {row_ci(rows[k], 'induction')}, random {row_ci(rows[k], 'random')}"
                        for k in ks)
            + f"; held at {sum(v['holds'] for v in per.values())}/{len(ks)} ks")


def _claims_b_c(lp: dict, ks: list[int]) -> list[Verdict]:
    per_b, per_c = {}, {}
    for k in ks:
        r = lp[k]
        d_ind, d_rnd = r.intact - r.induction, r.intact - r.random
        per_b[k] = {"holds": bool(r.random_minus_induction_ci_low > 0 and d_ind > 0 and d_ind >= 2 * max(d_rnd, 0.0)),
                    "induction_drop": d_ind, "random_drop": d_rnd,
                    "random_minus_induction": _triple(r, "random_minus_induction")}
        per_c[k] = {"holds": bool(r.random >= 0.9 * r.intact or r.random_minus_intact_ci_high >= 0),
                    "random": _triple(r, "random"), "random_minus_intact": _triple(r, "random_minus_intact")}
    up = [k for k in ks if lp[k].random_minus_intact_ci_low > 0]
    b = Verdict("B", text="induction-head ablation lowers p(lag +1) far more than random ablation",
                status=_status(_majority(per_b, ks)), per_k=per_b,
                rule="random − induction CI > 0 and induction drop ≥ 2 × random drop at ≥ half the ks, "
                     "significantly reversed at none",
                evidence=_per_k_evidence(lp, ks, per_b, "intact"))
    c = Verdict("C", text="random ablation leaves p(lag +1) intact or raises it",
                status=_status(all(v["holds"] for v in per_c.values())), per_k=per_c,
                rule="at every k: random ≥ 0.9 × intact, or the random − intact CI reaches 0",
                evidence="; ".join(f"k={k}: random − intact {fmt_ci(*v['random_minus_intact'])}"
                                   for k, v in per_c.items())
                         + (f" (significantly raised at k = {', '.join(map(str, up))})" if up else ""))
    return [b, c]


def _claim_d(ra: dict, ks: list[int]) -> Verdict:
    per_d = {k: {"holds": bool(ra[k].random_minus_induction_ci_low > 0), "intact": ra[k].intact,
                 "induction": ra[k].induction, "random": ra[k].random,
                 "random_minus_induction": _triple(ra[k], "random_minus_induction")} for k in ks}
    return Verdict("D", text="serial recall suffers more under induction ablation than under random ablation",
                   status=_status(_majority(per_d, ks)), per_k=per_d,
                   rule="teacher-forced accuracy random − induction CI > 0 at ≥ half the ks, significantly reversed "
                        "at none",
                   evidence=_per_k_evidence(ra, ks, per_d, "accuracy intact"))
