"""Claim: sigma_k(softmax(M)) <= C sigma_k(M) / k^2 for a constant C.

Computed, not asserted: the bound is checked on constructed matrices (M = 0; random M
of rank r with k > r, plain and causal row softmax) and on a model's own next-token
logits. A matrix with sigma_k(M) = 0 (to fp64 rounding) and sigma_k(softmax(M)) > 0
breaks the bound for every C; the smallest such matrix is printed. On matrices where
sigma_k(M) > 0 the figure is the C the bound would need (the largest ratio over k).
"""

from __future__ import annotations

import torch

from .evidence import Evidence
from .rule import HOLDS, REFUTED, Claim, Outcome, fmt

THRESHOLDS = {
    "zero_tol": 1e-10,  # sigma_k(M) <= zero_tol * max(1, sigma_1(M)): zero to fp64 rounding
    "positive": 1e-6,  # sigma_k(softmax(M)) above this: a real singular value
    "sizes": [1, 2, 4, 8, 16, 32],  # n of the n x n constructed matrices
    "ranks": [1, 2, 4],  # rank r of the low-rank constructions (k = r + 1 ... n)
    "seed": 0,
}


def causal_softmax(M: torch.Tensor) -> torch.Tensor:
    """Row softmax of M with the upper triangle masked out: causal attention's P."""
    n = M.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(M.masked_fill(mask, float("-inf")), dim=-1)


def worst_k(M: torch.Tensor, P: torch.Tensor) -> dict:
    """Over k, the bound's verdict on (M, softmax(M) = P): the first k where sigma_k(M) is
    zero and sigma_k(P) is not (a counterexample to every C), else the largest C needed."""
    s_m = torch.linalg.svdvals(M.double())
    s_p = torch.linalg.svdvals(P.double())
    zero = THRESHOLDS["zero_tol"] * max(1.0, float(s_m[0]) if s_m.numel() else 0.0)
    c_needed = 0.0
    for k in range(1, len(s_p) + 1):
        sm, sp = float(s_m[k - 1]), float(s_p[k - 1])
        if sm <= zero and sp > THRESHOLDS["positive"]:
            return {"k": k, "sigma_k_softmax": sp, "sigma_k_m": sm, "counterexample": True}
        if sm > zero:
            c_needed = max(c_needed, sp * k * k / sm)
    return {"k": None, "counterexample": False, "c_needed": c_needed}


def constructed() -> list[dict]:
    """Every constructed case: name, n, its verdict (worst_k), smallest n first."""
    g = torch.Generator().manual_seed(THRESHOLDS["seed"])
    cases = []
    for n in THRESHOLDS["sizes"]:
        zero = torch.zeros(n, n, dtype=torch.float64)
        cases.append({"case": f"M = 0 ({n}x{n}), row softmax", "n": n,
                      **worst_k(zero, torch.softmax(zero, dim=-1))})
        for r in THRESHOLDS["ranks"]:
            if r >= n:
                continue
            A = torch.randn(n, r, generator=g, dtype=torch.float64)
            B = torch.randn(n, r, generator=g, dtype=torch.float64)
            M = A @ B.T  # [n, n], rank r
            cases.append({"case": f"rank-{r} M ({n}x{n}), causal softmax", "n": n,
                          **worst_k(M, causal_softmax(M))})
    return cases


def on_logits(logits: torch.Tensor) -> dict:
    """The bound on a model's next-token logits [T, V] and their row softmax."""
    return {"case": f"model logits ({logits.shape[0]}x{logits.shape[1]}), row softmax",
            "n": int(logits.shape[0]), **worst_k(logits, torch.softmax(logits.double(), -1))}


def judge(ev: Evidence) -> Outcome:
    cases = constructed()
    if ev.probed is not None and ev.probed.logits is not None:
        cases.append(on_logits(ev.probed.logits))
    broken = [c for c in cases if c["counterexample"]]
    needed = [c["c_needed"] for c in cases if not c["counterexample"]]
    data = {"cases": cases}
    if broken:
        first = min(broken, key=lambda c: (c["n"], c["k"]))
        figure = (f"{first['case']}: sigma_{first['k']}(softmax M) = "
                  f"{fmt(first['sigma_k_softmax'])}, sigma_{first['k']}(M) = "
                  f"{fmt(first['sigma_k_m'])}")
        why = (f"{len(broken)} of {len(cases)} matrices break the bound for every C"
               + (f"; where sigma_k(M) > 0 the bound needs C up to {fmt(max(needed))}"
                  if needed else ""))
        return Outcome(REFUTED, figure, "sigma_k(softmax M) against C sigma_k(M)/k^2, every k",
                       why=why, used=f"{len(cases)} matrices", data={**data, "smallest": first})
    return Outcome(HOLDS, f"C needed <= {fmt(max(needed))}",
                   "sigma_k(softmax M) against C sigma_k(M)/k^2, every k",
                   used=f"{len(cases)} matrices", data=data)


CLAIM = Claim(
    name="softmax_bound",
    sentence="The softmax of a matrix has k-th singular value at most C sigma_k(M) / k^2.",
    source="the low-rank-bottleneck theory rankzoo starts from; it circulates without a "
           "findable published source",
    quantity="singular values of M and of its row softmax (plain, and causal for "
             "attention), fp64, every k",
    metrics="docs/METRICS.md#claims",
    rule="refuted if any matrix has sigma_k(M) <= 1e-10 max(1, sigma_1(M)) and "
         "sigma_k(softmax M) > 1e-6 (no C can hold); else holds, with the C it needs",
    thresholds=THRESHOLDS,
    evidence=("constructed", "hf"),
    judge=judge,
)
