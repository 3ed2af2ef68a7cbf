"""What Ritz values of A^T A prove about rank_eps, given the exact energy ||A||_F^2.

    b = energy_bounds(theta, rho, fro2, eps, block)   # b.rank, b.decided, b.floor  [a]

theta [a, d] are Ritz values (descending) from a block Krylov space (krylov.py), rho their
residual norms, fro2 the exact ||A||_F^2 = the sum of all eigenvalues lambda of M = A^T A.

- Upper bound, always: the Ritz values' running sums never exceed the eigenvalues' (Ky
  Fan), so the first j whose Ritz energy reaches (1 - eps^2) ||A||_F^2 is >= rank_eps.
- Exactness: lambda_i <= theta_i + e_i, with e_i = min(rho_i, rho_i^2 / gap_i) (Weyl's bound,
  or Kato-Temple's with the gap down to the next Ritz value less that value's residual).
  Where the first j - 1 values stay short of the threshold even so, rank_eps = j.
- Lower bound (`floor`): past the top c values every eigenvalue is at most theta_c + rho_c,
  so the energy still missing needs at least missing / (theta_c + rho_c) more values; c = 0
  uses the top value, or a certified bound on it where the caller has one (`top`: for
  attention, ||P||_2^2 <= ||P||_1 ||P||_inf, from sums the first pass takes).

Both the exactness and the floor assume that the i-th Ritz value stands for the i-th
eigenvalue: that no eigenvalue above it was missed. A random start sees every eigenspace,
but a block of s vectors holds at most s copies of a repeated eigenvalue, so the bounds
stop before any run of s converged Ritz values within a relative CONVERGED of each other
(a previous-token head's P^T P is ~I: its eigenvalue 1 repeats T/2 times). Where the
basis spans the whole space the Ritz values are the eigenvalues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# A Ritz value counts as converged once its residual is below this fraction of it, and two
# converged values this close (relative) belong to one cluster.
CONVERGED = 1e-3


@dataclass
class EnergyBounds:
    """What the Ritz values say about rank_eps, per entry [a]."""

    rank: torch.Tensor  # the first j whose Ritz energy reaches the threshold (>= rank_eps); NaN
    decided: torch.Tensor  # True where rank is exact
    floor: torch.Tensor  # rank_eps >= floor


def error_bounds(theta: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """How far above each Ritz value [a, d] its eigenvalue may lie: min(rho, rho^2 / gap)
    where the gap down to the next value, less that value's residual, is positive."""
    e = rho.clone()
    gap = theta[..., :-1] - theta[..., 1:] - rho[..., 1:]
    quad = rho[..., :-1].square() / gap.clamp_min(torch.finfo(gap.dtype).tiny)
    e[..., :-1] = torch.where(gap > 0, torch.minimum(rho[..., :-1], quad), rho[..., :-1])
    return e


def cluster_free(theta: torch.Tensor, rho: torch.Tensor, block: int) -> torch.Tensor:
    """How many top Ritz values [a] precede the first run of `block` converged values each
    within a relative CONVERGED of the next: where the space may hold too few copies."""
    conv = rho <= CONVERGED * theta
    close = conv[..., :-1] & conv[..., 1:] & (theta[..., :-1] - theta[..., 1:]
                                             <= CONVERGED * theta[..., :-1])  # [a, d - 1]
    i = torch.arange(close.shape[-1], device=theta.device)
    breaks = torch.where(close, torch.full_like(i, -1), i).cummax(-1).values  # last non-close
    run = i - breaks  # close pairs ending at pair i
    start = torch.where(run >= block - 1, i + 2 - block, torch.full_like(i, theta.shape[-1]))
    if not start.shape[-1]:  # a single value: no run
        return torch.full(theta.shape[:-1], theta.shape[-1], device=theta.device)
    return start.amin(-1)


def energy_bounds(theta: torch.Tensor, rho: torch.Tensor, fro2: torch.Tensor, eps: float,
                  block: int, spanned: torch.Tensor | None = None,
                  top: torch.Tensor | None = None) -> EnergyBounds:
    """rank_eps bounds (module docstring) from Ritz values theta [a, d] of A^T A, residual
    norms rho [a, d], the exact energies fro2 [a], a Krylov block of `block` vectors;
    `spanned` [a]: True where the basis spans the whole space (the values are exact);
    `top` [a]: a certified upper bound on the top eigenvalue (every eigenvalue is below it,
    so the floor needs no converged value)."""
    theta, rho = theta.double().clamp_min(0), rho.double()
    need = (1.0 - eps**2) * fro2.double().unsqueeze(-1)  # [a, 1]
    energy = theta.cumsum(-1)  # [a, d]
    reached = energy >= need
    first = reached.int().argmax(-1)  # [a]: the first True (0 where none)
    nan = torch.full_like(fro2, math.nan, dtype=theta.dtype)
    rank = torch.where(reached.any(-1), first + 1.0, nan)
    upper = torch.cat([torch.zeros_like(need), (theta + error_bounds(theta, rho)).cumsum(-1)],
                      -1)  # [a, d + 1]: the true energies' upper bounds, from 0 values on
    free = cluster_free(theta, rho, block)
    short = upper.gather(-1, first.unsqueeze(-1)).squeeze(-1) < need.squeeze(-1)
    decided = reached.any(-1) & short & (first <= free)
    if spanned is not None:
        decided |= spanned & reached.any(-1)
    return EnergyBounds(rank, decided | (fro2 <= 0), _floor(theta, rho, need, free, top))


def _floor(theta, rho, need, free, top=None) -> torch.Tensor:
    """A lower bound [a] on rank_eps from the converged, cluster-free top values c = 0..
    whose energy falls short: c + (missing energy) / (the most any later value can be)."""
    d = theta.shape[-1]
    c = torch.arange(0, d, device=theta.device, dtype=theta.dtype)  # values kept: 0..d-1
    first = (theta + rho)[..., :1]
    cap = torch.cat([first, (theta + rho)[..., :-1]], -1)  # [a, d]: at most this after c
    upper = torch.cat([torch.zeros_like(need), (theta + rho).cumsum(-1)[..., :-1]], -1)
    conv = (rho <= CONVERGED * theta).cumprod(-1).bool()  # [a, d]: values 0..i converged
    conv = torch.cat([conv[..., :1], conv[..., :-1]], -1)  # c = 0 rests on the top value
    if top is not None:  # no eigenvalue above it: the floor from c = 0 needs nothing else
        top = top.double().unsqueeze(-1)
        cap[..., :1] = torch.where(conv[..., :1], torch.minimum(cap[..., :1], top), top)
        cap, conv[..., 0] = torch.minimum(cap, top), True
    trusted = conv & (c <= free.unsqueeze(-1)) & (cap > 0) & (upper < need)
    more = torch.ceil((need - upper).clamp_min(0) / cap.clamp_min(torch.finfo(cap.dtype).tiny))
    floor = torch.where(trusted, c + more, torch.zeros_like(c)).amax(-1)
    return floor.clamp(min=1, max=1e12)
