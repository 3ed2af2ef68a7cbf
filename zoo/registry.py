"""The block registry: short names -> block classes."""

from __future__ import annotations

from typing import Any

from .block import Block
from .config import unknown_key_error
from .facts import Facts

_BLOCKS: dict[str, type[Block]] = {}


def register(name: str):
    """Class decorator: make a Block buildable as zoo.build(name, ...)."""

    def wrap(cls: type[Block]) -> type[Block]:
        if name in _BLOCKS:
            raise ValueError(f"block {name!r} is already registered by {_BLOCKS[name].__name__}")
        cls.kind = name
        _BLOCKS[name] = cls
        return cls

    return wrap


def names() -> list[str]:
    return sorted(_BLOCKS)


def families() -> list[str]:
    """The registered blocks in registration order: the order tables list them in when
    their costs tie (zoo/__init__.py registers them in that order)."""
    return list(_BLOCKS)


def facts_of(name: str) -> Facts:
    """What a block family declares about itself (zoo/facts.py)."""
    return block_class(name).facts


def block_class(name: str) -> type[Block]:
    if name not in _BLOCKS:
        raise unknown_key_error("block", name, names())
    return _BLOCKS[name]


def build(name: str, config: dict[str, Any] | None = None, **kwargs: Any) -> Block:
    """Build a registered block from keyword arguments (or a dict) validated by its config."""
    cls = block_class(name)
    return cls(cls.Config.from_dict(config, **kwargs))
