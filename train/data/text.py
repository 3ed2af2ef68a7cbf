"""Byte-level text read at run time from files, directories, globs or the standard
library, cut into seeded windows from disjoint train and validation parts."""

from __future__ import annotations

import glob
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from zoo.config import StrictConfig, positive_int, require

from .conventions import VAL_SEED_OFFSET

BYTE_VOCAB = 256
STDLIB = "stdlib"  # data.paths entry: the Python standard library's own .py sources


@dataclass(frozen=True)
class TextSpec(StrictConfig):
    """Byte-level text read at run time from `paths`: files, directories (files matching
    `pattern`, recursively), globs, or "stdlib" (the standard library's .py sources).
    The first max_bytes bytes, in sorted path order, are read; the last `val_fraction` of
    them is the validation split."""

    owner: ClassVar[str] = "text"

    paths: tuple[str, ...] | list[str]
    seq_len: int
    max_bytes: int = 2_000_000
    val_fraction: float = 0.1
    pattern: str = "*"

    def validate(self) -> None:
        require(bool(self.paths) and all(isinstance(p, str) and p for p in self.paths),
                f"text paths must be a non-empty list of paths (or 'stdlib'), "
                f"got {list(self.paths)!r}")
        require(0 < self.val_fraction < 1,
                f"text val_fraction must be in (0, 1), got {self.val_fraction!r}")
        positive_int("text", max_bytes=self.max_bytes)

    def baseline(self, seed: int) -> dict:
        """None known: whether a text run learned is not judged."""
        return {"task": "text", "chance_accuracy": None, "entropy_floor": None,
                "unigram_loss": None}


def _expand(path: str, pattern: str) -> list[Path]:
    """The files one `paths` entry names; an entry naming nothing is an error."""
    if path == STDLIB:
        root, pattern = Path(sysconfig.get_paths()["stdlib"]), "*.py"
        found = sorted(p for p in root.rglob(pattern) if "site-packages" not in p.parts)
    elif glob.has_magic(path):
        found = sorted(Path(p) for p in glob.glob(path, recursive=True))
    elif Path(path).is_dir():
        found = sorted(Path(path).rglob(pattern))
    elif Path(path).exists():
        found = [Path(path)]
    else:
        raise FileNotFoundError(f"data.paths: {path!r} does not exist")
    files = [p for p in found if p.is_file()]
    if not files:
        raise ValueError(f"data.paths: {path!r} names no files"
                         + (f" matching {pattern!r}" if Path(path).is_dir() else ""))
    return files


def read_text_bytes(spec: TextSpec) -> bytes:
    """The corpus: files concatenated in order, capped at max_bytes."""
    chunks, total = [], 0
    for entry in spec.paths:
        for path in _expand(entry, spec.pattern):
            try:
                data = path.read_bytes()[:spec.max_bytes - total]
            except OSError as e:
                raise ValueError(f"data.paths: cannot read {str(path)!r} ({e.strerror})") from None
            chunks.append(data)
            total += len(data)
            if total >= spec.max_bytes:
                return b"".join(chunks)
    return b"".join(chunks)


def _windows(data: torch.Tensor, count: int, seq_len: int,
             g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random windows of seq_len + 1 bytes: (tokens, next-token labels)."""
    starts = torch.randint(len(data) - seq_len, (count,), generator=g)  # [N]
    seq = data[starts[:, None] + torch.arange(seq_len + 1)]  # [N, T + 1]
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def text_splits(spec: TextSpec, train_size: int, val_size: int, seed: int):
    """Train and validation windows from disjoint parts of the corpus, seeded."""
    raw = read_text_bytes(spec)
    if not raw:
        raise ValueError(f"data.paths {list(spec.paths)!r}: every file is empty")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()  # [n_bytes]
    cut = int(len(data) * (1 - spec.val_fraction))
    train, val = data[:cut], data[cut:]
    if min(len(train), len(val)) <= spec.seq_len:
        raise ValueError(f"data.paths {list(spec.paths)!r}: {len(data):,} bytes is too little "
                         f"text for seq_len {spec.seq_len} with val_fraction "
                         f"{spec.val_fraction} (each split needs more than seq_len bytes)")
    return (_windows(train, train_size, spec.seq_len, torch.Generator().manual_seed(seed)),
            _windows(val, val_size, spec.seq_len,
                     torch.Generator().manual_seed(seed + VAL_SEED_OFFSET)))
