"""Experiment configs from YAML files, with `key=value` overrides applied before parsing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from zoo.config import require

from .experiment import Experiment
from .parse import parse_experiment


class YAML12Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as a float (YAML 1.2) rather than a string."""


YAML12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=YAML12Loader)


def load_experiment(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Experiment:
    """Read a YAML experiment, apply `key=value` overrides, validate everything."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"experiment config {path} is a directory, not a YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"experiment config not found: {path}")
    try:
        raw = yaml_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    require(raw is not None, f"{path}: the experiment config is empty")
    require(isinstance(raw, dict),
            f"{path}: an experiment must be a mapping, got {type(raw).__name__}")
    for override in overrides:
        apply_override(raw, override)
    return parse_experiment(raw, source=str(path))


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` override in place; value is parsed as a YAML scalar."""
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    require(bool(sep and key) and all(parts),
            f"bad override {override!r}: expected key=value with a dotted key, "
            "e.g. train.max_steps=100")
    try:
        value = yaml_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ValueError(f"bad override {override!r}: value is not valid YAML ({e})") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        require(isinstance(child, dict), f"bad override {override!r}: "
                                         f"{'.'.join(parts[:i + 1])} is {child!r}, not a mapping")
        node = child
    node[parts[-1]] = value
