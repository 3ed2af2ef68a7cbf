"""What one pass over a softmax block's chunks of probabilities sizes and adds up.

    rows = rows_fitting(t0, lo, c1, budget)   # query rows of a causal chunk within a budget
    sums = BlockSums(N, n, device); sums.add(P, c); sums.fro2, sums.colsum, sums.top()

matfree.AttentionOperator plans its chunks with the first and takes, in its normalizing
pass, the block's energies, column sums and a certified bound on its top singular value
with the second (for itself and for the sub-blocks named at its construction).
"""

from __future__ import annotations

import math

import torch


class BlockSums:
    """What one pass adds up over a block of probabilities [N, m, n]: ||P||_F^2 (per row in
    fp32, 25x faster than an fp64 sum, the rows in fp64, as centering's ||P||^2 - m ||mu||^2
    cancels), the column sums and the largest row sum."""

    def __init__(self, N: int, n: int, device):
        self.fro2 = torch.zeros(N, dtype=torch.float64, device=device)
        self.colsum = torch.zeros(N, n, device=device)
        self.rowmax = torch.zeros(N, device=device)

    def add(self, P: torch.Tensor, c: int) -> None:
        """P [N, rows, keys] of this block, its keys from column c on."""
        self.fro2 += torch.linalg.vector_norm(P, dim=-1).double().square().sum(-1)
        self.colsum[:, c:c + P.shape[-1]] += P.sum(-2)
        self.rowmax = torch.maximum(self.rowmax, P.sum(-1).amax(-1))

    def top(self) -> torch.Tensor:
        """An upper bound [N] on ||P||_2^2, certified: ||P||_1 ||P||_inf (Hoelder), the
        largest column sum times the largest row sum of the nonnegative P."""
        return (self.colsum.amax(-1) * self.rowmax).double() * (1 + 1e-5)

    def take(self, idx: torch.Tensor) -> BlockSums:
        sub = object.__new__(BlockSums)
        sub.fro2, sub.colsum, sub.rowmax = self.fro2[idx], self.colsum[idx], self.rowmax[idx]
        return sub


def rows_fitting(t0: int, lo: int, c1: int, budget: int) -> int:
    """The most query rows from t0 whose keys [lo, min(c1, t0 + rows)) hold <= budget scores:
    a causal chunk widens with its last row."""
    a = t0 - lo
    rows = int((math.sqrt(a * a + 4 * budget) - a) / 2)  # rows * (a + rows) <= budget
    if t0 + rows > c1:  # past the block's last column every row sees all of it
        rows = budget // max(1, c1 - lo)
    return max(1, rows)
