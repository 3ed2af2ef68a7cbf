"""zoo's own cut: only zoo/hf/ imports transformers, and `import zoo` does not import it
(the Auto classes learn model_type "rankzoo" through a hook when transformers loads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.layering.checker import CLEAN, ROOT, Rule, library_imports, plant, rule_violations

# the Hugging Face extra is optional for the zoo: its blocks and DecoderLM need torch only,
# and zoo/hf/ is the one place that makes them a Hugging Face model
ZOO_RULES = (
    Rule("transformers", ("zoo.hf",),
         "zoo/hf/ is the zoo's one Hugging Face module; the blocks need no hf extra"),
)


def test_only_zoo_hf_imports_transformers_inside_zoo():
    imports = library_imports(ROOT, ("zoo",))
    # guards the rule against passing blind: it sees zoo/hf/'s own imports
    assert any(module.startswith("zoo.hf") and name.startswith("transformers")
               for module, name, _ in imports), imports
    bad = rule_violations(imports, ZOO_RULES)
    if bad:
        pytest.fail("transformers imported in zoo/ outside zoo/hf/:\n  " + "\n  ".join(bad),
                    pytrace=False)


def test_the_zoo_rule_finds_a_planted_transformers_import(tmp_path):
    files = {**CLEAN, "zoo/hf/__init__.py": "def f():\n    import transformers\n",
             "zoo/lm.py": "def g():\n    from transformers import PreTrainedModel\n"}
    bad = rule_violations(library_imports(plant(tmp_path, files), ("zoo",)), ZOO_RULES)
    assert [line.split(" (")[0] for line in bad] == ["zoo/lm.py:2: zoo.lm imports transformers"]


def test_import_zoo_does_not_import_transformers():
    code = "import sys, zoo; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
