"""The token-loss phase shared by ``study head-types`` (Y2) and ``study routes`` (R3) (issue 34): the windows and
positions settled before anything is written (:func:`plan`), then in the study's phases (:func:`measure`) a pilot
(intact + the claim's ablation on ``--icl-pilot`` windows, one piece ``icl_pilot``) that sizes the confirmatory
run (piece ``icl_sample_size``: n = ⌈(1.96·σ/h)²⌉ capped by ``--budget-minutes`` and the text), the confirmatory
phase ``icl/<condition>`` on n windows under every condition (same windows in each: paired), and optional
sensitivity arms ``icl_<method>/<condition>``, one per other ablation method. Each piece resumes.

With ``--icl-sequences N`` there is no pilot: N windows, as before issue 34.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..core.stimuli import seed_for
from ..measures import token_loss as TL
from ..measures.power import SampleSize
from ..measures.stats import ci
from ..protocols import token_loss as P
from ..protocols.configs import TokenLossConfig
from .engine import Context, Phase

DEFINITION = ("per window, every token's loss ℓ_t (nats) from ⌈0.8·early⌉ to ⌊1.2·late⌋ (or late, where the window "
              "stops there); D = −b·ln 10 of the least-squares fit ℓ_t = a + b·ln t over t in [early, late] "
              "(primary: nats per tenfold more context); B = mean ℓ over [⌈0.8·early⌉, ⌊1.2·early⌋] − mean over "
              "[⌈0.8·late⌉, ⌊1.2·late⌋] (where the window holds it); single-token ℓ_early − ℓ_late (Olsson et al. "
              "2022, secondary)")


@dataclass
class TokenLossPlan:
    """What :func:`plan` settles: the config, the window's tokens, the scaled positions, the window and pilot seeds, the
    windows when their number is fixed (None: from the pilot), the windows the text provides and the pilot's
    windows (auto only)."""
    cfg: TokenLossConfig
    length: int
    late: int
    early: int
    seed: int
    pilot_seed: int
    windows: torch.Tensor | None = None
    available: int | None = None
    pilot_windows: torch.Tensor | None = None
    text_sha256: str | None = None

    @property
    def measured(self) -> tuple[int, int]:
        return TL.measured_range(self.early, self.late, self.length)

    def params(self) -> dict:
        """The run's ``params`` entries (a resumed run with others is refused)."""
        first, last = self.measured
        return {"icl_positions": {"late": self.late, "early": self.early}, "icl_window_tokens": self.length,
                "icl_measured_tokens": [first, last],
                **({"icl_text_sha256": self.text_sha256} if self.text_sha256 is not None else {})}


@dataclass
class TokenLossRun:
    """The phase's value: per condition the probe's arrays, per sensitivity method its arms' arrays (empty: no
    arm), the pilot's sizing record (None: a fixed n), the windows' count, the per-window table
    (:func:`~inductionlab.protocols.token_loss.window_table`) and the windows ``[n, length]``."""
    arrays: dict[str, dict[str, np.ndarray]]
    sensitivity: dict[str, dict[str, dict[str, np.ndarray]]]
    sizing: dict | None
    n: int
    table: pd.DataFrame = field(repr=False)
    windows: torch.Tensor | None = field(default=None, repr=False)


def plan(loaded, cfg: TokenLossConfig, seed: int) -> TokenLossPlan:
    """The windows' length and positions on this model, and the windows (a fixed ``--icl-sequences``) or the count
    the text provides and a check that it gives the pilot's windows (auto).

    Raises:
        InductionLabError: the text is missing or too short (one line naming the option)."""
    length, late, early = P.positions(loaded.model, cfg)
    tl = TokenLossPlan(cfg, length, late, early, seed_for(seed, 11), seed_for(seed, 12))
    tl.measured                                            # raises on positions that do not fit
    tl.text_sha256 = P.text_sha256(cfg)                    # a file's: a resume after it changed is refused
    if cfg.auto:
        tl.available = P.available_windows(loaded, cfg, length)
        tl.pilot_windows = P.text_windows(loaded, cfg, length, cfg.pilot, tl.pilot_seed)   # checked here, used by measure
    else:
        tl.windows = P.text_windows(loaded, cfg, length, cfg.n_sequences, tl.seed)
    return tl


def measure(ctx: Context, tl: TokenLossPlan, conditions, pilot_condition, sensitivity_conditions=()) -> TokenLossRun:
    """The pilot and the sizing (auto), then the confirmatory phase ``icl`` under ``conditions`` (the first is
    intact) and one sensitivity phase ``icl_<method>`` per method of ``cfg.arms`` under ``sensitivity_conditions``
    (none: skipped)."""
    cfg, loaded = tl.cfg, ctx.loaded
    sens = list(sensitivity_conditions)
    arms = cfg.arms if sens else ()                     # methods that run: none without conditions to run them on
    sizing = None
    if cfg.auto:
        pr = P.probe(tl.pilot_windows, cfg, tl.early, tl.late)
        pilot = ctx.arrays("icl_pilot", lambda: P.run_pilot(loaded, pr, [conditions[0], pilot_condition]))
        sizing = ctx.piece("icl_sample_size", lambda: P.choose_n(pilot, cfg, len(conditions) + len(arms) * len(sens),
                                                                tl.available))
        sizing |= {"pilot_condition": pilot_condition.name}
        n = int(sizing["sample_size"]["n"])
        windows = P.text_windows(loaded, cfg, tl.length, n, tl.seed)
    else:
        windows, n = tl.windows, len(tl.windows)
    runs = ctx.measure(Phase("icl", P.probe(windows, cfg, tl.early, tl.late), conditions),
                       *(Phase(f"icl_{m}", P.probe(windows, cfg, tl.early, tl.late, m), sens) for m in arms))
    arrays = runs["icl"].arrays
    return TokenLossRun(arrays, {m: runs[f"icl_{m}"].arrays for m in arms}, sizing, n, P.window_table(arrays),
                        windows)


def cost(run: TokenLossRun, icl_seconds: float | None, n_conditions: int) -> dict:
    """Seconds per window-condition: the pilot's where one ran (measured on windows of the same length), else this
    session's ``icl_seconds`` (``Context.timing("icl")``) over its windows × conditions (None when the phase was
    loaded from checkpoints)."""
    if run.sizing is not None:
        return {"seconds_per_trial_condition": run.sizing["pilot"]["seconds_per_window_condition"],
                "conditions": n_conditions, "unit": "windows", "source": "pilot"}
    spent = icl_seconds or 0.0
    per = spent / (run.n * n_conditions) if spent > 0 else None
    return {"seconds_per_trial_condition": per, "conditions": n_conditions, "unit": "windows", "source": "this session"}


def with_cap_note(verdicts, claim: str, run: TokenLossRun) -> list:
    """``verdicts`` with ``claim``'s caveat extended by the sizing's cap where a cap (budget, text) kept n below what
    the target half-width needs: the verdict says its n was not the one the rule asked for."""
    size = (run.sizing or {}).get("sample_size")
    if not size or not size["capped"]:
        return list(verdicts)
    note = SampleSize.from_dict(size).cap_note(gate="the gate (intact D's CI above 0)", value_unit=" nats")
    return [v | {"caveat": f"{v.caveat}; {note}" if v.caveat else note} if v.claim == claim else v for v in verdicts]


def record(tl: TokenLossPlan, run: TokenLossRun) -> dict:
    """results.json's ``token_loss`` entry: the measure, positions, windows, methods, the pilot and n, and the
    per-window SD of each measure on the intact model."""
    first, last = tl.measured
    intact = run.arrays["intact"]
    sd = {m: (float(np.nanstd(intact[m], ddof=1)) if np.isfinite(intact[m]).sum() > 1 else None) for m in P.MEASURES}
    means = {m: (dict(zip(("mean", "ci_low", "ci_high"), ci(intact[m][np.isfinite(intact[m])])))
                 if np.isfinite(intact[m]).sum() > 1 else None) for m in P.MEASURES}
    return {"definition": DEFINITION, "primary": "slope (D)", "late": tl.late, "early": tl.early,
            "window_tokens": tl.length, "measured_tokens": [first, last],
            "band": None if last >= TL.band(tl.late)[1] else
            f"absent: the windows stop at token {last}, before ⌊1.2·late⌋ = {TL.band(tl.late)[1]}",
            "windows": P.window_construction(tl.cfg), "n_windows": run.n, "method": tl.cfg.method,
            "sensitivity_methods": list(run.sensitivity),
            "sizing": run.sizing if run.sizing is not None else {"fixed": run.n, "option": "--icl-sequences"},
            "intact_per_window_sd": sd, "intact": means,
            "per_window_arrays": "checkpoints/icl/<condition>.npz: nll (float32 [n, tokens measured]), slope, band, "
                                 "single, loss_early, loss_late per window"}


def report_lines(rec: dict) -> list[str]:
    """The report's "Token-loss score" section from :func:`record`'s entry."""
    lines = ["## Token-loss ICL score", "", f"Measure: {rec['definition']}.", "",
             f"Windows: {rec['n_windows']} ({rec['windows']}); {rec['window_tokens']} tokens, losses kept for tokens "
             f"{rec['measured_tokens'][0]}–{rec['measured_tokens'][1]}; early {rec['early']}, late {rec['late']}. "
             f"Ablation: {rec['method']}" + (f"; sensitivity arms: {', '.join(rec['sensitivity_methods'])}"
                                              if rec["sensitivity_methods"] else "") + "."]
    if rec.get("band"):
        lines += ["", f"Band benefit B {rec['band']}."]
    sz = rec["sizing"]
    if "sample_size" in sz:
        s, p = sz["sample_size"], sz["pilot"]
        sig = ", ".join(f"{k} {v:.3g}" for k, v in p["sigma"].items() if v is not None)
        lines += ["", f"Pilot: {p['n']} windows, intact and {sz.get('pilot_condition', 'the claim’s ablation')}, "
                      f"{p['seconds']:.0f} s ({p['seconds_per_window_condition']:.3g} s per window-condition); "
                      f"σ per window: {sig}. Sample size: {sz['sentence']}."]
        if s["capped"]:
            lines += ["", f"**The {s['reason']} cap kept n below the {s['needed']} windows the target half-width "
                          f"{s['half_width']:g} nats needs.**"]
    else:
        lines += ["", f"Windows fixed by {sz['option']} {sz['fixed']} (no pilot)."]
    sd = rec["intact_per_window_sd"]
    lines += ["", "Intact, per window: " + "; ".join(
        f"{m} {rec['intact'][m]['mean']:+.3f} [{rec['intact'][m]['ci_low']:+.3f}, {rec['intact'][m]['ci_high']:+.3f}] "
        f"(SD {sd[m]:.3g})" for m in P.MEASURES if rec["intact"].get(m)) + " nats.", ""]
    return lines


__all__ = ["TokenLossPlan", "TokenLossRun", "DEFINITION", "plan", "measure", "cost", "with_cap_note", "record",
           "report_lines"]
