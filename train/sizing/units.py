"""Units people type and read: cache dtypes, byte sizes (KiB or KB), counts (M, G).

    dtype_name("bfloat16") -> "bf16";  DTYPE_BYTES["bf16"] -> 2
    parse_bytes("256KiB") -> 262144;   format_bytes(262144) -> "256 KiB"
    parse_count("1.5B", "--params-budget") -> 1500000000;  format_count(3.02e8) -> "302M"

Byte sizes per dtype come from budgets' table (budgets/cache.py), the one source the
report's advice and compress use too. A bad value is a ValueError naming the flag and the value.
"""

from __future__ import annotations

import re

from budgets import cache

# the short names people write -> the names of budgets' byte table (the one source of sizes)
DTYPE_LONG = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8",
              "int8": "int8"}
DTYPE_BYTES = {short: cache.DTYPE_BYTES[long] for short, long in DTYPE_LONG.items()}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "half": "fp16", "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}

BYTE_UNITS = {"": 1, "b": 1, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
              "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}
COUNT_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "b": 10 ** 9, "t": 10 ** 12}
# the largest size or count taken: budgets are compared as int64 and floats downstream,
# and anything larger is no machine's (1e999 reads as inf)
MAX_VALUE = 2 ** 63 - 1
NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.I)


def dtype_name(text: str) -> str:
    """The canonical name of a cache dtype (`bf16`, `bfloat16` -> bf16); an unknown one is
    an error listing the known ones."""
    name = str(text).strip().lower()
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(f"--cache-dtype {text}: unknown dtype; known: "
                         f"{', '.join(DTYPE_BYTES)} (or {', '.join(DTYPE_ALIASES)})")
    return name


def _number(text: str, flag: str, what: str) -> tuple[float, str]:
    text = str(text)
    if text.strip().startswith("-"):
        raise ValueError(f"{flag} {text}: expected a positive {what}, got a negative one")
    m = NUMBER.match(text)
    if m is None:
        raise ValueError(f"{flag} {text}: expected a {what}")
    return float(m[1]), m[2].lower()


def _bounded(value: float, text: str, flag: str) -> int:
    """int(value), refusing inf and anything above MAX_VALUE before it is converted."""
    if not value <= MAX_VALUE:
        raise ValueError(f"{flag} {text}: too large; at most {MAX_VALUE:.3g}")
    return int(value)


def parse_bytes(text: str, flag: str = "--cache-budget") -> int:
    """Bytes from `262144`, `256KiB`, `1MiB`, `1.5 GiB` (1024-based) or `64KB`, `1MB`
    (1000-based); a bare `k`/`m`/`g` is refused as ambiguous."""
    value, unit = _number(text, flag, "size in bytes, e.g. 256KiB, 1MiB or 262144")
    if unit in ("k", "m", "g", "t"):
        raise ValueError(f"{flag} {text}: say {value:g}{unit.upper()}iB (1024-based) or "
                         f"{value:g}{unit.upper()}B (1000-based)")
    if unit not in BYTE_UNITS:
        raise ValueError(f"{flag} {text}: unknown unit {unit!r}; known: B, KiB, MiB, GiB, TiB, "
                         "KB, MB, GB, TB")
    size = _bounded(value * BYTE_UNITS[unit], text, flag)
    if size < 1:
        raise ValueError(f"{flag} {text}: expected at least one byte")
    return size


def parse_count(text: str, flag: str) -> int:
    """A count from `300000000`, `300M`, `1.5B`, `2G`, `4e9` (1000-based; for FLOPs a
    trailing `FLOP` or `FLOPs` is allowed: `2GFLOPs`)."""
    stripped = re.sub(r"flops?$", "", str(text).strip(), flags=re.I)
    value, unit = _number(stripped, flag, "count, e.g. 300M, 1.5B or 2e9")
    if unit not in COUNT_UNITS:
        raise ValueError(f"{flag} {text}: unknown unit {unit!r}; known: k, M, G (or B), T")
    count = _bounded(value * COUNT_UNITS[unit], text, flag)
    if count < 1:
        raise ValueError(f"{flag} {text}: expected at least 1")
    return count


def format_bytes(n: int | None) -> str:
    """`12 B`, `252 KiB`, `243.8 KiB`, `48 MiB`."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.4g} {unit}"
    raise AssertionError("unreachable")


def byte_flag(n: int) -> str:
    """A byte count as a command-line value: `256KiB` where a binary unit divides it."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def format_count(n: int | float | None) -> str:
    """`950`, `12.3k`, `302M`, `1.34G` (1000-based)."""
    if n is None:
        return "-"
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"
