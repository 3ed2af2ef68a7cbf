"""Inside train/: each library imported where its job is, and no cycle between train's
subpackages.
(The checker and its rules: tests/layering/checker.py.)"""

from __future__ import annotations

import pytest

from tests.layering.checker import (
    CLEAN,
    ROOT,
    describe_cycle,
    find_cycles,
    import_edges,
    library_imports,
    plant,
    rule_violations,
    subpackage_edges,
)

# ------------------------------------------------------------------ jobs inside train/


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
