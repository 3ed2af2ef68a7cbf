"""The block registry: short names -> block classes."""

from __future__ import annotations

from typing import Any

from .block import Block
from .config import unknown_key_error
from .facts import Facts

_BLOCKS: dict[str, type[Block]] = {}


def register(name: str):
    """Class decorator: make a Block buildable as zoo.build(name, ...). The class must
    declare its own `facts` (zoo/facts.py): pick, blocks, matching, compress, the advice
    checks and the HF per-kind table read it, and an inherited one would size, check and
    mirror the new block as its parent."""

    def wrap(cls: type[Block]) -> type[Block]:
        if name in _BLOCKS:
            raise ValueError(f"block {name!r} is already registered by {_BLOCKS[name].__name__}")
        check_facts(name, cls)
        cls.kind = name
        _BLOCKS[name] = cls
        return cls

    return wrap


def check_facts(name: str, cls: type) -> None:
    """A registered class's own Facts, whose HF layer kinds no other block mirrors (the
    per-kind table names one zoo block per kind)."""
    facts = cls.__dict__.get("facts")
    if not isinstance(facts, Facts):
        got = "none" if facts is None else f"{type(facts).__name__} {facts!r}"
        raise TypeError(f"block class {cls.__name__} (registered as {name!r}) must declare "
                        f"`facts = Facts(...)` on the class itself (zoo/facts.py), got {got}")
    for kind in facts.mirrors:
        other = next((n for n, c in _BLOCKS.items() if kind in c.facts.mirrors), None)
        if other is not None:
            raise ValueError(f"block class {cls.__name__} (registered as {name!r}) mirrors "
                             f"the HF layer kind {kind!r}, which {other!r} already mirrors")


def unregister(name: str) -> type[Block]:
    """Remove a registered block (a test's own block, registered for the test); returns
    its class."""
    block_class(name)  # an unknown name: the registry's error
    return _BLOCKS.pop(name)


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
