"""Study bi-induct, its claims: the decision rules (:data:`RULES`, :data:`CLAIMS` and their
thresholds, written before any data; issue 10), the seed CI (:func:`seed_ci`) and one verdict per claim
(:func:`verdict_a` ... :func:`verdict_e`, :func:`verdicts`): pure functions over the runs table of
:mod:`inductionlab.studies.bi_induct.tables`. Imports :class:`~inductionlab.studies.run.Verdict`."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from ...measures.power import power_record
from ..run import Verdict
from .config import BI_INDUCT, VARIANTS

# ---- decision rules (written before any data; issue 10) ----------------------------------------

MIN_SEEDS_FOR_CI = 2          # a 95% CI over seeds needs at least 2 seeds
INDUCTION_EFFECT = 0.10       # A: final max induction score (attention prob.) higher by >= this ...
ANTI_NEAR_ZERO = 0.20         # B: peak max anti-induction score stays below this (uniform at T=16 ~0.05)
PROBE_FLOOR = 0.05            # C: natural-only's intact accuracy on the deciding probe must exceed this
PROBE_MARGIN = 0.02           # C: Bi-Induct may beat natural-only by at most this (accuracy) to call it neutral
ICL_FLOOR = 0.05              # D: intact ICL benefit (nats) of natural-only must exceed this to be testable
# Issue 19, written before the cpu-natural data: a relative change is reported only where every compared
# run's intact value is above these (below them it divides by ~0); the verdict itself uses absolute changes.
RELATIVE_FLOOR = {"icl_benefit": 0.10, "recall_accuracy": 0.20, "copy_accuracy": 0.20}
D_MEASURE = "icl_benefit"     # D decides on the absolute induction − random contrast of this (nats)
C_MEASURE = "recall_accuracy" # C decides on this intact probe (associative recall in the model's own tokens)

RULES: dict[str, str] = {
    "A": (f"Testable iff every compared variant has >= {MIN_SEEDS_FOR_CI} seeds and at least one run of the study "
          f"reached the emergence threshold (a head formed at this scale). Reproduced iff, over seeds paired by "
          f"seed index, the final max induction score of the Bi-Induct variant minus natural-only has mean >= "
          f"{INDUCTION_EFFECT} and 95% CI low > 0, OR the variant emerged in every seed and earlier than "
          f"natural-only in every seed (never = infinitely late). Else not reproduced."),
    "B": (f"Testable iff the anti and balanced variants have >= {MIN_SEEDS_FOR_CI} seeds. Reproduced iff for both, "
          f"the peak (over checkpoints) max anti-induction score has 95% CI high < {ANTI_NEAR_ZERO}. "
          f"Not reproduced iff either mean >= {ANTI_NEAR_ZERO}; otherwise (CI straddles) not testable."),
    "C": (f"Benchmarks via lm-evaluation-harness are not run (datasets offline); probes only, in the model's own "
          f"tokens. Deciding probe: {C_MEASURE} (associative recall: top-1 accuracy of a value after its repeated "
          f"key). Testable iff >= {MIN_SEEDS_FOR_CI} seeds and natural-only's intact accuracy > {PROBE_FLOOR} in "
          f"every seed (off the floor; else the probe is uninformative). Reproduced iff for every Bi-Induct variant "
          f"the paired (by seed) difference variant − natural-only is not (mean > +{PROBE_MARGIN} with 95% CI low > "
          f"0) (no variant clearly better than natural-only). Else not reproduced. The function-style probes "
          f"(HITS@1) and copy accuracy are reported beside it."),
    "D": (f"Testable iff >= {MIN_SEEDS_FOR_CI} seeds and natural-only's intact ICL benefit (loss early − late, "
          f"held-out text) > {ICL_FLOOR} nats in every seed. Measure per run: the ABSOLUTE change (nats) of the "
          f"{D_MEASURE} under top-2%-per-layer induction-head ablation minus under matched random heads (per "
          f"window, random draws pooled). Reproduced iff the paired (by seed) difference natural-only − induction "
          f"variant has 95% CI high < 0 (natural-only loses more nats). Else not reproduced. Relative changes are "
          f"reported only where every compared run's intact value exceeds RELATIVE_FLOOR ({RELATIVE_FLOOR}); the "
          f"same absolute contrasts of recall and copy accuracy (points) are reported beside it. Paper (relative): "
          f"−22.6% vs −4.9% at 0.13B, −19.5% vs −14.5% at 1B."),
    "E": (f"Testable iff >= {MIN_SEEDS_FOR_CI} seeds. Measure: log held-out perplexity of the induction variant "
          f"minus natural-only, paired by seed. Reproduced iff 95% CI low > 0 (a penalty); else not reproduced."),
    "CI": "95% CIs over seeds are Student-t (n − 1 degrees of freedom); over units (windows, sequences) normal.",
}

CLAIMS: dict[str, str] = {
    "A": "Bi-Induct raises induction activity / speeds emergence",
    "B": "anti-induction stays near zero even with backward (anti) data",
    "C": "benchmarks and probes neutral or better for natural-only",
    "D": "natural-only loses more under top-2% induction-head ablation",
    "E": "Bi-Induct pays a perplexity penalty",
}



# ---- verdicts (pure functions over the runs table) -------------------------------------------

def _by_seed(t: pd.DataFrame, variant: str, col: str) -> pd.Series:
    g = t[t["variant"] == variant].set_index("seed")[col] if col in t else pd.Series(dtype=float)
    return g.astype(float)


def seed_ci(values) -> tuple[float, float, float]:
    """``(mean, ci_low, ci_high)``: 95% Student-t CI over seeds (n − 1 degrees of freedom; NaN
    bounds for one seed). A study has 2–5 seeds, where the normal approximation is too narrow
    (t quantile 4.30 at n = 3 against 1.96)."""
    from scipy.stats import t as student_t

    x = np.asarray(values, np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(student_t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def _paired(t: pd.DataFrame, a: str, b: str, col: str) -> tuple[np.ndarray, tuple[float, float, float] | None]:
    """Per-seed ``a − b`` of ``col`` over seeds both have, and its (mean, ci_low, ci_high) (None: no seed)."""
    x, y = _by_seed(t, a, col), _by_seed(t, b, col)
    d = (x - y).dropna().to_numpy()
    return d, (seed_ci(d) if len(d) else None)


def _fmt(m: tuple | None, d: int = 3) -> str:
    if m is None:
        return "n/a"
    mean, lo, hi = m
    if not np.isfinite(lo):
        return f"{mean:+.{d}f} [CI n/a]"
    return f"{mean:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"


def _verdict(claim: str, status: str, evidence: str) -> Verdict:
    return Verdict(claim, status, RULES[claim] + " " + RULES["CI"], evidence, text=CLAIMS[claim])


def _n_seeds(t: pd.DataFrame, variants: Sequence[str]) -> int:
    return min((int((t["variant"] == v).sum()) for v in variants), default=0)


def verdict_a(t: pd.DataFrame, threshold: float) -> list[Verdict]:
    """Claim A per forward-copy variant (induction, balanced), by :data:`RULES` ["A"]."""
    out = []
    formed = bool((t["peak_max_induction"] >= threshold).any())
    for v in ("induction", "balanced"):
        if v not in set(t["variant"]):
            continue
        d, m = _paired(t, v, "none", "final_max_induction")
        em_v, em_n = _by_seed(t, v, "emergence_tokens"), _by_seed(t, "none", "emergence_tokens")
        seeds = sorted(set(em_v.index) & set(em_n.index))
        inf = lambda x: math.inf if x is None or pd.isna(x) else float(x)  # noqa: E731
        earlier = bool(seeds) and all(np.isfinite(inf(em_v[s])) and inf(em_v[s]) < inf(em_n[s]) for s in seeds)
        ev = (f"{v}: final max induction − none = {_fmt(m)} (seeds {len(d)}); emergence tokens {v} "
              f"{[None if pd.isna(x) else int(x) for x in em_v]} vs none {[None if pd.isna(x) else int(x) for x in em_n]}"
              f" (threshold {threshold})")
        if _n_seeds(t, (v, "none")) < MIN_SEEDS_FOR_CI or not formed:
            why = "fewer than 2 seeds" if _n_seeds(t, (v, "none")) < MIN_SEEDS_FOR_CI else "no run formed a head"
            out.append(_verdict("A", "not testable", f"{why}; {ev}") | {"variant": v})
            continue
        ok = (m is not None and m[0] >= INDUCTION_EFFECT and m[1] > 0) or earlier
        out.append(_verdict("A", "reproduced" if ok else "not reproduced", ev) | {"variant": v})
    return out


def verdict_b(t: pd.DataFrame) -> Verdict:
    vs = [v for v in ("anti", "balanced") if v in set(t["variant"])]
    parts, cis = [], []
    for v in vs:
        x = _by_seed(t, v, "peak_max_anti_induction").dropna().to_numpy()
        c = seed_ci(x) if len(x) else None
        cis.append(c)
        parts.append(f"{v}: peak max anti-induction {_fmt(c)} (seeds {len(x)})")
    ev = "; ".join(parts) + f" (bound {ANTI_NEAR_ZERO})"
    if not vs or _n_seeds(t, vs) < MIN_SEEDS_FOR_CI:
        return _verdict("B", "not testable", "fewer than 2 seeds of anti/balanced; " + ev)
    if any(c[0] >= ANTI_NEAR_ZERO for c in cis):
        return _verdict("B", "not reproduced", ev)
    if all(c[2] < ANTI_NEAR_ZERO for c in cis):
        return _verdict("B", "reproduced", ev)
    return _verdict("B", "not testable", "CI straddles the bound; " + ev)


def verdict_c(t: pd.DataFrame) -> Verdict:
    """Claim C by :data:`RULES` ["C"]: the deciding probe :data:`C_MEASURE`, function probes beside it."""
    col = C_MEASURE
    if col not in t or t[col].isna().all():
        return _verdict("C", "not testable", f"no {col} results (evaluation not run)")
    vs = [v for v in BI_INDUCT if v in set(t["variant"])]
    diffs = {v: _paired(t, v, "none", col)[1] for v in vs}
    nat = _by_seed(t, "none", col)
    side = []
    for c in ("copy_accuracy", "hits1_1shot", "hits1_10shot"):
        if c in t and not t[c].isna().all():
            side.append(f"{c} " + ", ".join(f"{v} {t.loc[t.variant == v, c].mean():.3f}" for v in VARIANTS
                                           if v in set(t["variant"])))
    ev = "; ".join(f"{v} − none {col} = {_fmt(m)}" for v, m in diffs.items()) + \
        f"; natural-only intact {col} per seed {[round(float(x), 3) for x in nat]} (floor {PROBE_FLOOR}); " + \
        "; ".join(side)
    if _n_seeds(t, ("none", *vs)) < MIN_SEEDS_FOR_CI:
        return _verdict("C", "not testable", f"fewer than 2 seeds; {ev}")
    if not (nat > PROBE_FLOOR).all():
        return _verdict("C", "not testable", f"natural-only is at the floor on {col} (the probe is "
                                                            f"uninformative); {ev}")
    better = [v for v, m in diffs.items() if m is not None and m[0] > PROBE_MARGIN and m[1] > 0]
    return _verdict("C", "not reproduced" if better else "reproduced", ev)


def _relative_allowed(t: pd.DataFrame, variants: Sequence[str], measure: str) -> bool:
    """Pre-registered: a relative change is reported only when every compared run's intact value
    exceeds :data:`RELATIVE_FLOOR` [measure]."""
    g = t[t.variant.isin(variants)][measure].astype(float)
    return bool(len(g)) and bool((g > RELATIVE_FLOOR[measure]).all())


def verdict_d(t: pd.DataFrame) -> Verdict:
    """Claim D by :data:`RULES` ["D"]: absolute induction − random contrasts, natural-only vs induction."""
    col = f"abs_{D_MEASURE}_contrast"
    if col not in t or t[col].isna().all():
        return _verdict("D", "not testable", "no ablation results (evaluation not run)")
    parts = []
    for m, unit in (("icl_benefit", "nats"), ("recall_accuracy", "acc"), ("copy_accuracy", "acc")):
        if f"abs_{m}_contrast" not in t:
            continue
        d, c = _paired(t, "none", "induction", f"abs_{m}_contrast")
        per = ", ".join(f"{v} {t.loc[t.variant == v, f'abs_{m}_induction'].mean():+.3f} / "
                        f"{t.loc[t.variant == v, f'abs_{m}_random'].mean():+.3f} (intact "
                        f"{t.loc[t.variant == v, m].mean():.3f})" for v in VARIANTS if v in set(t.variant))
        if _relative_allowed(t, ("none", "induction"), m):
            _, rc = _paired(t, "none", "induction", f"rel_{m}_contrast")
            rel = f"; relative contrast none − induction {_fmt(rc)} (intact above {RELATIVE_FLOOR[m]})"
        else:
            rel = f"; relative not reported (some intact value <= {RELATIVE_FLOOR[m]})"
        parts.append(f"{m} [{unit}]: absolute contrast (induction − random) none − induction = {_fmt(c)}; "
                     f"absolute change induction / random heads per variant: {per}{rel}")
    ev = " ◆ ".join(parts)      # not "|": the evidence sits in a markdown table cell
    ben = _by_seed(t, "none", "icl_benefit")
    if _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI or not (ben > ICL_FLOOR).all():
        few = _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI
        why = "fewer than 2 seeds" if few else f"natural-only has no ICL benefit to lose (<= {ICL_FLOOR} nats)"
        out = _verdict("D", "not testable", f"{why}; {ev}")
        return out if few else out | {"power": power_record(ben.to_numpy(), unit="seeds", what="natural-only's intact "
                                                            "ICL benefit (the floor); no training cost measured")}
    d, m = _paired(t, "none", "induction", col)
    out = _verdict("D", "reproduced" if m is not None and m[2] < 0 else "not reproduced", ev)
    if m is not None and m[1] <= 0 <= m[2]:          # the CI straddles 0: how many seeds would decide it
        out = out | {"power": power_record(d, unit="seeds", what="the paired (by seed) contrast; normal approximation, "
                                                                 "no training cost measured")}
    return out


def verdict_e(t: pd.DataFrame) -> Verdict:
    col = "ppl" if "ppl" in t and not t["ppl"].isna().all() else "telemetry_heldout_ppl"
    t = t.assign(log_ppl=np.log(t[col].astype(float)))
    parts = {v: _paired(t, v, "none", "log_ppl")[1] for v in BI_INDUCT if v in set(t["variant"])}
    ev = "; ".join(f"{v} − none log ppl = {_fmt(m)}" for v, m in parts.items()) + \
        "; ppl " + ", ".join(f"{v} {t.loc[t.variant == v, col].mean():.2f}" for v in VARIANTS if v in set(t.variant)) \
        + f" (source {col})"
    if _n_seeds(t, ("none", "induction")) < MIN_SEEDS_FOR_CI:
        return _verdict("E", "not testable", "fewer than 2 seeds; " + ev)
    m = parts.get("induction")
    return _verdict("E", "reproduced" if m is not None and m[1] > 0 else "not reproduced", ev)


def decide(t: pd.DataFrame, threshold: float) -> list[Verdict]:
    """Every claim's verdict (A per forward variant, then B–E) by :data:`RULES`."""
    return [*verdict_a(t, threshold), verdict_b(t), verdict_c(t), verdict_d(t), verdict_e(t)]
