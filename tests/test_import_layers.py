"""The package's import graph: every ``import`` of ``src/inductionlab`` (module level and inside
functions alike, read with ``ast``), one arrow per module imported. A circle in it means the layers
are tangled (the one closed by issue 16: data/shards -> data/tokenizer -> models -> data/shards)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import networkx as nx          # a dependency of torch, so always installed with this package

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
    assert g.has_edge("inductionlab.data.shards", "inductionlab.curriculum")   # inside TokenShards.check_ids
    assert g.has_edge("inductionlab.data.shards", "inductionlab.data.tokenizer")  # at module level
    assert g.number_of_nodes() > 40


def test_no_import_cycle():
    cycles = sorted(c[c.index(min(c)):] + c[:c.index(min(c))] for c in nx.simple_cycles(import_graph()))
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])
