"""The one protocol every captured call type implements, so that a probe measures any of
them without asking which it is.

    kind = call.kind(moe)                 # {"attention": "global" | "sliding" | "ssm", ...}
    M = call.exact()                      # [B, H, T, T] the mixing matrix it applied
    op = call.operator()                  # its past->future block, matrix-free
    caps = call.caps(T, D, params, block) # RankBudget, as the matching zoo block declares
    call.release()                        # measured: its big tensors freed

`kind_name` keys the probe's table of entry builders ("attention", "scan"): what each kind
of layer adds to its entry beyond the mixing (projections, caches) is a row there, not a
branch on the call's class.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ..budget import RankBudget


@runtime_checkable
class Mixer(Protocol):
    """A token mixer's call, as a source captured it."""

    module: nn.Module | None  # the module that made the call
    kind_name: str  # the probe's entry builder for it

    def kind(self, moe: bool) -> dict:
        """The layer's kind for the report: attention kind, window, state, label, ..."""
        ...

    def exact(self) -> torch.Tensor:
        """The exact mixing matrix [B, H, T, T] the call applied (P, or an SSD's M)."""
        ...

    def operator(self):
        """Its past->future block as an operator (budgets/rank/matfree.py), never T x T."""
        ...

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        """The declared caps of a layer making this call."""
        ...

    def release(self) -> None:
        """Free what was only needed for measuring (the capture keeps every call)."""
        ...
