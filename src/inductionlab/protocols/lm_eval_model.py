"""lm-evaluation-harness on an ablated model: the lm-eval model type ``inductionlab``.

Importing this module registers :class:`InductionLabLM` with lm-eval (``lm_eval.api.registry``) as
``inductionlab``. It is lm-eval's ``hf`` model (:class:`lm_eval.models.huggingface.HFLM`, subclassed)
whose every forward and generation runs inside one :func:`inductionlab.core.instrument.ablate` context
on the chosen heads: ``_model_call`` (the loglikelihood and rolling-loglikelihood paths, and lm-eval's
batch-size probe) and ``_model_generate`` (``generate_until``, its KV cache built inside the context).
All heads of one model type are edited in the same attention call, by value, at every call: no hook
keeps a reference to a vector that a later one replaces (lm-eval's own ``steered`` model binds its
"add" vectors late). With no ``ablate`` it is the intact model, number for number ``hf``.

``model_args`` (lm-eval's ``key=value,key=value``; :func:`parse_ablate` gives the grammar):

* ``pretrained``: what :func:`inductionlab.load_model` accepts (``smollm2-135m``, a directory, a ``.gguf``,
  a trainer checkpoint); ``dtype`` (default ``auto``) and lm-eval's ``device`` (default: cuda when present);
* ``ablate``: ``top-K[:SCORE]`` (the top K heads by a head score, default ``induction``, from
  :func:`~inductionlab.core.scores.compute_head_scores` seeded ``seed``; ties by (layer, head)),
  ``random-K`` (K heads uniform over all heads: :func:`~inductionlab.core.ablation.random_heads` seeded
  ``seed_for(seed, K, draw)``, the ``random-all-K-d<draw>`` heads of ``evaluate --random all``), or heads
  ``L18H6;L17H3`` (``;``, ``+`` or spaces between them; lm-eval splits model_args at commas);
* ``method``: ``zero`` (default) | ``mean`` | ``sink``; ``positions``: ``all`` (default) | ``last`` (each
  forward's last query);
* ``seed`` (0), ``draw`` (0);
* lm-eval's own ``hf`` arguments that act on a model already loaded (:data:`HF_ARGS`: ``max_length``,
  ``truncation``, ``add_bos_token``, ...); ``batch_size``, ``max_batch_size`` and ``device`` also come from lm-eval's
  ``--batch_size`` / ``--max_batch_size`` / ``--device`` (one of the two, not both).

Parsed strictly, nothing dropped: an unknown key is refused naming it and the known ones; so is a key of ``hf``
that only acts when ``hf`` loads the model itself (:data:`HF_LOADING_ARGS`: ``revision``, ``peft``, ...), an empty
``ablate=``, a key with no value that is a head (``ablate=L0H1,L0H2`` reaches the model as ``ablate=L0H1`` and a key
``L0H2``: heads are separated by ``;`` or ``+``), and a key given both in ``model_args`` and by lm-eval's option.

``mean`` replaces a head's output by its mean over a reference batch, made as in ``evaluate``
(:mod:`inductionlab.studies.evaluate.study`): the first :data:`~inductionlab.protocols.runner.REFERENCE_TRIALS`
random sequences ``[BOS] S S`` (S: :data:`REFERENCE_SEQ_LEN` distinct ordinary tokens, seeded ``seed``),
averaged over :func:`~inductionlab.core.instrument.head_output_means` at ``positions``; computed once.
What was ablated and from what is :attr:`InductionLabLM.intervention` (lm-eval writes it into its
results' ``config`` as ``inductionlab``).

Every argument is checked before the model's first forward: a malformed ``ablate``, a head out of
range, an unknown score or method, K above the head count are one-line ``InductionLabError``.

Command line: ``inductionlab lm-eval run --model inductionlab --model_args pretrained=smollm2-135m,ablate=top-10
--tasks ...`` (:mod:`inductionlab.cli.lm_eval`: registers, then runs lm-eval's own CLI). Python:
``import inductionlab.protocols.lm_eval_model`` then ``lm_eval.simple_evaluate(model="inductionlab", ...)``,
or ``simple_evaluate(model=InductionLabLM(loaded, heads=[(1, 3)]), ...)``.
"""

from __future__ import annotations

import contextlib
import os
import re

import torch

from ..core.ablation import Head, random_heads, top_k_heads
from ..core.instrument import ablate as ablate_heads, check_head, head_output_means
from ..core.models import LoadedModel, attention_shape
from ..core.stimuli import seed_for
from ..errors import InductionLabError
from ..names import ABLATION_METHOD_NEEDS, DEFAULT_METHOD, SCORE_NAMES
from .lm_eval_tasks import _require_lm_eval
from .runner import REFERENCE_TRIALS

_require_lm_eval()

from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

MODEL_NAME = "inductionlab"
REFERENCE_SEQ_LEN = 50   # T of the mean-ablation reference [BOS] S S: evaluate's induction.seq_len (SPEC §3)
METHODS = tuple(m for m, need in ABLATION_METHOD_NEEDS.items() if need in (None, "value"))   # zero, mean, sink
GRAMMAR = "top-K[:SCORE] (e.g. top-10:induction), random-K, or heads like L18H6;L17H3"

#: The model arguments of this model type (text in ``model_args``; ``heads``, ``means``, ``means_source`` and a
#: ``tokenizer`` object are the Python API's).
OWN_ARGS = ("pretrained", "ablate", "heads", "method", "positions", "seed", "draw", "dtype", "device", "tokenizer",
            "means", "means_source")
#: lm-eval ``hf`` arguments that act on a model loaded by inductionlab (passed on to ``HFLM``).
HF_ARGS = ("backend", "truncation", "logits_cache", "max_length", "softmax_dtype", "mixed_precision_dtype",
           "batch_size", "max_batch_size", "add_bos_token", "prefix_token_id", "think_end_token", "enable_thinking",
           "chat_template_args")
#: lm-eval ``hf`` arguments that act only when ``hf`` loads the model itself: refused (they would be ignored).
HF_LOADING_ARGS = ("revision", "subfolder", "use_fast_tokenizer", "trust_remote_code", "parallelize",
                   "max_memory_per_gpu", "max_cpu_memory", "offload_folder", "tp_plan", "peft", "delta", "autogptq",
                   "gptqmodel", "gguf_file")
#: Arguments lm-eval passes from its own options (``--batch_size``, ``--max_batch_size``, ``--device``).
LM_EVAL_OPTIONS = ("batch_size", "max_batch_size", "device")
SEPARATORS = "; or +"          # between heads in ablate= / heads= (lm-eval splits model_args at commas)

_TOP = re.compile(r"top-(?P<k>\d+)(?::(?P<score>[a-z_]+))?")
_RANDOM = re.compile(r"random-(?P<k>\d+)")
_HEAD = re.compile(r"L(?P<l>\d+)H(?P<h>\d+)")


def parse_ablate(spec: str) -> tuple[str, object]:
    """Parse the ``ablate`` model argument (syntax only, no model).

    Returns: ``("top", (k, score))``, ``("random", k)`` or ``("heads", [(layer, head), ...])``.

    Raises:
        InductionLabError: anything else (:data:`GRAMMAR`), k < 1, an unknown score, a head given twice."""
    s = str(spec).strip()
    if m := _TOP.fullmatch(s):
        k, score = int(m["k"]), m["score"] or "induction"
        if score not in SCORE_NAMES:
            raise InductionLabError(f"ablate={spec!r}: unknown head score {score!r}; use one of "
                                    f"{', '.join(SCORE_NAMES)}")
        if k < 1:
            raise InductionLabError(f"ablate={spec!r}: k must be >= 1")
        return "top", (k, score)
    if m := _RANDOM.fullmatch(s):
        if int(m["k"]) < 1:
            raise InductionLabError(f"ablate={spec!r}: k must be >= 1")
        return "random", int(m["k"])
    parts = [p for p in re.split(r"[;+\s]+", s) if p]
    heads = [(int(m["l"]), int(m["h"])) for p in parts if (m := _HEAD.fullmatch(p))]
    if not parts or len(heads) != len(parts):
        raise InductionLabError(f"ablate={spec!r} is not a head selection; use {GRAMMAR}")
    if len(set(heads)) != len(heads):
        raise InductionLabError(f"ablate={spec!r} names a head twice; give each once")
    return "heads", heads


def parse_heads(value, name: str = "heads") -> list[Head]:
    """The ``heads`` model argument as ``(layer, head)`` pairs: text in :func:`parse_ablate`'s head grammar
    (``L0H1;L0H2``) or a sequence of pairs (the Python API, a JSON ``model_args``).

    Raises:
        InductionLabError: anything else, naming ``name`` and the grammar."""
    usage = f"give heads like L18H6;L17H3 ({SEPARATORS} between them) or (layer, head) pairs"
    if isinstance(value, str):
        if not value.strip():
            raise InductionLabError(f"{name}= is empty; {usage}, or leave {name} out for the intact model")
        try:
            kind, heads = parse_ablate(value)
        except InductionLabError:
            kind = None
        if kind != "heads":
            raise InductionLabError(f"{name}={value!r} is not a list of heads; {usage}")
        return heads
    try:
        pairs = [tuple(p) for p in value]
    except TypeError:
        raise InductionLabError(f"{name}={value!r} is not a list of heads; {usage}") from None
    if any(len(p) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in p) for p in pairs):
        raise InductionLabError(f"{name}={value!r} is not a list of heads; {usage}")
    return [(int(l), int(h)) for l, h in pairs]


def check_model_args(args: dict, from_lm_eval: dict | None = None) -> None:
    """Refuse what the model type would ignore (module docstring): unknown keys (naming the known ones), keys of
    ``hf`` that act only when it loads the model, a key with no value (a head cut off at a comma), an empty
    ``ablate=``, a key set both in ``args`` and by lm-eval's own option (``from_lm_eval``, its non-None values).

    Raises:
        InductionLabError: the first such key, with the fix."""
    import difflib

    for key, value in args.items():
        if key in HF_LOADING_ARGS:
            raise InductionLabError(f"model argument {key}= has no effect with --model {MODEL_NAME} (inductionlab loads "
                                    "the model itself; lm-eval's hf applies it only to a model it loads); drop it")
        if key in OWN_ARGS or key in HF_ARGS:
            continue
        if value == "" and (_HEAD.fullmatch(str(key).strip()) or _TOP.fullmatch(str(key).strip())
                            or _RANDOM.fullmatch(str(key).strip())):
            raise InductionLabError(f"model argument {key!r} has no value: lm-eval splits model_args at commas, so a "
                                    f"second head after a comma arrives as a key; separate heads with {SEPARATORS} "
                                    f"(ablate=L0H1;L0H2)")
        close = difflib.get_close_matches(str(key), OWN_ARGS + HF_ARGS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InductionLabError(f"unknown model argument {key!r} for --model {MODEL_NAME}; {hint}known: "
                                f"{', '.join(OWN_ARGS[:9])} and lm-eval hf's {', '.join(HF_ARGS)}")
    if "ablate" in args and isinstance(args["ablate"], str) and not args["ablate"].strip():
        raise InductionLabError(f"ablate= is empty; give {GRAMMAR}, or leave ablate out for the intact model")
    for key, value in (from_lm_eval or {}).items():
        if value is not None and key in args:
            raise InductionLabError(f"model argument {key}={args[key]} and lm-eval's --{key} {value} both set {key}; "
                                    f"give it once (drop {key}= from --model_args or --{key})")


def reference_ids(loaded: LoadedModel, seed: int = 0, seq_len: int = REFERENCE_SEQ_LEN) -> torch.Tensor:
    """The mean-ablation reference batch ``[REFERENCE_TRIALS, 2 * seq_len + 1]``: ``[BOS] S S`` with S of
    ``seq_len`` distinct ordinary tokens (``evaluate``'s reference, :func:`~inductionlab.core.stimuli.random_sequences`
    seeded ``seed``; no BOS when the tokenizer has none)."""
    from ..core.scores import build_sequences
    from ..core.stimuli import ordinary_token_ids, random_sequences

    pool = ordinary_token_ids(attention_shape(loaded.model.config)["vocab_size"], (), loaded.tokenizer)
    S = random_sequences(pool, REFERENCE_TRIALS, min(seq_len, len(pool)), seed)
    return build_sequences(S, "induction", loaded.tokenizer.bos_token_id)


def _load(pretrained, tokenizer, dtype, device) -> LoadedModel:
    from ..core.support import load_model

    if isinstance(pretrained, LoadedModel):
        return pretrained
    if isinstance(pretrained, torch.nn.Module):
        if tokenizer is None:
            raise InductionLabError("InductionLabLM(pretrained=<model object>) needs tokenizer=; or pass a "
                                    "LoadedModel (inductionlab.load_model) or a spec")
        return LoadedModel(pretrained, tokenizer, {"name": type(pretrained).__name__,
                                                   **attention_shape(pretrained.config)})
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return load_model(str(pretrained), dtype=dtype or "auto", device=str(device))


@register_model(MODEL_NAME)
class InductionLabLM(HFLM):
    """lm-eval's ``hf`` model with every forward and generation inside one inductionlab ablation (module docstring).

    Args:
        pretrained: a :func:`~inductionlab.load_model` spec or path, a LoadedModel, or a model object (with
            ``tokenizer``).
        ablate: the heads (:func:`parse_ablate`'s grammar); None: intact.
        heads: ``(layer, head)`` pairs instead of ``ablate`` (the Python API; not both).
        method: ``zero`` | ``mean`` | ``sink``.
        positions: ``all`` | ``last``.
        seed, draw: seeds of the head scores, random heads and the mean-ablation reference.
        means: ``[n_layers, n_heads, head_dim]`` precomputed mean outputs for ``mean`` (e.g. a study's own
            reference); given, no reference batch runs.
        means_source: what ``means`` were computed from, for the record.
        dtype, device: of :func:`~inductionlab.load_model` (a loaded model stays where it is).
        kwargs: :class:`~lm_eval.models.huggingface.HFLM`'s (``batch_size``, ``max_length``, ...).

    Attributes:
        heads: the ablated heads, query-head indexing (empty: intact).
        intervention: the record: heads, method, positions, selection, seeds, the reference used.

    Raises:
        InductionLabError: before any forward, as the module docstring says.
    """

    def __init__(self, pretrained="smollm2-135m", ablate: str | None = None, *, heads=None,
                 method: str = DEFAULT_METHOD, positions: str = "all", seed: int = 0, draw: int = 0,
                 means: torch.Tensor | None = None, means_source: str | None = None, dtype: str | None = "auto",
                 device: str | None = None, tokenizer=None, **kwargs) -> None:
        check_model_args(dict(kwargs) | ({"ablate": ablate} if isinstance(ablate, str) else {}))
        if ablate is not None and heads is not None:
            raise InductionLabError("InductionLabLM: give ablate= or heads=, not both")
        if isinstance(pretrained, (str, os.PathLike)) and tokenizer is not None:
            raise InductionLabError("model argument tokenizer= has no effect with pretrained= a name or path (the "
                                    "model's own tokenizer is loaded with it); drop it")
        heads = parse_heads(heads) if heads is not None else None
        sel = parse_ablate(ablate) if ablate not in (None, "none") else None
        if method not in METHODS:
            raise InductionLabError(f"method={method!r}: use one of {', '.join(METHODS)} (resample and patch need a "
                                    "source run per prompt, which lm-eval requests do not carry)")
        if positions not in ("all", "last"):
            raise InductionLabError(f"positions={positions!r}: use all or last (the last query of each forward)")
        if method == "sink" and positions != "all":
            raise InductionLabError("method=sink edits the attention mask at every query; use positions=all")
        for name, v in (("seed", seed), ("draw", draw)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InductionLabError(f"{name}={v!r} must be an integer >= 0")
        loaded = _load(pretrained, tokenizer, dtype, device)
        shape = attention_shape(loaded.model.config)
        L, H = shape["n_layers"], shape["n_heads"]
        record: dict = {"method": method, "positions": positions, "seed": seed}
        if heads is not None:
            chosen = [check_head(l, h, L, H) for l, h in heads]
            record["selection"] = "heads"
        elif sel is None:
            chosen = []
            record["selection"] = "intact"
        else:
            chosen = self._select(loaded, sel, (L, H), seed, draw, record)
        record["heads"] = [list(h) for h in chosen]
        if chosen and ABLATION_METHOD_NEEDS[method] == "value":
            if means is None:
                means = head_output_means(loaded.model, reference_ids(loaded, seed).to(loaded.model.device),
                                          positions=positions)
                means_source = (f"head_output_means over {REFERENCE_TRIALS} random [BOS] S S sequences "
                                f"(T={REFERENCE_SEQ_LEN}, ordinary tokens, seed {seed}) at positions={positions}")
            record["reference"] = means_source or "means given by the caller"
        self.loaded, self.heads, self.method, self.positions = loaded, chosen, method, positions
        self._means = means
        self.intervention = record
        kwargs.pop("pretrained", None)
        super().__init__(pretrained=loaded.model, tokenizer=loaded.tokenizer, **kwargs)

    @staticmethod
    def _select(loaded: LoadedModel, sel, shape: tuple[int, int], seed: int, draw: int, record: dict) -> list[Head]:
        kind, arg = sel
        L, H = shape
        if kind == "heads":
            record["selection"] = "heads"
            return [check_head(l, h, L, H) for l, h in arg]
        k = arg[0] if kind == "top" else arg
        if k > L * H:
            raise InductionLabError(f"ablate={kind}-{k}: the model has {L * H} heads ({L} layers x {H}); use k <= "
                                    f"{L * H}")
        if kind == "random":
            record.update(selection=f"random-{k}", draw=draw, draw_seed="seed_for(seed, k, draw)")
            return random_heads(shape, k, seed=seed_for(seed, k, draw))
        from ..core.scores import compute_head_scores

        score = arg[1]
        with torch.inference_mode():
            hs = compute_head_scores(loaded.model, tokenizer=loaded.tokenizer, names=(score,), seed=seed,
                                     induction_loss=False)
        record.update(selection=f"top-{k}:{score}", scores=hs.params)
        return top_k_heads(hs[score], k)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm-eval's constructor from ``model_args`` text (``key=value,key=value``), refusing what would be dropped
        (:func:`check_model_args`) before the model loads."""
        from lm_eval.utils import simple_parse_args_string

        check_model_args(simple_parse_args_string(arg_string), additional_config)
        return super().create_from_arg_string(arg_string, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's constructor from ``model_args`` as a mapping (its command line's), checked as
        :meth:`create_from_arg_string`."""
        check_model_args(dict(arg_dict), additional_config)
        return super().create_from_arg_obj(arg_dict, additional_config)

    def _intervention(self):
        """The ablation context of one call (a null context when intact)."""
        if not self.heads:
            return contextlib.nullcontext()
        return ablate_heads(self.loaded.model, self.heads, self.method, positions=self.positions, means=self._means)

    def _model_call(self, inps, attn_mask=None, labels=None):
        with self._intervention():
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with self._intervention():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def get_model_info(self) -> dict:
        """The model's identity and the intervention, for lm-eval's results ``config`` (no network: HFLM's
        own looks a hub revision up)."""
        ident = {k: v for k, v in self.loaded.identity.items() if isinstance(v, (str, int, float, bool, type(None)))}
        return {"model_num_parameters": sum(p.numel() for p in self.loaded.model.parameters()),
                "model_dtype": str(self.loaded.model.dtype), "inductionlab": {"model": ident, **self.intervention}}


__all__ = ["MODEL_NAME", "GRAMMAR", "METHODS", "REFERENCE_SEQ_LEN", "OWN_ARGS", "HF_ARGS", "HF_LOADING_ARGS",
           "InductionLabLM", "parse_ablate", "parse_heads", "check_model_args", "reference_ids"]
