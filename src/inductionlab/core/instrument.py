"""Head instrumentation (SPEC §2): one mechanism for every analysis.

We register one attention function, ``"inductionlab"``, in transformers' own
``AttentionInterface`` (and the matching additive-mask builder in ``AttentionMaskInterface``)
and point a model at it for the duration of an :func:`instrument` context. Inside each
attention call we

1. edit the additive mask per **query head** for ``sink`` and ``knockout`` interventions
   (pre-softmax; K/V shared by a GQA group are never touched),
2. delegate to the model's own attention math (its module's ``eager_attention_forward`` when
   probabilities are needed, else transformers' SDPA kernel), so numbers come from the native
   forward, not a re-implementation,
3. apply ``zero`` / ``mean`` / ``resample`` / ``patch`` interventions on the per-head attention output
   (the input of ``o_proj``, split with ``config.head_dim``), so only the named query head changes —
   at every query, or only at chosen positions and rows (activation patching: the last position,
   named positions; :attr:`HeadIntervention.positions`),
4. reduce the attention probabilities of the edited call to the statistics an analysis asked
   for (``reductions``: the probability on one target key per query, shape ``[B, H, Q]``; a
   zero-ablated head's reads 0), never keeping ``[B, H, T, T]`` patterns unless
   ``keep_patterns=True``. With reductions alone (CPU, no softcapping) no pattern is built at
   all: SDPA's fused CPU flash kernel computes the output and the row log-sum-exp in step 2,
   and each target probability is ``exp(scale·q·k_target + mask_target − lse)`` — O(T) memory
   per row, equal to the eager pattern's value within 1e-6 in fp32
   (tests/test_fused_reductions.py).

Positions are **absolute**: position 0 is each sequence's first real token (left padding
excluded, read from the 2-D ``attention_mask`` passed to the model), and a query decoded
against a KV cache keeps the position it has in the whole sequence. Sink, knockout edges and
reduction targets all name absolute positions, so a left-padded batch gives each row what it
gives alone, and cached decoding gives what the full forward gives (dynamic caches, including
sliding-window layers; a static cache's unused slots count as padding).

Ablation methods live in one table, :data:`ABLATION_METHODS` (name -> :class:`AblationMethod`):
each entry is either a **mask edit** (``cut``: which query→key edges to mask before the
softmax, step 1) or an **output edit** (``replace``: the head's new output, step 3). Adding a
method is one function and one entry; validation and the CLI read the table
(:func:`ablation_methods`).

On exit the model's original attention implementation (and each module's train / eval mode:
measurements run in eval mode) is restored; registering the name is the only global change and
it alters no other model. A context edits only the forwards of the thread that opened it, and a
KV cache computed under other interventions than the context's is refused. Any intervention
that provably did nothing (a head whose output was already what we wrote, edges that were
already masked) and any model whose attention never dispatched through the registry raise an
error.

Where the code is: this module holds the public contexts (:func:`instrument`, :func:`ablate`,
:func:`head_output_means`, :func:`self_check`, :func:`eval_mode`) and re-exports the names
callers use; :mod:`inductionlab.core.methods` the method table (add a method there);
:mod:`inductionlab.core.attention` the registration with transformers and
:class:`~inductionlab.core.attention.Instrumentation`, one context's state, whose ``_attention``
runs the four steps above, one method each.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Mapping

import torch

from ..errors import InductionLabError
from ..names import DEFAULT_METHOD
from .architecture import refuse_static
from .attention import (CACHE_TAG, FUNCTION_NAME, AlreadyInstrumented, Instrumentation, NoOpIntervention,
                        StaleKVCache, UnsupportedArchitecture, gather_targets)
from .methods import (ABLATION_METHODS, METHODS, AblationMethod, HeadIntervention, Positions, ablation_method,
                      ablation_methods, check_head, query_mask)
from .models import attention_shape
from .placement import execution_device

__all__ = [  # the contexts, and the names callers import from here
    "instrument", "ablate", "head_output_means", "head_outputs", "attention_patterns", "source_values", "self_check",
    "eval_mode",
    "unwrap_model",
    "HeadIntervention", "Positions", "AblationMethod", "ABLATION_METHODS", "METHODS", "ablation_methods",
    "ablation_method", "check_head", "Instrumentation", "gather_targets", "FUNCTION_NAME", "CACHE_TAG",
    "UnsupportedArchitecture", "NoOpIntervention", "AlreadyInstrumented", "StaleKVCache",
]


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """Every submodule of ``model`` in eval mode (dropout off) for the block; each module's own
    train / eval flag restored after. Measurements run under it, so a model left in ``train()``
    gives the same scores on identical calls."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def unwrap_model(model):
    """The ``torch.nn.Module`` of ``model``: itself, or the ``.model`` of a LoadedModel bundle.

    Raises:
        TypeError: neither a module with a ``config`` nor a bundle holding one (None included).
    """
    if isinstance(model, torch.nn.Module) and hasattr(model, "config"):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module) and hasattr(inner, "config"):
        return inner
    raise TypeError(f"expected a transformers model (or a LoadedModel bundle from inductionlab.load_model), got "
                    f"{type(model).__name__}")


@contextlib.contextmanager
def instrument(model, interventions: Iterable[HeadIntervention] = (), *,
               reductions: Mapping[str, torch.Tensor] | None = None, keep_patterns: bool = False,
               capture_head_means: bool = False, need_probs: bool | None = None,
               strict: bool = True, capture_heads: Iterable[tuple[int, int]] = (),
               mean_positions="all", capture_value_norms: bool = False,
               grad_probes: bool = False) -> Iterator[Instrumentation]:
    """Point ``model`` at the inductionlab attention function for the duration of the block.

    Args:
        model: a transformers causal LM whose attention dispatches through ``AttentionInterface``
            (or a LoadedModel bundle holding one).
        interventions: :class:`HeadIntervention` items (query-head indexing, absolute positions).
        reductions: name -> target key per query, LongTensor ``[Qt]`` or ``[B, Qt]`` indexed by
            absolute query position and giving an absolute key position (``-1`` = none); after
            a forward, ``inst.reduced[name]`` is float32 ``[n_layers, B, n_heads, Qt]``.
        keep_patterns: also keep full ``[B, H, Q, K]`` probabilities per layer (memory heavy).
        capture_head_means: accumulate per-head outputs over real tokens for mean ablation (at
            ``mean_positions``: ``"all"``, ``"last"`` or positions, as :attr:`HeadIntervention.positions`).
        capture_heads: ``(layer, head)`` pairs whose output ``[B, Q, head_dim]`` each call keeps in
            ``inst.captured`` (the source run of activation patching; :func:`head_outputs`).
        capture_value_norms: keep each layer's value-vector norms ``[B, n_kv_heads, K]`` of the last call in
            ``inst.value_norms`` (value-weighted attention, Kobayashi et al. 2020; slots as ``patterns``).
        grad_probes: add a zero leaf tensor to each layer's head outputs (``inst.probes``), whose gradient
            after a forward with gradients enabled is the metric's gradient with respect to every query head's
            output (attribution patching, :mod:`inductionlab.core.attribution`).
        need_probs: force (True) or forbid (False) the eager path; default: eager only when
            probabilities are needed or the model was loaded with eager attention.
        strict: on exit, raise :class:`NoOpIntervention` if an intervention changed nothing.

    The model runs in eval mode inside the block (dropout off, :func:`eval_mode`; each module's
    mode restored on exit). The context belongs to the thread that opened it: another thread's
    forward of the same model meanwhile runs the model's own attention, with no intervention and
    no reduction. A KV cache passed to a forward inside the block must have been computed under
    the same interventions (in this context or an equal one); the model's own cache, built
    inside, is.

    Raises:
        InductionLabError: head out of range or not an integer, unknown method, missing mean
            value / edges, malformed edges or targets.
        AlreadyInstrumented: the model is already inside a context (this thread's: nest the
            interventions in one call; another thread's: one context per model at a time).
        StaleKVCache: (from a forward in the block) a KV cache with cached positions computed
            under other interventions, e.g. a plain forward's cache reused inside :func:`ablate`.
        UnsupportedArchitecture: the model has no attention layers, uses differential attention or has no
            single head grid (:func:`~inductionlab.core.architecture.refuse_static`, before anything runs), or it
            never called the registered attention function.
        NoOpIntervention: (``strict``) an intervention provably did nothing.
    """
    model = unwrap_model(model)
    refuse_static(model)          # no attention, differential attention, no single head grid: one line
    inst = Instrumentation(model, list(interventions), reductions or {}, keep_patterns,
                           capture_head_means, need_probs, capture_heads, mean_positions, capture_value_norms,
                           grad_probes)
    with inst.attach(), eval_mode(model):
        yield inst
    if inst.calls == 0 and (inst.interventions or inst.reduction_targets):
        raise UnsupportedArchitecture(f"{type(model).__name__} ran without calling the registered attention "
                                      "function: it does not dispatch through AttentionInterface")
    if strict:
        inst.check_effects()


def head_output_means(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      positions="all") -> torch.Tensor:
    """Mean per-head attention output over a reference batch (for ``mean`` ablation).

    Args:
        input_ids: ``[B, T]`` token ids of the reference batch.
        attention_mask: optional ``[B, T]`` (1 = real token, 0 = padding); padding slots are
            left out of the mean.
        positions: the token class averaged over (:attr:`HeadIntervention.positions`): ``"all"`` real
            tokens, ``"last"`` (each prompt's last token: Todd et al. 2024's mean at the query-predictive
            position), absolute or from-the-end positions.

    Returns:
        float32 ``[n_layers, n_heads, head_dim]``: mean over the batch's tokens at ``positions`` of each
        query head's output (the input of ``o_proj``). Convention: position-independent mean, as in mean
        ablation of Wang et al. 2022 / Todd et al. 2024 (mean over a reference set).

    Raises:
        InductionLabError: the batch holds no real token at ``positions``.
    """
    model = unwrap_model(model)
    with torch.inference_mode(), instrument(model, capture_head_means=True, mean_positions=positions) as inst:
        model(input_ids=input_ids, attention_mask=attention_mask)
    if inst.head_output_count == 0:
        raise InductionLabError("the mean-ablation reference batch holds no real token; pass a non-empty batch")
    return inst.head_output_sum / inst.head_output_count


def head_outputs(model, input_ids: torch.Tensor, heads: Iterable[tuple[int, int]],
                 attention_mask: torch.Tensor | None = None) -> dict[tuple[int, int], torch.Tensor]:
    """The outputs of ``heads`` in one forward over ``input_ids`` (the source run of activation patching).

    Args:
        input_ids: ``[B, T]`` token ids; attention_mask: optional ``[B, T]`` (left padding).
        heads: ``(layer, head)`` pairs, query-head indexing.

    Returns:
        ``(layer, head)`` -> the head's output (the input of ``o_proj``) ``[B, T, head_dim]`` in the model's
        dtype: patched back unchanged, it reproduces the forward bit for bit.

    Raises:
        InductionLabError: a head out of range or not an integer."""
    model = unwrap_model(model)
    shape = attention_shape(model.config)
    heads = [check_head(*lh, shape["n_layers"], shape["n_heads"]) for lh in heads]
    with torch.inference_mode(), instrument(model, capture_heads=heads) as inst:
        model(input_ids=input_ids, attention_mask=attention_mask)
    return {h: inst.captured[h] for h in heads}


def attention_patterns(model, input_ids, heads) -> "np.ndarray":
    """The attention patterns of ``heads`` on one sequence (one forward, the model's own eager attention).

    The patterns are read inside :func:`instrument` (``keep_patterns=True``), the path every head score
    reads its target probabilities on; the model's own attention math computes them (its module's
    ``eager_attention_forward``: SDPA returns no probabilities), so a head's row here is the one its
    induction score averages over. Query-head indexing: in a GQA model the query heads of one KV group
    share keys and values but each has its own pattern.

    Args:
        model: a transformers causal LM (or a LoadedModel bundle).
        input_ids: one sequence of token ids, ``[T]`` or ``[1, T]`` (list, tensor or array), e.g.
            :func:`~inductionlab.core.scores.induction_sequence` (``[BOS] S S``, the induction score's).
        heads: a ``(layer, head)`` pair or a list of them, query-head indexing.

    Returns:
        float32 numpy ``[n_heads, T, T]``: ``[i, q, k]`` = the attention probability (after the softmax,
        in [0, 1]) that query position ``q`` puts on key position ``k`` in head ``heads[i]``; positions are
        token indices of ``input_ids`` (0 = the first token, e.g. BOS). Each row sums to 1; 0 above the
        diagonal (causal) and outside a sliding window. Memory during the forward:
        ``n_layers × n_heads × T² × 4`` bytes (every layer's pattern is kept, then the heads are picked).

    Raises:
        InductionLabError: no heads, a head out of range or not an integer, ``input_ids`` not one non-empty
            sequence of integer ids, an id outside the vocabulary, a sequence longer than the model's context.
    """
    import numpy as np

    model = unwrap_model(model)
    shape = attention_shape(model.config)
    if isinstance(heads, tuple) and len(heads) == 2 and not isinstance(heads[0], (tuple, list)):
        heads = [heads]
    heads = [check_head(*lh, shape["n_layers"], shape["n_heads"])
             if isinstance(lh, (tuple, list, np.ndarray)) and len(lh) == 2 else _not_a_head(lh) for lh in heads]
    if not heads:
        raise InductionLabError("attention_patterns(): heads is empty; pass a (layer, head) pair or a list of them")
    try:
        ids = torch.as_tensor(np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids))
    except (TypeError, ValueError):
        raise InductionLabError("attention_patterns(): input_ids must be one sequence of token ids, "
                                "[T] or [1, T]") from None
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if (ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.dtype.is_complex
            or ids.dtype == torch.bool):
        raise InductionLabError(f"attention_patterns(): input_ids must be one non-empty sequence of integer token ids, "
                                f"[T] or [1, T]; got shape {tuple(ids.shape)}, dtype {ids.dtype}")
    V, ctx = shape["vocab_size"], shape["max_position_embeddings"]
    bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
    if not 0 <= bad < V:
        raise InductionLabError(f"attention_patterns(): token id {bad} is outside the model's vocabulary 0-{V - 1}")
    if ctx and ids.numel() > ctx:
        raise InductionLabError(f"attention_patterns(): {ids.numel()} tokens exceed the model's context of {ctx}; "
                                "pass a shorter sequence")
    with torch.inference_mode(), instrument(model, keep_patterns=True) as inst:
        model(input_ids=ids.long()[None].to(execution_device(model)))
    return np.stack([inst.patterns[l][0, h].numpy() for l, h in heads]).astype(np.float32, copy=False)


def _not_a_head(x):
    raise InductionLabError(f"attention_patterns(): {x!r} is not a (layer, head) pair")


def source_values(outputs: torch.Tensor, positions, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A head's source-run outputs ``[B, T, head_dim]`` (:func:`head_outputs`) at ``positions``, as the
    ``value`` of a ``patch`` / ``resample`` intervention: ``[B, P, head_dim]``, row by row the outputs at the
    positions ``positions`` names in the source (``"all"``: every real token; ``"last"``: the last token;
    ints: absolute positions, negative ones from the end), in position order.

    Raises:
        InductionLabError: rows of the source that name different numbers of positions."""
    B, T, _ = outputs.shape
    real = torch.ones(B, T, dtype=torch.bool, device=outputs.device) if attention_mask is None \
        else attention_mask.to(outputs.device, torch.bool)
    abs_pos = torch.where(real, real.long().cumsum(1) - 1, torch.full((B, T), -1, device=outputs.device))
    sel = query_mask(positions, Positions(abs_pos, abs_pos))
    sel = real if sel is None else sel
    counts = sel.sum(1)
    if bool((counts != counts[0]).any()):
        raise InductionLabError(f"the source rows name {sorted(set(counts.tolist()))} positions; give every source "
                                "row the same number (pad the source like the target)")
    return outputs[sel].reshape(B, int(counts[0]), -1)


@contextlib.contextmanager
def ablate(model, heads: Iterable[tuple[int, int]], method: str = DEFAULT_METHOD, *,
           reference_ids: torch.Tensor | None = None, reference_mask: torch.Tensor | None = None,
           source_ids: torch.Tensor | None = None, source_mask: torch.Tensor | None = None,
           positions="all", reference_positions=None, rows=None, means: torch.Tensor | None = None,
           source_outputs: Mapping | None = None, strict: bool = True) -> Iterator[Instrumentation]:
    """Ablate (or patch) a set of query heads while the block runs.

    Args:
        model: the model (or a LoadedModel bundle).
        heads: ``(layer, head)`` integer pairs, query-head indexing.
        method: a name in :func:`ablation_methods` (``zero`` | ``mean`` | ``sink`` | ``resample`` built in,
            ``patch`` with a source; ``knockout`` needs edges: use :func:`instrument`).
        reference_ids: ``[B, T]`` reference batch for methods that need a value (``mean``).
        reference_mask: optional ``[B, T]`` attention mask of the reference batch (padding is
            left out of the mean).
        source_ids, source_mask: ``[B, T']`` the source run of ``patch`` / ``resample`` (another prompt; random
            tokens): each head's output there, at ``positions`` (:func:`source_values`), replaces its output
            at the same named positions here, row by row.
        positions: the queries the edit applies at (:attr:`HeadIntervention.positions`: ``"all"``, ``"last"``
            — each forward call's last query, so under KV-cached generation the prompt's last token and
            every generated one — or positions); mask edits (``sink``) need ``"all"``.
        reference_positions: the token class of the ``mean`` (default: ``positions``): e.g. ``"last"``
            for Todd et al. 2024's mean at the last position of clean prompts.
        rows: the batch rows edited (None: every row).
        means: ``[n_layers, n_heads, head_dim]``, the heads' ``mean`` values computed beforehand (e.g. by
            :func:`head_output_means` over prompts of the study's choosing, once for many conditions); given,
            ``reference_ids`` is not read.
        source_outputs: ``(layer, head)`` -> the head's outputs ``[B, T', head_dim]`` in the source run, computed
            beforehand (:func:`head_outputs` of ``source_ids``, e.g. once for every head and many conditions);
            given, ``source_ids`` is not run (``source_mask`` still names its padding).

    The ablation is per thread and per model: it edits only the forwards of the thread that
    opened it (another thread's forward of the same model meanwhile runs unablated), a second
    ``ablate()`` / :func:`instrument` of the same model while it is open is refused, and the
    model runs in eval mode inside. A KV cache computed outside the block (or under another
    ablation) is refused when passed to a forward inside it (:class:`StaleKVCache`): recompute
    the prefix inside the block.

    Raises:
        InductionLabError: unknown method, head out of range or not an integer, ``mean``
            without reference_ids, ``patch`` / ``resample`` without source_ids, bad positions or rows, no
            heads (nothing would be ablated: almost surely a bug; run the model without ``ablate()`` for the
            intact model); :class:`AlreadyInstrumented`, :class:`StaleKVCache` (see :func:`instrument`).
    """
    heads = list(heads)
    if not heads:
        raise InductionLabError("ablate(): heads is empty, so nothing would be ablated; pass at least one "
                                "(layer, head) pair, or run the model without ablate() for the intact model")
    model = unwrap_model(model)
    refuse_static(model)          # before the head grid is read: a model without one is refused by name
    m = ablation_method(method)
    if m.needs == "edges":
        raise InductionLabError(f"{method} needs edges; use instrument(model, [HeadIntervention(layer, head, "
                                f"{method!r}, edges=...)]) or one of {', '.join(ablation_methods())}")
    shape = attention_shape(model.config)
    heads = [check_head(*lh, shape["n_layers"], shape["n_heads"]) for lh in heads]
    values: dict = {}
    if m.needs == "value" and means is not None:
        if tuple(means.shape[:2]) != (shape["n_layers"], shape["n_heads"]):
            raise InductionLabError(f"means of shape {tuple(means.shape)} for a model of {shape['n_layers']} layers x "
                                    f"{shape['n_heads']} heads; give [n_layers, n_heads, head_dim]")
        values = {(l, h): means[l, h] for l, h in heads}
    elif m.needs == "value":
        if reference_ids is None:
            raise InductionLabError(f"{method} ablation needs a reference batch (reference_ids)")
        means = head_output_means(model, reference_ids, attention_mask=reference_mask,
                                  positions=positions if reference_positions is None else reference_positions)
        values = {(l, h): means[l, h] for l, h in heads}
    elif m.needs in ("source", "random") and source_outputs is not None:
        values = {lh: source_values(source_outputs[lh], positions, source_mask) for lh in heads}
    elif m.needs in ("source", "random"):
        if source_ids is None:
            raise InductionLabError(f"{method} needs a source run: pass source_ids (another prompt's ids, or random "
                                    "tokens of the same shape for resample)")
        outs = head_outputs(model, source_ids, heads, attention_mask=source_mask)
        values = {lh: source_values(o, positions, source_mask) for lh, o in outs.items()}
    ivs = [HeadIntervention(l, h, method, value=values.get((l, h)), positions=positions, rows=rows) for l, h in heads]
    with instrument(model, ivs, strict=strict) as inst:
        yield inst


def self_check(model, input_ids: torch.Tensor, *, atol: float = 1e-4) -> dict:
    """Prove the instrumentation is live and transparent on this model.

    1. Instrumented forward without interventions equals the plain forward (bit-identical
       when both use the same kernel; within ``atol`` across kernels).
    2. Zero-ablating every head of the middle layer changes the logits.

    Returns: ``{"max_abs_diff_plain": float, "ablation_changes_logits": True}``.

    Raises:
        UnsupportedArchitecture: the registered function was never called, or ablation is a no-op.
        AssertionError: instrumented logits differ from plain logits.
    """
    with torch.inference_mode():
        plain = model(input_ids=input_ids).logits.float()
        with instrument(model, need_probs=model.config._attn_implementation == "eager") as inst:
            same = model(input_ids=input_ids).logits.float()
        if inst.calls == 0:
            raise UnsupportedArchitecture(f"{type(model).__name__} does not dispatch through AttentionInterface")
        diff = (plain - same).abs().max().item()
        if diff > atol:
            raise AssertionError(f"instrumented logits differ from plain logits by {diff:.3g} > {atol}")
        shape = attention_shape(model.config)
        mid = shape["n_layers"] // 2
        with ablate(model, [(mid, h) for h in range(shape["n_heads"])], strict=False):
            abl = model(input_ids=input_ids).logits.float()
        if torch.equal(abl, plain):
            raise UnsupportedArchitecture("zero-ablating a whole layer did not change the logits: the "
                                          "instrumentation is not reaching the model")
    return {"max_abs_diff_plain": diff, "ablation_changes_logits": True}
