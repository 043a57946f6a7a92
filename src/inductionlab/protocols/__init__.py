"""Protocols: measures of in-context behaviour run over ablation conditions.

* ``runner`` — :func:`~inductionlab.protocols.runner.run_conditions`: every condition on the same
  :class:`~inductionlab.protocols.runner.Trials` (paired), references for methods that need one,
  residual reuse, torchrun sharding.
* one module per protocol: ``lag_probe`` (its all-cue packed forward in ``packed``), ``serial_recall``, ``function_probes`` (with its task
  lists in ``icl_tasks``), ``icl_score`` (ICL score, induction loss, associative recall),
  ``perplexity``, ``load_bearing`` (single-head map), ``lm_eval_tasks`` (the lm-eval bridge).

A new protocol is a module here with a config (``validate()`` needing no model), a function that
builds its :class:`~inductionlab.protocols.runner.Trials` and a ``measure_batch(model, batch) ->
{name: Tensor [b, ...]}``; :func:`~inductionlab.protocols.runner.run_conditions` does the rest
(the recipe: the runner's docstring). Imports ``core``, ``measures``, ``runtime``, ``data`` and the face.
"""
