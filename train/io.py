"""The run directory's small files: YAML configs and JSON summaries, read and written.

One place for their format (YAML keys in the order written, JSON indented, a trailing
newline), so every stage writes them alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path) -> Any:
    """A YAML file written by write_yaml (or by hand); None when it is empty."""
    return yaml.safe_load(Path(path).read_text())


def write_yaml(path: Path, data: dict) -> None:
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def write_json(path: Path, data: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
