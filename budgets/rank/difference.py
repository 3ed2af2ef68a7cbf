"""Signed mixing known through products: differential attention's M = P1 - lambda P2 per
output head, two heads of one causal softmax combined (budgets/capture/differential.py).

    mixing = DifferenceMixing(AttentionMixing(q, k, scale, ...), lam)   # lam [H/2]
    block = mixing.past_future()          # an Operator [B, H/2, T - T/2, T/2]
    m = operator_metrics(block, eps=0.1)  # rank_eps, erank, ... [B, H/2]

Output head j is softmax head j minus lam[j] times head j + H/2 (the halves transformers'
diffllama splits its heads into). Every product goes through the one AttentionOperator
of all H heads: the input is repeated over both halves and the halves' results combined.
The exact Frobenius norm of a difference, which the two heads' norms do not give (the
cross term 2 lambda <P1, P2>), takes one more pass over the block's chunks. The whole
matrix is not offered (`full` is None): matrix-free, a signed layer's past->future block is
measured, as a factored one's is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .matfree import AttentionMixing, AttentionOperator, Operator


class DifferenceOperator(Operator):
    """P[:, :H/2] - lam P[:, H/2:] for the block P [B, H, m, n] of `op`: [B, H/2, m, n]."""

    def __init__(self, op: AttentionOperator, lam: torch.Tensor):
        B, H = op.batch
        if H % 2:
            raise ValueError(f"differential mixing pairs its heads: {H} heads is odd")
        self.op, self.half = op, H // 2
        self.lam = lam.float().to(op.device).reshape(1, H // 2, 1, 1)
        self.batch, self.shape = (B, H // 2), op.shape
        self.dtype, self.device = op.dtype, op.device
        self._fro2 = self._energy()  # [B, H/2] fp64

    def _combined(self, Y: torch.Tensor) -> torch.Tensor:
        """Per head pair, head j's product minus lam[j] times head j + H/2's."""
        return Y[:, :self.half] - self.lam * Y[:, self.half:]

    def matmul(self, X: torch.Tensor) -> torch.Tensor:  # [B, H/2, n, k] -> [B, H/2, m, k]
        return self._combined(self.op.matmul(torch.cat([X, X], dim=1)))

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:  # [B, H/2, m, k] -> [B, H/2, n, k]
        return self._combined(self.op.rmatmul(torch.cat([Y, Y], dim=1)))

    def _energy(self) -> torch.Tensor:
        """||P1 - lam P2||_F^2 per output head, one pass over the block's chunks."""
        B, H = self.op.batch
        out = torch.zeros(B, self.half, dtype=torch.float64, device=self.device)
        for t0, t1, lo, hi in self.op.chunks:
            P = self.op.probs_block(t0, t1, lo, hi).view(B, H, t1 - t0, hi - lo)
            out += self._combined(P).square().sum((-2, -1), dtype=torch.float64)
        return out

    def fro2(self) -> torch.Tensor:
        return self._fro2


@dataclass
class DifferenceMixing:
    """Differential attention's mixing, known by its H softmax heads (`parts`) and each
    output head's lambda [H/2]."""

    parts: AttentionMixing
    lam: torch.Tensor

    def full(self) -> None:
        return None

    def past_future(self) -> DifferenceOperator:
        return DifferenceOperator(self.parts.past_future(), self.lam)

    @property
    def seq_len(self) -> int:
        return self.parts.seq_len

    def prefix(self, t: int) -> DifferenceMixing:
        """The mixing of the first t tokens: causal, so both heads' top-left corners."""
        return DifferenceMixing(self.parts.prefix(t), self.lam)
