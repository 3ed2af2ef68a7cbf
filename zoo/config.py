"""Frozen, self-validating config dataclasses that reject unknown keys.

One validation path for every config in rankzoo (blocks, and train's sections): a
`StrictConfig` checks each field against its annotation when it is built, `from_dict`
names unknown keys (with a suggestion when one is close) and missing required keys, and
each subclass's `validate` checks what types cannot say (ranges, divisibility).
"""

from __future__ import annotations

import difflib
import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, TypeVar

C = TypeVar("C", bound="StrictConfig")

# A suggestion is offered only when it is this close (difflib ratio) to the key given:
# far-off suggestions ("windw" -> "bias") mislead more than they help.
SUGGEST_CUTOFF = 0.7


def unknown_key_error(owner: str, key: str, known: list[str]) -> ValueError:
    """The error for a key nobody reads, with the nearest known key as a suggestion."""
    # compare the last dotted part only: a shared prefix ("variants.mha.") makes any two
    # keys look alike
    tail = {k.rsplit(".", 1)[-1]: k for k in known}
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tail), n=1,
                                      cutoff=SUGGEST_CUTOFF)
    close = [tail[c] for c in close]
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {sorted(known)}"
    return ValueError(f"unknown {owner} key {key!r}{hint}")


def is_instance(value: Any, t: Any) -> bool:
    """isinstance for the annotations configs use: bool is not an int, an int is a float."""
    if t is type(None):
        return value is None
    if t is Any:
        return True
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin = typing.get_origin(t) or t
    return isinstance(value, origin)


def _alternatives(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _type_name(t: Any) -> str:
    return "null" if t is type(None) else getattr(t, "__name__", str(t))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_types(cfg: Any, owner: str) -> None:
    """Check each init field of a dataclass against its annotation, naming the value."""
    hints = _hints(type(cfg))
    for f in fields(cfg):
        if not f.init:
            continue
        value, allowed = getattr(cfg, f.name), _alternatives(hints[f.name])
        if not any(is_instance(value, t) for t in allowed):
            names = " or ".join(_type_name(t) for t in allowed)
            raise ValueError(f"{owner}.{f.name} must be {names}, got {value!r}")
        # inf and nan pass every `> 0` check that nan does not fail; no setting means them
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}.{f.name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class StrictConfig:
    """Base for configs: types checked from annotations, then `validate` names bad values;
    `from_dict` rejects unknown keys and names missing ones."""

    owner: ClassVar[str] = ""  # the name errors start with ("softmax", "train", ...)

    def __post_init__(self) -> None:
        check_types(self, self.config_owner())
        self.validate()

    @classmethod
    def config_owner(cls) -> str:
        return cls.owner or cls.__name__

    def validate(self) -> None:  # overridden by subclasses
        pass

    @classmethod
    def required_keys(cls) -> list[str]:
        return [f.name for f in fields(cls)
                if f.init and f.default is MISSING and f.default_factory is MISSING]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any] | None = None, **kwargs: Any) -> C:
        data = {**(data or {}), **kwargs}
        known = [f.name for f in fields(cls) if f.init]
        for key in data:
            if key not in known:
                raise unknown_key_error(cls.config_owner(), key, known)
        missing = [k for k in cls.required_keys() if k not in data]
        if missing:
            raise ValueError(f"{cls.config_owner()}: missing required "
                             f"key{'s' if len(missing) > 1 else ''} "
                             f"{', '.join(repr(k) for k in missing)}")
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


# The largest seed every generator a run seeds accepts: numpy's (Lightning seeds it too)
# stops at 2**32 - 1, torch's at 2**64 - 1.
MAX_SEED = 2**32 - 1


def seed_value(where: str, value: Any, optional: bool = False) -> None:
    """A seed: an int in [0, MAX_SEED] (None too when `optional`), named by `where`."""
    if optional and value is None:
        return
    require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED,
            f"{where} must be a non-negative int up to {MAX_SEED}"
            f"{' or null' if optional else ''}, got {value!r}")


def positive_number(owner: str, **values: Any) -> None:
    """Each value a positive int or float (None is skipped: an optional field left unset)."""
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")
