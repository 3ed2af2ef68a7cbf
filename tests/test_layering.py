"""The packages' layering, read from the source: benches -> train -> zoo -> budgets, and
nothing else.

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
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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

@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(ROOT)


def test_the_checker_reads_the_project(edges):
    """Guards the tests below against passing on an empty graph (a wrong ROOT, say)."""
    modules = modules_of(ROOT)
    assert {"zoo.block", "budgets.rank.metrics", "train.cli",
            "benches.budgets.bench_ranks"} <= set(modules)
    assert any(e.source == "zoo.block" and e.target == "budgets" for e in edges)


def test_no_import_cycles(edges):
    cycles = find_cycles(edges)
    if cycles:
        pytest.fail("import cycles (an import inside a function counts):\n  "
                    + "\n  ".join(describe_cycle(c) for c in cycles), pytrace=False)


def _package(module: str) -> str:
    return module.split(".")[0]


def test_budgets_imports_neither_zoo_nor_train(edges):
    bad = [e for e in layer_violations(edges)
           if _package(e.source) == "budgets" and _package(e.target) in ("zoo", "train")]
    if bad:
        pytest.fail("budgets is the leaf and must not import zoo or train:\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {e.target}" for e in bad),
                    pytrace=False)


def test_zoo_does_not_import_train(edges):
    bad = [e for e in layer_violations(edges)
           if _package(e.source) == "zoo" and _package(e.target) == "train"]
    if bad:
        pytest.fail("zoo must not import train:\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {e.target}" for e in bad),
                    pytrace=False)


def test_the_product_does_not_import_benches(edges):
    bad = [e for e in layer_violations(edges) if _package(e.target) == "benches"]
    if bad:
        pytest.fail("benches/ measures zoo, budgets and train; none of them may import it:\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {e.target}" for e in bad),
                    pytrace=False)


def test_no_private_names_imported_across_modules(edges):
    bad = private_imports(edges)
    if bad:
        pytest.fail("private names imported from another module (make them public, or keep "
                    "them in the module that uses them):\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {n} from {e.target}"
                                   for e, n in bad), pytrace=False)


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


def test_checker_passes_a_clean_tree(tmp_path):
    edges = import_edges(plant(tmp_path, CLEAN))
    pairs = {(e.source, e.target) for e in edges}
    assert {("zoo", "zoo.softmax"), ("zoo.ops.attention.reference", "zoo.ops.registry"),
            ("train.cli", "train.experiment.stages"),
            ("train.experiment.stages", "zoo.ops.registry"),
            ("train.cli", "budgets.metrics")} <= pairs  # relative, nested, in a function
    assert not find_cycles(edges)
    assert not layer_violations(edges)
    assert not private_imports(edges)  # torch's private names are torch's business


def test_checker_finds_a_planted_cycle(tmp_path):
    stages = "train/experiment/stages.py"
    files = {**CLEAN, stages: CLEAN[stages] + "\ndef report():\n    from ..cli import main\n"}
    cycles = find_cycles(import_edges(plant(tmp_path, files)))
    assert [describe_cycle(c) for c in cycles] == [
        "train.cli -> train.experiment.stages -> train.cli  "
        "(train/cli/__init__.py:6, train/experiment/stages.py:8)"]


def test_checker_finds_a_longer_cycle_through_subpackages(tmp_path):
    files = {**CLEAN, "zoo/ops/registry.py": "from ..softmax import Block\n"}
    (cycle,) = find_cycles(import_edges(plant(tmp_path, files)))
    assert describe_cycle(cycle).startswith(
        "zoo.ops.attention -> zoo.ops.attention.reference -> zoo.ops.registry -> zoo.softmax"
        " -> zoo.ops.attention  (")


def test_checker_finds_a_planted_budgets_to_zoo_import(tmp_path):
    files = {**CLEAN, "budgets/budget.py": "def probe():\n    import zoo.block\n",
             "budgets/schema.py": "from train.cli import main\n"}
    bad = layer_violations(import_edges(plant(tmp_path, files)))
    assert sorted((e.where, e.target) for e in bad) == [
        ("budgets/budget.py:2", "zoo.block"), ("budgets/schema.py:1", "train.cli")]


def test_checker_finds_zoo_importing_train(tmp_path):
    files = {**CLEAN, "zoo/softmax.py": CLEAN["zoo/softmax.py"] + "from train import cli\n"}
    bad = layer_violations(import_edges(plant(tmp_path, files)))
    assert [(e.source, e.target, e.where) for e in bad] == [
        ("zoo.softmax", "train.cli", "zoo/softmax.py:3")]


def test_checker_finds_the_product_importing_benches(tmp_path):
    files = {**CLEAN, "benches/bench_x.py": "import train.cli\nfrom zoo import Block\n",
             "train/experiment/stages.py": CLEAN["train/experiment/stages.py"]
             + "\ndef bench():\n    from benches import bench_x\n",
             "budgets/metrics.py": "from benches.bench_x import run\n"}
    bad = layer_violations(import_edges(plant(tmp_path, files)))
    assert sorted((e.where, e.target) for e in bad) == [  # benches itself may import anything
        ("budgets/metrics.py:1", "benches.bench_x"),
        ("train/experiment/stages.py:8", "benches.bench_x")]


def test_checker_finds_a_planted_private_import(tmp_path):
    files = {**CLEAN, "budgets/budget.py": "from .metrics import _helper, rank_metrics\n",
             "train/render/plots.py": "def f():\n"
                                      "    from zoo.ops.registry import Backend, _cache\n"}
    bad = private_imports(import_edges(plant(tmp_path, files)))
    assert sorted((e.where, e.target, n) for e, n in bad) == [
        ("budgets/budget.py:1", "budgets.metrics", "_helper"),
        ("train/render/plots.py:2", "zoo.ops.registry", "_cache")]


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


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rule_violations(imports: list[tuple[str, str, str]], rules=RULES) -> list[str]:
    """One line per import that breaks a rule: a kept library imported outside its
    subpackages, or torch imported by a subpackage that must not need it."""
    bad = []
    for module, name, where in imports:
        for rule in rules:
            if _under(name, rule.library) and not any(_under(module, o) for o in rule.only):
                bad.append(f"{where}: {module} imports {name} ({rule.why})")
        if _under(name, "torch") and any(_under(module, p) for p in NO_TORCH):
            bad.append(f"{where}: {module} imports {name} (train/render/ draws documents "
                       f"and needs no torch)")
    return bad


def test_each_library_is_imported_where_its_job_is():
    bad = rule_violations(library_imports(ROOT))
    if bad:
        pytest.fail("imports outside the subpackage whose job they are:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_the_rules_find_planted_violations(tmp_path):
    files = {**CLEAN,
             "train/harness/fit.py": "import lightning as L\n",
             "train/render/table.py": "from rich.table import Table\n",
             "train/experiment/sweep.py": "def f():\n    from lightning.pytorch import Trainer\n"
                                          "from rich.table import Table\n",
             "train/render/heads.py": "import torch.nn\nimport matplotlib.pyplot\n"}
    bad = rule_violations(library_imports(plant(tmp_path, files)))
    assert sorted(line.split(" (")[0] for line in bad) == [
        "train/experiment/sweep.py:2: train.experiment.sweep imports lightning.pytorch",
        "train/experiment/sweep.py:3: train.experiment.sweep imports rich.table",
        "train/render/heads.py:1: train.render.heads imports torch.nn"]


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


def test_trains_subpackages_form_no_cycle(edges):
    """Each job of train/ reads only the jobs below it, so one can be read (and tested)
    without the ones above: the CLI on top, the run directory, config, data and the LM
    below."""
    cycles = find_cycles(subpackage_edges(edges))
    if cycles:
        pytest.fail("train/'s subpackages import each other:\n  "
                    + "\n  ".join(describe_cycle(c) for c in cycles), pytrace=False)


def test_the_subpackage_check_finds_a_planted_cycle(tmp_path):
    files = {**CLEAN, "train/rundir/__init__.py": "", "train/render/__init__.py": "",
             "train/rundir/read.py": "from ..render.document import report_markdown\n",
             "train/render/document.py": "def report_markdown():\n    pass\n",
             "train/render/plots.py": "from ..rundir.read import variant_dirs\n"}
    edges = import_edges(plant(tmp_path, files))
    assert not find_cycles(edges)  # no cycle between modules ...
    (cycle,) = find_cycles(subpackage_edges(edges))  # ... but between the two jobs
    assert {(e.source, e.target) for e in cycle} == {("train.render", "train.rundir"),
                                                     ("train.rundir", "train.render")}


# ------------------------------------------------------------------ budgets' own cut

def test_budgets_subpackages_form_no_cycle(edges):
    """budgets/ is cut by job into rank/, probe/, hf/, advice/, report/ beside budget.py
    and schema.py: the cut stays one-way, so each job reads only those below it."""
    cycles = find_cycles(subpackage_edges(edges, "budgets"))
    if cycles:
        pytest.fail("budgets/'s subpackages import each other:\n  "
                    + "\n  ".join(describe_cycle(c) for c in cycles), pytrace=False)


def test_the_budgets_cut_check_finds_a_planted_cycle(tmp_path):
    files = {**CLEAN, "budgets/rank/__init__.py": "", "budgets/advice/__init__.py": "",
             "budgets/rank/spectra.py": "def spectrum():\n    pass\n",
             "budgets/rank/metrics.py": "def f():\n    from ..advice.kv import kv_advice\n",
             "budgets/advice/kv.py": "from ..rank.spectra import spectrum\n\n"
                                     "def kv_advice():\n    pass\n"}
    edges = import_edges(plant(tmp_path, files))
    assert not find_cycles(edges)  # no cycle between modules ...
    (cycle,) = find_cycles(subpackage_edges(edges, "budgets"))  # ... but between two jobs
    assert {(e.source, e.target) for e in cycle} == {("budgets.advice", "budgets.rank"),
                                                     ("budgets.rank", "budgets.advice")}


# the Hugging Face extra is optional: budgets works on any torch module without it, and
# budgets/hf/ is its one reader of Hugging Face models
BUDGETS_RULES = (
    Rule("transformers", ("budgets.hf",),
         "budgets/hf/ is budgets' one reader of Hugging Face models; the rest of budgets "
         "measures any torch module, without the hf extra"),
)


def test_only_budgets_hf_imports_transformers_inside_budgets():
    bad = rule_violations(library_imports(ROOT, ("budgets",)), BUDGETS_RULES)
    if bad:
        pytest.fail("transformers imported in budgets/ outside budgets/hf/:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_the_budgets_rule_finds_a_planted_transformers_import(tmp_path):
    files = {**CLEAN, "budgets/hf/__init__.py": "",
             "budgets/hf/capture.py": "def f():\n    from transformers import masking_utils\n",
             "budgets/metrics.py": CLEAN["budgets/metrics.py"]
             + "def g():\n    import transformers.modeling_utils\n",
             "train/hf/model_dir.py": "import transformers\n"}  # train's is not budgets' rule
    bad = rule_violations(library_imports(plant(tmp_path, files), ("budgets",)), BUDGETS_RULES)
    assert [line.split(" (")[0] for line in bad] == [
        "budgets/metrics.py:10: budgets.metrics imports transformers.modeling_utils"]


# ------------------------------------------------------------------ budgets/mixing/: the bottom

# Each recurrent operator's math lives once in budgets/mixing/, and the zoo's kernels and
# blocks import it as well as budgets' captures: it stands below both, so it reads torch and
# budgets' rank primitives only (a capture or the zoo under it would make the math depend on
# what it serves, and transformers would make the zoo need the hf extra)
MIXING = "budgets.mixing"
MIXING_MAY_IMPORT = (MIXING, "budgets.budget", "budgets.rank")  # dotted prefixes
MIXING_LIBRARIES = ("torch",)  # beside Python's standard library
# zoo reads budgets through its public face, `budgets`, and below it only budgets/mixing/


def mixing_violations(root: Path, edges: list[Edge]) -> list[str]:
    """One line per import by budgets/mixing/ of anything but torch, the standard library,
    budgets/budget.py, budgets/rank/ and itself."""
    bad = [f"{e.where}: {e.source} imports {e.target}" for e in edges
           if _under(e.source, MIXING) and not any(_under(e.target, p) for p in MIXING_MAY_IMPORT)]
    return bad + [f"{where}: {module} imports {name}"
                  for module, name, where in library_imports(root, ("budgets",))
                  if _under(module, MIXING) and name.split(".")[0] not in sys.stdlib_module_names
                  and not any(_under(name, lib) for lib in MIXING_LIBRARIES)]


def zoo_into_budgets(edges: list[Edge]) -> list[str]:
    """One line per import by zoo of a budgets module other than the package itself (its
    public face) and budgets/mixing/."""
    return [f"{e.where}: {e.source} imports {e.target}" for e in edges
            if _package(e.source) == "zoo" and _package(e.target) == "budgets"
            and e.target != "budgets" and not _under(e.target, MIXING)]


def test_budgets_mixing_imports_only_torch_and_the_rank_primitives(edges):
    bad = mixing_violations(ROOT, edges)
    if bad:
        pytest.fail("budgets/mixing/ is the operators' math under zoo and the captures; it "
                    "imports torch, budgets/budget.py and budgets/rank/ only:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_zoo_reads_budgets_through_its_face_and_budgets_mixing(edges):
    # guards the rule against passing blind: the ssm block takes SSD's math from below
    assert any(e.source == "zoo.ssm" and _under(e.target, MIXING) for e in edges)
    bad = zoo_into_budgets(edges)
    if bad:
        pytest.fail("zoo imports budgets (its public face) and budgets/mixing/ only:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_the_mixing_rules_find_planted_imports(tmp_path):
    ssd = ("from __future__ import annotations\nimport math\nimport torch.nn.functional\n"
           "from ..budget import RankBudget\nfrom ..rank.factored import FactoredMixing\n"
           "from . import conv\n"  # all of them allowed; the rest are not
           "import numpy\nfrom ..hf.scans import ScanCall\nfrom .. import probe_model\n"
           "def f():\n    import zoo.block\n    from transformers import PreTrainedModel\n")
    files = {**CLEAN, "budgets/budget.py": "", "budgets/rank/__init__.py": "",
             "budgets/rank/factored.py": "", "budgets/hf/__init__.py": "",
             "budgets/hf/scans.py": "from ..mixing.ssd import ssd_mixing\n",
             "budgets/mixing/__init__.py": "", "budgets/mixing/conv.py": "",
             "budgets/mixing/ssd.py": ssd,
             "zoo/ssm.py": "import budgets\nfrom budgets import RankBudget\n"
                           "from budgets.mixing.ssd import ssd_mixing\n"
                           "from budgets.hf.scans import ScanCall\n"}
    root = plant(tmp_path, files)
    edges = import_edges(root)
    assert sorted(line.split(" (")[0] for line in mixing_violations(root, edges)) == [
        "budgets/mixing/ssd.py:11: budgets.mixing.ssd imports zoo.block",
        "budgets/mixing/ssd.py:12: budgets.mixing.ssd imports transformers",
        "budgets/mixing/ssd.py:7: budgets.mixing.ssd imports numpy",
        "budgets/mixing/ssd.py:8: budgets.mixing.ssd imports budgets.hf.scans",
        "budgets/mixing/ssd.py:9: budgets.mixing.ssd imports budgets"]
    assert zoo_into_budgets(edges) == ["zoo/ssm.py:4: zoo.ssm imports budgets.hf.scans"]


# ------------------------------------------------------------------ transformers' registries

# transformers' attention tables are process-global: a function registered under a name
# serves every model that attends by that name. One module registers there, the capture
# (and takes its entry out again); a second would shadow or remove the other's.
REGISTRIES = ("AttentionInterface", "ALL_ATTENTION_FUNCTIONS", "AttentionMaskInterface",
              "ALL_MASK_ATTENTION_FUNCTIONS")
REGISTRAR = "budgets.hf.capture"
REGISTER_METHODS = ("register", "update", "setdefault", "__setitem__")


def _is_registry(node: ast.AST, names: set[str]) -> bool:
    """A registry by its own name (`transformers.AttentionInterface` too) or an alias."""
    return ((isinstance(node, ast.Name) and node.id in names)
            or (isinstance(node, ast.Attribute) and node.attr in REGISTRIES))


def _returned_registries(tree: ast.AST, names: set[str]) -> dict[str, set[int | None]]:
    """Function name -> the positions of registries in the tuple it returns (None: it
    returns one itself), for the module's functions that hand registries out."""
    out: dict[str, set[int | None]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for ret in ast.walk(fn):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            if _is_registry(ret.value, names):
                out.setdefault(fn.name, set()).add(None)
            elif isinstance(ret.value, ast.Tuple):
                out.setdefault(fn.name, set()).update(
                    i for i, e in enumerate(ret.value.elts) if _is_registry(e, names))
    return out


def registry_names(tree: ast.AST) -> set[str]:
    """The names that stand for a registry in one module: its own names, their import
    aliases, and names bound from them (`table = ALL_ATTENTION_FUNCTIONS`, or unpacked from
    a call of a function of the module that returns them, as capture.py's
    `functions, masks, ... = transformers_attention()`). Module-wide, not per scope."""
    names = set(REGISTRIES)
    names |= {a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              for a in node.names if a.name in REGISTRIES and a.asname}
    while True:
        returns, found = _returned_registries(tree, names), set(names)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            call = node.value.func.id if (isinstance(node.value, ast.Call) and isinstance(
                node.value.func, ast.Name)) else None
            for target in node.targets:
                if isinstance(target, ast.Name) and (_is_registry(node.value, names)
                                                     or None in returns.get(call, ())):
                    found.add(target.id)
                elif isinstance(target, ast.Tuple) and call in returns:
                    found |= {e.id for i, e in enumerate(target.elts)
                              if i in returns[call] and isinstance(e, ast.Name)}
        if found == names:
            return names
        names = found


def registrations(root: Path, packages=PACKAGES) -> list[tuple[str, str]]:
    """(module, "file:line") of every registration into transformers' attention tables:
    `<registry>.register(...)` (or update, setdefault), and an item assigned or deleted
    (`ALL_ATTENTION_FUNCTIONS[name] = f`, `del table[name]`). Reading one is not counted."""
    found = []
    for module, path in modules_of(root, packages).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        names, rel = registry_names(tree), path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in REGISTER_METHODS
                    and _is_registry(node.func.value, names)):
                found.append((module, rel, node.lineno))
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            found += [(module, rel, node.lineno) for t in targets
                      if isinstance(t, ast.Subscript) and _is_registry(t.value, names)]
    return [(module, f"{rel}:{line}") for module, rel, line in sorted(found)]


def test_one_module_registers_attention_functions():
    found = registrations(ROOT)
    # guards the rule against passing blind: it sees the capture's own entry
    assert any(module == REGISTRAR for module, _ in found), found
    bad = [where for module, where in found if module != REGISTRAR]
    if bad:
        pytest.fail(f"registrations into transformers' attention tables outside {REGISTRAR} "
                    "(budgets/hf/capture.py is the one module that registers there):\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_the_registry_rule_finds_planted_registrations(tmp_path):
    capture = ("def tables():\n"
               "    from transformers.masking_utils import AttentionMaskInterface\n"
               "    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n"
               "    return ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface\n\n"
               "def capture(f, m):\n"
               "    functions, masks = tables()\n"
               "    masks.register('mine', m)\n"
               "    functions['mine'] = f\n"
               "    del functions['mine']\n")
    surgery = ("import transformers\n"
               "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as table\n\n"
               "def attach(f, m):\n"
               "    original = table['sdpa']\n"  # reading: not a registration
               "    table['other'] = f\n"
               "    transformers.AttentionInterface.register('other', f)\n"
               "    transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.update(o=m)\n"
               "    return original\n")
    files = {**CLEAN, "budgets/hf/__init__.py": "", "budgets/hf/capture.py": capture,
             "train/commands/__init__.py": "", "train/commands/surgery.py": surgery}
    found = registrations(plant(tmp_path, files))
    assert found == [
        ("budgets.hf.capture", "budgets/hf/capture.py:8"),
        ("budgets.hf.capture", "budgets/hf/capture.py:9"),
        ("budgets.hf.capture", "budgets/hf/capture.py:10"),
        ("train.commands.surgery", "train/commands/surgery.py:6"),
        ("train.commands.surgery", "train/commands/surgery.py:7"),
        ("train.commands.surgery", "train/commands/surgery.py:8")]


# ------------------------------------------------------------------ train/render/ draws

# train/render/ draws what its caller hands it; the run directory is read by
# train/rundir/read.py. Calls that read a file, by name (`open(...)`, `path.read_text()`,
# budgets.schema's read_text(path), `budgets.load_report(path)`) and json.load.
RENDER = "train.render"
FILE_READERS = ("open", "read_text", "read_bytes", "read_yaml", "load_report")
RUN_READER = "train.rundir.read"


def render_reads(root: Path, edges: list[Edge]) -> list[str]:
    """One line per import of train/rundir/read.py and per file read in train/render/."""
    bad = [f"{e.where}: {e.source} imports {e.target}" for e in edges
           if _under(e.source, RENDER) and _under(e.target, RUN_READER)]
    for module, path in modules_of(root, ("train",)).items():
        if not _under(module, RENDER):
            continue
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else None
            json_load = (isinstance(f, ast.Attribute) and f.attr == "load"
                         and isinstance(f.value, ast.Name) and f.value.id == "json")
            if name in FILE_READERS or json_load:
                bad.append(f"{rel}:{node.lineno}: {module} reads a file ({ast.unparse(f)})")
    return bad


def test_render_reads_no_run_directory(edges):
    bad = render_reads(ROOT, edges)
    if bad:
        pytest.fail("train/render/ draws the data its caller passes in and reads no file "
                    "(train/rundir/read.py reads the run directory):\n  " + "\n  ".join(bad),
                    pytrace=False)


def test_the_render_rule_finds_planted_reads(tmp_path):
    plots = ("import json\nfrom pathlib import Path\n\n"
             "from ..rundir.files import atomic_path\n\n"  # writing figures is its job
             "def f(p):\n"
             "    from ..rundir.read import rank_records\n"
             "    with open(p) as fh:\n"
             "        json.load(fh)\n"
             "    return Path(p).read_text(), json.loads('{}')\n")
    files = {**CLEAN, "train/render/__init__.py": "", "train/render/plots.py": plots,
             "train/rundir/__init__.py": "", "train/rundir/files.py": "",
             "train/rundir/read.py": "def rank_records(p):\n    return open(p).read()\n"}
    root = plant(tmp_path, files)
    bad = render_reads(root, import_edges(root))
    assert [line.split(" (")[0] for line in bad] == [
        "train/render/plots.py:7: train.render.plots imports train.rundir.read",
        "train/render/plots.py:8: train.render.plots reads a file",
        "train/render/plots.py:9: train.render.plots reads a file",
        "train/render/plots.py:10: train.render.plots reads a file"]
