"""The claims: one module each, one row here (the order the table lists them in)."""

from __future__ import annotations

from . import (
    data_rank,
    depth,
    grokking,
    heads,
    long_context,
    lora_rank,
    optimizers,
    softmax_bound,
    strict_effective,
)
from .rule import Claim

CLAIMS: dict[str, Claim] = {m.CLAIM.name: m.CLAIM for m in (
    depth,
    strict_effective,
    long_context,
    data_rank,
    optimizers,
    lora_rank,
    softmax_bound,
    heads,
    grokking,
)}


def claim(name: str) -> Claim:
    if name not in CLAIMS:
        raise ValueError(f"unknown claim {name!r}; the claims are {', '.join(CLAIMS)}")
    return CLAIMS[name]
