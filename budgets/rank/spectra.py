"""The spectra engine: every exact singular-value computation of budgets goes through here.

    s = spectrum(A)                    # A [..., m, n] -> s [..., min(m, n)], descending
    s = spectrum(A, center=True)       # of A - 1 mean_rows(A)
    s = product_spectrum(L, R)         # of L @ R^T, L [..., m, r], R [..., n, r], never formed

The exact method is picked from the dtype alone (choose_method; docs/METRICS.md, "How the
spectra are computed"):

  gram   every fp32 input, whatever its shape or device: eigenvalues of the smaller Gram
         matrix A^T A or A A^T, formed and decomposed in fp64. s_i = sqrt(lambda_i) is
         then accurate to ~1e-8 * s_1: far below what any reported metric resolves for
         fp32 data (numerical rank's own tolerance is s_1 * max(m, n) * 1.2e-7), only the
         short side is decomposed, and it cost less than the SVD at every shape measured.
  svd    torch.linalg.svdvals, for fp64 input, whose numerical rank asks for s_i down to
         ~1e-16 * s_1, which a Gram matrix cannot resolve.

Both run as one batched call on the tensors' device (CUDA when the model is there). Not
one matrix per Python thread: each LAPACK call starts its own OpenMP team, and two teams
spinning on the same cores made a probe 100x slower (measured: 183 s instead of ~2 s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

Method = Callable[[torch.Tensor], torch.Tensor]


@contextlib.contextmanager
def one_thread():
    """Eigensolvers on one thread. LAPACK's tridiagonalization synchronizes its OpenMP team
    O(n) times, and on a loaded machine each synchronization waits for a time slice:
    measured on 2 shared cores, two 576 x 576 eigvalsh took 10.8 s on two threads and
    0.058 s on one, nine 1024 x 1024 4.0 s and 1.2 s (matmuls, with few synchronizations,
    keep every thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _svd(A: torch.Tensor) -> torch.Tensor:
    with one_thread():
        return torch.linalg.svdvals(A)  # [..., min(m, n)]


def _gram_values(A: torch.Tensor) -> torch.Tensor:
    A = A.to(torch.float64)
    m, n = A.shape[-2:]
    G = A @ A.mT if m <= n else A.mT @ A  # [..., min(m, n), min(m, n)]
    with one_thread():
        lam = torch.linalg.eigvalsh(G)  # ascending; tiny negatives are rounding
    return lam.flip(-1).clamp_min(0).sqrt()


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
