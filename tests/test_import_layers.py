"""The package's import graph: every ``import`` of ``src/inductionlab`` (module level and inside
functions alike, read with ``ast``), one arrow per module imported. A circle in it means the layers
are tangled (the one closed by issue 16: data/shards -> data/tokenizer -> models -> data/shards);
an arrow from a lower layer to a higher one (:data:`LAYERS`) means a folder is in the wrong place."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import networkx as nx          # a dependency of torch, so always installed with this package
import pytest

SRC = Path(os.environ.get("INDUCTIONLAB_SRC", Path(__file__).resolve().parents[1] / "src")) / "inductionlab"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = SRC) -> nx.DiGraph:
    """Module -> module imported, for the modules of the package at ``root``; ``from X import Y``
    points at the submodule ``X.Y`` when Y is one, else at ``X``. Imports of other packages are left out."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:          # `import a.b.c` of a module a.b: the arrow goes to a.b
                    t = t.rpartition(".")[0]
                if t and t != name:
                    g.add_edge(name, t)
    return g


def test_graph_sees_function_level_imports():
    """The reader finds a known arrow that lives inside a function (not only module-level ones)."""
    g = import_graph()
    assert g.has_edge("inductionlab.data.shards", "inductionlab.data.curriculum")   # inside TokenShards.check_ids
    assert g.has_edge("inductionlab.data.shards", "inductionlab.data.tokenizer")  # at module level
    assert g.number_of_nodes() > 40


def test_no_import_cycle():
    cycles = sorted(c[c.index(min(c)):] + c[:c.index(min(c))] for c in nx.simple_cycles(import_graph()))
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])


# The layers, bottom up (README: "Where things go"). A module may import the package's face, its own
# folder and the folders of lower layers; folders of one layer do not import each other.
LAYERS = (("face",), ("runtime", "measures"), ("data",), ("core",), ("protocols", "train"), ("studies",), ("cli",))
FACE = {"__init__", "errors", "names", "checks", "config", "documents"}   # the top level: what every layer may use
# Inside studies/: the shared skeleton (run, pieces, report, plots) never imports a study's folder.
STUDY_SHARED = {"__init__", "run", "spec", "engine", "configs", "report", "plots", "token_loss", "view"}


def folder(module: str) -> str:
    """``inductionlab.core.models`` -> ``core``; the package and its top-level modules -> ``face``."""
    parts = module.split(".")
    return "face" if len(parts) == 1 or parts[1] in FACE else parts[1]


def rank(module: str) -> int:
    f = folder(module)
    for i, names in enumerate(LAYERS):
        if f in names:
            return i
    raise AssertionError(f"{module}: folder {f!r} is in no layer; add it to LAYERS (and README's Where things go)")


def _other_study_module(a: str, b: str) -> bool:
    """``a`` in one study's folder imports a module of another study's folder other than its ``__init__``
    (``studies.routes.study -> studies.head_types.study``): a study uses another only through its face."""
    pa, pb = a.split("."), b.split(".")
    study_a = pa[2] if len(pa) > 3 and pa[2] not in STUDY_SHARED else None
    study_b = pb[2] if len(pb) > 2 and pb[2] not in STUDY_SHARED else None
    return study_a is not None and study_b is not None and study_a != study_b and len(pb) > 3


def upward_arrows(g: nx.DiGraph) -> list[str]:
    """Every arrow that breaks the layering, as ``a -> b (why)``."""
    bad = []
    for a, b in g.edges:
        fa, fb = folder(a), folder(b)
        if fa == fb and fa != "face":
            if fa == "studies" and a.split(".")[2] in STUDY_SHARED and b.split(".")[2] not in STUDY_SHARED:
                bad.append(f"{a} -> {b} (the studies' shared skeleton imports one study)")
            elif fa == "studies" and _other_study_module(a, b):
                bad.append(f"{a} -> {b} (a study imports another study's module, not its __init__)")
            continue
        if fa == "face" and fb == "face":
            continue
        if rank(a) < rank(b):
            bad.append(f"{a} -> {b} (layer {folder(a)} imports the higher layer {folder(b)})")
        elif rank(a) == rank(b):
            bad.append(f"{a} -> {b} ({folder(a)} and {folder(b)} are one layer: neither imports the other)")
    return sorted(bad)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    bad = upward_arrows(import_graph())
    assert not bad, "arrows against the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("edge", [
    ("inductionlab.studies.routes.study", "inductionlab.studies.head_types"),     # another study's __init__
    ("inductionlab.studies.routes.study", "inductionlab.studies.routes.config"),  # its own folder
    ("inductionlab.studies.routes.study", "inductionlab.studies.token_loss"),     # the shared skeleton
])
def test_layer_check_allows_a_study_through_its_init(edge):
    g = nx.DiGraph([edge])
    assert upward_arrows(g) == []


def test_top_level_holds_only_the_face():
    top = {p.stem for p in SRC.glob("*.py")}
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert top == FACE, f"top-level modules beyond the face: {sorted(top - FACE)}"
    assert folders == {f for names in LAYERS[1:] for f in names}, sorted(folders)


@pytest.mark.parametrize("edge, why", [
    (("inductionlab.core.scores", "inductionlab.protocols.runner"), "imports the higher layer protocols"),
    (("inductionlab.train.trainer", "inductionlab.protocols.lag_probe"), "are one layer"),
    (("inductionlab.checks", "inductionlab.core.ablation"), "imports the higher layer core"),
    (("inductionlab.studies.report", "inductionlab.studies.temporal.report"), "shared skeleton imports one study"),
    (("inductionlab.studies.routes.study", "inductionlab.studies.head_types.study"), "another study's module"),
    (("inductionlab.studies.routes.config", "inductionlab.studies.head_types.config"), "another study's module"),
])
def test_layer_check_catches_an_arrow_against_the_layers(edge, why):
    g = nx.DiGraph([("inductionlab.cli.main", "inductionlab.core.models"), ("inductionlab.core.models", "inductionlab.errors")])
    assert upward_arrows(g) == []
    g.add_edge(*edge)
    bad = upward_arrows(g)
    assert len(bad) == 1 and why in bad[0], bad
