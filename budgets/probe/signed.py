"""What the probe's mixing figures mean for signed mixing (differential attention's
M = P1 - lambda P2, budgets/capture/differential.py), and the mark a layer carries.

    quantities, extras = mixing_figures(M, eps, signed=True)   # blocks.py
    extras["signed"] = signed_mark(quantities)                 # what was computed, what not

The singular-value metrics (rank_eps, erank, stable rank, participation ratio, numerical
rank, sigma_1, sigma_ratio) are defined for any real matrix and apply as they are, to the
whole M and to its past->future block (and its prefixes). What assumes P >= 0 with rows
summing to 1 does not: the centering P - 1 mean_rows(P), which removes the all-ones
direction a row-stochastic matrix always carries (M's rows sum to 1 - lambda and its
entries take either sign, so that direction is not special), and the per-head masses and
shares built on P being a distribution (first-token mass, diagonal mass, centered energy).
Those are left out, null rather than a figure that reads as something it is not.
"""

from __future__ import annotations

NOT_APPLICABLE = ("mixing_centered", "heads.first_token_mass", "heads.diagonal_mass",
                  "heads.centered_energy")
WHY = ("signed mixing: its entries take either sign and its rows sum to 1 - lambda, so the "
       "row-stochastic centering and the masses do not apply; the singular-value metrics do")


def signed_mark(quantities: dict) -> dict:
    """The layer's `signed` entry: the mixing quantities computed (past_future_lengths
    with them), those that do not apply, and why."""
    return {"computed": [*quantities, "past_future_lengths"],
            "not_applicable": list(NOT_APPLICABLE), "why": WHY}
