"""One module registers attention functions in transformers' global tables.
(The checker and its rules: tests/layering/checker.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layering.checker import (
    CLEAN,
    PACKAGES,
    ROOT,
    modules_of,
    plant,
)

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
