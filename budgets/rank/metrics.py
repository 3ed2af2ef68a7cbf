"""Effective-rank metrics of a batch of matrices, from one singular-value computation.

    m = rank_metrics(P, eps=0.1, center=True)   # P: [B, H, T, T] -> m["erank"]: [B, H]

Every metric is a function of the singular values s_1 >= s_2 >= ... of each matrix
(definitions and pitfalls: docs/METRICS.md):

  rank_eps             min k with sum_{i<=k} s_i^2 >= (1 - eps^2) sum s_i^2
                       (equivalently ||A - A_k||_F <= eps ||A||_F, by Eckart-Young)
  erank                Roy & Vetterli: exp of the entropy of p_i = s_i / sum s_j
  stable_rank          sum s^2 / s_1^2
  participation_ratio  (sum s^2)^2 / sum s^4
  numerical_rank       #{s_i > s_1 * max(m, n) * machine eps}   (NumPy's matrix_rank tol)
  sigma_1, sigma_ratio s_1 and s_2 / s_1 (the gap that rank collapse lives in)

An all-zero (or empty) matrix reads 0 on every metric: it has no rank to measure, and 0 is
the one answer that aggregates (means over heads) without poisoning the rest with NaN.
"""

from __future__ import annotations

import torch

from .eigen import eigvalsh
from .spectra import centered_pair, spectrum

METRICS = (
    "rank_eps",
    "erank",
    "stable_rank",
    "participation_ratio",
    "numerical_rank",
    "sigma_1",
    "sigma_ratio",
)


def check_eps(eps: float) -> None:
    if not 0.0 < float(eps) < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got eps={eps!r}")


def as_matrices(A) -> torch.Tensor:
    """Validate A as a batch of matrices [..., m, n] and bring it to fp32 or fp64.

    bf16/fp16 are upcast to fp32: bf16 keeps ~2-3 significant digits (eps = 2^-7), so its
    singular values below ~1e-2 * s_1 are rounding noise, and LAPACK has no half-precision
    SVD anyway. Upcasting cannot recover what bf16 already lost, but it stops the SVD from
    adding more. Integers and bools are cast too (e.g. 0/1 adjacency matrices).
    """
    A = torch.as_tensor(A)
    if A.dim() < 2:
        raise ValueError(f"expected a matrix or a batch of matrices [..., m, n], "
                         f"got shape {tuple(A.shape)}")
    if A.is_complex():
        raise ValueError(f"expected a real matrix, got dtype {A.dtype}")
    if A.dtype != torch.float64:
        A = A.to(torch.float32)
    bad = A.numel() - int(torch.isfinite(A).sum())
    if bad:
        raise ValueError(f"matrix of shape {tuple(A.shape)} has {bad} non-finite "
                         f"(NaN or inf) entries")
    return A.detach()


def singular_values(A, center: bool = False) -> torch.Tensor:
    """Singular values [..., min(m, n)], descending, in fp32 (fp64 for fp64 input).

    center=True subtracts the mean row first (P - 1 mean_rows(P)). A row-stochastic P has
    P 1 = 1, so s_1 >= 1 from the all-ones direction alone: near-uniform attention reads
    rank ~1 whatever structure rides on top. Centering removes that direction.
    """
    # one batched call on A's device, by the cheapest exact method for its shape and dtype
    return spectrum(as_matrices(A), center=center)


def singular_value_pair(A) -> tuple[torch.Tensor, torch.Tensor]:
    """(singular_values(A), singular_values(A, center=True)) from one Gram product and one
    eigensolver batch (spectra.centered_pair): a mixing matrix's raw and centered metrics."""
    return centered_pair(as_matrices(A))


def spectrum_metrics(s: torch.Tensor, shape: tuple[int, int], eps: float = 0.1
                     ) -> dict[str, torch.Tensor]:
    """All METRICS from singular values s [..., k] (descending) of matrices of `shape` (m, n)."""
    check_eps(eps)
    lead, k = s.shape[:-1], s.shape[-1]
    if k == 0:  # empty matrices: nothing to measure
        return {name: s.new_zeros(lead) for name in METRICS}
    s1 = s[..., 0]
    alive = s1 > 0  # all-zero matrices give 0 everywhere, not 0/0
    # Normalize by s_1 first: s^4 overflows fp32 for s > ~1e9, and every metric but
    # sigma_1 is scale-invariant, so this changes nothing else.
    r = s / torch.where(alive, s1, torch.ones_like(s1)).unsqueeze(-1)
    energy = r.square().cumsum(-1)  # [..., k]
    total = energy[..., -1]
    # rank_eps: positions whose cumulative energy is still short of the threshold, plus one.
    # Comparing against the cumsum's own last entry keeps k reachable when eps is tiny.
    short = energy < ((1.0 - eps**2) * total).unsqueeze(-1)
    rank_eps = (short.sum(-1) + 1).clamp(max=k).to(s.dtype)
    p = r / r.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    erank = torch.exp(-torch.special.xlogy(p, p).sum(-1))  # xlogy: 0 log 0 = 0, no +1e-7 bias
    tol = s1 * max(shape) * torch.finfo(s.dtype).eps
    out = {
        "rank_eps": rank_eps,
        "erank": erank,
        "stable_rank": total,
        "participation_ratio": total.square() / r.pow(4).sum(-1),
        "numerical_rank": (s > tol.unsqueeze(-1)).sum(-1).to(s.dtype),
        "sigma_1": s1,
        "sigma_ratio": r[..., 1] if k > 1 else torch.zeros_like(s1),
    }
    return {name: torch.where(alive, v, torch.zeros_like(v)) for name, v in out.items()}


def gram_rank_eps(gram: torch.Tensor, rows: int, eps: float) -> torch.Tensor:
    """rank_eps [G] of matrices of `rows` rows known by their Gram matrices A^T A
    [G, K, K] (fp64): the singular values are the square roots of its eigenvalues."""
    s = eigvalsh(gram.double()).flip(-1).clamp(min=0.0).sqrt()  # [G, K]
    return spectrum_metrics(s, (rows, gram.shape[-1]), eps)["rank_eps"]


def rank_metrics(A, eps: float = 0.1, center: bool = False) -> dict[str, torch.Tensor]:
    """Effective-rank metrics of A [..., m, n] -> {name: tensor [...]} (leading dims kept).

    One batched spectrum call for the whole batch (budgets/rank/spectra.py); fp32 results, or
    fp64 when A is fp64.
    Raises ValueError for fewer than 2 dims, non-finite entries, or eps outside (0, 1).
    """
    check_eps(eps)  # before the SVD, so a bad eps costs nothing
    A = torch.as_tensor(A)
    shape = tuple(A.shape[-2:]) if A.dim() >= 2 else ()
    s = singular_values(A, center=center)
    return spectrum_metrics(s, shape, eps)
