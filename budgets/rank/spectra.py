"""The spectra engine: every exact singular-value computation of budgets goes through here.

    s = spectrum(A)                    # A [..., m, n] -> s [..., min(m, n)], descending
    s = spectrum(A, center=True)       # of A - 1 mean_rows(A)
    s = product_spectrum(L, R)         # of L @ R^T, L [..., m, r], R [..., n, r], never formed
    s, s_c = centered_pair(A)          # spectrum(A) and spectrum(A, center=True), one Gram

The exact method is picked from the dtype alone (choose_method; docs/METRICS.md, "How the
spectra are computed"):

  gram   every fp32 input, whatever its shape or device: eigenvalues of the smaller Gram
         matrix A^T A or A A^T, formed and decomposed in fp64. s_i = sqrt(lambda_i) is
         then accurate to ~1e-8 * s_1: far below what any reported metric resolves for
         fp32 data (numerical rank's own tolerance is s_1 * max(m, n) * 1.2e-7), only the
         short side is decomposed, and it cost less than the SVD at every shape measured.
  svd    torch.linalg.svdvals, for fp64 input, whose numerical rank asks for s_i down to
         ~1e-16 * s_1, which a Gram matrix cannot resolve.

Both run on the tensors' device (CUDA when the model is there: one batched call). On a
CPU a batch is spread over worker threads, each LAPACK call on one thread (eigen.py): never
two OpenMP teams on the same cores, which made a probe 100x slower (183 s instead of ~2 s).

A matrix and its centered form share one Gram product: the centered Gram is the raw one
projected (C G C, C = I - 1 1^T / m), in fp64 from the fp32 data. Each worker forms its own
matrices' fp64 copies and Gram products (a causal matrix's by halves, _lower_gram) and
decomposes them; with fewer matrices than workers the products go first and the raw and
centered eigenproblems after, as tasks of their own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from .eigen import solve, spread, spread_workers

Method = Callable[[torch.Tensor], torch.Tensor]


def _svd(A: torch.Tensor) -> torch.Tensor:
    return spread(torch.linalg.svdvals, A)  # [..., min(m, n)]


TRIANGULAR_BASE = 128  # _lower_gram's blocks from this side down are plain products


def _lower_gram(A: torch.Tensor) -> torch.Tensor:
    """A A^T [..., n, n] of lower-triangular A [..., n, n] (a causal mixing matrix), by
    halves: [[A11, 0], [A21, A22]] gives A11 A11^T, A21 A11^T and A21 A21^T + A22 A22^T,
    the triangular ones recursively. A third of a full product's flops: 1024 x 1024 in
    fp64 on one thread took 16 ms instead of 41 (AMD EPYC)."""
    n = A.shape[-1]
    if n <= TRIANGULAR_BASE:
        return A @ A.mT
    h = n // 2
    A11, A21, A22 = A[..., :h, :h], A[..., h:, :h], A[..., h:, h:]
    G = A.new_empty(A.shape)
    G[..., :h, :h] = _lower_gram(A11)
    G21 = A21 @ A11.mT  # [..., n - h, h]
    G[..., h:, :h] = G21
    G[..., :h, h:] = G21.mT
    G[..., h:, h:] = A21 @ A21.mT + _lower_gram(A22)
    return G


def _gram(A: torch.Tensor) -> torch.Tensor:
    """The smaller Gram matrix [..., k, k] of fp64 A [..., m, n], k = min(m, n); of a
    lower-triangular square A by its halves (the zeros checked: ~1 ms at 1024)."""
    m, n = A.shape[-2:]
    if m == n > TRIANGULAR_BASE and not A.triu(1).any():
        return _lower_gram(A)
    return A @ A.mT if m <= n else A.mT @ A


def _values(G: torch.Tensor) -> torch.Tensor:
    """Singular values, descending, from Gram matrices G [..., k, k] (in a worker)."""
    lam = solve(G)  # ascending; tiny negatives are rounding
    return lam.flip(-1).clamp_min(0).sqrt()


def _gram_values_here(A: torch.Tensor) -> torch.Tensor:
    return _values(_gram(A.to(torch.float64)))


def _gram_values(A: torch.Tensor) -> torch.Tensor:
    # the whole pipeline in each worker: the fp64 copy and the Gram product are a third
    # of the eigensolver's time on 1024 x 1024, and spread over the cores with it
    return spread(_gram_values_here, A)


METHODS: dict[str, Method] = {"svd": _svd, "gram": _gram_values}


_forced: list[str] = []  # set by `forced_method`, for benchmarks and checks


def choose_method(A: torch.Tensor) -> str:
    """fp64 input keeps the SVD's full precision; fp32 input takes the Gram route, which
    costs less at every shape measured (2 CPU cores, one batched call: attention matrices
    9 x 1024 x 1024 0.90 s vs 1.05 s by the SVD, 128 x 256 x 256 0.43 s vs 0.47 s; K caches
    4 x 256 x 512 0.013 s vs 0.028 s), and on CUDA the batched symmetric eigensolver is the
    faster kernel too."""
    if _forced:
        return _forced[-1]
    return "svd" if A.dtype == torch.float64 else "gram"


@contextlib.contextmanager
def forced_method(name: str):
    """Within the block, `auto` means `name` (the benchmark compares methods this way)."""
    if name not in METHODS:
        raise ValueError(f"unknown spectrum method {name!r}; one of {', '.join(METHODS)}")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


def spectrum(A: torch.Tensor, center: bool = False, method: str = "auto") -> torch.Tensor:
    """Singular values [..., min(m, n)] of A [..., m, n] (a validated fp32/fp64 batch),
    descending, in A's dtype; center=True measures A - 1 mean_rows(A)."""
    if center:
        A = A - A.mean(dim=-2, keepdim=True)
    if min(A.shape[-2:]) == 0:
        return A.new_zeros(A.shape[:-2] + (0,))
    name = choose_method(A) if method == "auto" else method
    if name not in METHODS:
        raise ValueError(f"unknown spectrum method {method!r}; one of auto, {', '.join(METHODS)}")
    return METHODS[name](A).to(A.dtype)


def _centered_gram(G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """The Gram matrix of A - 1 mean_rows(A) from A's own, G = _gram(A): on the rows' side
    (A A^T) C G C with C = I - 1 1^T / m, on the columns' side (A^T A) G - m mu mu^T.
    Rounding: ~1e-16 ||A||^2 per entry in fp64, where centering the fp32 data first
    rounds each entry to ~6e-8 of its size (docs/METRICS.md, "How the spectra are
    computed")."""
    m, n = A.shape[-2:]
    if m <= n:
        r = G.mean(-1, keepdim=True)  # G 1 / m: [..., m, 1]
        return G - r - r.mT + r.mean(-2, keepdim=True)
    mu = A.mean(-2)  # [..., n]
    return G - m * (mu.unsqueeze(-1) * mu.unsqueeze(-2))


def _pair_grams(A: torch.Tensor) -> torch.Tensor:
    """[N, 2, k, k]: the raw and the centered Gram matrices of A [N, m, n] (in a worker)."""
    A = A.to(torch.float64)
    G = _gram(A)
    return torch.stack([G, _centered_gram(G, A)], dim=1)


def _pair_here(A: torch.Tensor) -> torch.Tensor:
    """[N, 2, k]: the raw and the centered singular values of A [N, m, n] (in a worker)."""
    return _values(_pair_grams(A))


def _pair_values(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Each worker takes whole matrices, its Grams still in its cache for the eigensolver:
    # a layer's 9 heads of 1024 x 1024 on 2 workers, 0.63 s against 0.69 s in two passes.
    # With fewer matrices than workers, two passes: the products, then the 2N eigenproblems
    # as tasks of their own, twice the workers busy (one head on 2 workers: see the tests).
    if math.prod(A.shape[:-2]) < spread_workers(A):
        s = spread(_values, spread(_pair_grams, A))  # [..., 2, k]
    else:
        s = spread(_pair_here, A)  # [..., 2, k]
    return s[..., 0, :], s[..., 1, :]


def centered_pair(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(spectrum(A), spectrum(A, center=True)) of a validated fp32/fp64 batch A [..., m, n]:
    for fp32 one Gram product, the centered Gram derived from it, one eigensolver batch;
    the raw values bit-identical to spectrum(A)'s. fp64 input (or a forced method other
    than gram) takes the two spectra as they are."""
    if choose_method(A) != "gram" or min(A.shape[-2:]) == 0:
        return spectrum(A), spectrum(A, center=True)
    s, s_c = _pair_values(A)
    return s.to(A.dtype), s_c.to(A.dtype)


def product_spectrum(L: torch.Tensor, R: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Singular values [..., r] (descending) of scale * L @ R^T for L [..., m, r] and
    R [..., n, r], from the r x r core of their QR factors: O((m + n) r^2), and exact, so
    every metric of a low-rank product (a LoRA update, W_Q W_K^T, the past->future block of
    linear attention or an SSM) comes at the cost of an r x r problem."""
    if L.shape[-1] != R.shape[-1]:
        raise ValueError(f"L {tuple(L.shape)} and R {tuple(R.shape)} must share their last "
                         f"dim (the rank r of L @ R^T)")
    dtype = torch.promote_types(L.dtype, R.dtype)
    _, RL = torch.linalg.qr(L.to(dtype))  # [..., min(m, r), r]
    _, RR = torch.linalg.qr(R.to(dtype))  # [..., min(n, r), r]
    return spectrum(float(scale) * RL @ RR.mT)
