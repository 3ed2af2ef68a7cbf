"""The spectra engine: every exact singular-value computation of budgets goes through here.

    s = spectrum(A)                    # A [..., m, n] -> s [..., min(m, n)], descending
    s = spectrum(A, center=True)       # of A - 1 mean_rows(A)
    s = product_spectrum(L, R)         # of L @ R^T, L [..., m, r], R [..., n, r], never formed

The cheapest exact method is picked from the shape and dtype (docs/METRICS.md, "How the
spectra are computed"):

  gram   (fp32 input at least twice as long as wide, or on CUDA) eigenvalues of the
         smaller Gram matrix A^T A or A A^T, formed and decomposed in fp64.
         s_i = sqrt(lambda_i) is then accurate to ~1e-8 * s_1: far below what any reported
         metric resolves for fp32 data (numerical rank's own tolerance is
         s_1 * max(m, n) * 1.2e-7), and only the short side is decomposed.
  svd    torch.linalg.svdvals in the input's dtype: square-ish matrices on the CPU, and
         fp64 input, whose numerical rank asks for s_i down to ~1e-16 * s_1, which a Gram
         matrix cannot resolve.

Both run on the tensors' device (CUDA when the model is there). On the CPU a batch is
split across torch's intra-op threads, one LAPACK call per thread: LAPACK's own threading
barely helps a single 1024 x 1024 decomposition (its Householder reductions are
memory-bound), so independent matrices in parallel are what uses the cores.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

Method = Callable[[torch.Tensor], torch.Tensor]


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="rankzoo-spectra")


# below this many elements per matrix a decomposition is too short to be worth a thread
PARALLEL_FROM = 128 * 128


def _in_parallel(fn: Callable[[torch.Tensor], torch.Tensor], A: torch.Tensor) -> torch.Tensor:
    """fn over the matrices of A [..., m, n], in torch.get_num_threads() chunks on the CPU."""
    lead = A.shape[:-2]
    flat = A.reshape(-1, *A.shape[-2:])  # [b, m, n]
    workers = min(torch.get_num_threads(), flat.shape[0])
    if A.is_cuda or workers < 2 or A.shape[-1] * A.shape[-2] < PARALLEL_FROM:
        return fn(A)
    parts = list(_pool(workers).map(fn, flat.tensor_split(workers)))
    return torch.cat(parts).reshape(*lead, -1)


def _svd(A: torch.Tensor) -> torch.Tensor:
    return _in_parallel(torch.linalg.svdvals, A)  # [..., min(m, n)]


def _gram_values(A: torch.Tensor) -> torch.Tensor:
    A = A.to(torch.float64)
    m, n = A.shape[-2:]
    G = A @ A.mT if m <= n else A.mT @ A  # [..., min(m, n), min(m, n)]
    lam = torch.linalg.eigvalsh(G)  # ascending; tiny negatives are rounding
    return lam.flip(-1).clamp_min(0).sqrt()


def _gram(A: torch.Tensor) -> torch.Tensor:
    return _in_parallel(_gram_values, A)


METHODS: dict[str, Method] = {"svd": _svd, "gram": _gram}


# the CPU crossovers of choose_method, in the short side's length
GRAM_SQUARE_FROM = 1024
GRAM_OBLONG_FROM = 192

_forced: list[str] = []  # set by `forced_method`, for benchmarks and checks


def choose_method(A: torch.Tensor) -> str:
    """fp64 input keeps the SVD's full precision. For fp32 on the CPU, with one matrix per
    thread, the Gram route wins where its short side is long or the matrix oblong, and the
    SVD elsewhere (measured on 2 cores: attention matrices 1024 x 1024, Gram 1.0 s vs SVD
    1.15 s for 9; at 256 x 256, 0.14 s vs 0.08 s for 32; K caches 256 x 512, 0.03 s vs
    0.06 s for 4). On CUDA the batched symmetric eigensolver is the faster kernel at every
    shape."""
    if _forced:
        return _forced[-1]
    if A.dtype == torch.float64:
        return "svd"
    short, long = sorted(A.shape[-2:])
    oblong = long >= 2 * short and short >= GRAM_OBLONG_FROM
    return "gram" if A.is_cuda or short >= GRAM_SQUARE_FROM or oblong else "svd"


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
