"""The protocol runner: conditions × batches × ablation, written once.

A behavioural protocol (the lag probe, serial recall, your own probe) is a :class:`Probe`: a small value
bound to its config (``lag_probe.probe(cfg)``) that holds

1. ``build_trials(loaded)``: every trial as tensors with a leading trial axis —
   a dict ``{"ids": LongTensor [n_trials, T], ...}`` (``ids`` is what the model reads; other
   entries, e.g. the target ids of each trial, travel with it batch by batch; trials of
   different lengths are left-padded by :meth:`Trials.padded`, which adds the
   ``attention_mask`` / ``position_ids`` of :func:`pad_left`);
2. ``measure_batch(model, batch) -> {name: Tensor [b, ...]}``: per-trial measures of one batch
   (``batch`` holds the same keys as the trials, sliced and on the model's device);
3. its batch size (trials per forward), decided there and nowhere else, and its ablation method.

:func:`run_conditions` then does the rest, identically for every protocol: for each
:class:`~inductionlab.core.ablation.Condition` in order it opens :func:`~inductionlab.core.instrument.ablate`
on the condition's heads (none for ``intact``; a method whose table entry needs a value —
``mean``: :data:`inductionlab.names.ABLATION_METHOD_NEEDS` — gets the reference batch
:attr:`Trials.reference`, by default the first :data:`REFERENCE_TRIALS` trials), runs the trials in batches of
``batch_size`` under ``torch.inference_mode``, reports progress in trials, and concatenates
each measure over batches into a numpy array ``[n_trials, ...]``. Every condition sees the
same trials in the same order, so differences between conditions are paired — and so a
condition that ablates nothing below layer ``l`` is fed the hidden state entering ``l`` recorded
by an earlier ablated condition on the same batch, skipping layers ``0..l-1`` (bit-identical;
:mod:`inductionlab.core.reuse`; ``reuse=False`` turns it off). Given a
:class:`~inductionlab.runtime.distributed.Dist` of several processes (torchrun) it runs batch ``b`` on
rank ``b % world_size`` and gathers the batches back in order, so every rank gets the arrays of
one process (:mod:`inductionlab.runtime.distributed`).

Batches here are rectangular. Sequences of different lengths go through :func:`pad_left`
(:meth:`Trials.padded`), which derives ``position_ids`` from the attention mask (left padding
otherwise shifts every real token's position: TransformerLens #1609, nnsight #672);
:func:`trim_padding` then cuts a batch's columns that are padding in every one of its trials,
so a batch is what :func:`pad_left` makes of its own sequences, and :func:`model_inputs` gives
the model its ``input_ids`` / ``attention_mask`` / ``position_ids``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..core.models import cache_keyword, forward, returned_cache
from ..core.reuse import first_ablated_layer
from ..core.placement import execution_device
from ..errors import InductionLabError
from ..names import ABLATION_METHOD_NEEDS, DEFAULT_METHOD
from ..runtime import distributed as D

REFERENCE_TRIALS = 8   # trials in the mean-ablation reference batch (decision: the first 8 of the run)


def needs_reference(method: str) -> bool:
    """Whether ``method`` needs a value computed from a reference batch (its table entry's
    ``needs == "value"``: ``mean``), so the runner builds one."""
    return ABLATION_METHOD_NEEDS.get(method) == "value"


@dataclass
class Trials:
    """All trials of a protocol run.

    Attributes:
        tensors: ``{"ids": LongTensor [n_trials, T], ...}``; every entry has the trial axis first
            and is sliced into batches alongside ``ids``. Left-padded trials also carry
            ``attention_mask`` / ``position_ids`` (LongTensor ``[n_trials, T]``, as
            :func:`pad_left` builds them; :meth:`padded`), handed to ``measure_batch`` with ``ids``.
        words: the word set the trials were drawn from (for the record; may be empty).
        reference: ``[B, T']`` ids of the reference batch for a method that needs a value
            (:func:`needs_reference`); None: the first :data:`REFERENCE_TRIALS` trials (with
            their attention mask when padded).
        reference_means: ``[n_layers, n_heads, head_dim]``: that value computed beforehand (e.g. each head's
            mean at the last position of other prompts); given, no reference batch runs.
        source_outputs: per batch (first trial, size), every head's outputs in that batch's source run of
            ``resample`` / ``patch`` (filled by :func:`run_conditions`, so later conditions on the same trials skip
            the source forward; bounded by :data:`SOURCE_CACHE_BYTES`).
    """
    tensors: dict[str, torch.Tensor]
    words: list[str] = field(default_factory=list)
    reference: torch.Tensor | None = None
    reference_means: torch.Tensor | None = None
    source_outputs: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.tensors["ids"])

    def head(self, n: int) -> "Trials":
        """The first ``n`` trials (e.g. a cheaper condition that reuses the start of a run)."""
        return Trials({k: v[:n] for k, v in self.tensors.items()}, self.words, self.reference, self.reference_means,
                      self.source_outputs)

    @classmethod
    def padded(cls, seqs: Sequence[Sequence[int]], pad_id: int, **extra: torch.Tensor) -> "Trials":
        """Token id lists of any lengths, left-padded by :func:`pad_left` into ``ids`` /
        ``attention_mask`` / ``position_ids`` ``[n_trials, T_max]``; ``extra`` tensors (trial axis
        first) travel with them. No sequences: ``ids`` of shape ``[0, 1]``."""
        if len(seqs):
            p = pad_left(seqs, pad_id)
        else:
            p = {k: torch.zeros((0, 1), dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids")}
        return cls({"ids": p["input_ids"], "attention_mask": p["attention_mask"], "position_ids": p["position_ids"],
                    **extra})

    def reference_batch(self, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(ids, attention_mask or None)`` of the reference batch, on ``device``."""
        if self.reference is not None:
            return self.reference.to(device), None
        n = min(REFERENCE_TRIALS, len(self))
        mask = self.tensors.get("attention_mask")
        return self.tensors["ids"][:n].to(device), None if mask is None else mask[:n].to(device)


MeasureBatch = Callable[[torch.nn.Module, dict[str, torch.Tensor]], Mapping[str, torch.Tensor]]


@dataclass(frozen=True, eq=False)
class Probe:
    """A protocol bound to its config: the value a study's phase holds and :func:`run_conditions` runs
    (TransformerLens' ``partial``-bound patching functions, as a value).

    Made by a protocol module's ``probe(cfg)`` (``lag_probe.probe(cfg)``, ``serial_recall.probe(cfg)``), or
    by :meth:`of_trials` for trials built beforehand. Two phases holding the same probe share its
    trials and its residual cache.

    Attributes:
        name: the protocol, for progress bars and messages (``"lag probe"``).
        build_trials: ``(loaded) -> Trials``: every trial, checked against the model (pool, context, vocabulary).
        measure_batch: ``(model, batch) -> {measure: Tensor [b, ...]}`` (the module docstring).
        batch_size: trials per forward: an int, or ``(loaded, trials) -> int | None``; None: :func:`auto_batch_size`
            at the trials' length. The one place a protocol's batch size is decided.
        method: ablation method of the conditions' heads (:data:`inductionlab.names.ABLATION_METHOD_NEEDS`).
        reuse: skip the layers below each condition's first ablated head (bit-identical; :mod:`inductionlab.core.reuse`).
        positions: where an output-edit method applies (``"all"`` | ``"last"``: the last query of each forward).
    """
    name: str
    build_trials: Callable[[Any], "Trials"] = field(repr=False)
    measure_batch: MeasureBatch = field(repr=False)
    batch_size: int | None | Callable[[Any, "Trials"], int | None] = field(default=None, repr=False)
    method: str = DEFAULT_METHOD
    reuse: bool = True
    positions: object = "all"

    @classmethod
    def of_trials(cls, name: str, trials: "Trials", measure_batch: MeasureBatch, *, batch_size: int | None = None,
                  method: str = DEFAULT_METHOD, reuse: bool = True, positions="all") -> "Probe":
        """A probe over trials built beforehand (e.g. with a reference batch of the study's choosing)."""
        return cls(name, lambda loaded: trials, measure_batch, batch_size, method, reuse, positions)

    def trials_per_batch(self, loaded, trials: "Trials") -> int | None:
        """Trials per forward for ``trials`` on ``loaded`` (None: the runner's :func:`auto_batch_size`)."""
        return self.batch_size(loaded, trials) if callable(self.batch_size) else self.batch_size

    def run(self, loaded, conditions: Sequence, trials: "Trials | None" = None, *, progress=None, dist=None,
            reuse=None) -> dict[str, dict[str, np.ndarray]]:
        """:func:`run_conditions` of this probe over ``trials`` (None: :attr:`build_trials`); ``reuse``
        overrides :attr:`reuse` (e.g. a :class:`~inductionlab.core.reuse.ResidualCache` shared by phases)."""
        trials = self.build_trials(loaded) if trials is None else trials
        return run_conditions(loaded, conditions, trials, method=self.method,
                              batch_size=self.trials_per_batch(loaded, trials), measure_batch=self.measure_batch,
                              progress=progress, dist=dist, reuse=self.reuse if reuse is None else reuse,
                              positions=self.positions)


def trim_padding(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch of left-padded trials less the leading columns that are padding in all of them
    (``attention_mask`` 0), so it equals :func:`pad_left` of its own sequences (same shapes, so the
    same numbers as a batch padded alone). Entries ``[b, T]`` like ``ids`` are cut; a batch
    without ``attention_mask`` is returned as it is."""
    mask = batch.get("attention_mask")
    if mask is None or mask.shape[1] == 0:
        return batch
    real = mask.any(0)
    start = int(real.int().argmax()) if bool(real.any()) else mask.shape[1] - 1
    if start == 0:
        return batch
    T = mask.shape[1]
    return {k: v[:, start:] if v.dim() == 2 and v.shape[1] == T else v for k, v in batch.items()}


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The keywords a forward pass of a batch takes: ``input_ids`` (its ``ids``), and its
    ``attention_mask`` / ``position_ids`` when the trials are padded."""
    kw = {"input_ids": batch["ids"]}
    for k in ("attention_mask", "position_ids"):
        if k in batch:
            kw[k] = batch[k]
    return kw


def forward_logits(model, ids: torch.Tensor, keep: int | torch.Tensor = 1, **inputs) -> torch.Tensor:
    """Float32 logits ``[B, n, V]`` at the kept positions of one forward pass.

    Args:
        ids: ``[B, T]`` input ids.
        keep: an int: the last ``keep`` positions (``n = keep``); a LongTensor ``[n]``: those
            positions, in that order.
        inputs: the other keywords of the forward: the ``attention_mask`` / ``position_ids`` of
            left-padded trials (:func:`model_inputs`), a packed forward's 4-D mask.

    The LM head runs on the kept positions only where the architecture allows it
    (:func:`~inductionlab.core.models.forward`, its fallbacks included).
    """
    return forward(model, ids, keep=keep, **inputs).logits.float()


def greedy_tokens(model, ids: torch.Tensor, n: int, attention_mask: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` greedy tokens after ``ids`` ``[B, P]`` → (float32 logits ``[B, V]`` at the prompt's last position,
    long tokens ``[B, n]``).

    One forward of the prompt with a KV cache, then one single-token forward per further token (the
    instrumentation tags the cache with the context's interventions, so an ablation acts on every position of
    every step exactly as on a full forward). Left-padded prompts pass their ``attention_mask`` / ``position_ids``
    ``[B, P]``; both grow by one real position per token. A model that returns no cache gets one full forward of
    the prompt and the tokens so far per token (the same tokens, ``n`` times the cost)."""
    kv = cache_keyword(model)
    extra = {k: v for k, v in (("attention_mask", attention_mask), ("position_ids", position_ids)) if v is not None}
    out = forward(model, ids, keep=1, use_cache=True, **extra)
    past = returned_cache(out)
    first = out.logits[:, -1].float()
    toks = [first.argmax(-1)]
    for _ in range(n - 1):
        nxt = toks[-1][:, None]
        if "attention_mask" in extra:
            extra["attention_mask"] = torch.cat([extra["attention_mask"], torch.ones_like(nxt)], 1)
        if "position_ids" in extra:
            extra["position_ids"] = torch.cat([extra["position_ids"], extra["position_ids"][:, -1:] + 1], 1)
        if past is not None:
            step = dict(extra)
            if "position_ids" in step:
                step["position_ids"] = step["position_ids"][:, -1:]
            out = model(input_ids=nxt, use_cache=True, **{kv: past}, **step)
            past = returned_cache(out)
        else:
            ids = torch.cat([ids, nxt], 1)
            out = model(input_ids=ids, **extra)
        toks.append(out.logits[:, -1].argmax(-1))
    return first, torch.stack(toks, 1)


def auto_batch_size(loaded, seq_len: int, logit_positions: int = 1, cap: int = 64) -> int:
    """Trials per forward pass from free accelerator memory (CPU: 8).

    Heuristic (inference, no gradients): per sequence ≈ seq_len × (24·hidden + 4·heads·head_dim)
    activations in the model dtype, plus one eager attention map heads × seq_len² in float32
    (needed by ``sink`` / reductions), plus ``logit_positions`` × vocab float32 logits ×3
    (logits, softmax, gather). Uses half of the smallest free memory over the devices the model
    occupies.
    """
    params = list(loaded.model.parameters())
    devs = {p.device for p in params if p.device.type == "cuda"} | \
        {d for d in [execution_device(loaded.model)] if d.type == "cuda"}     # offloaded weights: on meta
    if not devs:
        return 8
    free = min(torch.cuda.mem_get_info(d)[0] for d in devs)
    s = loaded.identity
    nbytes = params[0].element_size()
    per = (seq_len * (24 * s["hidden_size"] + 4 * s["n_heads"] * s["head_dim"]) * nbytes
           + s["n_heads"] * seq_len ** 2 * 4 + logit_positions * s["vocab_size"] * 4 * 3)
    return int(max(1, min(cap, 0.5 * free // per)))


def ablation_context(model, heads, method: str = DEFAULT_METHOD, reference_ids: torch.Tensor | None = None,
                     reference_mask: torch.Tensor | None = None, *, positions="all", source_ids=None,
                     source_mask=None, means=None, source_outputs=None):
    """:func:`inductionlab.core.instrument.ablate` over ``heads`` (``(layer, head)`` pairs), or a no-op
    context when ``heads`` is None or empty (an intact condition), so every protocol runs intact and
    ablated through one code path (:func:`~inductionlab.core.instrument.ablate` itself refuses no heads).

    Raises:
        InductionLabError: as :func:`~inductionlab.core.instrument.ablate` (unknown method, a head that is
            not an integer pair in range)."""
    if heads is None or not len(heads):
        return contextlib.nullcontext()
    from ..core.instrument import ablate   # here: importing this module does not import transformers

    return ablate(model, heads, method, reference_ids=reference_ids, reference_mask=reference_mask, positions=positions,
                  source_ids=source_ids, source_mask=source_mask, means=means, source_outputs=source_outputs)


SOURCE_CACHE_BYTES = 1 << 30   # every head's source-run outputs kept per batch across conditions, up to this


def _source_outputs(loaded, method: str, batch: dict, start: int, pool: dict, cache: dict | None):
    """``(outputs, mask)``: every head's outputs ``[b, T, head_dim]`` in this batch's source run (:func:`_source`),
    one forward, kept in ``cache`` (keyed by the batch's first trial and size) while it holds under
    :data:`SOURCE_CACHE_BYTES`."""
    from ..core.instrument import head_outputs
    from ..core.models import attention_shape

    key = (start, int(batch["ids"].shape[0]), method)
    if cache is not None and key in cache:
        return cache[key]
    src, mask = _source(loaded, method, batch, start, pool)
    shape = attention_shape(loaded.model.config)
    outs = head_outputs(loaded.model, src, [(l, h) for l in range(shape["n_layers"]) for h in range(shape["n_heads"])],
                        attention_mask=mask)
    if cache is not None:
        size = sum(o.numel() * o.element_size() for o in outs.values())
        held = sum(o.numel() * o.element_size() for v in cache.values() for o in v[0].values())
        if held + size <= SOURCE_CACHE_BYTES:
            cache[key] = (outs, mask)
    return outs, mask


def per_batch_source(method: str) -> bool:
    """Whether ``method`` takes its values from a source run per batch (``resample``: random tokens the
    runner draws; ``patch``: the batch's own ``source_ids``), so each batch opens its own ablation."""
    return ABLATION_METHOD_NEEDS.get(method) in ("source", "random")


def _source(loaded, method: str, batch: dict, start: int, pool: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The source run of one batch: ``resample``: random ordinary tokens of the batch's shape (seeded by the
    batch's first trial, so every condition sees the same; the batch's padding kept), ``patch``: the batch's
    ``source_ids`` / ``source_attention_mask``.

    Raises:
        InductionLabError: ``patch`` on trials without ``source_ids``."""
    ids, mask = batch["ids"], batch.get("attention_mask")
    if ABLATION_METHOD_NEEDS.get(method) == "source":
        if "source_ids" not in batch:
            raise InductionLabError(f"{method} needs trials with a source run (source_ids); this protocol has none: "
                                    "use zero, mean, sink or resample")
        return batch["source_ids"], batch.get("source_attention_mask")
    if "ids" not in pool:
        from ..core.models import attention_shape
        from ..core.stimuli import ordinary_token_ids

        pool["ids"] = ordinary_token_ids(attention_shape(loaded.model.config)["vocab_size"], (), loaded.tokenizer)
    from ..core.stimuli import seed_for

    gen = torch.Generator().manual_seed(seed_for(0, start))
    rand = pool["ids"][torch.randint(len(pool["ids"]), tuple(ids.shape), generator=gen)].to(ids.device)
    return (rand if mask is None else torch.where(mask.bool(), rand, ids)), mask


def residual_cache(model, conditions: Sequence, max_bytes: int = 4 << 30):
    """A :class:`~inductionlab.core.reuse.ResidualCache` for ``conditions`` (their first ablated layers),
    or None when the architecture is not one it supports (then every condition runs in full)."""
    from ..core.reuse import ResidualCache, decoder_layers, first_ablated_layer

    layers = decoder_layers(model)
    if layers is None:
        return None
    return ResidualCache(model, [first_ablated_layer(c.heads, len(layers)) for c in conditions], max_bytes)


def run_conditions(loaded, conditions: Sequence, trials: Trials | Mapping[str, torch.Tensor], *, method: str = DEFAULT_METHOD,
                   batch_size: int | None = None, measure_batch: MeasureBatch, progress=None,
                   logit_positions: int = 1, dist=None, reuse=True, positions="all") -> dict[str, dict[str, np.ndarray]]:
    """Run ``measure_batch`` over all ``trials`` under each condition.

    Args:
        loaded: a :class:`~inductionlab.core.models.LoadedModel` (anything with ``.model``; ``.identity``
            is read only when ``batch_size`` is None on a GPU).
        conditions: :class:`~inductionlab.core.ablation.Condition` list (``.name``, ``.heads``).
        trials: :class:`Trials`, or its ``tensors`` dict ``{"ids": LongTensor [n_trials, T], ...}``.
        method: ablation method for the conditions' heads (``zero`` | ``mean`` | ``sink`` | ``resample`` |
            ``patch``); one that needs a value (:func:`needs_reference`) is given :meth:`Trials.reference_batch`;
            ``resample`` a random-token source run per batch, ``patch`` the trials' ``source_ids``
            (:func:`per_batch_source`).
        positions: where an output edit applies (:attr:`inductionlab.core.methods.HeadIntervention.positions`:
            ``"all"`` or ``"last"``, the last query of each forward).
        batch_size: trials per forward pass; None: :func:`auto_batch_size` (CPU: 8).
        measure_batch: ``(model, batch) -> {measure: Tensor [b, ...]}`` (see module docstring).
        progress: optional callable(n_trials_done).
        logit_positions: logits kept per trial (for :func:`auto_batch_size` only).
        dist: a :class:`~inductionlab.runtime.distributed.Dist` to shard over (every rank calls with the same
            arguments): batch ``b`` runs on rank ``b % world_size`` and the batches are gathered in
            order, so every rank returns the arrays of one process. None: one process.
        reuse: True: skip the layers below each condition's first ablated head, feeding them the
            hidden state recorded in an earlier pass over the same batch (:mod:`inductionlab.core.reuse`;
            bit-identical results; architectures it does not support run in full); False: every
            condition runs in full; or a :class:`~inductionlab.core.reuse.ResidualCache` shared across
            calls (a study that runs one condition per call).

    Returns:
        condition name -> measure -> numpy array ``[n_trials, ...]`` (dtype as measured). The model
        runs in eval mode (:func:`~inductionlab.core.instrument.eval_mode`; its mode restored after).

    Raises:
        InductionLabError: unknown method, head out of range (from :func:`~inductionlab.core.instrument.ablate`),
            no conditions.
        TypeError: ``loaded`` without ``.model``, a condition not a Condition.
    """
    from ..checks import check_loaded
    from ..core.ablation import check_conditions

    check_loaded(loaded, "run_conditions", needs=("model",))
    check_conditions(conditions, "run_conditions")
    model = loaded.model
    device = execution_device(model)
    if not isinstance(trials, Trials):
        trials = Trials(dict(trials))
    source_cache = trials.source_outputs
    means = trials.reference_means if needs_reference(method) else None
    ref, ref_mask = trials.reference_batch(device) if needs_reference(method) and means is None else (None, None)
    trials = trials.tensors
    ids = trials["ids"]
    n = len(ids)
    bs = D.min_across(batch_size or auto_batch_size(loaded, ids.shape[1], logit_positions), dist)
    main = dist is None or dist.is_main
    cache = residual_cache(model, conditions) if reuse is True else reuse or None
    out: dict[str, dict[str, np.ndarray]] = {}
    pool: dict = {}                                     # resample: the ordinary token ids, once
    from ..core.instrument import eval_mode   # here: importing this module does not import transformers

    with torch.inference_mode(), eval_mode(model):      # dropout off (a model left in train()), mode restored
        mine = list(D.local_batches(n, bs, dist))          # this rank's batch starts (all of them on one process)
        for c in conditions:
            batches: list[dict[str, torch.Tensor]] = []
            serve = cache.use(first_ablated_layer(c.heads, len(cache.layers))) if cache and mine else \
                contextlib.nullcontext()
            # a rank without a batch (fewer batches than ranks) opens no ablation: it would run no forward
            heads = c.heads if mine else None
            each = per_batch_source(method) and heads is not None and len(heads) > 0
            with (contextlib.nullcontext() if each else
                  ablation_context(model, heads, method, ref, ref_mask, positions=positions, means=means)), serve:
                for s in mine:
                    batch = {k: v[s:s + bs].to(device) for k, v in trials.items()}
                    if each:                  # resample / patch: this batch's source run, then its ablation
                        outs, src_mask = _source_outputs(loaded, method, batch, s, pool, source_cache)
                        with ablation_context(model, heads, method, positions=positions, source_outputs=outs,
                                              source_mask=src_mask):
                            measured = measure_batch(model, batch)
                    else:
                        measured = measure_batch(model, batch)
                    batches.append({key: value.cpu() for key, value in measured.items()})
                    if progress is not None and main:
                        progress(D.round_size(s, n, bs, dist))
            batches = D.gather_batches(batches, -(-n // bs), dist)
            out[c.name] = {key: torch.cat([b[key] for b in batches]).numpy() for key in batches[0]} if batches else {}
    return out


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad token id lists into one batch.

    Returns: ``input_ids`` / ``attention_mask`` / ``position_ids``, each LongTensor ``[B, T_max]``;
    positions count real tokens only (0 at each sequence's first real token; pads get 0 too,
    and are masked out of attention).
    """
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        if len(s):
            ids[b, T - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[b, T - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}


def last_token_logits(model, seqs: Sequence[Sequence[int]], pad_id: int = 0) -> torch.Tensor:
    """Logits at each sequence's last token from one left-padded forward pass: float32 ``[B, V]``.

    Asks for the last position only (:func:`~inductionlab.core.models.forward`) where the architecture allows it."""
    device = execution_device(model)
    batch = {k: v.to(device) for k, v in pad_left(seqs, pad_id).items()}
    return forward_logits(model, batch.pop("input_ids"), 1, **batch)[:, -1]
