"""Sample sizes and power (issue 34): how many trials (windows, lists, seeds) a paired mean needs, and the line an
undecided verdict prints. Pure Python / numpy.

* :func:`sample_size` — the pilot rule: ``n = ⌈(z·σ/h)²⌉`` for a 95% CI half-width ``h`` (z = 1.96), capped by a
  budget (minutes at a measured cost per trial-condition) and by the trials the material provides, with the
  reason the chosen n stopped where it did;
* :func:`n_to_decide` — trials for a CI to exclude 0 at a given effect with 80% power,
  ``⌈((z_.975 + z_.8)·σ/|δ|)²⌉`` (ANCHORS-POWER §1.2);
* :func:`power_record` / :func:`power_line` — the record a verdict carries and its one line:
  "n = N windows would decide it at σ = … (≈ T min on this machine at … s per window-condition)".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..errors import InductionLabError
from .stats import Z95

Z80 = 0.8416212335729143      # one-sided 80% quantile of the standard normal (power 0.8)
REASONS = ("half-width", "gate", "budget", "text", "minimum")


@dataclass(frozen=True)
class SampleSize:
    """The n chosen from a pilot, and why (:func:`sample_size`).

    Attributes:
        n: trials to run (>= 2).
        needed: ``⌈(z·σ/h)²⌉``, what the target half-width asks for, or ``gate_n`` where that is larger.
        reason: what bound n: ``"half-width"`` (n = needed), ``"gate"`` (n = the gate's ``gate_n``), ``"budget"``
            (the minutes), ``"text"`` (the trials the material provides), ``"minimum"`` (2: a CI needs two).
        sigma, half_width: the σ and h used; budget_n / available: the caps (None: none given);
        seconds_per_trial_condition, conditions: the cost the budget cap used; minutes: n's estimated time."""
    n: int
    needed: int
    reason: str
    sigma: float
    half_width: float
    budget_n: int | None = None
    available: int | None = None
    seconds_per_trial_condition: float | None = None
    conditions: int | None = None
    minutes: float | None = None
    gate_n: int | None = None

    @property
    def capped(self) -> bool:
        """Whether a cap kept n below what the half-width needs."""
        return self.n < self.needed

    @property
    def gate_set(self) -> bool:
        """Whether the gate's n (not the half-width's) set ``needed``."""
        return self.gate_n is not None and self.gate_n >= self.needed

    def to_dict(self) -> dict:
        return asdict(self) | {"capped": self.capped}

    @classmethod
    def from_dict(cls, d: dict) -> "SampleSize":
        """The inverse of :meth:`to_dict` (a record read back from a run's JSON)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def cap_note(self, unit: str = "windows", *, gate: str = "the gate", value_unit: str = "") -> str:
        """The caveat of a capped n, e.g. "n = 30 windows, capped by the budget: the gate needs 55" (``gate``: how
        the gate is named; ``value_unit``: the half-width's unit, e.g. " nats")."""
        what = gate if self.gate_set else f"the target half-width {self.half_width:g}{value_unit}"
        note = f"n = {self.n} {unit}, capped by the {self.reason}: {what} needs {self.needed}"
        return note if self.gate_set else f"{note} at pilot σ = {self.sigma:.3g}"

    def sentence(self, unit: str = "windows") -> str:
        """One line for a report: the n, σ, h and the bound."""
        what = "the gate" if self.gate_set else f"the half-width {self.half_width:g}"
        why = {"half-width": f"the target 95% CI half-width {self.half_width:g} needs {self.needed}",
               "gate": f"the gate needs {self.needed} (80% power at the pilot's intact mean; the half-width "
                       f"{self.half_width:g} needs fewer)",
               "budget": f"the budget caps it ({what} needs {self.needed})",
               "text": f"the text provides no more ({what} needs {self.needed})",
               "minimum": "a CI needs two"}[self.reason]
        cost = "" if self.minutes is None else f"; ≈ {self.minutes:.1f} min"
        return f"n = {self.n} {unit} at pilot σ = {self.sigma:.3g}: {why}{cost}"


def _needed(sigma: float, h: float, z: float = Z95) -> int:
    return max(2, math.ceil((z * sigma / h) ** 2)) if sigma > 0 else 2


def sample_size(sigma: float, half_width: float, *, budget_minutes: float | None = None,
                seconds_per_trial_condition: float | None = None, conditions: int = 1,
                available: int | None = None, gate_n: int | None = None) -> SampleSize:
    """Trials for a 95% CI of half-width ``half_width`` on a mean whose per-trial SD is ``sigma``.

    Args:
        sigma: per-trial SD of the statistic (a pilot's, ddof = 1).
        half_width: h, in the statistic's units.
        budget_minutes: wall minutes allowed for all ``conditions`` over n trials (None: no budget cap).
        seconds_per_trial_condition: the measured cost of one trial under one condition (needed with a budget).
        conditions: conditions every trial runs under.
        available: trials the material provides (None: no cap).
        gate_n: trials another condition of the claim needs (its testability gate, :func:`n_to_decide`); needed
            is the larger of the two.

    Returns: :class:`SampleSize`; n = ``min(needed, budget cap, available)``, at least 2.

    Raises:
        InductionLabError: ``half_width <= 0``, a negative or non-finite ``sigma``, a budget without a cost."""
    if not half_width > 0:
        raise InductionLabError(f"the target half-width must be > 0, got {half_width}")
    if not (np.isfinite(sigma) and sigma >= 0):
        raise InductionLabError(f"the pilot's σ must be finite and >= 0, got {sigma}")
    needed, reason = _needed(sigma, half_width), "half-width"
    if gate_n is not None and gate_n > needed:
        needed, reason = int(gate_n), "gate"
    n = needed
    budget_n = None
    if budget_minutes is not None:
        if not seconds_per_trial_condition or seconds_per_trial_condition <= 0:
            raise InductionLabError("a budget needs the measured seconds per trial and condition (> 0)")
        budget_n = int(budget_minutes * 60 // (seconds_per_trial_condition * max(1, conditions)))
        if budget_n < n:
            n, reason = budget_n, "budget"
    if available is not None and available < n:
        n, reason = int(available), "text"
    if n < 2:
        n, reason = 2, "minimum"
    minutes = None if seconds_per_trial_condition is None else n * seconds_per_trial_condition * max(1, conditions) / 60
    return SampleSize(int(n), int(needed), reason, float(sigma), float(half_width), budget_n,
                      None if available is None else int(available), seconds_per_trial_condition,
                      int(conditions), minutes, None if gate_n is None else int(gate_n))


def planning_sigma(sigma: float, n: int, level: float = 0.8) -> float:
    """A pilot's SD made safe to plan with: its one-sided ``level`` upper confidence limit,
    ``σ·√((n − 1)/χ²_{1−level, n−1})`` (Browne 1995, "On the use of a pilot sample for sample size determination",
    Statistics in Medicine 14: the pilot's own σ underpowers the main study about half the time). ``n``: the
    pilot's trials (ddof = 1). Returns ``sigma`` unchanged when ``n < 2`` or ``sigma`` is not finite."""
    from scipy.stats import chi2

    if n < 2 or not np.isfinite(sigma):
        return float(sigma)
    return float(sigma * math.sqrt((n - 1) / chi2.ppf(1 - level, n - 1)))


def planning_effect(mean: float, sigma: float, n: int) -> float:
    """A pilot's mean made safe to plan a gate with: the lower limit of its one-sided 80% interval,
    ``mean − 0.84·σ/√n``, but at least half the mean (a pilot that barely shows the effect plans for half of it).
    0 or less in: returned as is (no gain to plan for)."""
    if not (np.isfinite(mean) and mean > 0) or n < 2 or not np.isfinite(sigma):
        return float(mean)
    return float(max(mean - Z80 * sigma / math.sqrt(n), mean / 2))


def n_to_decide(sigma: float, effect: float) -> float:
    """Trials for a paired mean ``effect`` with per-trial SD ``sigma`` to have a 95% CI excluding 0 with 80% power:
    ``⌈((1.96 + 0.84)·σ/|effect|)²⌉`` (inf when the effect is 0 or not finite)."""
    if not (np.isfinite(effect) and np.isfinite(sigma)) or effect == 0:
        return math.inf
    return float(max(2, math.ceil(((Z95 + Z80) * sigma / abs(effect)) ** 2)))


def power_record(values, *, unit: str = "windows", seconds_per_trial_condition: float | None = None,
                 conditions: int | None = None, what: str | None = None) -> dict:
    """What an undecided verdict carries: for per-trial values ``[n]`` (a paired difference, or the intact
    measure of a gate), their mean and SD and :func:`n_to_decide`, with the time it would take.

    Returns: ``{"n", "mean", "sigma", "n_needed", "unit", "seconds_per_trial_condition", "conditions", "minutes",
    "what"}`` (``minutes`` None without a cost; ``n_needed`` None when the mean is 0)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    mean = float(v.mean()) if len(v) else math.nan
    sigma = float(v.std(ddof=1)) if len(v) > 1 else math.nan
    need = n_to_decide(sigma, mean)
    need = None if not math.isfinite(need) else int(need)
    minutes = None if need is None or not seconds_per_trial_condition else \
        need * seconds_per_trial_condition * (conditions or 1) / 60
    return {"n": int(len(v)), "mean": mean, "sigma": sigma, "n_needed": need, "unit": unit,
            "seconds_per_trial_condition": seconds_per_trial_condition, "conditions": conditions,
            "minutes": minutes, "what": what}


def power_from_ci(mean: float, ci_low: float, ci_high: float, n: int, *, unit: str = "trials",
                  what: str | None = None, seconds_per_trial_condition: float | None = None,
                  conditions: int | None = None) -> dict:
    """:func:`power_record` from a normal-approximation 95% CI over ``n`` trials instead of the values:
    σ = (ci_high − ci_low) / (2 · 1.96) · √n."""
    sigma = (ci_high - ci_low) / (2 * Z95) * math.sqrt(n) if n > 1 and np.isfinite(ci_high - ci_low) else math.nan
    need = n_to_decide(sigma, mean)
    need = None if not math.isfinite(need) else int(need)
    minutes = None if need is None or not seconds_per_trial_condition else \
        need * seconds_per_trial_condition * (conditions or 1) / 60
    return {"n": int(n), "mean": float(mean), "sigma": float(sigma), "n_needed": need, "unit": unit,
            "seconds_per_trial_condition": seconds_per_trial_condition, "conditions": conditions,
            "minutes": minutes, "what": what}


def power_line(p: dict) -> str:
    """The verdict's power line: ``n = N windows would decide it at σ = … (≈ T min on this machine at … s per
    window-condition)``; the time left out where no cost was measured."""
    unit, one = p.get("unit", "trials"), str(p.get("unit", "trials")).removesuffix("s")
    what = f" ({p['what']})" if p.get("what") else ""
    if p.get("n_needed") is None:
        return f"no n decides it at σ = {p['sigma']:.3g}{what}: the mean is 0 over {p['n']} {unit}"
    s = f"n = {p['n_needed']} {unit} would decide it at σ = {p['sigma']:.3g}{what}, 80% power at the mean {p['mean']:+.3g}"
    if p.get("minutes") is not None:
        per = p["seconds_per_trial_condition"]
        conds = f" × {p['conditions']} conditions" if p.get("conditions") else ""
        s += f" (≈ {p['minutes']:.0f} min on this machine at {per:.3g} s per {one}-condition{conds})"
    return s + f"; this run has {p['n']}"


__all__ = ["planning_sigma", "planning_effect", "SampleSize", "sample_size", "n_to_decide", "power_record", "power_from_ci", "power_line", "REASONS",
           "Z80"]
