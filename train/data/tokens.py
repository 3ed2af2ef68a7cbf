"""Pre-tokenized shards as a task: nanoGPT's .bin, modded-nanogpt's headered .bin or .npy
(train/data/shards.py), memory-mapped, cut into seeded windows like text.

    spec = TokensSpec(("data/train_*.bin",), seq_len=1024, vocab_size=50304,
                      val_paths=("data/val_000000.bin",))
    (x, y), (val_x, val_y) = tokens_splits(spec, train_size, val_size, seed)

Validation is the shards `val_paths` names, or else the last `val_fraction` of the
tokens of `paths` (in sorted path order). Headers are checked when the spec is built;
token ids where they are read, in the windows a run draws: a shard is never read whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from zoo.config import StrictConfig, positive_int, require

from .conventions import VAL_SEED_OFFSET
from .shards import FORMATS, SUFFIX, Shard, bad_id_error, first_bad_id, open_shard
from .text import expand_paths
from .windows import Segment, draw_windows, window_count

DEFAULT_VAL_FRACTION = 0.1
SHARD_SUFFIXES = set(SUFFIX.values())


@dataclass(frozen=True)
class TokensSpec(StrictConfig):
    """Token shards: `paths` (files, directories, globs; a directory's files matching
    `pattern`, by default its .bin and .npy files), their `format` ("auto": by suffix and
    header), ids below `vocab_size`."""

    owner: ClassVar[str] = "tokens"

    paths: tuple[str, ...] | list[str]
    seq_len: int
    vocab_size: int
    val_paths: tuple[str, ...] | list[str] | None = None
    val_fraction: float | None = None
    pattern: str | None = None
    format: str = "auto"

    def validate(self) -> None:
        for key in ("paths", "val_paths"):
            value = getattr(self, key)
            listed = bool(value) and all(isinstance(p, str) and p for p in value)
            require(listed or (key == "val_paths" and value is None),
                    f"data.{key} must be a non-empty list of shard files, directories or "
                    f"globs, got {value!r}")
        require(self.format in ("auto", *FORMATS),
                f"data.format must be one of {['auto', *FORMATS]}, got {self.format!r}")
        require(self.val_paths is None or self.val_fraction is None,
                "data.val_paths and data.val_fraction both set: validation is the named "
                "shards or the last fraction of data.paths, not both")
        require(self.val_fraction is None or 0 < self.val_fraction < 1,
                f"data.val_fraction must be in (0, 1), got {self.val_fraction!r}")
        positive_int("data", vocab_size=self.vocab_size, seq_len=self.seq_len)
        try:
            self.shards()  # names a missing file, a truncated one, a bad header
        except FileNotFoundError as e:  # a config's bad value, as every other one
            raise ValueError(str(e)) from None

    def baseline(self, seed: int) -> dict:
        """None known: whether a tokens run learned is not judged."""
        return {"task": "tokens", "chance_accuracy": None, "entropy_floor": None,
                "unigram_loss": None}

    def shards(self) -> tuple[list[Shard], list[Shard]]:
        """(train shards, named validation shards: [] for the last fraction), headers checked."""
        return ([open_shard(p, self.format) for p in self._files("paths")],
                [open_shard(p, self.format) for p in self._files("val_paths")])

    def _files(self, key: str) -> list[Path]:
        files = []
        for entry in getattr(self, key) or ():
            found = expand_paths(entry, self.pattern)
            if self.pattern is None and Path(entry).is_dir():  # its shards, not its README
                found = [p for p in found if p.suffix in SHARD_SUFFIXES]
            require(bool(found), f"data.{key}: {entry!r} holds no .bin or .npy shard")
            files += found
        return files


def segments_of(spec: TokensSpec, train: list[Shard],
                val: list[Shard]) -> tuple[list[Segment], list[Segment]]:
    """(train segments, validation segments): the named validation shards, or the last
    val_fraction of the train shards' tokens cut off them."""
    whole = [Segment(str(s.path), s.tokens(), 0, s.count) for s in train]
    if val:
        return whole, [Segment(str(s.path), s.tokens(), 0, s.count) for s in val]
    total = sum(s.count for s in train)
    cut = int(total * (1 - (spec.val_fraction or DEFAULT_VAL_FRACTION)))
    before, after, seen = [], [], 0
    for seg in whole:  # the cut falls in one shard: its head trains, its tail validates
        here = min(max(cut - seen, 0), seg.stop)
        if here > 0:
            before.append(Segment(seg.name, seg.tokens, 0, here))
        if here < seg.stop:
            after.append(Segment(seg.name, seg.tokens, here, seg.stop))
        seen += seg.stop
    return before, after


def tokens_splits(spec: TokensSpec, train_size: int, val_size: int, seed: int):
    """Train and validation windows, seeded; an id outside the vocabulary in a window is an
    error naming its shard and the offset of the first such id in it."""
    train, val = spec.shards()
    shards = {str(s.path): s for s in [*train, *val]}
    out = []
    for name, segs, size, offset in zip(("train", "validation"), segments_of(spec, train, val),
                                        (train_size, val_size), (0, VAL_SEED_OFFSET),
                                        strict=True):
        if window_count(segs, spec.seq_len) == 0:
            held = sum(s.stop - s.start for s in segs)
            raise ValueError(f"data.paths {list(spec.paths)!r}: the {name} split holds "
                             f"{held:,} tokens in shards of at most seq_len {spec.seq_len} "
                             f"(a window takes seq_len + 1 tokens of one shard)")
        g = torch.Generator().manual_seed(seed + offset)
        (x, y), (seg, starts) = draw_windows(segs, size, spec.seq_len, g)
        check_ids(torch.cat([x, y[:, -1:]], dim=1), seg, starts, segs, shards, spec.vocab_size)
        out.append((x, y))
    return tuple(out)


def check_ids(windows: torch.Tensor, seg: torch.Tensor, starts: torch.Tensor,
              segs: list[Segment], shards: dict[str, Shard], vocab_size: int) -> None:
    """Raise naming the first bad id of the first shard a bad window came from."""
    bad = (windows >= vocab_size) | (windows < 0)  # [N, T + 1]
    if not bad.any():
        return
    row = int(bad.any(dim=1).nonzero()[0])
    shard = shards[segs[int(seg[row])].name]
    at = int(starts[row]) + int(bad[row].nonzero()[0])
    raise bad_id_error(shard, first_bad_id(shard, vocab_size, stop=at + 1), vocab_size)
