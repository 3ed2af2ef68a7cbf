"""YAML text to data, with a syntax error as one line naming the source and the line.

    parse_yaml(text, "configs/quick.yaml")  # ValueError: "configs/quick.yaml:7: not valid
                                            # YAML (mapping values are not allowed here, ...)"

Experiment files, `key=value` overrides and the run directory's YAML files
(train/rundir/files.py) are all read through here.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import yaml


def yaml_problem(e: yaml.YAMLError) -> tuple[int | None, str]:
    """(line, what went wrong) of a PyYAML error, without its `"<unicode string>"` marks;
    the construct the problem was found in is named with where it starts."""
    mark, context = getattr(e, "problem_mark", None), getattr(e, "context", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is not None:
        what += f", column {mark.column + 1}"
    if context:
        start = getattr(e, "context_mark", None)
        what += f"; {context}" + (f" that starts at line {start.line + 1}, column "
                                  f"{start.column + 1}" if start is not None else "")
    return (None if mark is None else mark.line + 1), what


MERGE_TAG = "tag:yaml.org,2002:merge"


@functools.cache
def unique_keys(loader: type) -> type:
    """`loader` (SafeLoader or a subclass) refusing a key written twice in one mapping:
    PyYAML keeps the last one silently, so two `mha:` variants would become one."""

    class UniqueKeyLoader(loader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == MERGE_TAG:  # `<<: *base` merges, then may override
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if not isinstance(key, Hashable):  # PyYAML names that one itself
                        continue
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"found duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def parse_yaml(text: str, source: str, loader: type = yaml.SafeLoader) -> Any:
    """One YAML document; a syntax error or a key written twice in one mapping is a
    ValueError naming `source` and the line."""
    try:
        return yaml.load(text, Loader=unique_keys(loader))  # SafeLoader or a subclass
    except yaml.YAMLError as e:
        line, what = yaml_problem(e)
        raise ValueError(f"{source}{'' if line is None else f':{line}'}: not valid YAML "
                         f"({what})") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid YAML (nested too deeply)") from None
