"""Seeded windows cut from token arrays that may be memory-mapped: what the text task with
a tokenizer and the tokens task train and validate on.

    segments = [Segment("train_000.bin", tokens, 0, len(tokens))]
    (x, y), sources = draw_windows(segments, count=512, seq_len=128, g=generator)

A window never crosses from one segment into the next (two shards, or a shard's train and
validation parts). Only the windows drawn are read: a shard of billions of tokens costs
what the split holds, count x (seq_len + 1) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Segment:
    """tokens[start:stop] of one array, named by where it came from (a file)."""

    name: str
    tokens: np.ndarray
    start: int
    stop: int

    def starts(self, seq_len: int) -> int:
        """How many windows of seq_len + 1 tokens start in it."""
        return max(0, self.stop - self.start - seq_len)


def window_count(segments: list[Segment], seq_len: int) -> int:
    return sum(s.starts(seq_len) for s in segments)


def draw_windows(segments: list[Segment], count: int, seq_len: int, g: torch.Generator
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`count` windows of seq_len + 1 tokens drawn uniformly among every start of every
    segment: ((tokens, next-token labels) [N, T] int64, (segment index, start) [N] of each
    window, for an error that names where a bad token sits)."""
    per = torch.tensor([s.starts(seq_len) for s in segments])  # [S]
    total = int(per.sum())
    if total == 0:
        raise ValueError(f"no window of seq_len + 1 = {seq_len + 1} tokens fits")
    flat = torch.randint(total, (count,), generator=g)  # [N]
    ends = per.cumsum(0)  # [S]
    seg = torch.searchsorted(ends, flat, right=True)  # [N]
    starts = flat - (ends[seg] - per[seg]) + torch.tensor([s.start for s in segments])[seg]
    seq = np.empty((count, seq_len + 1), dtype=np.int64)  # [N, T + 1]
    span = np.arange(seq_len + 1)
    for i, s in enumerate(segments):
        rows = (seg == i).nonzero().flatten().numpy()
        if rows.size:  # a memmap's fancy index reads only the pages it touches
            seq[rows] = s.tokens[starts.numpy()[rows, None] + span]
    seq = torch.from_numpy(seq)
    return (seq[:, :-1].contiguous(), seq[:, 1:].contiguous()), (seg, starts)
