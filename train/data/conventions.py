"""What every task's examples share: next-token labels with IGNORE at the positions nothing
is scored on, accuracy over the labelled positions, and the validation split's seed."""

from __future__ import annotations

import torch

IGNORE = -100
VAL_SEED_OFFSET = 1_000_003  # the validation split's seed is the train seed plus this


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(fraction correct at labelled positions, number of labelled positions)."""
    mask = labels != IGNORE  # [B, T]
    count = int(mask.sum())
    if count == 0:
        return logits.new_zeros(()), 0
    correct = (logits.argmax(dim=-1) == labels) & mask  # [B, T]
    return correct.sum().float() / count, count
