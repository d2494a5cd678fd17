"""The import direction: every module's imports point down the layers, never up, never in a circle.

spyre_lab is read bottom up (device < compiler < runtime < engine < viz < the programs people run),
and a learner can only do that if a layer never reaches above itself. This test reads every module's
source (``ast``, nothing is imported) and collects what it depends on: ``import`` statements anywhere
in the file (inside functions and ``TYPE_CHECKING`` blocks too: a lazy import is still a dependency)
and string constants that name a module (lazy-export tables, ``importlib.import_module("...")``).

Four rules:

1. no import points to a higher layer;
2. model code (``engine/models``, ``engine/layers``) never imports a platform: platforms build on the
   portable layers, never the reverse;
3. no module imports another module's underscore (private) name;
4. no import cycle among the modules of one layer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "spyre_lab"

# Lower number = lower layer. A module may import its own layer or any layer below it.
LAYERS: dict[str, int] = {
    "user_line": 0,  # the ground floor: warnings filed under the user's line, for every layer
    "heap": 0,  # the ground floor too: the cycle collector kept off every layer's hot paths
    "device": 0,
    "compiler": 1,
    "ktir": 1,
    "runtime": 2,
    "distributed": 2,
    "engine": 3,
    "viz": 4,
    "serving": 4,
}
TOP = 5  # cli, demo, studies, workshop and the package's own __init__ (the facade people import)
MODEL_CODE = ("spyre_lab.engine.models", "spyre_lab.engine.layers")
PLATFORMS = "spyre_lab.engine.platforms"

# Known violations still being removed, as (rule, importer, imported); this list only shrinks, and is empty.
# For the cycle rule an entry is the back edge that closes a cycle: the rule checks the graph without it.
ALLOWED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the file that imports
    target: str  # dotted module name it depends on
    names: tuple[str, ...]  # names taken from ``target`` (``from target import a, b``)
    line: int


class ImportGraph:
    """Every module of one source tree and every import between its modules."""

    def __init__(self, root: Path, package: str = PACKAGE) -> None:
        self.root = root
        self.package = package
        self.modules = {self._module_name(p): p for p in sorted((root / package).rglob("*.py"))}
        self.imports = [
            imp for name, path in self.modules.items() for imp in self._imports_of(name, path) if imp.target != name
        ]

    def _module_name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def _own_module(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is one of our modules (None for torch, numpy, ...)."""
        parts = dotted.split(".")
        while parts:
            if ".".join(parts) in self.modules:
                return ".".join(parts)
            parts.pop()
        return None

    def _resolve_relative(self, importer: str, level: int, module: str | None) -> str:
        base = importer.split(".")
        if self.modules[importer].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def _imports_of(self, name: str, path: Path) -> Iterator[Import]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._own_module(alias.name)
                    if target:
                        yield Import(name, target, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = self._resolve_relative(name, node.level, node.module) if node.level else (node.module or "")
                for alias in node.names:
                    # ``from pkg import submodule`` depends on the submodule, ``from mod import name`` on mod.
                    sub = f"{base}.{alias.name}"
                    if sub in self.modules:
                        yield Import(name, sub, (), node.lineno)
                    elif target := self._own_module(base):
                        yield Import(name, target, (alias.name,), node.lineno)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.split(":")[0]  # "pkg.mod:attr", the entry-point spelling
                if text.startswith(self.package + ".") and text in self.modules:
                    yield Import(name, text, (), node.lineno)


def layer_of(name: str) -> int:
    parts = name.split(".")
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def upward(graph: ImportGraph) -> list[tuple[str, str, str]]:
    return [
        (i.importer, i.target, f"line {i.line}: layer {layer_of(i.importer)} imports layer {layer_of(i.target)}")
        for i in graph.imports
        if layer_of(i.target) > layer_of(i.importer)
    ]


def model_code_to_platform(graph: ImportGraph) -> list[tuple[str, str, str]]:
    return [
        (i.importer, i.target, f"line {i.line}: model code imports a platform")
        for i in graph.imports
        if i.importer.startswith(MODEL_CODE) and i.target.startswith(PLATFORMS)
    ]


def private_names(graph: ImportGraph) -> list[tuple[str, str, str]]:
    found = []
    for i in graph.imports:
        private = [n for n in (*i.names, i.target.rsplit(".", 1)[-1]) if n.startswith("_") and not n.startswith("__")]
        if private:
            found.append((i.importer, i.target, f"line {i.line}: imports {', '.join(private)}"))
    return found


def cycles(graph: ImportGraph, without: Set[tuple[str, str]] = frozenset()) -> list[tuple[str, str, str]]:
    """Every edge that lies on a cycle among modules of one layer (Tarjan's strongly connected components).

    ``without``: edges left out of the graph (the allow-listed back edges).
    """
    edges: dict[str, set[str]] = {name: set() for name in graph.modules}
    for i in graph.imports:
        # A package's __init__ re-exports its submodules; a submodule importing its own package's
        # __init__ back is a cycle too, so every edge counts.
        if layer_of(i.importer) == layer_of(i.target) and (i.importer, i.target) not in without:
            edges[i.importer].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [
        (v, w, f"cycle among {', '.join(sorted(component))}")
        for component in components
        for v in sorted(component)
        for w in sorted(edges[v] & component)
    ]


RULES: dict[str, Callable[[ImportGraph], list[tuple[str, str, str]]]] = {
    "upward": upward,
    "model-code-imports-platform": model_code_to_platform,
    "private-name": private_names,
    "cycle": cycles,
}


def violations(graph: ImportGraph, rule: str, allowed: Set[tuple[str, str, str]] = frozenset()) -> list[str]:
    """What breaks ``rule``, minus the allow-list, one readable line each."""
    if rule == "cycle":
        found = cycles(graph, without={(imp, tgt) for r, imp, tgt in allowed if r == "cycle"})
    else:
        found = RULES[rule](graph)
    return sorted(f"{imp}  ->  {tgt}   ({why})" for imp, tgt, why in found if (rule, imp, tgt) not in allowed)


@pytest.fixture(scope="module")
def project() -> ImportGraph:
    return ImportGraph(ROOT)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_imports_follow_the_layers(project: ImportGraph, rule: str) -> None:
    bad = violations(project, rule, ALLOWED)
    assert not bad, f"{len(bad)} import(s) break the rule {rule!r}:\n  " + "\n  ".join(bad)


def test_allow_list_only_names_violations_that_still_exist(project: ImportGraph) -> None:
    """An entry that no longer matches a real violation must be deleted, so the list only shrinks."""
    live = {(rule, imp, tgt) for rule, find in RULES.items() for imp, tgt, _ in find(project)}
    stale = sorted(ALLOWED - live)
    assert not stale, f"remove fixed entries from ALLOWED: {stale}"


def test_the_walker_sees_the_packages_imports(project: ImportGraph) -> None:
    """The rules are only as good as the import walk: it must find the package's real dependencies."""
    edges = {(i.importer, i.target) for i in project.imports}
    assert ("spyre_lab.device", "spyre_lab.device.config") in edges
    assert ("spyre_lab.engine.platforms.base", "spyre_lab.engine.layers.custom_op") in edges
    assert len(project.modules) > 80


def _write(root: Path, files: dict[str, str]) -> ImportGraph:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ImportGraph(root)


def test_each_rule_catches_its_violation(tmp_path: Path) -> None:
    """A small package that breaks every rule once; each rule must name exactly its own offender."""
    graph = _write(tmp_path, {
        "__init__.py": "",
        "device/__init__.py": "",
        "device/config.py": "X = 1\n",
        "compiler/__init__.py": "",
        "compiler/backend.py": "def run():\n    from spyre_lab.runtime.programs import launch\n",
        "compiler/program.py": "from . import explain\n",
        "compiler/explain.py": "from spyre_lab.compiler.program import Program\n",
        "runtime/__init__.py": 'LAZY = {"launch": "spyre_lab.runtime.programs"}\n',
        "runtime/programs.py": "from spyre_lab.runtime.streams import _device_index\n"
                               "from spyre_lab.device import config\n",
        "runtime/streams.py": "_device_index = 0\n",
        "engine/__init__.py": "",
        "engine/layers/__init__.py": "",
        "engine/layers/norm.py": "from spyre_lab.engine.platforms.base import current\n",
        "engine/platforms/__init__.py": "",
        "engine/platforms/base.py": "current = None\n",
    })
    assert ("spyre_lab.runtime", "spyre_lab.runtime.programs") in {(i.importer, i.target) for i in graph.imports}
    assert [v.split()[0:3] for v in violations(graph, "upward")] == [
        ["spyre_lab.compiler.backend", "->", "spyre_lab.runtime.programs"]]
    assert [v.split()[0] for v in violations(graph, "model-code-imports-platform")] == ["spyre_lab.engine.layers.norm"]
    assert [v.split()[0] for v in violations(graph, "private-name")] == ["spyre_lab.runtime.programs"]
    assert sorted(v.split()[0] for v in violations(graph, "cycle")) == [
        "spyre_lab.compiler.explain", "spyre_lab.compiler.program"]
    allowed = {("cycle", "spyre_lab.compiler.program", "spyre_lab.compiler.explain")}
    assert violations(graph, "cycle", allowed) == []


def test_no_test_skips_itself_when_our_own_code_fails_to_import() -> None:
    """A broken import of spyre_lab must fail the suite, not quietly skip the tests that would show it."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith(PACKAGE)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} importorskip({node.args[0].value!r})")
    assert not offenders, "import it plainly instead:\n  " + "\n  ".join(offenders)
