"""Claim: Muon lowers W_V's effective rank about 2x against AdamW, and Lion 1.4-1.8x.

Published evidence points the other way for Muon: Moonshot's "Muon is Scalable for LLM
Training" (arXiv 2502.16982) reports higher SVD entropy of Muon-trained weights. The
quantity: erank of W_V (Roy & Vetterli), mean over layers, at the end of matched runs
(configs/claims/optimizers.yaml: the same model, data, seed and steps, each optimizer at
its own usual learning rate); stable rank and rank_0.01 are reported beside it. The ratio
is AdamW's erank over the other's, paired by seed.
"""

from __future__ import annotations

from .evidence import Evidence, Run, value_figures
from .rule import HOLDS, PARTLY, REFUTED, Claim, Outcome, fmt, missing, within_noise

EXPERIMENT = "claims_optimizers"
THRESHOLDS = {"muon": [1.6, 2.5], "lion": [1.4, 1.8],  # AdamW erank / theirs, "about 2x"
              "metric": "erank", "seeds": 2}


def figures(runs: list[Run]) -> dict[str, dict[int, dict[str, float]]]:
    """optimizer -> seed -> W_V figures (erank, stable_rank, rank_eps)."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for run in runs:
        out.setdefault(run.optimizer, {})[run.seed] = value_figures(run.last)
    return out


def part(name: str, table: dict, metric: str) -> tuple[str, str, list[float]]:
    """(verdict, why, ratios per seed) of one optimizer against AdamW."""
    seeds = sorted(set(table["adamw"]) & set(table[name]))
    ratios = [table["adamw"][s][metric] / table[name][s][metric] for s in seeds]
    band = THRESHOLDS[name]
    inside = [band[0] <= r <= band[1] for r in ratios]
    noise = within_noise([table["adamw"][s][metric] for s in seeds],
                         [table[name][s][metric] for s in seeds])
    said = (f"{name}: AdamW/{name} {', '.join(fmt(r) for r in ratios)} "
            f"(seeds {', '.join(map(str, seeds))}); claimed {band[0]}-{band[1]}")
    if len(seeds) < THRESHOLDS["seeds"]:
        said += f"; only {len(seeds)} seed(s)"
    if noise:
        said += "; the difference is within seed-to-seed spread"
    if all(r < 1 for r in ratios):
        said += f"; {name} leaves W_V with the higher rank"
    if all(inside):
        return HOLDS, said, ratios
    return (REFUTED if not any(inside) else PARTLY), said + \
        ("" if not any(inside) else "; the seeds disagree"), ratios


def judge(ev: Evidence) -> Outcome:
    table = figures(ev.of(EXPERIMENT))
    if "adamw" not in table or not ({"muon", "lion"} & set(table)):
        return missing(f"runs of {EXPERIMENT} (configs/claims/optimizers.yaml)")
    metric = THRESHOLDS["metric"]
    parts = {n: part(n, table, metric) for n in ("muon", "lion") if n in table}
    verdicts = {v for v, _, _ in parts.values()}
    verdict = (verdicts.pop() if len(verdicts) == 1 else PARTLY)
    figure = "; ".join(f"AdamW/{n} erank {'/'.join(fmt(r) for r in rs)}"
                       for n, (_, _, rs) in parts.items())
    seeds = sorted({s for t in table.values() for s in t})
    used = (f"{EXPERIMENT}: {', '.join(sorted(table))} x seeds "
            f"{', '.join(map(str, seeds))}, W_V of every layer")
    plot = {"kind": "optimizers", "metric": metric,
            "values": {o: {str(s): f for s, f in t.items()} for o, t in table.items()}}
    return Outcome(verdict, figure, "W_V erank, AdamW over Muon and Lion, paired by seed",
                   why="; ".join(w for _, w, _ in parts.values()), used=used, plot=plot,
                   data={"figures": plot["values"]})


CLAIM = Claim(
    name="optimizers",
    sentence="Muon lowers W_V's effective rank about 2x against AdamW, and Lion 1.4-1.8x.",
    source="the low-rank-bottleneck theory rankzoo starts from; against it for Muon: "
           "Moonshot, arXiv 2502.16982",
    quantity="erank of W_V, mean over layers, at the end of matched runs; srank and "
             "rank_0.01 beside it",
    metrics="docs/METRICS.md#claims",
    rule="per optimizer, AdamW/theirs erank per seed in the claimed band (Muon 1.6-2.5, Lion "
         "1.4-1.8) on every seed: holds; on none: refuted; on some: holds partly (seeds "
         "disagree); two seeds; a difference within the seeds' spread is said",
    thresholds=THRESHOLDS,
    evidence=("runs",),
    judge=judge,
)
