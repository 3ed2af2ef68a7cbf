"""Experiment configs from YAML files, with `key=value` overrides applied before parsing."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from budgets.schema import read_text
from zoo.config import require

from .experiment import Experiment
from .parse import parse_experiment
from .yaml_parse import parse_yaml, yaml_problem


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
    raw = parse_yaml(read_text(path), str(path), YAML12Loader)  # names the file and line
    require(raw is not None, f"{path}: the experiment config is empty")
    require(isinstance(raw, dict),
            f"{path}: an experiment must be a mapping, got {type(raw).__name__}")
    return parse_with_overrides(raw, list(overrides), str(path))


def parse_with_overrides(raw: dict[str, Any], overrides: list[str], source: str) -> Experiment:
    """The experiment of `raw` with the overrides applied; an error that an override
    brought in names that override rather than the file."""
    applied = overridden(raw, overrides)  # a malformed override names itself
    try:
        return parse_experiment(applied, source=source)
    except ValueError as e:
        culprit = first_failing(raw, overrides, str(e), source)
        if culprit is None:  # the file's own error
            raise
        what = str(e).removeprefix(f"{source}: ")
        raise ValueError(f"override {culprit!r} (applied to {source}): {what}") from None


def overridden(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `raw` with the overrides applied in order (`raw` is left as it was)."""
    raw = copy.deepcopy(raw)
    for override in overrides:
        apply_override(raw, override)
    return raw


def first_failing(raw: dict[str, Any], overrides: list[str], error: str,
                  source: str) -> str | None:
    """The override after which parsing first fails with `error` (None: the file alone
    does). Only run on the error path: one parse per override."""
    for k in range(len(overrides)):
        try:
            parse_experiment(overridden(raw, overrides[:k]), source=source)
        except ValueError as e:
            if str(e) == error:
                return None if k == 0 else overrides[k - 1]
    return overrides[-1] if overrides else None


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
        raise ValueError(f"bad override {override!r}: value is not valid YAML "
                         f"({yaml_problem(e)[1]})") from None
    except RecursionError:
        raise ValueError(f"bad override {override!r}: value is nested too deeply") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        require(isinstance(child, dict), f"bad override {override!r}: "
                                         f"{'.'.join(parts[:i + 1])} is {child!r}, not a mapping")
        node = child
    node[parts[-1]] = value
