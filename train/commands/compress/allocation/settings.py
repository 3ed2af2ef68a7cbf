"""The settings compress measures: per target ratio one per allocation, checked on calibration.

    todo = settings(target, cal, sens, options, T, prediction, notes, grid)
    # [(allocation, target ratio or eps, Setting, check or None)], the advice first

Allocations (each a function of the target ratio, in ALLOCATE):
  uniform        one r for every head and slot (bases/lowrank.py uniform_ranks)
  greedy         from r = 1 up by each head's share of its own gain per byte (bases/lowrank.py)
  greedy-scaled  the same on the output-aware gains as they are (one scale)
  sensitivity    ranks of least summed predicted loss (choices.py), from uniform up
  mixed          per KV head full, low rank or a window + sinks (choices.py), from uniform

sensitivity and mixed predict; the prediction is second order (sensitivity.py) and can be
wrong where a perturbation is large, so each is then checked on the calibration data: the
candidate and the uniform ranks are both evaluated there (the loss the model is measured
by, on tokens the evaluation never sees) and the better kept. A setting so chosen is never
worse than uniform on calibration data, and is measured on the evaluation data like the
rest; its row says which won.
"""

from __future__ import annotations

from collections.abc import Callable

from budgets.cache import CostModel

from ..bases.lowrank import cache_bytes, eps_ranks, greedy_ranks, projectors, uniform_ranks
from ..options import CompressOptions
from ..target.protocol import Target
from .choices import Setting, mixed_setting, sensitivity_setting

COST_MODEL = CostModel.SHARED  # the bases are weights (../measure.py)
SHARED = COST_MODEL == CostModel.SHARED  # lowrank's flag for it
CHECKED = ("sensitivity", "mixed")  # allocations kept only when calibration agrees


def _ranks(ranks: dict | None) -> Setting | None:
    return None if ranks is None else Setting(ranks)


def _uniform(target, cal, sens, ratio, nbytes, T, grid):
    return _ranks(uniform_ranks(target.slots, ratio, nbytes, T, SHARED))


def _greedy(target, cal, sens, ratio, nbytes, T, grid):
    return _ranks(greedy_ranks(target.slots, cal.energy, ratio, nbytes, T, SHARED, shares=True))


def _greedy_scaled(target, cal, sens, ratio, nbytes, T, grid):
    return _ranks(greedy_ranks(target.slots, cal.energy, ratio, nbytes, T, SHARED,
                               shares=False))


def _sensitivity(target, cal, sens, ratio, nbytes, T, grid):
    return sensitivity_setting(target.slots, sens, ratio, nbytes, T, SHARED)


def _mixed(target, cal, sens, ratio, nbytes, T, grid):
    return mixed_setting(target, sens, ratio, nbytes, T, grid)


# allocation -> its Setting for a target ratio (None: out of reach)
ALLOCATE = {"uniform": _uniform, "greedy": _greedy, "greedy-scaled": _greedy_scaled,
            "sensitivity": _sensitivity, "mixed": _mixed}


def calibration_loss(target: Target, cal, setting: Setting) -> float:
    """The loss on the calibration tokens (their labels) with the setting applied."""
    P = {key: projectors(cal.bases[key], setting.ranks[key], cal.encoders.get(key))
         for key in setting.ranks}
    with target.projected(P, setting.windows):
        return target.evaluate(cal.data, cal.labels, cal.batch_size)["loss"]


class Checker:
    """The calibration check of a candidate against the uniform ranks, each setting's
    calibration loss computed once."""

    def __init__(self, target, cal):
        self.target, self.cal, self.seen = target, cal, {}

    def loss(self, setting: Setting) -> float:
        key = setting.signature()
        if key not in self.seen:
            self.seen[key] = calibration_loss(self.target, self.cal, setting)
        return self.seen[key]

    def __call__(self, alloc: str, candidate: Setting, uniform: Setting
                 ) -> tuple[Setting, dict]:
        mine, theirs = self.loss(candidate), self.loss(uniform)
        kept = alloc if mine <= theirs else "uniform"
        return (candidate if kept == alloc else uniform,
                {"calibration_loss": mine, "uniform_calibration_loss": theirs, "kept": kept})


def settings(target: Target, cal, sens, options: CompressOptions, T: int, prediction: dict | None,
             notes: list[str], grid: tuple[int, ...] = (),
             progress: Callable[[str], None] | None = None) -> list[tuple]:
    """(allocation, target ratio or eps, Setting, check) to evaluate: the report's advice
    first; check: the calibration check of sensitivity and mixed (None for the rest)."""
    out = []
    if prediction is not None:
        out.append(("advised", None, Setting(prediction["ranks"]), None))
    nbytes, slots = options.nbytes, target.slots
    allocations = _usable(list(options.allocations), target, cal, notes)
    check = Checker(target, cal)
    for ratio in options.ratios:
        uniform = _uniform(target, cal, sens, ratio, nbytes, T, grid)
        for alloc in allocations:
            setting = ALLOCATE[alloc](target, cal, sens, ratio, nbytes, T, grid)
            if setting is None:
                floor = cache_bytes(slots, {s.key: [1] * s.heads for s in slots}, nbytes, T,
                                    SHARED)
                notes.append(f"{alloc} {ratio:g}x: out of reach: at r = 1 everywhere the cache "
                             f"is {floor['ratio']:.2f}x smaller")
                continue
            checked = None
            if alloc in CHECKED:
                if progress is not None:
                    progress(f"{alloc} {ratio:g}x: checked against uniform on calibration")
                setting, checked = check(alloc, setting, uniform)
            out.append((alloc, ratio, setting, checked))
    for eps in options.eps:
        out.append(("eps", eps, Setting(eps_ranks(cal.stats, eps)), None))
    return out


def _usable(allocations: list[str], target: Target, cal, notes: list[str]) -> list[str]:
    """The allocations asked that apply to this target (each left out says why)."""
    if "greedy-scaled" in allocations and not cal.one_scale:
        allocations.remove("greedy-scaled")
        notes.append("greedy-scaled: left out: its gains are not on one scale here (energy "
                     "bases, a recurrent state or MoE's shared KV head)")
    if "mixed" in allocations and not target.caches_kv:
        allocations.remove("mixed")
        notes.append(f"mixed: left out: its choices are per KV head, and {target.family} "
                     f"caches no keys and values (sensitivity ranks its slots alone)")
    return allocations
