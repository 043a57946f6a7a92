"""The head-types study's claims Y1–Y4 (SPEC §10; Yin & Steinhardt 2025), with their decision rules, fixed in
code before the first real run: :func:`decide` (the drops of every measure under every condition against intact,
paired over the same trials, are :func:`~inductionlab.measures.stats.drop_table` of :func:`per_trial`).

Claims:

* **Y1** — FV-exclusive ablation lowers 10-shot HITS@1 more than induction-exclusive ablation at matched f;
* **Y2** — induction-exclusive ablation lowers the token-loss ICL score more than FV-exclusive ablation;
* **Y3** — induction-exclusive ablation lowers the lag probe's temporal factor more than FV-exclusive ablation;
* **Y4** — the top-5% induction and FV sets overlap more than chance.

Rules (this project's; the paper states the claims without tests). "Exclusive" = the ranking's top heads after
removing the other ranking's top 2%. For Y1–Y3 the per-trial difference of the two exclusive conditions at
each fraction f (same prompts / windows / lists in every condition, so the difference is paired) is averaged
over the fractions, per trial, and the claim is **reproduced** when the 95% CI of that mean over trials lies
above 0 in the claim's direction, **not reproduced** otherwise; **not testable** when the intact model has
nothing to lower: 10-shot HITS@1 below 0.05 (Y1), an intact log-slope ICL benefit D whose CI reaches 0 (Y2), a
temporal factor whose CI reaches 0.5, chance (Y3). Y2 decides on D (issue 34: every token between early and late,
:mod:`inductionlab.measures.token_loss`), gate and claim alike; the single-token benefit is reported beside it.
A verdict left undecided (not testable, or a CI that straddles 0) carries a power record: the n that would
decide it at the measured σ (:func:`~inductionlab.measures.power.power_record`), with its time where the cost per
trial-condition was measured (Y2). Y4 is reproduced when the hypergeometric tail
P(X ≥ overlap) < 0.05 (FV ranked by signed AIE), not testable when the top-5% sets hold a single head.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...measures.power import power_record
from ...measures.serial_position import lag_rank
from ...measures.stats import ci
from ...protocols.lag_probe import LagProbeResult
from ..report import fmt_ci
from ..run import Verdict

#: measure -> (description, higher is better)
MEASURES = {"hits1_mean": "10-shot HITS@1, heads' last-position output ← mean",
            "hits1_zero": "10-shot HITS@1, heads' last-position output ← 0",
            "icl_benefit": "ICL benefit, single token: loss(early) − loss(late) (nats)",
            "icl_slope": "ICL benefit D, log-slope: nats per tenfold more context (early..late)",
            "icl_band": "ICL benefit B, log-symmetric bands around early and late (nats)",
            "lag_plus1": "lag probe p(lag +1)",
            "temporal_factor": "lag probe temporal factor"}

CLAIMS = {
    "Y1": "FV-exclusive ablation lowers 10-shot HITS@1 more than induction-exclusive ablation at matched f",
    "Y2": "induction-exclusive ablation lowers the token-loss ICL score more than FV-exclusive ablation",
    "Y3": "induction-exclusive ablation lowers the lag probe's temporal factor more than FV-exclusive ablation",
    "Y4": "the top-5% induction and FV head sets overlap more than chance",
}


def per_trial(name: str, probes: pd.DataFrame, icl: pd.DataFrame, lag: LagProbeResult) -> dict[str, np.ndarray]:
    """Every measure's per-trial values ``[n]`` under condition ``name`` (trials in a fixed order)."""
    out = {}
    for method in probes["method"].unique():
        p = probes[(probes.condition == name) & (probes.method == method)]
        out[f"hits1_{method}"] = p.sort_values(["task", "index"]).hits1.to_numpy(np.float64)
    rows = icl[icl.condition == name].sort_values("sequence")
    out["icl_benefit"] = rows.benefit.to_numpy(np.float64)
    for col in ("slope", "band"):
        if col in rows:
            out[f"icl_{col}"] = rows[col].to_numpy(np.float64)
    out["lag_plus1"] = lag.probs[name][:, lag.config.cue_position].astype(np.float64)
    out["temporal_factor"] = np.nanmean(lag_rank(lag.cue_probs[name], lag.cue_positions), axis=1) \
        if lag.cue_positions is not None else np.full(len(out["lag_plus1"]), np.nan)
    return out


def _exclusive_difference(conditions, probes, icl, lag, measure: str, sign: int, fractions) -> tuple[np.ndarray, dict]:
    """Per trial, the mean over fractions of ``sign · (value under induction-exclusive − value under
    FV-exclusive)``, and per fraction the mean with its CI."""
    by_k = {c.k: c for c in conditions if c.kind == "induction-excl-fv"}
    fv_k = {c.k: c for c in conditions if c.kind == "fv-excl-induction"}
    diffs, per = [], {}
    for k in sorted(set(by_k) & set(fv_k)):
        a = per_trial(by_k[k].name, probes, icl, lag)[measure]
        b = per_trial(fv_k[k].name, probes, icl, lag)[measure]
        d = sign * (a - b)
        diffs.append(d)
        m, lo, hi = ci(d)
        f = fractions.get(k) if fractions else None
        per[f"{f:g}" if f is not None else str(k)] = {"heads": k, "difference": m, "ci_low": lo, "ci_high": hi}
    return np.mean(diffs, axis=0), per


UNITS = {"hits1_mean": "prompts", "icl_benefit": "windows", "icl_slope": "windows", "temporal_factor": "lists"}


def _paired_claim(claim: str, conditions, probes, icl, lag, measure: str, sign: int, fractions, floor,
                  cost: dict | None = None) -> Verdict:
    intact = per_trial("intact", probes, icl, lag)[measure]
    im, ilo, ihi = ci(intact)
    d, per = _exclusive_difference(conditions, probes, icl, lag, measure, sign, fractions)
    m, lo, hi = ci(d)
    cost = {k: v for k, v in (cost or {}).items() if k in ("seconds_per_trial_condition", "conditions")}
    unit = UNITS.get(measure, "trials")
    who = "induction-exclusive − FV-exclusive" if sign > 0 else "FV-exclusive − induction-exclusive"
    rule = (f"per trial, the mean over fractions of ({who}) {MEASURES[measure]}, i.e. how much more the "
            f"{'FV' if sign > 0 else 'induction'}-exclusive ablation lowers it; reproduced iff its 95% CI over trials "
            f"lies above 0")
    evidence = f"difference {fmt_ci(m, lo, hi)} over {len(d)} trials; intact {fmt_ci(im, ilo, ihi)}"
    testable, why = floor(im, ilo, ihi)
    if not testable:
        return Verdict(claim, "not testable", rule, evidence, CLAIMS[claim], caveat=why, per_k=per,
                       power=power_record(intact, unit=unit, what="the intact gate", **cost))
    straddles = lo <= 0 <= hi
    return Verdict(claim, "reproduced" if lo > 0 else "not reproduced", rule, evidence, CLAIMS[claim], per_k=per,
                   power=power_record(d, unit=unit, what="the paired difference", **cost) if straddles else None)


def y2_measure(icl: pd.DataFrame) -> str:
    """The measure Y2 decides on: ``icl_slope`` (D) where the table has it, else the single-token ``icl_benefit``."""
    return "icl_slope" if "slope" in icl else "icl_benefit"


def decide(drops: pd.DataFrame, probes: pd.DataFrame, icl: pd.DataFrame, lag: LagProbeResult, conditions,
           overlap: pd.DataFrame, counts: dict[int, float], *, icl_cost: dict | None = None,
           icl_sensitivity: dict[str, pd.DataFrame] | None = None) -> list[Verdict]:
    """The claims Y1–Y4 (module docstring), each a :class:`~inductionlab.studies.run.Verdict` with its numbers
    (``counts``: head count -> the fraction that gave it, for the per-fraction numbers; ``icl_cost``: the
    token-loss phase's ``seconds_per_trial_condition`` and ``conditions``, for Y2's power line;
    ``icl_sensitivity``: sensitivity method -> the per-window table under it; Y2's difference under each goes to
    the verdict's caveat, in the order given)."""
    y2 = y2_measure(icl)
    v2 = _paired_claim("Y2", conditions, probes, icl, lag, y2, -1, counts,
                       lambda m, lo, hi: (lo > 0, "the intact ICL benefit D's CI reaches 0: no in-context gain to lower"),
                       icl_cost)
    arms = []
    for method, table in (icl_sensitivity or {}).items():
        conds = [c for c in conditions if c.name in set(table.condition)]
        d, _ = _exclusive_difference(conds, probes, table, lag, y2_measure(table), -1, counts)
        arms.append(f"{method} {fmt_ci(*ci(d))}")
    if arms:
        note = "sensitivity arms, the same difference under another ablation: " + "; ".join(arms)
        v2 = v2 | {"caveat": f"{v2.caveat}; {note}" if v2.caveat else note}
    out = [
        _paired_claim("Y1", conditions, probes, icl, lag, "hits1_mean", +1, counts,
                      lambda m, lo, hi: (m >= 0.05, f"intact 10-shot HITS@1 {m:.3f} < 0.05: nothing to lower")),
        v2,
        _paired_claim("Y3", conditions, probes, icl, lag, "temporal_factor", -1, counts,
                      lambda m, lo, hi: (lo > 0.5, "the intact temporal factor's CI reaches 0.5 (chance)")),
    ]
    row = overlap[(overlap.a == "induction") & (overlap.b == "fv")].iloc[0]
    rule = "hypergeometric tail P(X >= overlap) of the top-5% sets < 0.05 (FV by signed AIE)"
    evidence = (f"{int(row.overlap)} of {int(row.n_top)} shared vs {row.expected:.2f} expected, P = {row.p_value:.3g}; "
                f"Spearman {row.spearman:+.2f}")
    if int(row.n_top) < 2:
        out.append(Verdict("Y4", "not testable", rule, evidence, CLAIMS["Y4"], caveat="top-5% sets of one head"))
    else:
        out.append(Verdict("Y4", "reproduced" if row.p_value < 0.05 else "not reproduced", rule, evidence, CLAIMS["Y4"]))
    return out


__all__ = ["MEASURES", "CLAIMS", "per_trial", "decide", "y2_measure"]
