"""The package rules across the project (benches -> train -> zoo -> budgets, no cycle, no
private names), and the checker finding each planted violation.
(The checker and its rules: tests/layering/checker.py.)"""

from __future__ import annotations

import pytest

from tests.layering.checker import (
    CLEAN,
    ROOT,
    describe_cycle,
    find_cycles,
    import_edges,
    layer_violations,
    modules_of,
    package_of,
    plant,
    private_imports,
)

# ------------------------------------------------------------------ the project's own tree


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




def test_budgets_imports_neither_zoo_nor_train(edges):
    bad = [e for e in layer_violations(edges)
           if package_of(e.source) == "budgets" and package_of(e.target) in ("zoo", "train")]
    if bad:
        pytest.fail("budgets is the leaf and must not import zoo or train:\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {e.target}" for e in bad),
                    pytrace=False)


def test_zoo_does_not_import_train(edges):
    bad = [e for e in layer_violations(edges)
           if package_of(e.source) == "zoo" and package_of(e.target) == "train"]
    if bad:
        pytest.fail("zoo must not import train:\n  "
                    + "\n  ".join(f"{e.where}: {e.source} imports {e.target}" for e in bad),
                    pytrace=False)


def test_the_product_does_not_import_benches(edges):
    bad = [e for e in layer_violations(edges) if package_of(e.target) == "benches"]
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
