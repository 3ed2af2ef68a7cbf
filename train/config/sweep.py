"""The `sweep` section: a grid of optimizer x lr x seed that every variant runs at.

    sweep: {optimizer: [adamw, muon], lr: [1.0e-3, 3.0e-3], seed: [0, 1], select: val/loss}

Each grid point of each variant is a run of its own, named by `run_name`
(mha_muon_lr0.003_s1); the selection of the best lr is train/experiment/sweep.py's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.config import StrictConfig, is_instance, require

from .sections import OPTIMIZERS

# The sweep's selection metrics and which way is better.
SELECT_MODES = {"val/loss": "min", "val/accuracy": "max"}
SWEEP_AXES = ("optimizer", "lr", "seed")


@dataclass(frozen=True)
class SweepConfig(StrictConfig):
    """A grid: every variant runs at every listed optimizer x lr x seed (an axis left out
    keeps the train section's value and the experiment's seed). The best lr per variant
    and optimizer is the one with the best `select` averaged over seeds, as Zoology picks
    it; a run whose loss diverges counts as the worst."""

    owner: ClassVar[str] = "sweep"

    optimizer: list | None = None
    lr: list | None = None
    seed: list | None = None
    select: str = "val/loss"  # val/loss (lower is better) or val/accuracy (higher)

    def validate(self) -> None:
        require(self.select in SELECT_MODES, f"sweep.select must be one of "
                                             f"{list(SELECT_MODES)}, got {self.select!r}")
        require(bool(self.axes), f"sweep needs at least one of {list(SWEEP_AXES)} as a list")
        for axis, values in self.axes.items():
            require(bool(values) and len(set(values)) == len(values),
                    f"sweep.{axis} must be a non-empty list without repeats, got {values!r}")
            for value in values:
                check_axis_value(axis, value)

    @property
    def axes(self) -> dict[str, list]:
        """The swept axes, in SWEEP_AXES order."""
        return {a: getattr(self, a) for a in SWEEP_AXES if getattr(self, a) is not None}

    def points(self) -> list[dict[str, Any]]:
        """Every grid point, e.g. {"optimizer": "muon", "lr": 0.003, "seed": 1}."""
        axes = self.axes
        grid = itertools.product(*axes.values())
        return [dict(zip(axes, values, strict=True)) for values in grid]


def check_axis_value(axis: str, value: Any) -> None:
    if axis == "optimizer":
        require(value in OPTIMIZERS,
                f"sweep.optimizer values must be in {list(OPTIMIZERS)}, got {value!r}")
    elif axis == "lr":
        require(is_instance(value, float) and value > 0,
                f"sweep.lr values must be numbers > 0, got {value!r}")
    elif axis == "seed":
        require(is_instance(value, int) and value >= 0,
                f"sweep.seed values must be non-negative ints, got {value!r}")


def run_name(variant: str, point: dict[str, Any]) -> str:
    """A sweep run's directory name: mha_muon_lr0.003_s1 (only the swept axes appear)."""
    tags = {"optimizer": str, "lr": lambda v: f"lr{v:g}", "seed": lambda v: f"s{v}"}
    return "_".join([variant, *(tags[a](point[a]) for a in SWEEP_AXES if a in point)])
