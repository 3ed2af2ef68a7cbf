"""Every file the project's text points to exists in the repository.

Docstrings, comments, the README and docs/ name files as pointers for the reader
("see docs/METRICS.md", "train/lm/lora.py"). A pointer counts when it starts with one of the
repository's top-level directories or is a bare capitalized Markdown name (README.md,
METRICS.md); it resolves against the repository root, the referring file's directory or
docs/. Lowercase bare names (report.md, config.yaml) are files of a run directory, not
pointers. This file and tests/layering/ are left out: their tests plant source
trees of their own, whose paths need not exist here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANTING = (Path(__file__).resolve(),
            *sorted((ROOT / "tests" / "layering").glob("*.py")))
SOURCES = ("zoo", "budgets", "train", "benches", "tests")
TOP_LEVEL = ("zoo", "budgets", "train", "benches", "tests", "docs", "configs", "notes", ".ci", "..")
REFERENCE = re.compile(r"(?<![\w/.-])((?:\.\./)?(?:[\w.-]+/)*[\w.-]+\.(?:py|md|yaml))(?![\w/])")


def references(text: str):
    """(line number, reference) for every pointer in `text`."""
    for number, line in enumerate(text.splitlines(), 1):
        for match in REFERENCE.finditer(line):
            ref = match.group(1)
            first = ref.split("/")[0]
            if first in TOP_LEVEL or ("/" not in ref and ref[0].isupper()):
                yield number, ref


def dangling(root: Path) -> list[str]:
    files = [p for d in SOURCES if (root / d).is_dir() for p in sorted((root / d).rglob("*.py"))]
    files += [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
              if p.is_file()]
    return [f"{path.relative_to(root)}:{number}: {ref}"
            for path in files if path.resolve() not in PLANTING
            for number, ref in references(path.read_text())
            if not any((base / ref).exists() for base in (root, path.parent, root / "docs"))]


def test_every_reference_resolves():
    bad = dangling(ROOT)
    if bad:
        pytest.fail("references to files that are not in the repository:\n  "
                    + "\n  ".join(bad), pytrace=False)


def test_the_check_finds_a_dangling_reference(tmp_path):
    (tmp_path / "zoo").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "METRICS.md").write_text("the [README](../README.md)\n")
    (tmp_path / "README.md").write_text("see docs/METRICS.md or METRICS.md; writes report.md\n")
    (tmp_path / "zoo" / "block.py").write_text(
        '"""The contract (see DESIGN.md and notes/x.md; docs/METRICS.md)."""\n')
    assert dangling(tmp_path) == ["zoo/block.py:1: DESIGN.md", "zoo/block.py:1: notes/x.md"]
