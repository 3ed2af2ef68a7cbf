"""The optional stages' sections: a sweep before the variants' reports, a LoRA fine-tune
after them. Each section alone is checked here; train/config/parse.py checks it against
the experiment (variants, vocabulary, targets).

The `sweep` section: a grid of optimizer x lr x seed that every variant runs at.

    sweep: {optimizer: [adamw, muon], lr: [1.0e-3, 3.0e-3], seed: [0, 1], select: val/loss}

Each grid point of each variant is a run of its own, named by `run_name`
(mha_muon_lr0.003_s1); the selection of the best lr is train/experiment/sweep.py's.

The `finetune` section: a LoRA stage that adapts pretrained variants to a second task.

    finetune:
      from_variants: [mha, ssm]          # default: every variant
      ranks: [1, 2, 4, 8]                # one fine-tune per r
      alpha: null                        # null: alpha = r, so scaling = 1 at every r
      targets: [v_proj, o_proj, in_proj] # PEFT-like names; per variant, those it has
      data: {task: mqar, permute_seed: 1, ...}   # the second task (a full data section)
      train: {max_steps: 200, lr: 1.0e-2}        # overrides of the experiment's train

train/experiment/finetune.py runs the fine-tune stage.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from zoo.config import StrictConfig, is_instance, require, seed_value

from .sections import OPTIMIZERS, DataConfig, TrainConfig

# ---------------------------------------------------------------- sweep

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
        require(value < math.inf, f"sweep.lr values must be finite, got {value!r}")
    elif axis == "seed":
        require(is_instance(value, int) and value >= 0,
                f"sweep.seed values must be non-negative ints, got {value!r}")
        seed_value("sweep.seed values", value)


def run_name(variant: str, point: dict[str, Any]) -> str:
    """A sweep run's directory name: mha_muon_lr0.003_s1 (only the swept axes appear)."""
    tags = {"optimizer": str, "lr": lambda v: f"lr{v:g}", "seed": lambda v: f"s{v}"}
    return "_".join([variant, *(tags[a](point[a]) for a in SWEEP_AXES if a in point)])


# ---------------------------------------------------------------- finetune

def lora_name(variant: str, r: int) -> str:
    """The fine-tune's directory name beside its base variant's."""
    return f"{variant}.lora-r{r}"


def positive_ints(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value))


def names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v
                                                           for v in value)


@dataclass(frozen=True)
class FinetuneConfig(StrictConfig):
    """The `finetune` section; built by parse_finetune (train/config/parse.py), which also
    checks it against the experiment (variants, vocabulary, targets)."""

    owner: ClassVar[str] = "finetune"

    data: DataConfig
    from_variants: list | None = None  # None: every variant
    ranks: list = field(default_factory=lambda: [4])
    alpha: float | None = None  # None: alpha = r (scaling 1 for every r of the sweep)
    targets: list = field(default_factory=lambda: ["v_proj"])
    train: dict = field(default_factory=dict)  # overrides of the experiment's train section

    def validate(self) -> None:
        require(positive_ints(self.ranks) and len(set(self.ranks)) == len(self.ranks),
                f"finetune.ranks must be a non-empty list of distinct ints >= 1, "
                f"got {self.ranks!r}")
        # bool is rejected by the type check; an alpha of 0 or below is not
        require(self.alpha is None or self.alpha > 0,
                f"finetune.alpha must be a number > 0 or null, got {self.alpha!r}")
        require(names(self.targets), f"finetune.targets must be a non-empty list of "
                                     f"projection names (e.g. [q_proj, v_proj]), "
                                     f"got {self.targets!r}")
        require(self.from_variants is None or names(self.from_variants),
                f"finetune.from_variants must be a non-empty list of variant names or "
                f"null, got {self.from_variants!r}")

    def alpha_for(self, r: int) -> float:
        return float(r if self.alpha is None else self.alpha)

    def train_config(self, base: TrainConfig) -> TrainConfig:
        return TrainConfig(**{**base.to_dict(), **self.train})

    def to_dict(self) -> dict[str, Any]:
        return {"from_variants": self.from_variants, "ranks": list(self.ranks),
                "alpha": self.alpha, "targets": list(self.targets),
                "data": self.data.to_dict(), "train": dict(self.train)}


FINETUNE_KEYS = [f.name for f in dataclasses.fields(FinetuneConfig)]
