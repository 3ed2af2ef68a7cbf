"""Text read at run time from files, directories, globs or the standard library, cut
into seeded windows from disjoint train and validation parts: bytes (vocabulary 256), or
with a tokenizer its ids, tokenized once and cached (train/data/token_cache.py)."""

from __future__ import annotations

import glob
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from zoo.config import StrictConfig, positive_int, require

from .conventions import VAL_SEED_OFFSET
from .token_cache import tokenized_parts
from .tokenizer import TOKENIZER_FILE, bpe_size, tokenizer_kind, trained_bpe
from .windows import Segment, draw_windows

BYTE_VOCAB = 256
# data.paths entry: the Python standard library's own .py sources; "stdlib/<glob>" those
# the glob names under its directory (stdlib/json/*.py)
STDLIB = "stdlib"


@dataclass(frozen=True)
class TextSpec(StrictConfig):
    """Text read at run time from `paths`: files, directories (files matching `pattern`,
    recursively), globs, or "stdlib" (the standard library's .py sources; "stdlib/<glob>"
    some of them). The first max_bytes bytes, in sorted path order, are read; the last
    `val_fraction` of them is the validation split. Bytes are the tokens, unless
    `tokenizer` names one (train/data/tokenizer.py): then each split is its ids."""

    owner: ClassVar[str] = "text"

    paths: tuple[str, ...] | list[str]
    seq_len: int
    max_bytes: int = 2_000_000
    val_fraction: float = 0.1
    pattern: str = "*"
    tokenizer: str | None = None

    def validate(self) -> None:
        require(bool(self.paths) and all(isinstance(p, str) and p for p in self.paths),
                f"text paths must be a non-empty list of paths (or 'stdlib'), "
                f"got {list(self.paths)!r}")
        require(0 < self.val_fraction < 1,
                f"text val_fraction must be in (0, 1), got {self.val_fraction!r}")
        positive_int("text", max_bytes=self.max_bytes)
        if self.tokenizer is not None:
            tokenizer_kind(self.tokenizer)  # names a path that does not exist

    def baseline(self, seed: int) -> dict:
        """None known: whether a text run learned is not judged."""
        return {"task": "text", "chance_accuracy": None, "entropy_floor": None,
                "unigram_loss": None}


def stdlib_files(pattern: str | None = None) -> list[Path]:
    """The standard library's files (found at run time), sorted: every .py source, or
    those the glob `pattern` names under its directory; installed packages
    (site-packages) left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if pattern is None:
        return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    found = (Path(p) for p in glob.glob(str(root / pattern), recursive=True))
    return sorted(p for p in found if "site-packages" not in p.relative_to(root).parts)


def expand_paths(path: str, pattern: str | None) -> list[Path]:
    """The files one `paths` entry names; an entry naming nothing is an error. A
    directory's files are those matching `pattern` (every file for None)."""
    if path == STDLIB:
        found = stdlib_files()
    elif path.startswith(STDLIB + "/"):
        found = stdlib_files(path[len(STDLIB) + 1:])
    elif glob.has_magic(path):
        found = sorted(Path(p) for p in glob.glob(path, recursive=True))
    elif Path(path).is_dir():
        found = sorted(Path(path).rglob(pattern or "*"))
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
        for path in expand_paths(entry, spec.pattern):
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
    if spec.tokenizer is not None:
        return token_splits(spec, raw, train_size, val_size, seed)
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


def token_splits(spec: TextSpec, raw: bytes, train_size: int, val_size: int, seed: int):
    """The windows of the tokenized corpus: its train and validation bytes (cut as for
    bytes) tokenized apart, so a bpe:N tokenizer is trained on the train part alone."""
    cut = int(len(raw) * (1 - spec.val_fraction))
    ids = tokenized_parts({"train": raw[:cut], "val": raw[cut:]}, spec.tokenizer)
    splits = []
    for name, size, offset in (("train", train_size, 0), ("val", val_size, VAL_SEED_OFFSET)):
        segment = Segment(f"the {name} text", ids[name], 0, len(ids[name]))
        if segment.starts(spec.seq_len) == 0:
            raise ValueError(f"data.paths {list(spec.paths)!r}: the {name} split holds "
                             f"{len(ids[name]):,} tokens of {spec.tokenizer!r}, too few for "
                             f"seq_len {spec.seq_len} (each split needs more than seq_len)")
        g = torch.Generator().manual_seed(seed + offset)
        splits.append(draw_windows([segment], size, spec.seq_len, g)[0])
    return tuple(splits)


def tokenizer_json(spec: TextSpec) -> Path | None:
    """The tokenizer.json the splits of `spec` are the ids of, to keep beside a model
    trained on them (so `rankzoo report --model --tokenizer` reads its text as the model
    read its own): a bpe:N's trained on the train part, as token_splits trains it; a
    named file; a model directory's own. None for bytes, or a directory whose tokenizer
    only transformers loads."""
    if spec.tokenizer is None:
        return None
    kind = tokenizer_kind(spec.tokenizer)
    if kind == "bpe":
        raw = read_text_bytes(spec)
        train = raw[:int(len(raw) * (1 - spec.val_fraction))].decode("utf-8", errors="replace")
        return trained_bpe(bpe_size(spec.tokenizer), train)  # cached: not trained again
    path = Path(spec.tokenizer)
    path = path / TOKENIZER_FILE if kind == "dir" else path
    return path if path.is_file() else None
