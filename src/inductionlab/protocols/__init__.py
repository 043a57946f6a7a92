"""Protocols: measures of in-context behaviour run over ablation conditions.

* ``runner`` — :func:`~inductionlab.protocols.runner.run_conditions`: every condition on the same
  :class:`~inductionlab.protocols.runner.Trials` (paired), references for methods that need one,
  residual reuse, torchrun sharding.
* one module per protocol: ``lag_probe`` (its all-cue packed forward in ``packed``), ``serial_recall``, ``function_probes`` (with its task
  lists in ``icl_tasks``), ``icl_score`` (ICL score, induction loss, associative recall),
  ``perplexity``, ``load_bearing`` (single-head map), ``lm_eval_tasks`` (the lm-eval bridge),
  ``lm_eval_model`` (the lm-eval model type ``inductionlab``: any lm-eval task on an ablated model) and ``word_copy``
  (the word-list copy probe: words, nonsense, random ids), ``token_loss`` (the token-loss ICL score under ablation:
  windows, every position's loss reduced to D, B and the single-token benefit, the pilot that sizes the windows).

* ``configs`` — the protocols' configs (typed trees, no torch: the command line generates options from them).

A new protocol is a config in ``configs`` (``validate()`` needing no model) and a module here with
``build_trials(loaded, cfg) -> Trials``, ``measure_batch(model, batch, cfg) -> {name: Tensor [b, ...]}`` and
``probe(cfg) -> Probe`` binding them with the batch size; a study's phase holds the probe and
:func:`~inductionlab.protocols.runner.run_conditions` does the rest (the recipe: the runner's docstring).
Imports ``core``, ``measures``, ``runtime``, ``data`` and the face.
"""
