"""METRICS of matrices known through products, from block Lanczos runs (krylov.py).

    out = measure([[Target(fro2, shape)]], grams, eps=0.1, k_max=256)   # [[{metric: [N]}]]

A `Target` is one matrix A [N, m, n] to measure: its exact energies ||A||_F^2 and, for a
centered matrix, the rank-one downdate A_c^T A_c = A^T A - m mu mu^T. Targets in one group
share a Krylov run (a matrix and its centered form: one product serves both); each group
is a run of its own, and `grams` computes the products every open run asks for in one go,
so that runs over blocks of one attention matrix share its passes over the scores:

    grams([(key, active [a], X [a, n, s]), ...]) -> [A^T A X per request]

A head settles when its rank_eps is decided by the residual bounds (ritz_bounds.py; where
its values hold the whole energy, once they are resolved for erank too), when it is shown
to need more than k_max values, or when its product budget is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from .krylov import Lanczos, View, basis_size, block_size, empty_ritz
from .metrics import METRICS, spectrum_metrics
from .ritz_bounds import energy_bounds, error_bounds

# Vectors added to the Krylov basis per product: one pass over the scores serves them all
# (measured at T = 4096: 64 a block 0.75x the time of 32, 0.45x that of 16; 128 no faster).
BLOCK = 64
# A head's leftover energy below this fraction of ||A||_F^2 counts as "whole spectrum seen";
# its values are then resolved to this fraction of the top one before erank is taken, and
# values below NOISE of the top one (what rounding in fp32 products leaves) are dropped.
COMPLETE = 1e-6
RESOLVED = 1e-7
NOISE = 1e-7

Request = tuple[Hashable, torch.Tensor, torch.Tensor]  # (group key, active [a], X [a, n, s])
Grams = Callable[[list[Request]], list[torch.Tensor]]


@dataclass
class Target:
    """One matrix [N, m, n] to measure: its energies fro2 [N]; for a centered matrix the
    downdate of A^T A by w u u^T (u [N, n] = mu, w [N] = m); `top` bounds rank_eps from
    below before any product (rank_eps >= (1 - eps^2) ||A||_F^2 / top)."""

    fro2: torch.Tensor
    shape: tuple[int, int]
    u: torch.Tensor | None = None
    w: torch.Tensor | None = None
    top: torch.Tensor | None = None  # [N] a certified upper bound on ||A||_2^2, if known


def measure(groups: dict[Hashable, list[Target]], grams: Grams, eps: float,
            k: int | None, k_max: int, device=None) -> dict[Hashable, list[dict]]:
    """METRICS (and rank_eps_above) [N] of every target, by group key."""
    runs, views = [], {}
    for key, targets in groups.items():
        N, n = targets[0].fro2.shape[0], targets[0].shape[1]
        s = block_size(k or BLOCK, k_max, n)
        # a basis of 2 k_max: a rank near the threshold needs ~3x its values in products,
        # and each restart before that slows the convergence (measured: 10% fewer products)
        room = max(s, k_max)
        d_max = basis_size(k_max, s, n, room)
        views[key] = [View(_stop(t.fro2, t.top, eps, s, k_max),
                           empty_ritz(N, d_max, s, device), t.u, t.w) for t in targets]
        runs.append((key, Lanczos(N, n, views[key], k_max, s, device=device, room=room)))
    while runs:
        images = grams([(key, run.active, run.block()) for key, run in runs])
        runs = [(key, new) for (key, run), W in zip(runs, images, strict=True)
                for new in run.absorb(W)]
    return {key: [_metrics(v.ritz, t, eps) for v, t in zip(views[key], groups[key],
                                                           strict=True)]
            for key in groups}


def _metrics(ritz, target: Target, eps: float) -> dict[str, torch.Tensor]:
    bounds = energy_bounds(ritz.values, ritz.residuals, target.fro2, eps, ritz.block,
                           ritz.spanned, target.top)
    return assemble(ritz.values, target.fro2, bounds, target.shape, eps)


def _stop(fro2: torch.Tensor, top: torch.Tensor | None, eps: float, s: int, k_max: int):
    """The settling rule of one view: rank_eps decided (and, where the values hold the
    whole energy, resolved for erank too), or shown to exceed k_max."""
    def stop(idx, theta, rho, products) -> torch.Tensor:
        bounds = energy_bounds(theta, rho, fro2[idx], eps, s, None,
                               None if top is None else top[idx])
        whole = _whole(theta, fro2[idx])
        resolved = (error_bounds(theta, rho) <= RESOLVED * theta[..., :1]).all(-1)
        return (bounds.decided & (~whole | resolved)) | (bounds.floor > k_max)
    return stop


def _whole(theta: torch.Tensor, fro2: torch.Tensor) -> torch.Tensor:
    """Where the Ritz values theta [a, d] hold all but COMPLETE of the energy fro2 [a]."""
    return (fro2 - theta.clamp_min(0).sum(-1)) <= COMPLETE * fro2


def assemble(theta, fro2, bounds, shape, eps) -> dict[str, torch.Tensor]:
    """METRICS [N] from the Ritz values theta [N, d] and the bounds on rank_eps: a decided
    rank is given, else NaN with its floor in `rank_eps_above` ("rank_eps > a")."""
    s = theta.clamp_min(0).sqrt()  # [N, d] top singular values, zero padded
    s1 = s[..., 0]
    alive = (s1 > 0) & (fro2 > 0)
    nan = torch.full_like(fro2, math.nan)
    rank = torch.where(bounds.decided, bounds.rank, nan)  # else only its floor is known
    complete = _whole(theta, fro2)
    # erank etc. of the values seen, less those below what fp32 products resolve (rounding
    # in P gives A^T A eigenvalues of ~1e-9 theta_1 that a dense spectrum would not show)
    exact = spectrum_metrics(torch.where(theta > NOISE * theta[..., :1], s, 0), shape, eps)
    out = {
        "rank_eps": torch.where(alive, rank, fro2 * 0),
        "stable_rank": torch.where(alive, fro2 / s1.square().clamp_min(1e-300), fro2 * 0),
        "sigma_1": s1,
        "sigma_ratio": s[..., 1] / s1.clamp_min(1e-300) if s.shape[-1] > 1 else s1 * 0,
    }
    for name in ("erank", "participation_ratio"):
        out[name] = torch.where(complete | ~alive, exact[name].double(), nan)
    out["numerical_rank"] = nan  # products in fp32 cannot resolve s_1 * max(m, n) * 1e-7
    # undecided: rank_eps > floor - 1
    out["rank_eps_above"] = torch.where(out["rank_eps"].isnan(), bounds.floor - 1, nan)
    assert set(METRICS) <= set(out)
    return {name: v.double() for name, v in out.items()}
