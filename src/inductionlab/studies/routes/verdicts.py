"""The routes study's claims R1–R3, with their decision rules, fixed in code before the first real run:
:func:`decide` (the drops of every measure under every condition against intact, paired over the same trials, are
:func:`~inductionlab.measures.stats.drop_table`).

Claims:

* **R1** (Feucht et al. 2025, §5: token heads copy verbatim) — ablating the top-k token-induction heads lowers the
  copying of nonsense words (P(first token of the 10th item) in the copy probe's ``nonsense`` lists) more than
  ablating k random heads;
* **R2** (this project's: the lag probe predicts the next *word*) — ablating the top-k concept-induction heads
  lowers the lag probe's word-level p(+1) (all cues pooled) more than ablating the top-k token-induction heads
  after removing the top-k concept heads from that ranking (two disjoint sets of k heads);
* **R2w** (issue 34: R2's open test) — R2 on the lag probe with words of several tokens (``--r2-word-tokens``,
  e.g. 2–4; concept heads copy multi-token words as units, Feucht et al. 2025, so a single-token list leaves them
  nothing to do): the same comparison on the **whole next word's** p(+1) (the product of its tokens' teacher-forced
  probabilities, all cues pooled); its first token's p(+1) is reported beside it. Run only when asked for;
* **R3** (Ji-An et al. 2024: CMR-like heads carry in-context learning) — ablating the top-k CMR-like heads lowers
  the token-loss ICL benefit (loss at the early token − loss at the late token) more than ablating k random heads.

Rule (one for all of them). Every condition sees the same trials (copy-probe lists, lag-probe lists, text windows),
so the comparison is paired: per trial, ``value(B) − value(A)`` where A is the claim's ablation and B its
comparison (the random draws of k pooled per trial as the mean over draws) — how much more A lowers the measure
than B does. Averaged per trial over the study's head counts k, then mean and 95% CI over trials (normal
approximation, :func:`~inductionlab.measures.stats.ci`). **reproduced** iff the CI lies above 0; **not reproduced**
otherwise. **not testable** when the intact model has nothing to lower — R1: intact mean P(nonsense item) < 0.05;
R2: the intact lag +1 log-enrichment's CI reaches 0 (no contiguity above the word prior); R2w: the same on the
multi-token list's first tokens (the word prior needs every far lag, which only the first-token reading has); R3:
the intact ICL benefit's CI reaches 0 — and, with the caveat "not tested", when a ranking the claim needs is not among
``--rankings``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...measures.power import power_record
from ...measures.stats import ci, draws_by_k, paired_by_k
from ...protocols.word_copy import KINDS
from ..report import fmt_ci
from ..run import Verdict

_COPY = {"p_first": "P(10th item's first token)", "top1": "top-1 of the 10th item's first token",
         "verbatim": "verbatim copy of the 10th item", "paraphrase": "paraphrase of the 10th item"}

#: measure -> description (per-trial values; higher = more of the behaviour)
MEASURES = {
    "lag_plus1": "lag probe p(+1), all cues pooled",
    "lag_enrichment": "lag probe log-enrichment at +1 (nats), all cues pooled",
    "temporal_factor": "lag probe temporal factor",
    "recall_accuracy": "serial recall, teacher-forced accuracy",
    **{f"copy_{m}_{k}": f"copy probe, {k} items: {text}" for k in KINDS for m, text in _COPY.items()},
    "icl_benefit": "ICL benefit, single token: loss(early) − loss(late) (nats)",
    "icl_slope": "ICL benefit D, log-slope: nats per tenfold more context (early..late)",
    "icl_band": "ICL benefit B, log-symmetric bands around early and late (nats)",
    "lag_word_plus1": "multi-token lag probe: whole next word's p(+1), all cues pooled",
    "lag_word_logp_plus1": "multi-token lag probe: whole next word's log p(+1) (nats), all cues pooled",
    "lag_first_plus1": "multi-token lag probe: next word's first-token p(+1), all cues pooled",
    "lag_first_enrichment": "multi-token lag probe: first-token log-enrichment at +1 (nats), all cues pooled",
}

CLAIMS = {
    "R1": "ablating token-induction heads lowers nonsense-word copying more than ablating as many random heads",
    "R2": "ablating concept-induction heads lowers the lag probe's word-level p(+1) more than ablating as many "
          "token-induction heads excluding the concept heads",
    "R2w": "ablating concept-induction heads lowers the lag probe's whole-word p(+1) on multi-token words more than "
           "ablating as many token-induction heads excluding the concept heads",
    "R3": "ablating CMR-like heads lowers the token-loss ICL benefit more than ablating as many random heads",
}


def exclusive_kind(ranking: str, excluded: str) -> str:
    """The condition kind of ``ranking``'s top k after removing ``excluded``'s top k (``induction-excl-fv``)."""
    return f"{ranking}-excl-{excluded}"


def _pairs(conditions, get, claim: str, names: dict) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``[(k, A values, B values)]``: the claim's ablation A and its comparison B at each k."""
    if claim in ("R2", "R2w"):
        a = draws_by_k(conditions, names["concept"])
        b = draws_by_k(conditions, exclusive_kind(names["token"], names["concept"]))
        return [(k, get(a[k][0]), get(b[k][0])) for k in sorted(set(a) & set(b))]
    kind = names["token"] if claim == "R1" else names["cmr"]
    return paired_by_k(conditions, get, kind=kind)


def _floor(claim: str, im: float, ilo: float) -> tuple[bool, str]:
    if claim == "R1":
        return im >= 0.05, f"intact P(nonsense item) {im:.3f} < 0.05: nothing to lower"
    if claim == "R2":
        return ilo > 0, "the intact lag +1 log-enrichment's CI reaches 0: no contiguity above the word prior"
    if claim == "R2w":
        return ilo > 0, ("the intact first-token lag +1 log-enrichment of the multi-token list reaches 0: no "
                         "contiguity above the word prior")
    return ilo > 0, "the intact ICL benefit D's CI reaches 0: no in-context gain to lower"


CLAIM_MEASURE = {"R1": "copy_p_first_nonsense", "R2": "lag_plus1", "R2w": "lag_word_plus1", "R3": "icl_slope"}
FLOOR_MEASURE = {"R1": "copy_p_first_nonsense", "R2": "lag_enrichment", "R2w": "lag_first_enrichment",
                 "R3": "icl_slope"}
UNITS = {"R1": "lists", "R2": "lists", "R2w": "lists", "R3": "windows"}


def needed_rankings(claim: str, names: dict) -> list[str]:
    """The rankings a claim compares (``names``: role -> ranking: ``token``, ``concept``, ``cmr``)."""
    return {"R1": [names["token"]], "R2": [names["concept"], names["token"]], "R2w": [names["concept"], names["token"]],
            "R3": [names["cmr"]]}[claim]


def decide(conditions, values: Callable[[str], dict[str, np.ndarray]], rankings, names: dict, *,
           icl_cost: dict | None = None) -> list[Verdict]:
    """The claims R1–R3 (module docstring), each a :class:`~inductionlab.studies.run.Verdict` with its numbers
    (``per_k``: the difference at each k). ``rankings``: the run's; ``names``: role -> ranking; ``icl_cost``: the
    token-loss phase's ``seconds_per_trial_condition`` and ``conditions`` (R3's power line). An undecided verdict
    (not testable, or a CI that straddles 0) carries a power record
    (:func:`~inductionlab.measures.power.power_record`)."""
    out = []
    measured = set(values("intact"))
    for claim, measure in CLAIM_MEASURE.items():
        if claim == "R2w" and measure not in measured:
            continue
        a_name = {"R1": f"top-k {names['token']}", "R2": f"top-k {names['concept']}",
                  "R2w": f"top-k {names['concept']}", "R3": f"top-k {names['cmr']}"}[claim]
        b_name = (f"top-k {names['token']} excluding top-k {names['concept']}" if claim in ("R2", "R2w")
                  else "random-k (pooled)")
        rule = (f"per trial, ({b_name}) − ({a_name}) {MEASURES[measure]}, averaged over k; reproduced iff its 95% CI "
                "over trials lies above 0")
        absent = [r for r in needed_rankings(claim, names) if r not in rankings]
        if absent:
            out.append(Verdict(claim, "not testable", rule, "—", CLAIMS[claim],
                               caveat=f"not tested: ranking {', '.join(absent)} not among --rankings "
                                      f"({', '.join(rankings)})"))
            continue
        get = lambda n, m=measure: values(n)[m]   # noqa: E731
        pairs = _pairs(conditions, get, claim, names)
        per, diffs = {}, []
        for k, a, b in pairs:
            d = b - a
            diffs.append(d)
            m, lo, hi = ci(d)
            per[str(k)] = {"heads": k, "difference": m, "ci_low": lo, "ci_high": hi}
        floor_v = values("intact")[FLOOR_MEASURE[claim]]
        im, ilo, ihi = ci(floor_v)
        if not diffs:
            out.append(Verdict(claim, "not testable", rule, "—", CLAIMS[claim], caveat="no condition pair ran"))
            continue
        d = np.mean(diffs, axis=0)
        m, lo, hi = ci(d)
        evidence = (f"difference {fmt_ci(m, lo, hi, 4)} over {len(d)} trials; intact {MEASURES[FLOOR_MEASURE[claim]]} "
                    f"{fmt_ci(im, ilo, ihi, 4)}")
        testable, why = _floor(claim, im, ilo)
        cost = {k: v for k, v in (icl_cost or {}).items() if k in ("seconds_per_trial_condition", "conditions")} \
            if claim == "R3" else {}
        if not testable:
            out.append(Verdict(claim, "not testable", rule, evidence, CLAIMS[claim], caveat=why, per_k=per,
                               power=power_record(floor_v, unit=UNITS[claim], what="the intact gate", **cost)))
        else:
            out.append(Verdict(claim, "reproduced" if lo > 0 else "not reproduced", rule, evidence, CLAIMS[claim],
                               per_k=per, power=power_record(d, unit=UNITS[claim], what="the paired difference", **cost)
                               if lo <= 0 <= hi else None))
    return out


__all__ = ["MEASURES", "CLAIMS", "CLAIM_MEASURE", "exclusive_kind", "needed_rankings", "decide"]
