"""The run directory's small files: YAML configs and JSON summaries, read and written.

One place for their format (YAML keys in the order written, JSON indented, a trailing
newline), so every stage writes them alike; and for their shape on read: each file the
harness reads back goes through a schema (budgets/schema.py), so a truncated, binary or
hand-edited file is an error naming the file, the line where known, and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from budgets.schema import ANY, Int, MapOf, Maybe, Number, Record, check, read_text

# What the readers of a run directory take from its YAML files (train/rundir/read.py,
# train/experiment/stages.py, train/experiment/finetune.py, train/experiment/sweep.py);
# everything else is compared or parsed by the experiment parser, which names its own errors.
SECTION = Maybe(dict)
EXPERIMENT_YAML = Record({}, {"variants": Maybe(MapOf(ANY)),
                              **dict.fromkeys(("data", "model", "train", "monitor", "match",
                                               "sweep", "finetune"), SECTION)})
FINETUNE_RECORD = Record({"r": Int(1), "alpha": Number()},
                         {"trainable_params": Maybe(Int(0)), "zero_shot": MapOf(Number(
                             finite=False))})
VARIANT_YAML = Record({}, {"experiment": str, "variant": str, "params": Int(0),
                           "finetune": FINETUNE_RECORD,
                           **dict.fromkeys(("data", "model", "block", "train", "monitor",
                                            "match"), SECTION)})
# by file name: the run directory's files have fixed names (train/rundir/read.py)
RUN_YAML = {"experiment.yaml": EXPERIMENT_YAML, "config.yaml": VARIANT_YAML}
MAPPING = Maybe(dict)


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


def read_yaml(path: Path, spec: Any = None) -> Any:
    """A YAML file written by write_yaml (or by hand); None when it is empty. Checked
    against `spec`, by default the schema of its run-directory name (experiment.yaml,
    config.yaml), else: a mapping."""
    path = Path(path)
    data = parse_yaml(read_text(path), str(path))
    spec = spec if spec is not None else RUN_YAML.get(path.name, MAPPING)
    return None if data is None else check(data, spec, str(path))


def write_yaml(path: Path, data: dict) -> None:
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def write_json(path: Path, data: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
