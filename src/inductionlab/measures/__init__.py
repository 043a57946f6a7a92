"""Measures: small functions over arrays and tidy tables (numpy / pandas / scipy, no torch, no model),
in the style of psifr.

* ``stats`` — 95% CIs over trials, the ``x`` / ``x_ci_low`` / ``x_ci_high`` column convention,
  pooling of random draws (``arm_values``), paired contrasts (``paired_by_k``) (SPEC §4).
* ``lag`` — the lag probe's curve, headline, contrasts and word-prior correction (log-enrichment).
* ``crp`` — lag-CRP of recall sequences (Kahana 1996).
* ``serial_position`` — serial-position curves, temporal factor, lag enrichment.
* ``load_bearing_eval`` — relative / absolute changes under ablation with paired CIs, score concentration.
* ``token_loss`` — the token-loss ICL score's per-window reductions: log-slope benefit D, band benefit B,
  single-token benefit (issue 34).
* ``power`` — sample size from a pilot (n = ⌈(1.96·σ/h)²⌉ with its caps) and the power line of an undecided verdict.
* ``overlap`` — how two head rankings overlap: top-set overlap against its hypergeometric expectation
  and tail, mean cross-percentiles, Spearman (Yin & Steinhardt 2025).

Imports only the package's face. A new measure is a function here, with its test against a value
worked out by hand; the protocols and studies above call it.
"""
