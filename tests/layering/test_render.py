"""train/render/ draws documents and reads no run directory.
(The checker and its rules: tests/layering/checker.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layering.checker import (
    CLEAN,
    ROOT,
    Edge,
    import_edges,
    modules_of,
    plant,
    under,
)

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
           if under(e.source, RENDER) and under(e.target, RUN_READER)]
    for module, path in modules_of(root, ("train",)).items():
        if not under(module, RENDER):
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
