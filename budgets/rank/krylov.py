"""The top eigenvalues of A^T A for a batch of operators: thick-restart block Lanczos.

    ritz = block_lanczos(op, stop, k_max=256, block=64)   # ritz.values, ritz.residuals [N, d]

A basis V [N, n, d] of the block Krylov space of M = A^T A is grown one block of `block`
vectors per product M V_i (one op.gram), each new block orthogonalized against the whole
basis (classical Gram-Schmidt, twice) and orthonormalized by Cholesky QR. The Rayleigh
quotient H = V^T M V is accumulated a block column at a time, and its eigenpairs (theta, y)
are the Ritz pairs. The Lanczos relation M V = V H + Z E^T (Z = Q R the part of the last
image outside the basis, E the last block's columns) gives each pair's residual
||M V y - theta V y|| = ||R y_last|| at the cost of an r x r product, never a pass over M.

When the basis would exceed its size (k_max + room columns) it is restarted thick: the
best Ritz vectors are kept, H becomes their diagonal plus the coupling to the next block,
and the relation above still holds, so the residuals stay exact. Entries (heads) that
`stop` settles leave the batch; the rest go on with the operator restricted to them
(op.take). A run can carry several views of one basis (Lanczos: a matrix and its centered
form) and be advanced by a caller that serves several runs from one pass
(ritz_metrics.measure).

Reductions (V^T W, the Gram matrices of the QR) are in fp64 over fp32 vectors: in fp32
they lose ~1e-5 of the top value, which the energy sums behind rank_eps cannot afford;
the products themselves stay fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .eigen import one_thread

# Stop(idx [a], theta [a, d], rho [a, d], products) -> settled [a]: theta the Ritz values
# (descending), rho their residual norms, products the vectors M has been applied to.
Stop = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass
class Ritz:
    """Per entry [N, d_max], as each entry stopped: Ritz values of A^T A (descending, zero
    padded), their residual norms (zero padded), and the vectors M was applied to."""

    values: torch.Tensor
    residuals: torch.Tensor
    products: torch.Tensor  # [N]
    spanned: torch.Tensor  # [N] True where the basis spanned the whole space: values exact
    block: int  # the vectors per block it ran with


def cholesky_qr(Z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Z [N, n, s] = Q R, Q orthonormal (Z's dtype), R [N, s, s] upper (fp64): the Gram matrix
    in fp64 and one s x s Cholesky; a (numerically) rank-deficient block takes the
    Householder QR."""
    Zd = Z.double()
    G = Zd.mT @ Zd  # [N, s, s]
    with one_thread():
        L, info = torch.linalg.cholesky_ex(G)
        if bool((info != 0).any()):
            Q, R = torch.linalg.qr(Zd)
            return Q.to(Z.dtype), R
        eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
        Linv = torch.linalg.solve_triangular(L, eye, upper=False)  # s x s: a matmul after
    return (Zd @ Linv.mT).to(Z.dtype), L.mT


def orthonormalize(Z: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis [*batch, n, k] of the columns of Z [*batch, n, k] (Cholesky QR
    twice: the second pass restores what the first loses to rounding)."""
    flat = Z.reshape(-1, *Z.shape[-2:])
    Q = cholesky_qr(cholesky_qr(flat)[0])[0]
    return Q.reshape(Z.shape)


def _project_out(V: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W - V C, C = V^T W in fp64) and a second pass against what rounding left."""
    C = V.double().mT @ W.double()  # [a, d, s]
    Z = W - V @ C.to(W.dtype)
    return Z - V @ (V.mT @ Z), C


def _take_op(op, idx: torch.Tensor, N: int):
    """op restricted to the entries idx (the whole op when it cannot be restricted)."""
    if len(idx) == N:
        return op
    take = getattr(op, "take", None)
    return take(idx) if take is not None else None


def gram_of(op, idx: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """A^T A X for the flattened entries idx of op, X [a, n, s] -> [a, n, s]."""
    N = math.prod(op.batch)
    sub = _take_op(op, idx, N)
    if sub is not None:
        return sub.gram(X.reshape(*sub.batch, *X.shape[-2:])).reshape(X.shape)
    full = X.new_zeros(N, *X.shape[-2:])
    full[idx] = X
    return op.gram(full.reshape(*op.batch, *X.shape[-2:])).reshape(full.shape)[idx]


def block_size(block: int, k_max: int, n: int) -> int:
    """The vectors per block a Lanczos run takes: `block`, within k_max and n."""
    return max(1, min(block, k_max, n))


def basis_size(k_max: int, block: int, n: int, room: int | None = None) -> int:
    """The most columns a run's basis holds: k_max and `room` more (default one block)."""
    return min(n, k_max + (block if room is None else room))


@dataclass
class View:
    """One matrix a run measures, with its own stop rule and results: M itself, or, with
    u [N, n] and w [N], M - w u u^T (centering: A_c^T A_c = A^T A - m mu mu^T)."""

    stop: Stop
    ritz: Ritz
    u: torch.Tensor | None = None
    w: torch.Tensor | None = None


class Lanczos:
    """A thick-restart block Lanczos run over N entries of size n (module docstring),
    advanced one product at a time: `block()` is the block [a, n, s] whose image under
    M = A^T A the caller computes for the entries `active` [a] (indices into the N), and
    `absorb(W)` takes it and returns the runs that go on.

    Several views share one basis: with u inside the start block the Krylov spaces of M
    and of M - w u u^T are the same space, so one product serves both Rayleigh quotients
    (H and H - w c c^T, c = V^T u) and one residual block (the Lanczos relation holds for
    both). At the first restart, where each view keeps its own Ritz vectors, the run
    splits into one run per view; a run of one downdated view subtracts w u u^T X from
    each image itself. The basis holds the active entries only: V [a, n, d_max],
    H [a, d_max, d_max] (fp64)."""

    def __init__(self, N: int, n: int, views: list[View], k_max: int, block: int,
                 max_products: int | None = None, seed: int = 0, device=None,
                 room: int | None = None):
        self.n, self.views, self.s = n, views, block_size(block, k_max, n)
        self.d_max = basis_size(k_max, self.s, n, room)
        self.cap = max_products or 4 * self.d_max
        self.active = torch.arange(N, device=device)
        self.open = [torch.ones(N, dtype=torch.bool, device=device) for _ in views]
        self.V = torch.zeros(N, n, self.d_max, device=device)
        self.H = torch.zeros(N, self.d_max, self.d_max, dtype=torch.float64, device=device)
        g = torch.Generator(device=device).manual_seed(seed)
        start = torch.randn(N, n, self.s, generator=g, device=device)
        us = [v.u for v in views if v.u is not None]
        if len(views) > 1 and us:  # the downdate's vector first: the views share a space
            if len(us) > 1:
                raise ValueError(f"a joint run takes one downdated view, got {len(us)}")
            start[..., 0] = us[0]
        self.V[..., :self.s] = orthonormalize(start)
        self.lo, self.d, self.products = 0, self.s, 0  # the last block's columns
        # c = V^T u of the joint run's downdated view, a block at a time (u is in the
        # first block, so the rest is rounding, kept so that H - w c c^T stays V^T M_c V)
        self.c = torch.zeros(N, self.d_max, dtype=torch.float64, device=device)
        self._note_c(0)

    @property
    def finished(self) -> bool:
        return not len(self.active)

    def block(self) -> torch.Tensor:
        return self.V[:, :, self.lo:self.d]

    def absorb(self, W: torch.Tensor) -> list[Lanczos]:
        """Take the image W [a, n, s] of block(): for each view its Ritz pairs and residuals,
        the entries its stop settles recorded; entries every view settled leave; the next
        block joins the basis, after a thick restart (a split, for several views) if full."""
        self.products += W.shape[-1]
        if len(self.views) == 1 and self.views[0].u is not None:  # this run's M is downdated
            W = W - self._downdate(self.views[0], self.block())
        Q, R = self._extend(W)
        pairs = [self._ritz_pairs(v, R) for v in self.views]
        for i, (view, (theta, _, rho)) in enumerate(zip(self.views, pairs, strict=True)):
            settled = view.stop(self.active, theta, rho, self.products) | (
                self.products >= self.cap) | (self.d >= self.n)
            self._record(view, settled & self.open[i], theta, rho)
            self.open[i] = self.open[i] & ~settled
        keep = torch.stack(self.open).any(0)
        if not bool(keep.all()):  # the basis keeps the active entries only
            self._compact(keep)
            Q, pairs = Q[keep], [(t[keep], y[keep], r[keep]) for t, y, r in pairs]
        step = min(self.s, self.n - self.d)
        if self.finished:
            return []
        if self.d + step <= self.d_max:
            self._append(Q[..., :step])
            return [self]
        return [self._restarted(i, pairs[i], Q[..., :step]) for i in range(len(self.views))
                if bool(self.open[i].any())]

    # ------------------------------------------------------------ the basis

    def _downdate(self, view: View, X: torch.Tensor) -> torch.Tensor:
        """w u (u^T X) [a, n, s]: what a downdated view takes off M X."""
        u = view.u[self.active]  # [a, n]
        return (view.w[self.active].view(-1, 1, 1) * u.unsqueeze(-1)) * (u.unsqueeze(-2) @ X)

    def _extend(self, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """H's new block column from W; the next block Q [a, n, s] and R, Z = Q R the part
        of W outside the basis."""
        lo, d = self.lo, self.d
        V = self.V[:, :, :d]
        Z, C = _project_out(V, W)
        self.H[:, :d, lo:d], self.H[:, lo:d, :d] = C, C.mT
        Q, R = cholesky_qr(Z)
        # an image (nearly) inside the basis leaves rounding noise in Z, which normalizing
        # blows up: orthogonalize the normalized block once more
        if bool((R.diagonal(dim1=-2, dim2=-1).abs() < 1e-3 * W.norm(dim=-2)).any()):
            Q, R2 = cholesky_qr(_project_out(V, Q)[0])
            R = R2 @ R
        return Q, R

    def _ritz_pairs(self, view: View, R: torch.Tensor):
        """(theta [a, d] descending, Y [a, d, d], residual norms rho [a, d]) of a view."""
        d = self.d
        H = self.H[:, :d, :d]
        if view.u is not None and len(self.views) > 1:  # H - w c c^T, c = V^T u
            c = self.c[:, :d].unsqueeze(-1)  # [a, d, 1]
            H = H - view.w[self.active].double().view(-1, 1, 1) * (c @ c.mT)
        with one_thread():
            theta, Y = torch.linalg.eigh(H)
        theta, Y = theta.flip(-1).clamp_min(0), Y.flip(-1)
        rho = (R @ Y[:, self.lo:d, :]).norm(dim=-2)  # ||R y_last||
        return theta, Y, rho

    def _record(self, view: View, settled: torch.Tensor, theta, rho) -> None:
        done, d = self.active[settled], self.d
        view.ritz.values[done, :d], view.ritz.residuals[done, :d] = theta[settled], rho[settled]
        view.ritz.products[done], view.ritz.spanned[done] = self.products, d >= self.n

    def _compact(self, keep: torch.Tensor) -> None:
        self.active, self.V, self.H = self.active[keep], self.V[keep], self.H[keep]
        self.c = self.c[keep]
        self.open = [o[keep] for o in self.open]

    def _append(self, Q: torch.Tensor) -> None:
        self.V[:, :, self.d:self.d + Q.shape[-1]] = Q
        self.lo, self.d = self.d, self.d + Q.shape[-1]
        self._note_c(self.lo)

    def _note_c(self, lo: int) -> None:
        u = [v.u for v in self.views if v.u is not None]
        if len(self.views) > 1 and u:
            block = self.V[:, :, lo:self.d].double()
            self.c[:, lo:self.d] = (block.mT @ u[0][self.active].double().unsqueeze(-1))[..., 0]

    def _restarted(self, i: int, pair, Q: torch.Tensor) -> Lanczos:
        """The run of view i from its best Ritz vectors, room left for one block: this run
        itself when it has one view, else a new run on the entries view i still has open."""
        theta, Y, _ = pair
        keep, rows = self.d_max - Q.shape[-1], self.open[i]
        run = self if len(self.views) == 1 else object.__new__(Lanczos)
        if run is not self:
            run.__dict__.update(self.__dict__)
            run.views, run.open = [self.views[i]], [torch.ones_like(rows[rows])]
            run.active, run.H, run.c = self.active[rows], self.H[rows].clone(), self.c[rows]
        V = self.V[rows]  # a copy where rows is a mask
        run.V = V if run is self else V.clone()
        run.V[:, :, :keep] = V[:, :, :self.d] @ Y[rows][..., :keep].to(V.dtype)
        run.H.zero_()
        run.H[:, :keep, :keep] = torch.diag_embed(theta[rows][:, :keep])
        run.d = keep
        run._append(Q[rows])
        return run


def run_lanczos(runs: list[Lanczos], gram: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                ) -> None:
    """Advance the runs until each finishes, gram(active [a], X [a, n, s]) -> A^T A X."""
    while runs:
        runs = [new for run in runs for new in run.absorb(gram(run.active, run.block()))]


def empty_ritz(N: int, d_max: int, block: int, device=None) -> Ritz:
    zeros = torch.zeros(N, d_max, dtype=torch.float64, device=device)
    return Ritz(zeros, zeros.clone(), torch.zeros(N, dtype=torch.long),
                torch.zeros(N, dtype=torch.bool), block)


def block_lanczos(op, stop: Stop, k_max: int, block: int = 32, max_products: int | None = None,
                  seed: int = 0) -> Ritz:
    """Ritz values of A^T A for every entry of op [*batch, m, n] (module docstring), grown
    until `stop` settles each entry, the whole space is spanned, or an entry has had
    max_products vectors (default 4 basis sizes) multiplied."""
    N, n = math.prod(op.batch), op.shape[1]
    s = block_size(block, k_max, n)
    view = View(stop, empty_ritz(N, min(n, k_max + s), s, op.device))
    run_lanczos([Lanczos(N, n, [view], k_max, s, max_products, seed, op.device)],
                lambda idx, X: gram_of(op, idx, X))
    return view.ritz
