"""lm-evaluation-harness on our model object, offline.

* :func:`export_lm_eval_tasks` writes our function-style ICL tasks (:mod:`inductionlab.protocols.icl_tasks`)
  as lm-eval tasks: per task a ``NAME.train.jsonl`` / ``NAME.test.jsonl`` (``{"x", "y"}`` per
  line) and a ``NAME.yaml`` over them (``dataset_path: json`` with the files' absolute paths), all
  tagged ``inductionlab_icl``. Any lm-eval user can run them offline:
  ``lm_eval run --include_path DIR --tasks inductionlab_icl --model hf --model_args pretrained=M``.
  The prompt is ours (``Q: x\\nA:``, target ``" y"``, the space part of the target (lm-eval 0.4 adds no
  delimiter to a loglikelihood request), demonstrations joined by a blank line,
  drawn from the train split); the metric is lm-eval's ``acc`` for ``loglikelihood`` tasks: 1
  when the whole answer is the model's greedy continuation (stricter than our first-token HITS@1).
* :func:`run_lm_eval` runs any of those or any installed lm-eval task by name on a loaded model
  (``HFLM(pretrained=model, tokenizer=tokenizer)``), with the datasets library offline; a task
  whose dataset is not on disk is a one-line error naming the task and its dataset, raised
  before any model forward. The record holds the lm-eval version, batch size, few-shot
  settings and limit.

lm-eval is the optional extra ``eval`` (``pip install 'inductionlab[eval]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InductionLabError
from ..runtime.runs import atomic_write_text

TAG = "inductionlab_icl"
PREFIX = "inductionlab_icl_"


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise InductionLabError("lm-evaluation-harness is not installed; install it with: "
                                "pip install 'inductionlab[eval]' (lm-eval>=0.4.13,<0.5)") from None
    from importlib import metadata
    return metadata.version("lm-eval")


def task_yaml(name: str, train: Path, test: Path, description: str = "") -> str:
    """The lm-eval task YAML of one exported task (plain YAML, no includes)."""
    cfg = {
        "task": PREFIX + name,
        "tag": [TAG],
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"train": str(train), "test": str(test)}},
        "training_split": "train",
        "test_split": "test",
        "fewshot_split": "train",
        "output_type": "loglikelihood",
        "doc_to_text": "Q: {{x}}\nA:",
        # the space is the target's own: lm-eval 0.4 joins target_delimiter only in few-shot examples and
        # multiple-choice requests, so with " " as the delimiter a loglikelihood request scored "A:y", not "A: y"
        "doc_to_target": " {{y}}",
        "target_delimiter": "",
        "fewshot_delimiter": "\n\n",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "source": "inductionlab.protocols.icl_tasks", "description": description},
    }
    import yaml
    return yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True)


def export_lm_eval_tasks(out_dir: str | os.PathLike, *, tasks: Sequence[str] | None = None, tokenizer=None,
                         n_test: int = 100, seed: int = 0) -> list[str]:
    """Write our ICL tasks as offline lm-eval tasks (module docstring).

    Args:
        tasks: names from :data:`inductionlab.protocols.icl_tasks.TASK_NAMES` (default all).
        tokenizer: when given, keep only items with a well-defined first answer token for it.
        n_test: test items per task (at most half the pool; the rest is the few-shot train split).

    Returns: the lm-eval task names written (``inductionlab_icl_<task>``).

    Raises: InductionLabError for an unknown task.
    """
    from .icl_tasks import build_tasks, well_defined_items

    out = Path(out_dir).resolve()
    names = []
    for name, task in build_tasks(tasks).items():
        items = well_defined_items(task, tokenizer) if tokenizer is not None else list(task.items)
        order = np.random.default_rng(seed).permutation(len(items))
        k = min(int(n_test), len(items) // 2)
        split = {"test": [items[i] for i in order[:k]], "train": [items[i] for i in order[k:]]}
        paths = {}
        for s, its in split.items():
            paths[s] = out / f"{name}.{s}.jsonl"
            atomic_write_text(paths[s], "".join(json.dumps({"x": it.x, "y": it.y}) + "\n" for it in its))
        atomic_write_text(out / f"{name}.yaml", task_yaml(name, paths["train"], paths["test"], task.description))
        names.append(PREFIX + name)
    return names


@contextlib.contextmanager
def _offline(on: bool):
    """datasets / hub offline while the block runs (env and the already-imported flags), restored after."""
    if not on:
        yield
        return
    import datasets.config as dc
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    old_env = {k: os.environ.get(k) for k in keys}
    old_flags = {k: getattr(dc, k, None) for k in keys}
    os.environ.update({k: "1" for k in keys})
    dc.HF_HUB_OFFLINE = dc.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in old_flags.items():
            setattr(dc, k, v)


def _dataset_of(manager, name: str) -> str:
    entry = manager.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    path = cfg.get("dataset_path")
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if path and files:
        return f"{path} {files}"
    return f"{path}" + (f"/{cfg['dataset_name']}" if cfg.get("dataset_name") else "") if path else "(unknown)"


def load_lm_eval_tasks(names: Sequence[str], *, include_path: str | os.PathLike | None = None, offline: bool = True):
    """Build lm-eval task objects (their datasets loaded), one-line errors for what is missing.

    Returns: ``(task_manager, {name: task_dict})``.

    Raises: InductionLabError: lm-eval missing, unknown task name, or (offline) a task whose
    dataset is not on disk.
    """
    _require_lm_eval()
    from lm_eval.tasks import TaskManager, get_task_dict

    ours_only = all(n == TAG or n.startswith(PREFIX) for n in names)   # skip indexing lm-eval's ~200 task dirs
    tm = TaskManager(include_path=str(include_path) if include_path else None, include_defaults=not ours_only)
    known = set(tm.all_tasks)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InductionLabError(f"unknown lm-eval task(s) {', '.join(map(repr, unknown))}; list them with "
                                "`lm_eval ls tasks`, or pass --include-path for local task YAML")
    built = {}
    for n in names:
        try:
            with _offline(offline):
                built[n] = get_task_dict([n], tm)
        except Exception as e:  # noqa: BLE001 - datasets raises many types when offline
            raise InductionLabError(f"lm-eval task {n!r}: its dataset {_dataset_of(tm, n)} is not on disk "
                                    f"({type(e).__name__}); fetch it into the Hugging Face datasets cache where "
                                    "there is network, or drop the task") from None
    return tm, built


def run_lm_eval(model, tokenizer, tasks: Sequence[str], *, include_path: str | os.PathLike | None = None,
                num_fewshot: int | None = None, batch_size: int = 8, limit: int | float | None = None,
                seed: int = 0, offline: bool = True, lm=None) -> dict:
    """Run lm-eval tasks on an in-memory model.

    Args:
        model, tokenizer: a transformers causal LM and its tokenizer (``load_model(...)``).
        lm: an lm-eval model built beforehand (e.g. an ablated
            :class:`~inductionlab.protocols.lm_eval_model.InductionLabLM`); None: lm-eval's ``hf`` on ``model``.
        tasks: lm-eval task / tag names (our exported ``inductionlab_icl_*`` tasks need
            ``include_path`` = the export directory).
        num_fewshot: demonstrations per prompt (None: each task's default).
        batch_size: lm-eval's batch size.
        limit: at most this many test documents per task (a fraction when < 1).
        seed: lm-eval's random, numpy, torch and few-shot seeds.

    Returns: ``{"lm_eval_version", "tasks", "num_fewshot", "batch_size", "limit", "seed",
    "results": {task: {metric: value}}, "n_samples": {task: {"original", "effective"}},
    "configs": {task: few-shot settings}}`` (+ ``"intervention"``: the ablation record of an ``lm`` that has one).

    Raises: InductionLabError as :func:`load_lm_eval_tasks`, before any forward pass.
    """
    version = _require_lm_eval()
    if num_fewshot is not None and num_fewshot < 0:
        raise InductionLabError(f"num_fewshot must be >= 0, got {num_fewshot}")
    tm, _ = load_lm_eval_tasks(tasks, include_path=include_path, offline=offline)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    if lm is None:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, trust_remote_code=False)
    with _offline(offline):
        res = simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, batch_size=batch_size,
                              limit=limit, task_manager=tm, random_seed=seed, numpy_random_seed=seed,
                              torch_random_seed=seed, fewshot_random_seed=seed, log_samples=False, bootstrap_iters=0)
    configs = {t: {k: c.get(k) for k in ("num_fewshot", "fewshot_split", "fewshot_delimiter", "target_delimiter",
                                         "output_type", "dataset_path")}
               for t, c in (res.get("configs") or {}).items()}
    out = {"lm_eval_version": version, "tasks": list(tasks), "num_fewshot": num_fewshot, "batch_size": batch_size,
           "limit": limit, "seed": seed, "results": res.get("results", {}), "n_samples": res.get("n-samples", {}),
           "configs": configs}
    if getattr(lm, "intervention", None) is not None:
        out["intervention"] = lm.intervention
    return out


__all__ = ["TAG", "PREFIX", "task_yaml", "export_lm_eval_tasks", "load_lm_eval_tasks", "run_lm_eval"]
