"""The packages' layering, read from the source: benches -> train -> zoo -> budgets, and
nothing else. This module is the checker and its rules; the tests beside it
(tests/layering/test_*.py) apply them to the project and to planted trees.

The checker parses every module of zoo/, budgets/, train/ and benches/ with `ast` (nothing
is imported) and builds the module-level graph of the project's own imports:

- relative imports are resolved against the importing module's package;
- `from pkg import name` is an edge to the submodule `pkg.name` when that is a module of
  the project, else to `pkg` itself;
- an import anywhere counts, inside a function or under `if TYPE_CHECKING:` included: an
  import deferred into a function to dodge a cycle still makes the two modules depend on
  each other;
- importing `pkg.sub` runs `pkg/__init__.py` too, but that is not counted as an edge to
  `pkg`, or every package whose `__init__` re-exports its submodules would be a cycle.

The package rules, one test each: no cycle; budgets imports neither zoo nor train; zoo
does not import train; none of them imports benches; no `from module import _private`
across modules. Inside train/, each subpackage has a job, and the libraries that belong to
a job stay with it: only train/harness/ imports Lightning, only train/render/ builds rich
tables or draws with matplotlib, train/render/ imports no torch (RULES, NO_TORCH) and reads
no run directory (no import of train/rundir/read.py, no file opened: render_reads); train's
subpackages form no cycle. Inside budgets/, its subpackages form no cycle either, and only
budgets/hf/ imports transformers (BUDGETS_RULES); budgets/mixing/, each operator's math
under both zoo and the captures, imports only torch, the standard library, budgets/budget.py
and budgets/rank/, and zoo reads budgets through its public face and budgets/mixing/ alone
(mixing_violations, zoo_into_budgets). Across the project, one module registers
attention functions in transformers' global tables, budgets/hf/capture.py (registrations).
(`import module` followed by `module._private` is not checked.) Each rule has a test that
plants its violation in a small source tree and checks that the checker finds it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("zoo", "budgets", "train", "benches")
# package -> the project packages it must not import (the direction is benches -> train ->
# zoo -> budgets: the benchmarks measure the product, which never needs them)
FORBIDDEN = {"budgets": ("zoo", "train", "benches"), "zoo": ("train", "benches"),
             "train": ("benches",)}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, e.g. "train.experiment.stages"
    target: str  # imported module of the project, e.g. "train.experiment.finetune"
    where: str  # "train/experiment/stages.py:51", for the failure message
    names: tuple[str, ...] = ()  # names taken from target by `from target import ...`


def modules_of(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under each package directory."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name that `from <...> import` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        raise ValueError(f"{path}:{node.lineno}: relative import beyond the top package")
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _owner(name: str, modules) -> str | None:
    """The longest prefix of the dotted `name` that is a module of the project."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return None


def import_nodes(root: Path, modules: dict[str, Path]):
    """(module, its file, "file:line", node) for every import statement of every module,
    those inside functions included."""
    for module, path in modules.items():
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield module, path, f"{rel}:{node.lineno}", node


def import_edges(root: Path, packages=PACKAGES) -> list[Edge]:
    """Every import of a project module by a project module (self-imports left out)."""
    modules = modules_of(root, packages)
    edges = []
    for module, path, where, node in import_nodes(root, modules):
        if isinstance(node, ast.Import):
            targets = [(_owner(alias.name, modules), ()) for alias in node.names]
        else:
            base = _base(module, path, node)
            targets, names = [], []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:  # `from pkg import submodule`
                    targets.append((sub, ()))
                else:
                    names.append(alias.name)
            if names:
                targets.append((_owner(base, modules) if base in modules else None,
                                tuple(names)))
        edges += [Edge(module, target, where, names) for target, names in targets
                  if target is not None and target != module]
    return edges


def graph_of(edges: list[Edge]) -> dict[str, dict[str, Edge]]:
    """source -> target -> the first edge found between them."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)
        graph.setdefault(e.target, {})
    return graph


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """Cycles, each as its edges in order: in every strongly connected component of more
    than one module (Tarjan's algorithm, iterative), the shortest cycle through each of its
    modules, the same cycle listed once."""
    graph = graph_of(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    cycles, seen = [], set()
    for component in sorted(components):
        for member in component:
            cycle = _cycle_in(graph, set(component), member)
            key = frozenset((e.source, e.target) for e in cycle)
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
    return cycles


def _cycle_in(graph, component: set[str], start: str) -> list[Edge]:
    """A shortest cycle through `start` inside one strongly connected component (BFS)."""
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target, edge in sorted(graph[node].items()):
                if target not in component:
                    continue
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, parent[path[0].source])
                    return path
                if target not in parent:
                    parent[target] = edge
                    nxt.append(target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def layer_violations(edges: list[Edge], forbidden=FORBIDDEN) -> list[Edge]:
    """Edges from a package to one it must not import."""
    return [e for e in edges
            if e.target.split(".")[0] in forbidden.get(e.source.split(".")[0], ())]


def private_imports(edges: list[Edge]) -> list[tuple[Edge, str]]:
    """`from other_module import _name` (dunder names such as __version__ are public)."""
    return [(e, n) for e in edges for n in e.names
            if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]


def describe_cycle(cycle: list[Edge]) -> str:
    chain = " -> ".join([cycle[0].source, *(e.target for e in cycle)])
    return f"{chain}  ({', '.join(e.where for e in cycle)})"


# ------------------------------------------------------------------ the project's own tree

# ------------------------------------------------------------------ the checker itself

def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:  # every package exists, if only as an empty one
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


CLEAN = {
    "budgets/__init__.py": "from .metrics import rank_metrics\n",
    "budgets/metrics.py": "import torch\nfrom torch._C import _private_to_torch\n\n"
                          "def _helper():\n    pass\n\ndef rank_metrics():\n    _helper()\n",
    "zoo/__init__.py": "from . import softmax\nfrom .block import Block\n",
    "zoo/block.py": "from budgets import rank_metrics\n\nclass Block:\n    pass\n",
    "zoo/softmax.py": "from .block import Block\nfrom .ops.attention import kernel\n",
    "zoo/ops/__init__.py": "",
    "zoo/ops/attention/__init__.py": "from .reference import kernel\n",
    "zoo/ops/attention/reference.py": "from ..registry import Backend\n\n"
                                      "def kernel():\n    pass\n",
    "zoo/ops/registry.py": "class Backend:\n    pass\n",
    "train/__init__.py": "__version__ = '0'\n",
    "train/cli/__init__.py": "import zoo\nfrom budgets.metrics import rank_metrics\n"
                             "from .. import __version__\n\ndef main():\n"
                             "    from ..experiment.stages import fit\n",
    "train/experiment/__init__.py": "",
    "train/experiment/stages.py": "import zoo.ops.registry\nfrom zoo import Block\n\n"
                                  "def fit():\n    pass\n",
}

# ------------------------------------------------------------------ jobs inside train/

@dataclass(frozen=True)
class Rule:
    """Third-party modules whose import is kept to some of train's subpackages: `library`
    (a dotted prefix: `rich.table` covers `from rich.table import Table`) may be imported
    only by modules under `only` (dotted prefixes), for the reason `why`."""

    library: str
    only: tuple[str, ...]
    why: str


RULES = (
    Rule("lightning", ("train.harness",),
         "train/harness/ is the one place that knows Lightning; the rest of train/ calls "
         "its fit function"),
    Rule("pytorch_lightning", ("train.harness",), "Lightning is train/harness/'s alone"),
    Rule("rich.table", ("train.render",),
         "tables are built in train/render/, each from one description drawn as rich and "
         "as Markdown"),
    Rule("matplotlib", ("train.render",), "figures are drawn in train/render/"),
)
# train/render/ reads documents (dicts of numbers and strings) and computes nothing new:
# it must not need a tensor library to draw a table
NO_TORCH = ("train.render",)


def library_imports(root: Path, packages=("train",)) -> list[tuple[str, str, str]]:
    """(module, imported dotted name, where) for every import of something outside the
    project by a module of `packages` (an import inside a function counts)."""
    found = []
    for module, _, where, node in import_nodes(root, modules_of(root, packages)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = [node.module] if node.level == 0 and node.module else []
        found += [(module, name, where) for name in names
                  if name.split(".")[0] not in PACKAGES]
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rule_violations(imports: list[tuple[str, str, str]], rules=RULES) -> list[str]:
    """One line per import that breaks a rule: a kept library imported outside its
    subpackages, or torch imported by a subpackage that must not need it."""
    bad = []
    for module, name, where in imports:
        for rule in rules:
            if under(name, rule.library) and not any(under(module, o) for o in rule.only):
                bad.append(f"{where}: {module} imports {name} ({rule.why})")
        if under(name, "torch") and any(under(module, p) for p in NO_TORCH):
            bad.append(f"{where}: {module} imports {name} (train/render/ draws documents "
                       f"and needs no torch)")
    return bad

# ------------------------------------------------------------------ train's subpackages

def subpackage_edges(edges: list[Edge], package: str = "train") -> list[Edge]:
    """The module edges inside `package` seen one level down: train.cli.report ->
    train.render.document becomes train.cli -> train.render (the package's own
    __init__, the public face that re-exports from several jobs, is left out)."""
    def sub(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == package and len(parts) > 1 else None
    return [Edge(sub(e.source), sub(e.target), e.where) for e in edges
            if sub(e.source) and sub(e.target) and sub(e.source) != sub(e.target)]

def package_of(module: str) -> str:
    return module.split(".")[0]
