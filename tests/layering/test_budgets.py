"""budgets/' own cut: its subpackages form no cycle, only budgets/hf/ imports transformers,
and budgets/mixing/ stands below the zoo and the captures.
(The checker and its rules: tests/layering/checker.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.layering.checker import (
    CLEAN,
    ROOT,
    Edge,
    Rule,
    describe_cycle,
    find_cycles,
    import_edges,
    library_imports,
    package_of,
    plant,
    rule_violations,
    subpackage_edges,
    under,
)

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
           if under(e.source, MIXING) and not any(under(e.target, p) for p in MIXING_MAY_IMPORT)]
    return bad + [f"{where}: {module} imports {name}"
                  for module, name, where in library_imports(root, ("budgets",))
                  if under(module, MIXING) and name.split(".")[0] not in sys.stdlib_module_names
                  and not any(under(name, lib) for lib in MIXING_LIBRARIES)]


def zoo_into_budgets(edges: list[Edge]) -> list[str]:
    """One line per import by zoo of a budgets module other than the package itself (its
    public face) and budgets/mixing/."""
    return [f"{e.where}: {e.source} imports {e.target}" for e in edges
            if package_of(e.source) == "zoo" and package_of(e.target) == "budgets"
            and e.target != "budgets" and not under(e.target, MIXING)]


def test_budgets_mixing_imports_only_torch_and_the_rank_primitives(edges):
    bad = mixing_violations(ROOT, edges)
    if bad:
        pytest.fail("budgets/mixing/ is the operators' math under zoo and the captures; it "
                    "imports torch, budgets/budget.py and budgets/rank/ only:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_zoo_reads_budgets_through_its_face_and_budgets_mixing(edges):
    # guards the rule against passing blind: the ssm block takes SSD's math from below
    assert any(e.source == "zoo.ssm" and under(e.target, MIXING) for e in edges)
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
