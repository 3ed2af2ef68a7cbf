"""YAML text to data, with a syntax error as one line naming the source and the line.

    parse_yaml(text, "configs/quick.yaml")  # ValueError: "configs/quick.yaml:7: not valid
                                            # YAML (mapping values are not allowed here, ...)"

Experiment files, `key=value` overrides and the run directory's YAML files
(train/rundir/files.py) are all read through here.
"""

from __future__ import annotations

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


def parse_yaml(text: str, source: str, loader: type = yaml.SafeLoader) -> Any:
    """One YAML document; a syntax error is a ValueError naming `source` and the line."""
    try:
        return yaml.load(text, Loader=loader)  # SafeLoader or a subclass of it
    except yaml.YAMLError as e:
        line, what = yaml_problem(e)
        raise ValueError(f"{source}{'' if line is None else f':{line}'}: not valid YAML "
                         f"({what})") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid YAML (nested too deeply)") from None
