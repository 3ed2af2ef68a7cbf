"""Where each head puts its weight: per-head statistics of mixing matrices.

    stats = head_stats(P)                       # P [B, H, T, T] -> {name: [per head]}
    stats = head_stats_operator(full, centered) # the same from a matrix-free operator

Definitions (docs/METRICS.md, "Probe figures beside the ranks"), each per head, over the
probe batch:

  first_token_mass  mean over samples and queries t >= 1 of P[t, 0]: an attention sink
                    reads ~1 (query 0 is left out: it can attend nowhere else)
  diagonal_mass     mean over samples and queries t of P[t, t-2] + P[t, t-1] + P[t, t]:
                    a local head reads ~1
  centered_energy   ||P - 1 mean_rows(P)||_F^2 / ||P||_F^2, mean over samples: the share
                    of the energy centered metrics see; ~0 when every query reads nearly
                    the same mix, where centered metrics measure rounding noise

The matrix-free form never holds [T, T]: the first column and the diagonal band are
single scores against the log-sum-exp the operator streamed already, and the centered
energy is ||P||_F^2 - T ||mean row||^2, from the Frobenius norm and P^T 1 it computes.
"""

from __future__ import annotations

import torch

from ..rank.matfree import AttentionOperator, CenteredOperator

BAND = 3  # diagonal_mass: the query itself and the two keys before it
HEAD_STATS = ("first_token_mass", "diagonal_mass", "centered_energy")


def energy_share(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, 0 where den is 0 (an all-zero matrix has no energy to share)."""
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def _lists(stats: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """[B, H] per sample -> per-head means over the batch, as floats."""
    return {name: [float(x) for x in v.double().mean(0).cpu()] for name, v in stats.items()}


def head_stats(P: torch.Tensor, centered_energy: torch.Tensor | None = None
               ) -> dict[str, list[float]]:
    """first_token_mass, diagonal_mass, centered_energy (module docstring) per head of
    mixing matrices P [B, H, T, T], each the mean over the batch. `centered_energy`
    [B, H], when the caller has it from P's spectra, saves two passes over P."""
    T = P.shape[-1]
    f64 = torch.float64
    # sums in fp64, without an fp64 copy of P
    band = sum(P.diagonal(-d, -2, -1).sum(-1, dtype=f64) for d in range(min(BAND, T)))
    if centered_energy is None:
        fro2 = P.square().sum((-2, -1), dtype=f64)  # [B, H]
        centered = (P - P.mean(-2, keepdim=True)).square().sum((-2, -1), dtype=f64)
        centered_energy = energy_share(centered, fro2)
    first = P[..., 1:, 0].mean(-1, dtype=f64) if T > 1 else band * 0
    return _lists({"first_token_mass": first, "diagonal_mass": band / T,
                   "centered_energy": centered_energy})


def head_stats_operator(full: AttentionOperator, centered: CenteredOperator
                        ) -> dict[str, list[float]]:
    """head_stats of the whole matrix known as an operator `full` [B, H, T, T] (rows and
    columns all T) and its centered form, never forming [T, T]."""
    T = full.shape[0]
    if full.shape != (T, T) or full.rows != (0, T):
        raise ValueError(f"head statistics need the whole mixing matrix, got the block "
                         f"rows {full.rows}, cols {full.cols}")
    t = torch.arange(T, device=full.device)
    first = full.at(torch.zeros_like(t))[..., 1:].double().mean(-1) if T > 1 else \
        full.fro2() * 0
    band = sum(full.at(t - d).double() for d in range(min(BAND, T))).mean(-1)
    energy = energy_share(centered.fro2().double(), full.fro2().double())
    return _lists({"first_token_mass": first, "diagonal_mass": band,
                   "centered_energy": energy})


def undefined_head_stats(n_heads: int) -> dict[str, list[None]]:
    """Per-head nulls, for mixing known only by its past->future factors (linear attention
    and SSMs in matrix-free mode): the first column, the diagonal band and the mean row
    lie partly outside the block, so none is defined from them."""
    return {name: [None] * n_heads for name in HEAD_STATS}
