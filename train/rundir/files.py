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

from ..config.yaml_parse import parse_yaml

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
