"""The `finetune` section: a LoRA stage that adapts pretrained variants to a second task.

    finetune:
      from_variants: [mha, ssm]          # default: every variant
      ranks: [1, 2, 4, 8]                # one fine-tune per r
      alpha: null                        # null: alpha = r, so scaling = 1 at every r
      targets: [v_proj, o_proj, in_proj] # PEFT-like names; per variant, those it has
      data: {task: mqar, permute_seed: 1, ...}   # the second task (a full data section)
      train: {max_steps: 200, lr: 1.0e-2}        # overrides of the experiment's train

The section alone is checked here; train/config/parse.py checks it against the experiment
(variants, vocabulary, targets), and train/experiment/finetune.py runs the stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from zoo.config import StrictConfig, require

from .sections import DataConfig, TrainConfig


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
