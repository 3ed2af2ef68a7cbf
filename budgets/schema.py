"""Declared shapes of the JSON-like files rankzoo reads back, checked on read.

A reader that trusts a file's structure fails far from the cause (`KeyError: 'layers'`
inside a table renderer); checked here, a bad file is named with the field that is wrong:

    check(doc, REPORT, "runs/quick/mha/report.json")
    -> ValueError: runs/quick/mha/report.json: variants[0]: missing key 'layers'

Specs: the plain types int, float, str, bool, list, dict (bool is no int, an int is a
float; floats must be finite, since JSON's NaN and Infinity are never written on purpose
where they are checked), Number and Int for bounds, Maybe(spec) for null-or-spec,
ListOf(spec), MapOf(spec) (string keys), Choice(values), and Record(required, optional)
for objects. Keys a Record does not name are allowed (files gain keys over versions)
unless it is closed.

Reading text and JSON (`read_text`, `read_json`) names the file, and the line where it
is known, for an unreadable file, an undecodable byte or malformed JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class SchemaError(ValueError):
    """A value that does not have its declared shape; `where` is its path in the document."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}" if where else what)
        self.where, self.what = where, what


def shown(value: Any, limit: int = 40) -> str:
    """A short repr of a value for a message: long strings and containers are cut."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def key_path(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


class Spec:
    def check(self, value: Any, where: str) -> None:
        raise NotImplementedError


class Number(Spec):
    """A number (an int or a float, never a bool), finite unless asked otherwise."""

    def __init__(self, minimum: float | None = None, finite: bool = True):
        self.minimum, self.finite = minimum, finite

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(where, f"expected a number, got {shown(value)}")
        if self.finite and not math.isfinite(value):
            raise SchemaError(where, f"expected a finite number, got {value}")
        if self.minimum is not None and value < self.minimum:
            raise SchemaError(where, f"expected a number >= {self.minimum}, got {value}")


class Int(Spec):
    """An int (never a bool, never a float such as 5.0), optionally bounded below."""

    def __init__(self, minimum: int | None = None):
        self.minimum = minimum

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(where, f"expected an int, got {shown(value)}")
        if self.minimum is not None and value < self.minimum:
            raise SchemaError(where, f"expected an int >= {self.minimum}, got {value}")


class Plain(Spec):
    """isinstance against a plain type: str, bool, list, dict."""

    NAMES = {str: "a string", bool: "true or false", list: "a list", dict: "an object"}

    def __init__(self, t: type):
        self.t = t

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, self.t):
            raise SchemaError(where, f"expected {self.NAMES.get(self.t, self.t.__name__)}, "
                                     f"got {shown(value)}")


class Maybe(Spec):
    """null, or a value of `spec`."""

    def __init__(self, spec: Any):
        self.spec = as_spec(spec)

    def check(self, value: Any, where: str) -> None:
        if value is not None:
            self.spec.check(value, where)


class Choice(Spec):
    def __init__(self, values: Iterable[Any]):
        self.values = tuple(values)

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, (dict, list)) or value not in self.values:
            raise SchemaError(where, f"expected one of {list(self.values)}, got {shown(value)}")


class ListOf(Spec):
    def __init__(self, item: Any, min_len: int = 0):
        self.item, self.min_len = as_spec(item), min_len

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {shown(value)}")
        if len(value) < self.min_len:
            raise SchemaError(where, f"expected at least {self.min_len} entries, got "
                                     f"{len(value)}")
        for i, item in enumerate(value):
            self.item.check(item, f"{where}[{i}]")


class MapOf(Spec):
    """An object whose keys are strings and whose values all have `value`'s spec."""

    def __init__(self, value: Any):
        self.value = as_spec(value)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {shown(value)}")
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(where, f"expected string keys, got {shown(k)}")
            self.value.check(v, key_path(where, k))


class Record(Spec):
    """An object with `required` keys and `optional` ones, each of its own spec. Other keys
    are allowed (a later version may add some) unless `closed`."""

    def __init__(self, required: Mapping[str, Any], optional: Mapping[str, Any] | None = None,
                 closed: bool = False):
        self.required = {k: as_spec(v) for k, v in required.items()}
        self.optional = {k: as_spec(v) for k, v in (optional or {}).items()}
        self.closed = closed

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, got {shown(value)}")
        for key, spec in self.required.items():
            if key not in value:
                raise SchemaError(where, f"missing key {key!r}")
            spec.check(value[key], key_path(where, key))
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], key_path(where, key))
        if self.closed:
            unknown = [k for k in value if k not in self.required and k not in self.optional]
            if unknown:
                raise SchemaError(where, f"unknown key {shown(unknown[0])}; known: "
                                         f"{sorted([*self.required, *self.optional])}")


class AnyValue(Spec):
    def check(self, value: Any, where: str) -> None:
        pass


ANY = AnyValue()


def as_spec(spec: Any) -> Spec:
    if isinstance(spec, Spec):
        return spec
    if spec is int:
        return Int()
    if spec is float:
        return Number()
    if spec in (str, bool, list, dict):
        return Plain(spec)
    raise TypeError(f"not a schema spec: {spec!r}")


def same_lengths(record: Any, source: str, where: str = "") -> None:
    """The lists among a record's values, all of one length (per-head figures: one entry
    per head, read side by side); else a ValueError naming `source`, `where` and two of
    them. A record that is no dict is left to its schema."""
    if not isinstance(record, dict):
        return
    lengths = {k: len(v) for k, v in record.items() if isinstance(v, list)}
    if len(set(lengths.values())) > 1:
        (a, n), (b, m) = sorted(lengths.items(), key=lambda kv: kv[1])[::len(lengths) - 1]
        raise ValueError(f"{source}: {where}: per-head lists of different lengths ({a} has "
                         f"{n}, {b} has {m})")


def check(value: Any, spec: Any, source: str = "") -> Any:
    """`value` itself when it has the shape `spec` declares; else a ValueError naming
    `source` (a file, `file:line`) and the path of the first field that is wrong."""
    try:
        as_spec(spec).check(value, "")
    except SchemaError as e:
        raise ValueError(f"{source}: {e}" if source else str(e)) from None
    return value


# ---------------------------------------------------------------- reading files

def read_text(path: str | Path) -> str:
    """A file's text, decoded as UTF-8; an unreadable file or an undecodable byte is a
    ValueError naming the file (and the line of the byte)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except OSError as e:  # a directory, no permission, ...
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}; a "
                         "binary or corrupt file?)") from None


def parse_json(text: str, source: str) -> Any:
    """One JSON document; malformed JSON is a ValueError naming `source` and the line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}:{e.lineno}: not a JSON document ({e.msg}, column "
                         f"{e.colno})") from None
    except RecursionError:
        raise ValueError(f"{source}: not a JSON document (nested too deeply)") from None


def read_json(path: str | Path, spec: Any = ANY) -> Any:
    """A JSON file, checked against `spec`; every failure names the file."""
    return check(parse_json(read_text(path), str(path)), spec, str(path))
