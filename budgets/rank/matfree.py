"""Matrix-free ranks: effective ranks of a mixing matrix known only through products.

At T = 32k one head's [T, T] mixing matrix is 4 GiB in fp32 and its SVD is out of reach,
yet the questions the report asks ("what rank does the past->future block carry?") need
only its top singular values and its Frobenius norm. This module answers them without ever
forming a [T, T] tensor (docs/METRICS.md, "Matrix-free mode"):

    op = AttentionOperator(q, k, scale, window, rows=(T // 2, T), cols=(0, T // 2))
    m = operator_metrics(op, eps=0.1)     # rank_eps, stable_rank, sigma_1, ... [B, H]

- `Operator`: A [..., m, n] through A @ X, A^T @ Y and A^T A X, plus its exact squared
  Frobenius norm; `AttentionOperator` is causal softmax attention computed a chunk of query
  rows at a time (a [chunk, n] slice of scores at most), `CenteredOperator` subtracts the
  mean row.
- `LowRank`: a block known as L @ R^T (linear attention's feature maps, an SSM's decayed C
  and B): its spectrum is exact from an r x r core (spectra.product_spectrum).
- `operator_metrics`: subspace iteration on A^T A with a block of k vectors, doubled until
  every head's rank_eps is decided or k reaches `k_max`. The Ritz values of a subspace
  never exceed the true singular values, so a rank_eps reached by them is an upper bound,
  and a converged one is exact; the Frobenius norm is exact, so stable rank is too. A head
  still undecided at k_max reads rank_eps = NaN with `rank_eps_above` = a: "rank_eps > a",
  where a >= k comes from the energy the top k values leave (at least missing / s_k^2
  more values are needed); a head whose bound already exceeds k_max stops the doubling.
  erank and participation ratio need the whole spectrum: they are given only where the
  top k values hold all but a 1e-6 fraction of the energy, else NaN; numerical rank is
  never given (fp32 products cannot resolve its tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .metrics import METRICS, check_eps, spectrum_metrics
from .spectra import product_spectrum

# The elements of one chunk of scores [..., chunk, n] an operator may hold at once (fp32:
# 128 MiB); chunks are sized to this so that memory stays flat in T.
CHUNK_ELEMENTS = 1 << 25
# The largest block of vectors by default: a head whose rank_eps needs more reads "> k".
# At T = 32k each vector costs a pass over the (T/2)^2 scores of every head.
K_MAX = 64
# A head's leftover energy below this fraction of ||A||_F^2 counts as "whole spectrum seen".
COMPLETE = 1e-6


class Operator:
    """A batch of matrices A [*batch, m, n] known through products (subclasses define them)."""

    batch: tuple[int, ...]
    shape: tuple[int, int]
    dtype: torch.dtype
    device: torch.device

    def matmul(self, X: torch.Tensor) -> torch.Tensor:  # [*batch, n, k] -> [*batch, m, k]
        raise NotImplementedError

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:  # [*batch, m, k] -> [*batch, n, k]
        raise NotImplementedError

    def gram(self, X: torch.Tensor) -> torch.Tensor:  # A^T A X, [*batch, n, k]
        return self.rmatmul(self.matmul(X))

    def fro2(self) -> torch.Tensor:  # ||A||_F^2, [*batch]
        raise NotImplementedError


class AttentionOperator(Operator):
    """The block P[r0:r1, c0:c1] of causal softmax attention P = softmax(q k^T * scale)
    (keys s <= t, and s > t - window when a window is set), for q, k [*batch, T, K];
    sink logits [H] (the last batch dim is the head) join each row's normalizer only.

    One pass computes each row's log-sum-exp over every key it sees (the normalizer needs
    the keys outside the block too) and the block's exact Frobenius norm; every product
    afterwards recomputes the block's probabilities a chunk of rows at a time."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, scale: float,
                 window: int | None = None, rows: tuple[int, int] | None = None,
                 cols: tuple[int, int] | None = None, softcap: float | None = None,
                 sinks: torch.Tensor | None = None):
        T = q.shape[-2]
        self.q, self.k, self.scale, self.window = q.float(), k.float(), float(scale), window
        self.softcap = softcap
        self.sinks = None if sinks is None else sinks.float().reshape(-1, 1)  # [H, 1]
        self.rows, self.cols = rows or (0, T), cols or (0, T)
        self.batch, self.dtype, self.device = tuple(q.shape[:-2]), torch.float32, q.device
        self.shape = (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])
        width = max(T, 1) * max(math.prod(self.batch), 1)
        self.chunk = max(1, min(self.shape[0], CHUNK_ELEMENTS // width))
        self._lse, self._fro2 = self._normalize()

    def _chunks(self):
        r0, r1 = self.rows
        for t0 in range(r0, r1, self.chunk):
            yield t0, min(t0 + self.chunk, r1)

    def _scores(self, t0: int, t1: int, c0: int, c1: int) -> torch.Tensor:
        """Masked scores of queries t0..t1 against keys c0..c1: [*batch, t1 - t0, c1 - c0]."""
        S = self.q[..., t0:t1, :] @ self.k[..., c0:c1, :].mT * self.scale
        if self.softcap:  # Gemma-2's logit soft-capping: softcap * tanh(S / softcap)
            S = self.softcap * torch.tanh(S / self.softcap)
        if self.window is None and c1 <= t0 + 1:  # every key precedes every query here
            return S
        t = torch.arange(t0, t1, device=self.device).unsqueeze(-1)
        s = torch.arange(c0, c1, device=self.device)
        seen = s <= t if self.window is None else (s <= t) & (s > t - self.window)
        return S.masked_fill(~seen, float("-inf"))

    def _normalize(self) -> tuple[torch.Tensor, torch.Tensor]:
        lse, fro2 = [], torch.zeros(self.batch, device=self.device)
        for t0, t1 in self._chunks():
            lo = 0 if self.window is None else max(0, t0 - self.window + 1)
            row_lse = torch.logsumexp(self._scores(t0, t1, lo, t1), dim=-1)  # [*batch, c]
            if self.sinks is not None:  # the sink column takes its share of each row
                row_lse = torch.logaddexp(row_lse, self.sinks)
            lse.append(row_lse)
            fro2 += self._probs(t0, t1, row_lse).square().sum((-2, -1))
        return torch.cat(lse, dim=-1), fro2

    def _probs(self, t0: int, t1: int, lse: torch.Tensor | None = None) -> torch.Tensor:
        if lse is None:
            lse = self._lse[..., t0 - self.rows[0]:t1 - self.rows[0]]
        c0, c1 = self.cols
        return torch.exp(self._scores(t0, t1, c0, c1) - lse.unsqueeze(-1))  # [*batch, c, n]

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._probs(t0, t1) @ X for t0, t1 in self._chunks()], dim=-2)

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:
        out, r0 = 0, self.rows[0]
        for t0, t1 in self._chunks():
            out = out + self._probs(t0, t1).mT @ Y[..., t0 - r0:t1 - r0, :]
        return out

    def gram(self, X: torch.Tensor) -> torch.Tensor:
        out = 0  # fused: each chunk's probabilities serve both products
        for t0, t1 in self._chunks():
            P = self._probs(t0, t1)
            out = out + P.mT @ (P @ X)
        return out

    def fro2(self) -> torch.Tensor:
        return self._fro2

    def _pair_scores(self, d: int) -> torch.Tensor:
        """Masked scores of each query t of the rows with the key t - d: [*batch, m]."""
        r0, r1 = max(self.rows[0], d), self.rows[1]
        S = (self.q[..., r0:r1, :] * self.k[..., r0 - d:r1 - d, :]).sum(-1) * self.scale
        if self.softcap:
            S = self.softcap * torch.tanh(S / self.softcap)
        if self.window is not None and d >= self.window:  # outside every query's window
            S = torch.full_like(S, float("-inf"))
        missing = r0 - self.rows[0]  # queries t < d have no key t - d
        return torch.nn.functional.pad(S, (missing, 0), value=float("-inf"))

    def column(self, s: int) -> torch.Tensor:
        """P[t, s] for the queries t of the rows, [*batch, m], whatever the block's columns:
        one score per query against the streamed log-sum-exp, O(T K) (P e_s without the
        pass over all keys that matmul would take)."""
        t = torch.arange(*self.rows, device=self.device)
        S = (self.q[..., self.rows[0]:self.rows[1], :] @ self.k[..., s, :].unsqueeze(-1)
             ).squeeze(-1) * self.scale  # [*batch, m]
        if self.softcap:
            S = self.softcap * torch.tanh(S / self.softcap)
        seen = s <= t if self.window is None else (s <= t) & (s > t - self.window)
        return torch.exp(S.masked_fill(~seen, float("-inf")) - self._lse)

    def band(self, width: int) -> torch.Tensor:
        """sum of P[t, s] over t - width < s <= t for the queries t of the rows, [*batch, m]:
        the mass on the query itself and the width - 1 keys before it, O(width T K)."""
        return sum(torch.exp(self._pair_scores(d) - self._lse) for d in range(width))


class CenteredOperator(Operator):
    """A - 1 mu^T with mu = A^T 1 / m, the mean row: what centered metrics measure."""

    def __init__(self, op: Operator):
        self.op, self.batch, self.shape = op, op.batch, op.shape
        self.dtype, self.device = op.dtype, op.device
        ones = torch.ones(*self.batch, op.shape[0], 1, dtype=op.dtype, device=op.device)
        self.mu = op.rmatmul(ones) / op.shape[0]  # [*batch, n, 1]

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        return self.op.matmul(X) - self.mu.mT @ X  # broadcast over the m rows

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:
        return self.op.rmatmul(Y) - self.mu @ Y.sum(-2, keepdim=True)

    def gram(self, X: torch.Tensor) -> torch.Tensor:
        return self.op.gram(X) - self.shape[0] * self.mu @ (self.mu.mT @ X)

    def fro2(self) -> torch.Tensor:
        return (self.op.fro2() - self.shape[0] * self.mu.square().sum((-2, -1))).clamp_min(0)


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


def orthonormalize(Z: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis [*batch, n, k] of the columns of Z [*batch, n, k] by Cholesky
    QR in fp64, twice (the second pass restores the orthogonality the first loses to
    rounding): two k x k factorizations instead of a Householder QR of the tall block,
    which costs ~100x more on the CPU at n = 1024, k = 256. A block whose columns are
    (numerically) dependent - a head of rank below k - takes the Householder QR."""
    W = Z.double()
    for _ in range(2):
        L, info = torch.linalg.cholesky_ex(W.mT @ W)  # [*batch, k, k]
        if bool((info != 0).any()):
            return torch.linalg.qr(Z).Q
        W = torch.linalg.solve_triangular(L, W.mT, upper=False).mT
    eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    if float((W.mT @ W - eye).abs().max()) > 1e-6:  # too ill-conditioned even twice
        return torch.linalg.qr(Z).Q
    return W.to(Z.dtype)


def ritz_values(op: Operator, k: int, iters: int = 8, tol: float = 1e-5,
                seed: int = 0) -> torch.Tensor:
    """Estimates [*batch, k] of the top k singular values of op (descending, each a lower
    bound), by subspace iteration on A^T A until they move less than `tol` (relative)."""
    n = op.shape[1]
    g = torch.Generator(device=op.device).manual_seed(seed)
    X = torch.randn(*op.batch, n, k, generator=g, device=op.device, dtype=op.dtype)
    Q, prev = orthonormalize(X), None
    for _ in range(iters):
        Z = op.gram(Q)  # [*batch, n, k]
        lam = torch.linalg.eigvalsh((Q.mT @ Z).double()).flip(-1).clamp_min(0)  # s^2
        if prev is not None and ((lam - prev).abs() <= tol * lam[..., :1]).all():
            break
        Q, prev = orthonormalize(Z), lam
    return lam.sqrt()


def _decided(s: torch.Tensor, fro2: torch.Tensor, eps: float) -> torch.Tensor:
    """rank_eps from top values s [*b, k] and exact energies fro2 [*b]; NaN where the top
    k values do not reach (1 - eps^2) of the energy."""
    energy = s.square().cumsum(-1)
    reached = energy >= (1.0 - eps**2) * fro2.unsqueeze(-1)
    rank = (~reached).sum(-1).double() + 1
    return torch.where(reached[..., -1], rank, torch.full_like(rank, math.nan))


def operator_metrics(op: Operator, eps: float = 0.1, k: int = 16,
                     k_max: int = K_MAX) -> dict[str, torch.Tensor]:
    """METRICS of op [*batch, m, n] per batch entry, matrix-free (module docstring), plus
    `rank_eps_above`: a lower bound, rank_eps > it, where rank_eps is undecided (else NaN)."""
    check_eps(eps)
    full, fro2 = min(op.shape), op.fro2().double()
    k = min(k, full, k_max)
    while True:
        s = ritz_values(op, k)  # [*batch, k]
        rank = _decided(s, fro2, eps)
        # the last few Ritz values converge slowest: trust a rank inside the block only
        settled = rank <= k - max(2, k // 8)
        need = _rank_floor(s, fro2, eps)  # no head can do with fewer values than this
        open_ = ~settled & (need <= k_max)  # heads a larger block could still decide
        if k >= full or k >= k_max or not bool(open_.any()):
            break
        k = min(max(2 * k, int(need[open_].max()) + k // 4), full, k_max)
    return _assemble(s, fro2, rank, need, op.shape, eps)


def _rank_floor(s: torch.Tensor, fro2: torch.Tensor, eps: float) -> torch.Tensor:
    """A lower bound [*batch] on rank_eps from the top k values: the energy still missing
    is carried by values no larger than s_k, so at least missing / s_k^2 more are needed."""
    missing = ((1.0 - eps**2) * fro2 - s.square().sum(-1)).clamp_min(0)
    more = torch.ceil(missing / s[..., -1].square().clamp_min(1e-300))
    return (s.shape[-1] + more).clamp(max=1e12)


def _assemble(s, fro2, rank, need, shape, eps) -> dict[str, torch.Tensor]:
    s1 = s[..., 0]
    alive = s1 > 0
    nan = torch.full_like(fro2, math.nan)
    complete = (fro2 - s.square().sum(-1)) <= COMPLETE * fro2  # the whole spectrum seen
    exact = spectrum_metrics(s, shape, eps)  # erank etc. of the values seen
    out = {
        "rank_eps": rank,
        "stable_rank": torch.where(alive, fro2 / s1.square().clamp_min(1e-300), fro2 * 0),
        "sigma_1": s1,
        "sigma_ratio": s[..., 1] / s1.clamp_min(1e-300) if s.shape[-1] > 1 else s1 * 0,
    }
    for name in ("erank", "participation_ratio"):
        out[name] = torch.where(complete | ~alive, exact[name].double(), nan)
    out["numerical_rank"] = nan  # products in fp32 cannot resolve s_1 * max(m, n) * 1e-7
    out["rank_eps"] = torch.where(alive, out["rank_eps"], fro2 * 0)
    # undecided: rank_eps > need - 1 (need >= k + 1 whenever the top k fall short)
    out["rank_eps_above"] = torch.where(out["rank_eps"].isnan(), need.double() - 1, nan)
    assert set(METRICS) <= set(out)
    return {name: v.double() for name, v in out.items()}


@dataclass
class AttentionMixing:
    """Causal softmax mixing known by its queries q [B, H, T, K] and keys k [B, G, T, K]
    (rotated; query head h reads key head h // (H / G)), as a block's
    `mixing_operator(x)` or a Hugging Face attention layer gives it."""

    q: torch.Tensor
    k: torch.Tensor
    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H] sink logits (gpt-oss)

    def __post_init__(self) -> None:
        H, G = self.q.shape[-3], self.k.shape[-3]
        if H % G:
            raise ValueError(f"key heads ({G}) must divide query heads ({H})")
        self.k = self.k.repeat_interleave(H // G, dim=-3)  # [B, H, T, K]

    def operator(self, rows=None, cols=None) -> Operator:
        return AttentionOperator(self.q, self.k, self.scale, self.window, rows, cols,
                                 self.softcap, self.sinks)

    def full(self) -> Operator:
        return self.operator()

    def past_future(self) -> Operator:
        T = self.q.shape[-2]
        return self.operator((T // 2, T), (0, T // 2))

    @property
    def seq_len(self) -> int:
        return self.q.shape[-2]

    def prefix(self, t: int) -> AttentionMixing:
        """The mixing of the first t tokens: causal, so the top-left t x t corner."""
        return AttentionMixing(self.q[..., :t, :], self.k[..., :t, :], self.scale,
                               self.window, self.softcap, self.sinks)


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


def block_metrics(block: Operator | LowRank, eps: float, k_max: int = K_MAX
                  ) -> dict[str, torch.Tensor]:
    """METRICS (and rank_eps_above) of one mixing block, exact for a LowRank."""
    if isinstance(block, LowRank):
        out = {name: v.double() for name, v in block.metrics(eps).items()}
        out["rank_eps_above"] = torch.full_like(out["rank_eps"], math.nan)
        return out
    return operator_metrics(block, eps, k_max=k_max)
