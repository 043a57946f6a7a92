"""Reuse of the residual stream across ablation conditions (issue 12, item 5).

Every condition of a protocol reads the same trials. When a condition ablates no head below
layer ``l``, the hidden state entering layer ``l`` is the intact model's, so layers ``0..l-1``
need not run again: a :class:`ResidualCache` records that state in one pass and feeds it to
layer ``l`` in the later ones.

How, per forward call of the model (while :meth:`ResidualCache.use` is open):

1. the call is *eligible* when the model's attention is instrumented (an ablation is open: a
   state is recorded and served only in passes that run one attention function, so it is
   bit-identical to the one it replaces; the intact condition runs plainly and is not served),
   it is called with keywords only, starts afresh (no past KV cache, ``use_cache``
   not asked for: skipped layers would leave their cache slots empty) and no instrumentation
   reads layers below ``l`` (reductions, patterns, head means);
2. its key is every argument except ``logits_to_keep`` / ``use_cache`` (tensors compared with
   ``torch.equal``), so a state is only ever fed to the very call that produced it;
3. *replay*: for the deepest recorded level ``b ≤ l``, the forwards of layers ``0..b-1`` are
   swapped for one returning the recorded state (``use_cache=False``), and a pre-hook on layer
   ``b`` checks that the recorded tensor itself arrived there (nothing ran in between);
4. *record*: outputs of layers ``v-1`` for the wanted levels ``v`` in ``(b, l]`` not yet held are
   kept on the CPU, until ``max_bytes`` is spent.

Only the architectures tested bit for bit (``SUPPORTED``) take this path; others run plainly.
"""

from __future__ import annotations

import contextlib

import torch

from .placement import execution_device

SUPPORTED = ("llama", "qwen2", "gemma3_text", "gpt2", "gpt_neox")   # tested in tests/test_reuse.py
_IGNORED = ("logits_to_keep", "use_cache")                         # arguments that do not change hidden states


def decoder_layers(model) -> torch.nn.ModuleList | None:
    """The decoder layers of a supported architecture, in order; None for any other model."""
    if getattr(getattr(model, "config", None), "model_type", None) not in SUPPORTED:
        return None
    base = model.base_model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def first_ablated_layer(heads, n_layers: int) -> int:
    """The lowest layer among ``(layer, head)`` pairs; ``n_layers`` when there are none (intact)."""
    return min((int(l) for l, _ in heads), default=n_layers)


class ResidualCache:
    """Hidden states entering decoder layers, per model call, for reuse by later conditions.

    Args:
        model: a transformers causal LM of a :data:`SUPPORTED` architecture.
        levels: layers whose incoming state is worth keeping (the conditions' first ablated
            layers; 0 and ``n_layers`` are dropped: nothing to skip / nothing to feed).
        max_bytes: bound on the states held (CPU memory; one state is ``[B, T, hidden]`` in the
            model dtype, plus its call's tensor arguments). Past it, calls run without recording.

    Raises:
        ValueError: the architecture is not supported (check with :func:`decoder_layers`).
    """

    def __init__(self, model, levels, max_bytes: int = 4 << 30):
        self.model, self.layers = model, decoder_layers(model)
        if self.layers is None:
            raise ValueError(f"{type(model).__name__}: residual reuse supports {', '.join(SUPPORTED)} only")
        self.levels = sorted({int(v) for v in levels if 0 < int(v) < len(self.layers)})
        self.max_bytes, self.nbytes = max_bytes, 0
        self.states: dict[tuple, list] = {}   # (level, fingerprint) -> [(key, state, tuple_out)]
        self.skipped = 0                      # layer passes not computed (for the record)

    def add_levels(self, conditions) -> None:
        """Also keep the states entering the first ablated layers of ``conditions`` (a later phase's
        conditions served by the same cache)."""
        n = len(self.layers)
        self.levels = sorted(set(self.levels) | {v for v in (first_ablated_layer(c.heads, n) for c in conditions)
                                                 if 0 < v < n})

    def _key(self, args, kwargs):
        """Key of an eligible call (its arguments but ``_IGNORED``), else None."""
        from .attention import _ACTIVE, FUNCTION_NAME   # here: importing this module does not import transformers

        if args or self.model.config._attn_implementation != FUNCTION_NAME or kwargs.get("use_cache") \
                or kwargs.get("output_hidden_states") or kwargs.get("output_attentions") \
                or any(kwargs.get(n) is not None for n in ("past_key_values", "cache", "inputs_embeds")) \
                or not isinstance(kwargs.get("input_ids"), torch.Tensor):
            return None
        slot = next((_ACTIVE[id(m)] for m in self.layers[0].modules() if id(m) in _ACTIVE), None)
        if slot is not None and (slot.inst.reduction_targets or slot.inst.keep_patterns or slot.inst.capture_head_means
                                 or slot.inst.capture_heads):
            return None                   # an instrumentation that reads every layer
        return {k: v for k, v in kwargs.items() if k not in _IGNORED}

    @staticmethod
    def _fingerprint(key) -> tuple:
        ids = key["input_ids"]
        return tuple(ids.shape), hash(ids.cpu().numpy().tobytes())

    @staticmethod
    def _same(a: dict, b: dict) -> bool:
        if a.keys() != b.keys():
            return False
        for k, x in a.items():
            y = b[k]
            if isinstance(x, dict) or isinstance(y, dict):   # masks by layer type (the all-cue lag probe)
                if not (isinstance(x, dict) and isinstance(y, dict) and ResidualCache._same(x, y)):
                    return False
            elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                        and x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())):
                    return False
            elif x != y:
                return False
        return True

    def _find(self, level: int, fp: tuple, key: dict):
        for k, state, tuple_out in self.states.get((level, fp), ()):
            if self._same(k, key):
                return state, tuple_out
        return None

    @contextlib.contextmanager
    def use(self, first_ablated: int):
        """Serve the model's calls in this block: reuse states below ``first_ablated`` (the
        condition's lowest ablated layer; ``n_layers`` for intact) and record those up to it."""
        model, layers, call = self.model, self.layers, {}

        def pre(module, args, kwargs):
            call.clear()
            key = self._key(args, kwargs)
            if key is None:
                return None
            fp = self._fingerprint(key)
            hit = next(((v, s) for v in reversed(self.levels) if v <= first_ablated
                        for s in [self._find(v, fp, key)] if s is not None), None)
            b = hit[0] if hit else 0
            call.update(key=key, fp=fp, record=[v for v in self.levels if b < v <= first_ablated
                                                and self._find(v, fp, key) is None])
            if hit is None:
                return None
            state, tuple_out = hit[1]
            state = state.to(execution_device(model))
            out = (state,) if tuple_out else state
            saved = [layer.__dict__.get("forward") for layer in layers[:b]]   # e.g. accelerate's wrapper
            for layer in layers[:b]:
                layer.forward = lambda *a, **k: out
            call.update(saved=saved, state=state, patched=b)
            self.skipped += b
            return args, {**kwargs, "use_cache": False}

        def post(module, args, kwargs, output):
            for layer, f in zip(layers, call.get("saved", ())):
                if f is None:
                    del layer.forward
                else:
                    layer.forward = f
            call.clear()

        def check(v):
            def hook(module, args, kwargs):
                h = args[0] if args else kwargs.get("hidden_states")
                if call.get("patched") == v and h is not call["state"]:
                    raise RuntimeError(f"residual reuse: layer {v} did not receive the recorded state; "
                                       "run with reuse off and report the architecture")
            return hook

        def record(v):
            def hook(module, args, kwargs, output):
                if v not in call.get("record", ()) or self.nbytes >= self.max_bytes:
                    return
                h = output[0] if isinstance(output, tuple) else output
                state = h.detach().to("cpu", copy=True)
                key = _to_cpu(call["key"])
                self.states.setdefault((v, call["fp"]), []).append((key, state, isinstance(output, tuple)))
                self.nbytes += state.numel() * state.element_size() + _nbytes(key)
            return hook

        handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
                   model.register_forward_hook(post, with_kwargs=True, always_call=True)]
        for v in self.levels:
            handles.append(layers[v].register_forward_pre_hook(check(v), with_kwargs=True))
            handles.append(layers[v - 1].register_forward_hook(record(v), with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def _nbytes(d: dict) -> int:
    """Bytes of the tensors in a call's arguments (a key is held next to its state)."""
    return sum(x.numel() * x.element_size() if isinstance(x, torch.Tensor) else _nbytes(x) if isinstance(x, dict) else 0
               for x in d.values())


def _to_cpu(d: dict) -> dict:
    """A copy of a call's arguments with every tensor (also inside a dict of masks) on the CPU."""
    return {k: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else _to_cpu(x) if isinstance(x, dict) else x
            for k, x in d.items()}
