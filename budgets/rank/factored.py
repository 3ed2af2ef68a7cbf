"""Mixing known by low-rank factors: its past->future block L @ R^T, measured exactly.

    block = FactoredMixing(L, R).past_future()     # a LowRank
    m = block.metrics(eps=0.1)                       # rank_eps, erank, ... [B, H]

Linear attention's normalized feature maps and an SSM's decayed C and dt-weighted B give
the past->future block of their mixing as L @ R^T; its spectrum is exact from an r x r
core (spectra.product_spectrum), so this mode needs no iteration (matfree.py holds the
softmax operators, which do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .metrics import spectrum_metrics
from .spectra import product_spectrum


@dataclass
class LowRank:
    """A batch of matrices L @ R^T, L [*batch, m, r], R [*batch, n, r]: exact spectra."""

    L: torch.Tensor
    R: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (self.L.shape[-2], self.R.shape[-2])

    def metrics(self, eps: float) -> dict[str, torch.Tensor]:
        return spectrum_metrics(product_spectrum(self.L, self.R), self.shape, eps)


@dataclass
class FactoredMixing:
    """Mixing whose past->future block is L @ R^T, L [B, H, T - T/2, r], R [B, H, T/2, r]
    (linear attention: normalized feature maps; an SSM: decayed C and dt-weighted B).
    Its whole matrix is not low-rank, and is not measured in this mode."""

    L: torch.Tensor
    R: torch.Tensor

    def full(self) -> None:
        return None

    def past_future(self) -> LowRank:
        return LowRank(self.L, self.R)

    @property
    def seq_len(self) -> int:
        return self.L.shape[-2] + self.R.shape[-2]
