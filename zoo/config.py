"""Frozen, self-validating config dataclasses that reject unknown keys."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from typing import Any, TypeVar

C = TypeVar("C", bound="StrictConfig")


def unknown_key_error(owner: str, key: str, known: list[str]) -> ValueError:
    """The error for a key nobody reads, with the nearest known key as a suggestion."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {sorted(known)}"
    return ValueError(f"unknown {owner} key {key!r}{hint}")


@dataclass(frozen=True)
class StrictConfig:
    """Base for configs: `from_dict` rejects unknown keys, `validate` names bad values."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:  # overridden by subclasses
        pass

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any] | None = None, **kwargs: Any) -> C:
        data = {**(data or {}), **kwargs}
        known = [f.name for f in fields(cls) if f.init]
        for key in data:
            if key not in known:
                raise unknown_key_error(cls.__name__, key, known)
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds; messages name the values."""
    if not condition:
        raise ValueError(message)


def positive_int(owner: str, **values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")
