"""Matrix-free ranks: effective ranks of a mixing matrix known only through products.

At T = 32k one head's [T, T] mixing matrix is 4 GiB in fp32 and its SVD is out of reach,
yet the questions the report asks ("what rank does the past->future block carry?") need
only its top singular values and its Frobenius norm. This module answers them without ever
forming a [T, T] tensor (docs/METRICS.md, "Matrix-free mode"):

    op = AttentionOperator(q, k, scale, window, rows=(T // 2, T), cols=(0, T // 2))
    m = operator_metrics(op, eps=0.1)     # rank_eps, stable_rank, sigma_1, ... [B, H]

- `Operator`: A [*batch, m, n] through A X, A^T Y and A^T A X, its exact squared Frobenius
  norm and column sums, and `take(idx)`: the same operator on some of its (flattened)
  batch entries, so that the solver drops the heads it has settled.
- `AttentionOperator`: the block P[r0:r1, c0:c1] of causal softmax attention, a chunk of
  query rows at a time; a chunk spans only the keys its rows see (s <= t, s > t - window,
  s in t's own attention chunk of C tokens: Llama 4's chunked layers),
  so the whole causal matrix costs its lower triangle, and holds at most CHUNK_ELEMENTS
  scores, so memory stays flat in T. `CenteredOperator` subtracts the mean row.
- `operator_metrics`: the top eigenvalues of A^T A by thick-restart block Lanczos
  (krylov.py, ritz_metrics.py) until each head's rank_eps is decided by its residual
  bounds (ritz_bounds.py), shown to exceed k_max ("rank_eps > a" in `rank_eps_above`), or
  the product budget is spent; attention_ranks.py measures a whole layer's blocks from
  shared passes. Factored mixing (linear attention, SSMs) is exact: factored.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .factored import FactoredMixing, LowRank
from .krylov import gram_of
from .metrics import check_eps
from .passes import BlockSums, rows_fitting
from .ritz_metrics import Target, measure

# The elements of one chunk of scores [N, rows, keys] an operator may hold at once (fp32:
# 128 MiB); chunks are sized to this so that memory stays flat in T.
CHUNK_ELEMENTS = 1 << 25
# exp's argument floor (fp32's smallest normal is e^-87.3): see AttentionOperator._exp
EXP_FLOOR = -87.0
# The most singular values sought per head by default: a head whose rank_eps needs more
# reads "> a". At T = 32k each vector costs a pass over the (T/2)^2 scores of every head.
K_MAX = 64


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

    def colsum(self) -> torch.Tensor:  # 1^T A, [*batch, n]
        ones = torch.ones(*self.batch, self.shape[0], 1, dtype=self.dtype, device=self.device)
        return self.rmatmul(ones).squeeze(-1)

    def take(self, idx: torch.Tensor) -> Operator | None:
        """The operator on the flattened batch entries idx [a] (batch (a,)), or None where a
        subclass cannot restrict itself (a solver then multiplies every entry)."""
        return None

    def top_bound(self) -> torch.Tensor | None:  # >= ||A||_2^2, [*batch], where known
        return None


class AttentionOperator(Operator):
    """The block P[r0:r1, c0:c1] of causal softmax attention P = softmax(q k^T * scale)
    (keys s <= t, and s > t - window when a window is set, s >= t // C * C with attention
    chunks of C tokens), for q, k [*batch, T, K];
    sink logits [H] (the last batch dim is the head) join each row's normalizer only.

    One pass computes each row's log-sum-exp over every key it sees (the normalizer needs
    the keys outside the block too; `lse` [*batch, r1 - r0] given skips it), the block's
    exact Frobenius norm and its column sums; every product afterwards recomputes the
    block's probabilities a chunk of rows at a time."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, scale: float,
                 window: int | None = None, rows: tuple[int, int] | None = None,
                 cols: tuple[int, int] | None = None, softcap: float | None = None,
                 sinks: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                 blocks: tuple = (), chunk: int | None = None):
        T, K = q.shape[-2], q.shape[-1]
        self.batch, self.dtype, self.device = tuple(q.shape[:-2]), torch.float32, q.device
        N = math.prod(self.batch)
        self.q = (q.float() * float(scale)).reshape(N, T, K)  # scaled once, not per chunk
        self.k = k.float().reshape(N, T, K)
        self.scale, self.window, self.softcap, self.T = float(scale), window, softcap, T
        self.attn_chunk = chunk  # C: a query sees the keys of its own chunk alone
        self.sinks = None if sinks is None else (
            sinks.float().expand(self.batch).reshape(N, 1))  # [N, 1]: the head's sink logit
        self.rows, self.cols = rows or (0, T), cols or (0, T)
        self.chunk_elements = max(1, CHUNK_ELEMENTS // max(1, N))  # scores per entry
        self.shape = (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])
        self._plan()
        self._buffer: torch.Tensor | None = None  # the chunk of scores, reused
        self._lse = None if lse is None else lse.float().reshape(N, -1)  # [N, m]
        # blocks ((r0, r1), (c0, c1)) inside this one whose statistics the same pass takes
        self._blocks = {b: BlockSums(N, b[1][1] - b[1][0], q.device) for b in blocks}
        self._sums = BlockSums(N, self.shape[1], q.device)
        self._normalize()
        self._fro2, self._colsum = self._sums.fro2, self._sums.colsum

    # ------------------------------------------------------------ chunks and scores

    def _first_key(self, t: int, c0: int) -> int:
        first = c0 if self.window is None else max(c0, t - self.window + 1)
        C = self.attn_chunk
        return first if C is None else max(first, t // C * C)

    def _plan_for(self, cols: tuple[int, int]) -> list[tuple[int, int, int, int]]:
        """(t0, t1, lo, hi) per chunk of the rows: the keys [lo, hi) of cols its rows see."""
        budget = self.chunk_elements  # scores per entry
        (t0, r1), (c0, c1), out = self.rows, cols, []
        while t0 < r1:
            lo = self._first_key(t0, c0)
            t1 = min(r1, t0 + rows_fitting(t0, lo, c1, budget))
            if self.attn_chunk is not None:  # rows within one attention chunk: they share
                t1 = min(t1, (t0 // self.attn_chunk + 1) * self.attn_chunk)  # a first key
            hi = min(c1, t1)
            if hi > lo:
                out.append((t0, t1, lo, hi))
            t0 = t1
        return out

    def _plan(self) -> None:
        self.chunks = self._plan_for(self.cols)
        self.chunk = max((t1 - t0 for t0, t1, _, _ in self.chunks), default=1)

    def _scores(self, t0: int, t1: int, lo: int, hi: int, unseen: float | None = -math.inf
                ) -> torch.Tensor:
        """Scores of queries t0..t1 against keys lo..hi, [N, t1 - t0, hi - lo], the keys a
        query does not see set to `unseen` (None: left as they are). The chunk is written
        into one buffer kept across chunks and passes: a fresh 100 MiB tensor per chunk
        cost as much in page faults as the product itself."""
        N, shape = self.q.shape[0], (self.q.shape[0], t1 - t0, hi - lo)
        if self._buffer is None or self._buffer.numel() < math.prod(shape):
            self._buffer = torch.empty(max(math.prod(shape), N * self.chunk_elements),
                                       device=self.device)
        S = self._buffer[:math.prod(shape)].view(shape)
        torch.bmm(self.q[:, t0:t1], self.k[:, lo:hi].mT, out=S)
        if self.softcap:  # Gemma-2's logit soft-capping: softcap * tanh(S / softcap)
            S.div_(self.softcap).tanh_().mul_(self.softcap)
        if unseen is not None:
            self._fill_unseen(S, t0, t1, lo, hi, unseen)
        return S

    def _fill_unseen(self, S: torch.Tensor, t0: int, t1: int, lo: int, hi: int,
                     value: float) -> torch.Tensor:
        """S [N, t1 - t0, hi - lo] with `value` where key s is unseen by query t."""
        t = torch.arange(t0, t1, device=self.device).unsqueeze(-1)
        if hi > t0 + 1:  # keys after a query: only in the columns from t0 + 1 on
            S[..., t0 + 1 - lo:].masked_fill_(torch.arange(t0 + 1, hi, device=self.device) > t,
                                             value)
        if self.window is not None and lo <= t1 - 1 - self.window:  # keys left of a window
            b = min(hi, t1 - self.window) - lo
            S[..., :b].masked_fill_(torch.arange(lo, lo + b, device=self.device)
                                    <= t - self.window, value)
        return S

    def _exp(self, S: torch.Tensor, lse: torch.Tensor, t0, t1, lo, hi) -> torch.Tensor:
        """P = exp(S - lse) in place, 0 at unseen keys. Exponents below EXP_FLOOR are raised
        to it first: torch's exp takes a slow path below -88 (measured 25x), and what it
        would give there, under 1e-38, is below anything a product resolves."""
        S.sub_(lse.unsqueeze(-1)).clamp_(min=EXP_FLOOR).exp_()
        return self._fill_unseen(S, t0, t1, lo, hi, 0.0)

    def probs_block(self, t0: int, t1: int, lo: int, hi: int) -> torch.Tensor:
        """P[t0:t1, lo:hi], [N, t1 - t0, hi - lo] (in the chunk buffer)."""
        lse = self._lse[:, t0 - self.rows[0]:t1 - self.rows[0]]
        return self._exp(self._scores(t0, t1, lo, hi, None), lse, t0, t1, lo, hi)

    def _normalize(self) -> None:
        """One pass: each row's log-sum-exp (unless given), the block's BlockSums and those of
        the blocks named at construction."""
        whole_rows = self.cols == (0, self.T)  # the block's chunks see every key of a row
        if self._lse is None and not whole_rows:  # each row's normalizer over all its keys
            self._lse = torch.cat([self._row_lse(self._scores(t0, t1, lo, t1))
                                   for t0, t1, lo, _ in self._plan_for((0, self.T))], -1)
        lse = [] if self._lse is None else None
        for t0, t1, lo, hi in self.chunks:
            if lse is None:
                P = self.probs_block(t0, t1, lo, hi)
            else:  # one pass over the scores: each chunk's normalizer, then its P
                S = self._scores(t0, t1, lo, hi)
                lse.append(self._row_lse(S))
                P = self._exp(S, lse[-1], t0, t1, lo, hi)
            self._sums.add(P, lo - self.cols[0])
            for ((r0, r1), (b0, b1)), sums in self._blocks.items():
                a, b, ca, cb = max(t0, r0), min(t1, r1), max(lo, b0), min(hi, b1)
                if a < b and ca < cb:
                    sums.add(P[:, a - t0:b - t0, ca - lo:cb - lo], ca - b0)
        if lse is not None:
            self._lse = torch.cat(lse, -1)

    def _row_lse(self, S: torch.Tensor) -> torch.Tensor:
        """Each row's log-sum-exp [N, rows] of its scores S [N, rows, keys] (and sink)."""
        lse = torch.logsumexp(S, dim=-1)
        if self.sinks is not None:  # the sink column takes its share of each row
            lse = torch.logaddexp(lse, self.sinks)
        return lse

    # ------------------------------------------------------------ products

    def _flat(self, X: torch.Tensor) -> torch.Tensor:
        return X.reshape(self.q.shape[0], *X.shape[-2:])

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        X, (r0, _), (c0, _) = self._flat(X), self.rows, self.cols
        out = X.new_zeros(X.shape[0], self.shape[0], X.shape[-1])
        for t0, t1, lo, hi in self.chunks:
            out[:, t0 - r0:t1 - r0] = self.probs_block(t0, t1, lo, hi) @ X[:, lo - c0:hi - c0]
        return out.reshape(*self.batch, *out.shape[-2:])

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:
        Y, (r0, _), (c0, _) = self._flat(Y), self.rows, self.cols
        out = Y.new_zeros(Y.shape[0], self.shape[1], Y.shape[-1])
        for t0, t1, lo, hi in self.chunks:
            P = self.probs_block(t0, t1, lo, hi)
            out[:, lo - c0:hi - c0].baddbmm_(P.mT, Y[:, t0 - r0:t1 - r0])
        return out.reshape(*self.batch, *out.shape[-2:])

    def gram(self, X: torch.Tensor) -> torch.Tensor:
        X, c0 = self._flat(X), self.cols[0]
        out = torch.zeros_like(X)  # fused: each chunk's probabilities serve both products
        for t0, t1, lo, hi in self.chunks:
            P = self.probs_block(t0, t1, lo, hi)
            out[:, lo - c0:hi - c0].baddbmm_(P.mT, P @ X[:, lo - c0:hi - c0])
        return out.reshape(*self.batch, *out.shape[-2:])

    def block_grams(self, requests: list[tuple[tuple, torch.Tensor, torch.Tensor]]
                    ) -> list[torch.Tensor]:
        """B^T B X for blocks B = this operator's P[r0:r1, c0:c1] (within its own block),
        each request ((r0, r1), (c0, c1)), entries idx [a] (flattened), X [a, c1 - c0, s]),
        all from one pass over the scores: a chunk's probabilities serve every block they
        touch (the past->future blocks of a causal matrix and of its prefixes are corners
        of the one matrix, normalized alike)."""
        outs = [torch.zeros_like(X) for _, _, X in requests]
        union = torch.unique(torch.cat([idx for _, idx, _ in requests]))  # sorted
        where = [torch.searchsorted(union, idx) for _, idx, _ in requests]
        sub = self if len(union) == self.q.shape[0] else self.take(union)
        for t0, t1, lo, hi in self.chunks:
            P = None
            for ((r0, r1), (c0, c1)), pos, X, out in zip(
                    [r[0] for r in requests], where, [r[2] for r in requests], outs,
                    strict=True):
                a, b, ca, cb = max(t0, r0), min(t1, r1), max(lo, c0), min(hi, c1)
                if a >= b or ca >= cb:
                    continue
                P = sub.probs_block(t0, t1, lo, hi) if P is None else P  # [u, rows, keys]
                B = P[:, a - t0:b - t0, ca - lo:cb - lo]
                B = B if len(pos) == len(union) else B[pos]
                out[:, ca - c0:cb - c0].baddbmm_(B.mT, B @ X[:, ca - c0:cb - c0])
        return outs

    def fro2(self) -> torch.Tensor:
        return self._fro2.reshape(self.batch)

    def top_bound(self) -> torch.Tensor:
        return self._sums.top().reshape(self.batch)

    def block_sums(self, block: tuple) -> BlockSums | None:
        """The BlockSums of P[r0:r1, c0:c1] ([N] flattened) for a block named at construction."""
        return self._blocks.get(block)

    def colsum(self) -> torch.Tensor:
        return self._colsum.reshape(*self.batch, -1)

    def row_lse(self) -> torch.Tensor:
        """Each row's log-sum-exp over every key it sees, [*batch, m]."""
        return self._lse.reshape(*self.batch, -1)

    def take(self, idx: torch.Tensor) -> AttentionOperator:
        sub = object.__new__(AttentionOperator)
        sub.__dict__.update(self.__dict__)
        for name in ("q", "k", "sinks", "_lse", "_fro2", "_colsum"):
            value = getattr(self, name)
            setattr(sub, name, None if value is None else value[idx])
        sub._sums = self._sums.take(idx)
        sub.batch = (len(idx),)  # the chunks stay: as long as for the whole batch
        return sub

    # ------------------------------------------------------------ single entries

    def at(self, keys: torch.Tensor) -> torch.Tensor:
        """P[t, keys[i]] for the queries t = rows[0] + i, [*batch, m] (0 where the key is
        unseen or negative), whatever the block's columns: one score per query against the
        streamed log-sum-exp, O(T K), without a pass over all keys."""
        t = torch.arange(*self.rows, device=self.device)
        S = (self.q[:, t] * self.k[:, keys.clamp(0, self.T - 1)]).sum(-1)  # [N, m]
        if self.softcap:
            S = self.softcap * torch.tanh(S / self.softcap)
        seen = (keys >= 0) & (keys <= t)
        if self.window is not None:
            seen &= keys > t - self.window
        if self.attn_chunk is not None:
            seen &= keys >= t // self.attn_chunk * self.attn_chunk
        return torch.exp(S.masked_fill(~seen, -math.inf) - self._lse).reshape(*self.batch, -1)


class CenteredOperator(Operator):
    """A - 1 mu^T with mu = A^T 1 / m, the mean row: what centered metrics measure."""

    def __init__(self, op: Operator, mu: torch.Tensor | None = None):
        self.op, self.batch, self.shape = op, op.batch, op.shape
        self.dtype, self.device = op.dtype, op.device
        self.mu = (op.colsum() / op.shape[0]).unsqueeze(-1) if mu is None else mu  # [*b, n, 1]

    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        return self.op.matmul(X) - self.mu.mT @ X  # broadcast over the m rows

    def rmatmul(self, Y: torch.Tensor) -> torch.Tensor:
        return self.op.rmatmul(Y) - self.mu @ Y.sum(-2, keepdim=True)

    def gram(self, X: torch.Tensor) -> torch.Tensor:
        return self.op.gram(X) - self.shape[0] * self.mu @ (self.mu.mT @ X)

    def fro2(self) -> torch.Tensor:
        mean2 = self.mu.double().square().sum((-2, -1))
        return (self.op.fro2().double() - self.shape[0] * mean2).clamp_min(0)

    def top_bound(self) -> torch.Tensor | None:
        return self.op.top_bound()  # A_c = (I - 1 1^T / m) A: a projection, no larger

    def take(self, idx: torch.Tensor) -> CenteredOperator | None:
        op = self.op.take(idx)
        if op is None:
            return None
        return CenteredOperator(op, self.mu.reshape(-1, *self.mu.shape[-2:])[idx])


# ---------------------------------------------------------------- metrics of an operator

def target_of(A: Operator, base: Operator) -> Target:
    """A as a Target of products with `base`: base itself, or its centered form."""
    N, n = math.prod(base.batch), base.shape[1]
    fro2 = A.fro2().double().reshape(-1)
    top = A.top_bound()
    top = None if top is None else top.double().reshape(-1)
    if not isinstance(A, CenteredOperator):
        return Target(fro2, A.shape, top=top)
    m = torch.full((N,), float(A.shape[0]), device=base.device)  # A_c^T A_c = A^T A - m mu mu^T
    return Target(fro2, A.shape, A.mu.reshape(N, n), m, top)


def single_op_grams(op: Operator):
    return lambda requests: [gram_of(op, idx, X) for _, idx, X in requests]


def per_batch(metrics: dict[str, torch.Tensor], batch) -> dict[str, torch.Tensor]:
    return {name: v.reshape(batch) for name, v in metrics.items()}


def operator_metrics(op: Operator, eps: float = 0.1, k: int | None = None,
                     k_max: int = K_MAX) -> dict[str, torch.Tensor]:
    """METRICS of op [*batch, m, n] per batch entry, matrix-free (module docstring), plus
    `rank_eps_above`: a lower bound, rank_eps > it, where rank_eps is undecided (else NaN).
    `k`: the vectors per Lanczos block (ritz_metrics.BLOCK); at most 2 k_max are held."""
    check_eps(eps)
    base = op.op if isinstance(op, CenteredOperator) else op  # centered: a downdated view
    out = measure({0: [target_of(op, base)]}, single_op_grams(base), eps, k, k_max, op.device)
    return per_batch(out[0][0], op.batch)


# ---------------------------------------------------------------- mixing, as blocks give it

@dataclass
class AttentionMixing:
    """Causal softmax mixing known by its queries q [B, H, T, K] and keys k [B, G, T, K]
    (rotated; query head h reads key head h // (H / G)), as a block's
    `mixing_operator(x)` or a Hugging Face attention layer gives it. Each row's
    log-sum-exp, once the whole matrix's operator has streamed it, serves every block and
    prefix taken afterwards (a causal row's normalizer does not depend on later keys)."""

    q: torch.Tensor
    k: torch.Tensor
    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [H] sink logits (gpt-oss)
    lse: torch.Tensor | None = field(default=None, repr=False)  # [B, H, T], once known
    chunk: int | None = None  # C: attention chunks of C tokens (keys of the query's own)

    def __post_init__(self) -> None:
        H, G = self.q.shape[-3], self.k.shape[-3]
        if H % G:
            raise ValueError(f"key heads ({G}) must divide query heads ({H})")
        self.k = self.k.repeat_interleave(H // G, dim=-3)  # [B, H, T, K]

    def operator(self, rows=None, cols=None, blocks: tuple = ()) -> AttentionOperator:
        T = self.seq_len
        r0, r1 = rows or (0, T)
        lse = None if self.lse is None else self.lse[..., r0:r1]
        op = AttentionOperator(self.q, self.k, self.scale, self.window, rows, cols,
                               self.softcap, self.sinks, lse, blocks, self.chunk)
        if self.lse is None and (r0, r1) == (0, T):
            self.lse = op.row_lse()
        return op

    def full(self, blocks: tuple = ()) -> AttentionOperator:
        """The whole matrix's operator, made (its normalizing pass run) once; the energies
        of `blocks` taken in that pass (AttentionOperator.block_fro2)."""
        if getattr(self, "_whole", None) is None:
            self._whole = self.operator(blocks=blocks)
        return self._whole

    def past_future(self) -> AttentionOperator:
        T = self.q.shape[-2]
        return self.operator((T // 2, T), (0, T // 2))

    @property
    def seq_len(self) -> int:
        return self.q.shape[-2]

    def prefix(self, t: int) -> AttentionMixing:
        """The mixing of the first t tokens: causal, so the top-left t x t corner."""
        return AttentionMixing(self.q[..., :t, :], self.k[..., :t, :], self.scale,
                               self.window, self.softcap, self.sinks,
                               None if self.lse is None else self.lse[..., :t], self.chunk)


def block_metrics(block: Operator | LowRank, eps: float, k_max: int = K_MAX
                  ) -> dict[str, torch.Tensor]:
    """METRICS (and rank_eps_above) of one mixing block, exact for a LowRank."""
    if isinstance(block, LowRank):
        out = {name: v.double() for name, v in block.metrics(eps).items()}
        out["rank_eps_above"] = torch.full_like(out["rank_eps"], math.nan)
        return out
    return operator_metrics(block, eps, k_max=k_max)


__all__ = ["CHUNK_ELEMENTS", "K_MAX", "AttentionMixing", "AttentionOperator", "CenteredOperator",
           "FactoredMixing", "LowRank", "Operator", "block_metrics",
           "operator_metrics", "per_batch", "single_op_grams", "target_of"]
