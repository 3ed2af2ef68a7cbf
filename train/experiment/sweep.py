"""The sweep summary: the best learning rate per variant and optimizer, with its ranks.

A sweep (the `sweep` section of an experiment) runs every variant at every optimizer x lr
x seed of its grid. Each run is scored by `sweep.select` on validation; scores are averaged
over seeds, and the lr with the best mean wins, as Zoology selects it. A run that diverged
(its loss went NaN) or left no result scores worst, so a too-high lr never wins by default.

The realized ranks beside each winner are the seed-mean, over layers, of the report's
realized rank per axis (rank_eps, mean over heads), plus the centered mixing erank: the
figures that let a user see whether an optimizer or lr changed the rank a block used.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from ..config import SELECT_MODES, Experiment, parse_experiment
from ..rundir.files import read_yaml, write_json
from ..rundir.layout import EXPERIMENT_FILE

SWEEP_FILE = "sweep.json"
__all__ = ["best_runs", "run_summary", "summarize", "write_summary"]


def realized_by_axis(variant_report: dict) -> dict[str, float]:
    """Mean over layers of each axis's realized rank, and of the centered mixing erank."""
    per_axis: dict[str, list[float]] = {}
    for layer in variant_report["layers"]:
        rows: dict[str, list[float]] = {}
        for row in layer["axes"]:
            if row["realized_mean"] is not None:
                rows.setdefault(row["axis"], []).append(row["realized_mean"])
        for axis, values in rows.items():
            per_axis.setdefault(axis, []).append(statistics.fmean(values))
        if layer.get("mixing_centered_erank") is not None:
            per_axis.setdefault("mixing_centered_erank", []).append(
                layer["mixing_centered_erank"])
    return {axis: statistics.fmean(values) for axis, values in per_axis.items()}


def _score(run: dict[str, Any] | None, select: str) -> float | None:
    """The run's selection metric, or None when it diverged or has no finite value."""
    value = None if run is None else run.get("metrics", {}).get(select)
    return value if value is not None and math.isfinite(value) else None


def _best_lr(by_lr: dict[float, list[float | None]], mode: str) -> float | None:
    """The lr whose mean score over seeds is best; an lr with any failed seed is out."""
    means = {lr: statistics.fmean(s) for lr, s in by_lr.items()
             if s and all(x is not None for x in s)}
    if not means:
        return None
    pick = min if mode == "min" else max
    return pick(means, key=means.get)


def summarize(exp: Experiment, report: dict) -> dict[str, Any]:
    """The sweep's summary document: one group per (variant, optimizer)."""
    if exp.sweep is None:
        raise ValueError(f"experiment {exp.name!r} has no sweep section")
    select, mode = exp.sweep.select, SELECT_MODES[exp.sweep.select]
    runs = {v["variant"]: v for v in report["variants"]}
    groups: dict[tuple[str, str], list[str]] = {}
    for name, v in exp.variants.items():
        optimizer = v.point.get("optimizer", exp.train.optimizer)
        groups.setdefault((v.base, optimizer), []).append(name)
    out = [_group(exp, base, optimizer, names, runs, select, mode)
           for (base, optimizer), names in groups.items()]
    return {"experiment": exp.name, "select": select, "mode": mode,
            "axes": exp.sweep.axes, "groups": out}


def _group(exp: Experiment, base: str, optimizer: str, names: list[str],
           runs: dict[str, dict], select: str, mode: str) -> dict[str, Any]:
    by_lr: dict[float, list[str]] = {}
    for name in names:
        by_lr.setdefault(exp.variants[name].point.get("lr", exp.train.lr), []).append(name)
    scores = {lr: [_score(runs.get(n), select) for n in ns] for lr, ns in by_lr.items()}
    best = _best_lr(scores, mode)
    group = {
        "variant": base, "optimizer": optimizer, "best_lr": best,
        "lrs": [{"lr": lr, "runs": by_lr[lr], "scores": s,
                 "mean": statistics.fmean(s) if s and None not in s else None}
                for lr, s in scores.items()],
    }
    if best is not None:
        winners = [runs[n] for n in by_lr[best]]
        group["runs"] = by_lr[best]
        group["metrics"] = _mean_dicts([w.get("metrics", {}) for w in winners])
        group["realized"] = _mean_dicts([realized_by_axis(w) for w in winners])
        group["std"] = statistics.pstdev(scores[best]) if len(scores[best]) > 1 else 0.0
    return group


def best_runs(summary: dict[str, Any]) -> dict[str, str]:
    """Variant -> its single best run: the best optimizer's best lr, then the best seed
    there (what a later stage, such as a LoRA fine-tune, starts from). A variant with no
    finished run is left out."""
    better = min if summary["mode"] == "min" else max
    out: dict[str, str] = {}
    for variant in dict.fromkeys(g["variant"] for g in summary["groups"]):
        groups = [g for g in summary["groups"] if g["variant"] == variant and g["best_lr"]]
        if not groups:
            continue
        group = better(groups, key=lambda g: g["metrics"][summary["select"]])
        (lrs,) = [e for e in group["lrs"] if e["lr"] == group["best_lr"]]
        scored = dict(zip(lrs["runs"], lrs["scores"], strict=True))
        out[variant] = better(scored, key=scored.get)
    return out


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise mean over the dicts that have the key."""
    keys = dict.fromkeys(k for d in dicts for k in d)
    return {k: statistics.fmean(d[k] for d in dicts if k in d) for k in keys}


def write_summary(exp_dir: Path, summary: dict[str, Any]) -> Path:
    return write_json(Path(exp_dir) / SWEEP_FILE, summary)


def run_summary(run_dir: str | Path, report: dict) -> dict[str, Any] | None:
    """The sweep summary of a finished experiment directory, or None if it is no sweep."""
    path = Path(run_dir) / EXPERIMENT_FILE
    if not path.is_file():
        return None
    exp = parse_experiment(read_yaml(path), source=str(path))
    return summarize(exp, report) if exp.sweep is not None else None
