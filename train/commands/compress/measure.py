"""The settings compress measures, a row per setting, and the verdict on the advice.

    rows, chosen, baseline = measure(target, cal, evaluate, options, T, prediction, notes)
    verdict(rows, prediction, tolerance)   # {"verdict": "verified" | "refuted" | None, ...}
    extras(rows, cal)                      # the document's sensitivity, windows, agreement

Settings (allocation/settings.py): the report's advised ranks (prediction.py), per target
ratio one per allocation (uniform, greedy, greedy-scaled, sensitivity, mixed), and per eps
the per-layer rank_eps. Before any is evaluated, the sensitivity pass
(allocation/sensitivity.py) prices every choice on the calibration tokens, so each row
carries the loss change predicted for it beside the one measured.

Cost model: the bases are fitted once on calibration data and shared by every sequence,
so they are weights: a row's ratio and bytes_per_token count the codes per token alone,
its basis_bytes are paid once per model (ratio_per_sequence: the same ranks with the
bases paid per sequence at T, the report's per-sequence accounting). A windowed head
holds its keys and values whole for min(W + s, T) of T tokens.

Each setting is evaluated with every slot projected to its ranks and its windowed heads
masked; settings alike are evaluated once. The verdict: *verified* when the loss change
at the advised ranks is within the tolerance, else *refuted*, naming the largest measured
ratio that is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...render.compress import setting_name
from .allocation.agreement import agreement, change_se
from .allocation.choices import (
    Setting,
    choices_summary,
    layer_choices,
    setting_bytes,
    window_candidates,
)
from .allocation.sensitivity import sensitivity
from .allocation.settings import COST_MODEL, SHARED, settings
from .bases.calibrate import Calibration
from .bases.lowrank import Slot, cache_bytes, full_ranks, projectors, retained_energy
from .bases.windows import MIN_KEPT, SINKS, classes, window_grid
from .options import MIN_COMPRESSION, CompressOptions
from .target.protocol import Target

__all__ = ["COST_MODEL", "bases_used", "extras", "measure", "verdict"]


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


def full_row(target: Target, nbytes: int, T: int, baseline: dict) -> dict:
    """The row of the full cache: ratio 1, every width kept, the model's own evaluation."""
    full = cache_bytes(target.slots, full_ranks(target.slots), nbytes, T)
    return {"allocation": "full", "target": None, "ratio": 1.0, "ratio_per_sequence": 1.0,
            "cost_model": COST_MODEL,
            "bytes_per_token": full["full_bytes_per_token"],
            "code_bytes_per_token": full["full_bytes_per_token"], "basis_bytes": 0,
            "ranks": ranks_by_kind(target.slots, full_ranks(target.slots)),
            "ranks_summary": "full", "retained_energy": 1.0, "bases": None, "delta_loss": 0.0,
            "predicted_delta_loss": 0.0, "choices": None, "choices_summary": "full",
            "windows": [], "check": None,
            **{k: v for k, v in baseline.items() if k not in ("tokens", "per_sequence")},
            **({"delta_accuracy": 0.0} if "accuracy" in baseline else {})}


def make_row(target: Target, cal: Calibration, alloc: str, goal, setting: Setting, nbytes: int,
             T: int, metrics: dict, baseline: dict, predicted: float | None = None,
             check: dict | None = None) -> dict:
    ranks = setting.ranks
    size = setting_bytes(target.slots, setting, nbytes, T, SHARED)
    per_sequence = setting_bytes(target.slots, setting, nbytes, T)["ratio"]
    kept = [x for s in target.slots for x in retained_energy(cal.energy[s.key], ranks[s.key])]
    by_kind = ranks_by_kind(target.slots, ranks)
    per_layer = layer_choices(target.slots, setting)
    row = {"allocation": alloc, "target": goal, "ratio": size["ratio"],
           "ratio_per_sequence": per_sequence, "cost_model": COST_MODEL,
           "bytes_per_token": size["bytes_per_token"],
           "code_bytes_per_token": size["code_bytes_per_token"],
           "basis_bytes": size["basis_bytes"], "ranks": by_kind,
           "ranks_per_layer": {k: [sum(ly) / len(ly) for ly in v] for k, v in by_kind.items()},
           "ranks_summary": ranks_summary(by_kind),
           "retained_energy": sum(kept) / len(kept), "bases": bases_used(target.slots, cal),
           "choices": per_layer, "choices_summary": choices_summary(per_layer),
           "windows": [{"layer": layer, "kv_head": g, "window": W, "sinks": s}
                       for (layer, g), (W, s) in sorted(setting.windows.items())],
           "predicted_delta_loss": predicted, "check": check,
           "loss": metrics["loss"], "delta_loss": metrics["loss"] - baseline["loss"],
           "delta_loss_se": change_se(metrics, baseline)}
    for name in ("accuracy", "perplexity"):
        if name in metrics:
            row[name] = metrics[name]
    if "accuracy" in metrics:
        row["delta_accuracy"] = metrics["accuracy"] - baseline["accuracy"]
    return row


def _grid(target: Target, cal: Calibration, options: CompressOptions, T: int) -> tuple[int, ...]:
    """The windows tried (bases/windows.py window_grid), where mixed is asked and the target
    has layers that take one."""
    if "mixed" not in options.allocations or not target.window_layers:
        return ()
    return window_grid(int(cal.data.shape[1]), T)


def measure(target: Target, cal: Calibration, evaluate: Callable[[], dict],
            options: CompressOptions, T: int, prediction: dict | None, notes: list[str],
            progress: Callable[[str], None] | None = None) -> tuple[list[dict], dict, dict]:
    """(rows: the full cache first, then each setting; the ranks of each row by index;
    the full model's evaluation). The sensitivity pass's result is kept in
    cal.sensitivity, the windows tried in cal.grid (for extras)."""
    nbytes = options.nbytes
    began = time.perf_counter()
    baseline = evaluate()
    rows = [full_row(target, nbytes, T, baseline)]
    chosen = {0: None}
    cal.grid = _grid(target, cal, options, T)
    cal.sensitivity = sensitivity(target, cal, cal.batch_size, cal.grid)
    if progress is not None:
        progress(f"sensitivity pass · {cal.sensitivity.seconds:.1f} s")
    todo = settings(target, cal, cal.sensitivity, options, T, prediction, notes, cal.grid,
                    progress)
    seen: dict[tuple, dict] = {}
    for n, (alloc, goal, setting, check) in enumerate(todo, 1):
        signature = setting.signature()
        if signature not in seen:
            P = {key: projectors(cal.bases[key], setting.ranks[key], cal.encoders.get(key))
                 for key in setting.ranks}
            with target.projected(P, setting.windows):
                seen[signature] = evaluate()
        predicted = cal.sensitivity.predict(setting.ranks, setting.windows)
        rows.append(make_row(target, cal, alloc, goal, setting, nbytes, T, seen[signature],
                             baseline, predicted, check))
        chosen[len(rows) - 1] = setting.ranks
        if progress is not None:
            progress(f"{n}/{len(todo)} settings measured · {time.perf_counter() - began:.1f} s")
    return rows, chosen, baseline


def extras(rows: list[dict], cal: Calibration) -> dict:
    """The document's "sensitivity" (what was predicted, how), "windows" (the candidates
    per KV head, from the head statistics) and "agreement" (allocation/agreement.py)."""
    sens = getattr(cal, "sensitivity", None)
    return {"sensitivity": None if sens is None else sens.summary(),
            "windows": None if sens is None else _windows_tried(sens, cal),
            "agreement": agreement(rows)}


def _windows_tried(sens, cal: Calibration) -> dict | None:
    """Per window layer and KV head: its query heads' classes, the share each window
    keeps, and the windows offered."""
    grid = getattr(cal, "grid", ())
    if not grid:
        return None
    layers = []
    for layer, kept in sorted(sens.kept.items()):
        H = len(next(iter(kept.values())))
        G = len(sens.window_losses(layer, grid[0])) if (layer, grid[0]) in sens.windows else 1
        n = H // G
        heads_classes = classes(sens.stats[layer])
        layers.append({"layer": layer, "kv_heads": [
            {"classes": heads_classes[g * n:(g + 1) * n],
             "first_token_mass": sens.stats[layer]["first_token_mass"][g * n:(g + 1) * n],
             "diagonal_mass": sens.stats[layer]["diagonal_mass"][g * n:(g + 1) * n],
             "kept": {str(W): float(share[g * n:(g + 1) * n].mean()) for W, share in kept.items()},
             "candidates": window_candidates(sens, layer, g, n, grid)} for g in range(G)]})
    return {"grid": list(grid), "sinks": SINKS, "min_kept": MIN_KEPT, "layers": layers}


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
