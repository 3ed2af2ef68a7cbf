"""The settings compress measures, a row per setting, and the verdict on the advice.

    rows, chosen, baseline = measure(target, cal, evaluate, options, T, prediction, notes)
    verdict(rows, prediction, tolerance)   # {"verdict": "verified" | "refuted" | None, ...}

Settings: the report's advised ranks, per target ratio a uniform r and a greedy allocation
by gain per byte (train/commands/compress/lowrank.py), and per eps the per-layer rank_eps.

Cost model: the bases are fitted once on calibration data and shared by every sequence,
so they are weights: a row's ratio and bytes_per_token count the codes per token alone,
its basis_bytes are paid once per model (ratio_per_sequence: the same ranks with the
bases paid per sequence at T, the report's per-sequence accounting).

Each setting is evaluated with every slot projected to its ranks; settings with the same
ranks are evaluated once. The verdict: *verified* when the loss change at
the advised ranks is within the tolerance, else *refuted*, naming the largest measured
ratio that is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from budgets.cache import CostModel

from ...render.compress import setting_name
from .calibrate import Calibration
from .lowrank import (
    Slot,
    cache_bytes,
    eps_ranks,
    full_ranks,
    greedy_ranks,
    projectors,
    retained_energy,
    uniform_ranks,
)
from .options import MIN_COMPRESSION, CompressOptions

COST_MODEL = CostModel.SHARED  # the bases are weights (module docstring)
SHARED = COST_MODEL == CostModel.SHARED  # lowrank's flag for it


def _uniform(slots, cal, ratio, nbytes, T):
    return uniform_ranks(slots, ratio, nbytes, T, SHARED)


def _greedy(slots, cal, ratio, nbytes, T):
    return greedy_ranks(slots, cal.energy, ratio, nbytes, T, SHARED, shares=True)


def _greedy_scaled(slots, cal, ratio, nbytes, T):
    return greedy_ranks(slots, cal.energy, ratio, nbytes, T, SHARED, shares=False)


# allocation -> its ranks for a target ratio (train/commands/compress/lowrank.py)
ALLOCATE = {"uniform": _uniform, "greedy": _greedy, "greedy-scaled": _greedy_scaled}


def settings(target, cal: Calibration, options: CompressOptions, T: int,
             prediction: dict | None, notes: list[str]) -> list[tuple[str, float | None, dict]]:
    """(allocation, target ratio or eps, ranks) to evaluate: the report's advice first."""
    out = []
    if prediction is not None:
        out.append(("advised", None, prediction["ranks"]))
    nbytes, slots = options.nbytes, target.slots
    allocations = list(options.allocations)
    if "greedy-scaled" in allocations and not cal.one_scale:
        allocations.remove("greedy-scaled")
        notes.append("greedy-scaled: left out: its gains are not on one scale here (energy "
                     "bases, a recurrent state or MoE's shared KV head)")
    for ratio in options.ratios:
        for alloc in allocations:
            ranks = ALLOCATE[alloc](slots, cal, ratio, nbytes, T)
            if ranks is None:
                floor = cache_bytes(slots, {s.key: [1] * s.heads for s in slots}, nbytes, T,
                                    SHARED)
                notes.append(f"{alloc} {ratio:g}x: out of reach: at r = 1 everywhere the cache "
                             f"is {floor['ratio']:.2f}x smaller")
                continue
            out.append((alloc, ratio, ranks))
    for eps in options.eps:
        out.append(("eps", eps, eps_ranks(cal.stats, eps)))
    return out


def ranks_by_kind(slots: list[Slot], ranks: dict) -> dict[str, list[list[int]]]:
    """{kind: [per layer: [r per head]]}, layers in order."""
    out: dict[str, list[list[int]]] = {}
    for s in slots:
        out.setdefault(s.kind, []).append(list(ranks[s.key]))
    return out


def ranks_summary(by_kind: dict[str, list[list[int]]]) -> str:
    """`k 3-8 (5.2) · v 4-8 (6.0)`: per kind, min-max over layers and heads (mean)."""
    parts = []
    for kind, layers in by_kind.items():
        flat = [r for layer in layers for r in layer]
        lo, hi, mean = min(flat), max(flat), sum(flat) / len(flat)
        span = str(lo) if lo == hi else f"{lo}-{hi}"
        parts.append(f"{kind} {span}" + ("" if lo == hi else f" ({mean:.1f})"))
    return " · ".join(parts)


def bases_used(slots: list[Slot], cal: Calibration) -> dict[str, str]:
    """{kind: "output" | "energy" | "mixed"}: the bases each kind's slots were fitted as."""
    out: dict[str, set] = {}
    for s in slots:
        out.setdefault(s.kind, set()).add(cal.used.get(s.key, "energy"))
    return {kind: used.pop() if len(used) == 1 else "mixed" for kind, used in out.items()}


def full_row(target, nbytes: int, T: int, baseline: dict) -> dict:
    """The row of the full cache: ratio 1, every width kept, the model's own evaluation."""
    full = cache_bytes(target.slots, full_ranks(target.slots), nbytes, T)
    return {"allocation": "full", "target": None, "ratio": 1.0, "ratio_per_sequence": 1.0,
            "cost_model": COST_MODEL,
            "bytes_per_token": full["full_bytes_per_token"],
            "code_bytes_per_token": full["full_bytes_per_token"], "basis_bytes": 0,
            "ranks": ranks_by_kind(target.slots, full_ranks(target.slots)),
            "ranks_summary": "full", "retained_energy": 1.0, "bases": None, "delta_loss": 0.0,
            **{k: v for k, v in baseline.items() if k != "tokens"},
            **({"delta_accuracy": 0.0} if "accuracy" in baseline else {})}


def make_row(target, cal: Calibration, alloc: str, goal, ranks: dict, nbytes: int, T: int,
             metrics: dict, baseline: dict) -> dict:
    size = cache_bytes(target.slots, ranks, nbytes, T, SHARED)
    per_sequence = cache_bytes(target.slots, ranks, nbytes, T)["ratio"]
    kept = [x for s in target.slots for x in retained_energy(cal.energy[s.key], ranks[s.key])]
    by_kind = ranks_by_kind(target.slots, ranks)
    row = {"allocation": alloc, "target": goal, "ratio": size["ratio"],
           "ratio_per_sequence": per_sequence, "cost_model": COST_MODEL,
           "bytes_per_token": size["bytes_per_token"],
           "code_bytes_per_token": size["code_bytes_per_token"],
           "basis_bytes": size["basis_bytes"], "ranks": by_kind,
           "ranks_per_layer": {k: [sum(ly) / len(ly) for ly in v] for k, v in by_kind.items()},
           "ranks_summary": ranks_summary(by_kind),
           "retained_energy": sum(kept) / len(kept), "bases": bases_used(target.slots, cal),
           "loss": metrics["loss"], "delta_loss": metrics["loss"] - baseline["loss"]}
    for name in ("accuracy", "perplexity"):
        if name in metrics:
            row[name] = metrics[name]
    if "accuracy" in metrics:
        row["delta_accuracy"] = metrics["accuracy"] - baseline["accuracy"]
    return row


def measure(target, cal: Calibration, evaluate: Callable[[], dict], options: CompressOptions,
            T: int, prediction: dict | None, notes: list[str],
            progress: Callable[[str], None] | None = None) -> tuple[list[dict], dict, dict]:
    """(rows: the full cache first, then each setting; the ranks of each row by index;
    the full model's evaluation)."""
    nbytes = options.nbytes
    began = time.perf_counter()
    baseline = evaluate()
    rows = [full_row(target, nbytes, T, baseline)]
    chosen = {0: None}
    todo = settings(target, cal, options, T, prediction, notes)
    seen: dict[tuple, dict] = {}
    for n, (alloc, goal, ranks) in enumerate(todo, 1):
        signature = tuple((k, tuple(v)) for k, v in sorted(ranks.items()))
        if signature not in seen:
            P = {key: projectors(cal.bases[key], ranks[key], cal.encoders.get(key))
                 for key in ranks}
            with target.projected(P):
                seen[signature] = evaluate()
        rows.append(make_row(target, cal, alloc, goal, ranks, nbytes, T, seen[signature],
                             baseline))
        chosen[len(rows) - 1] = ranks
        if progress is not None:
            progress(f"{n}/{len(todo)} settings measured · {time.perf_counter() - began:.1f} s")
    return rows, chosen, baseline


def verdict(rows: list[dict], prediction: dict | None, tolerance: float) -> dict:
    """verified / refuted (or null: nothing advised to check) with the text that says so,
    and the largest measured ratio whose loss change stays within the tolerance."""
    measured = [r for r in rows if r["allocation"] != "full"]
    within = [r for r in measured if r["delta_loss"] <= tolerance]
    best = max(within, key=lambda r: r["ratio"], default=None)
    largest = ("no measured setting stays within it" if best is None else
               f"the largest measured ratio within it is {best['ratio']:.2f}x "
               f"({setting_name(best)}: loss {best['delta_loss']:+.4f})")
    advised = next((r for r in measured if r["allocation"] == "advised"), None)
    out = {"tolerance": tolerance, "largest_ratio_within": None if best is None else
           best["ratio"], "largest_within": None if best is None else setting_name(best)}
    if advised is None or prediction is None:
        return {**out, "verdict": None, "advised_ratio": None,
                "text": f"no advice to check; at a tolerance of {tolerance:g} nats per "
                        f"token, {largest}"}
    ok = advised["delta_loss"] <= tolerance
    return {**out, "verdict": "verified" if ok else "refuted",
            "advised_ratio": advised["ratio"], "advised_delta_loss": advised["delta_loss"],
            "text": _verdict_text(advised, prediction, tolerance, ok, largest)}


def _verdict_text(advised: dict, prediction: dict, tolerance: float, ok: bool,
                  largest: str) -> str:
    kind = "advice" if prediction["advised"] else "implied ratio"
    text = (f"{'verified' if ok else 'refuted'}: at the report's {kind} of "
            f"{advised['ratio']:.2f}x ({advised['bytes_per_token']:.1f} B/token) the eval loss "
            f"changes by {advised['delta_loss']:+.4f} nats per token, "
            f"{'within' if ok else 'beyond'} the tolerance of {tolerance:g}")
    text += f"; {largest}"
    if advised["ratio"] < MIN_COMPRESSION:
        text += (f"; at {advised['ratio']:.2f}x the advised ranks save little or nothing (the "
                 f"report advises a low-rank cache per layer only from {MIN_COMPRESSION:g}x)")
    if prediction.get("withheld"):
        why = prediction["withheld"].partition("no architecture advice: ")[2]
        text += f" (the report itself withheld its advice: {why or prediction['withheld']})"
    return text
