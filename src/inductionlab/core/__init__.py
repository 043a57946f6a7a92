"""Core: the model and what we do to its heads.

* ``models`` — :func:`~inductionlab.core.models.load_model` (embedded packages, GGUF, checkpoints),
  :class:`~inductionlab.core.models.LoadedModel` with its identity, and :func:`~inductionlab.core.models.forward`
  (the one call that asks for the logits of some positions only, ``logits_to_keep``).
* ``support`` — the supported-architecture policy: :func:`~inductionlab.core.support.check_supported` (a model
  is measured exactly or refused in one line naming why: no attention, differential attention, a hybrid, not
  causal, no dispatch through transformers' attention interface, a head not one slice of the output
  projection) and :func:`~inductionlab.core.support.load_model` (``models.load_model`` with the policy: the
  package's and the command line's loader); ``architecture`` — its checks that need no forward (every context
  runs them) and the sliding window a run warns about.
* ``instrument`` — the contexts that hook attention (the one place that does): per-head
  probabilities and outputs, :func:`~inductionlab.core.instrument.ablate`; built on
  ``attention`` (the attention function registered in transformers and one context's state, its
  call in four steps) and ``methods`` (the ablation methods table: zero / mean / sink / knockout).
* ``ablation`` — head selection: :class:`~inductionlab.core.ablation.Condition`, top-k, per-layer top-p,
  a fraction of all heads with another ranking's top excluded (``select_heads``,
  ``selection_conditions``: Yin & Steinhardt 2025), random heads (over all heads or outside the top
  N; a seeded permutation of all heads, so rounding moves a draw only where it touches a drawn
  head) and matched random heads.
* ``scores`` — head scores (induction, anti-induction, previous-token, duplicate-token, sink).
* ``reuse`` — the residual-stream cache shared across ablation conditions.
* ``patching`` — batched activation patching of a prompt's last tokens (one forward scores many patch sets:
  :func:`~inductionlab.core.patching.patched_last_logits`; the FV, dual-route and function-probe protocols'
  kernel).
* ``attribution`` — gradient attribution of every head at once: attribution patching (AtP, with AtP*'s GradDrop:
  :func:`~inductionlab.core.attribution.attribution_patching`) and per-head direct logit attribution with the final
  norm's scale frozen (:func:`~inductionlab.core.attribution.direct_logit_attribution`).
* ``anatomy`` — where a model keeps its attention modules, output projections, MLPs, final norm and unembedding.
* ``placement`` — where a model runs (:func:`~inductionlab.core.placement.execution_device`), offloaded
  models included; a model on the ``meta`` device with nothing to load its weights is refused.
* ``stimuli`` — word pools, seeds and random token sequences.
* ``finite`` — NaN / inf in a model's weights or logits, named where they first appear.

Imports ``runtime``, ``data`` and the face. A new head score is a function and a ``SCORES`` entry in
``scores``; a new ablation method a function and an ``ABLATION_METHODS`` entry in ``methods``
(its name in :data:`inductionlab.names.ABLATION_METHOD_NEEDS`).
"""
