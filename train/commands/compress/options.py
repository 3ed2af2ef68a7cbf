"""What `rankzoo compress` measures: its options, their defaults, and the choice of keys.

    options = CompressOptions(ratios=(1.5, 2), eps=(0.1,), keys="pre-rope")
    options.nbytes                      # bytes per cached element at options.cache_dtype
    resolve_keys("auto", rope=True, what="the model") -> Keys.PRE_ROPE

Errors name the parameter (the CLI, train/cli/__init__.py, shows them as its flags).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from budgets.advice.verdicts import VerdictThresholds
from budgets.cache import Keys, dtype_bytes

from ...sizing.units import DTYPE_LONG, dtype_name

SCHEMA = "rankzoo.compress"
SCHEMA_VERSION = 1
KEYS = ("auto", *(keys.value for keys in Keys))  # --keys: auto, pre-rope, post-rope
# allocation/settings.py ALLOCATE; sensitivity is the default allocation
ALLOCATIONS = ("uniform", "greedy", "greedy-scaled", "sensitivity", "mixed")
DEFAULT_ALLOCATIONS = ("uniform", "sensitivity", "mixed")
BASES = ("output", "energy")  # output-aware (weighted by the reader) or by energy alone
DEFAULT_RATIOS = (1.5, 2.0, 4.0, 8.0)
DEFAULT_TOLERANCE = 0.02  # nats per token: exp(0.02) = 2% perplexity
MIN_COMPRESSION = VerdictThresholds().min_compression  # the report's per-layer advice floor
ZOO_CALIBRATION = 64  # sequences of the training split
HEAL_OBJECTIVES = ("distill", "lm")  # --heal-loss: heal.py HEAL_LOSSES


def cache_dtype(text: str) -> str:
    """A cache dtype as budgets/advice/verdicts.py names it (bf16 and bfloat16 -> bfloat16), parsed
    as `rankzoo pick` parses it."""
    return DTYPE_LONG[dtype_name(text)]


@dataclass(frozen=True)
class CompressOptions:
    """What to measure; errors name the parameter (the CLI shows them as its flags)."""

    ratios: tuple[float, ...] = DEFAULT_RATIOS
    eps: tuple[float, ...] = ()
    allocations: tuple[str, ...] = DEFAULT_ALLOCATIONS
    keys: str = "auto"  # pre-rope (RoPE models' default), post-rope (the cached keys)
    bases: str = "output"  # output: errors weighted as the reader sees them; energy
    cache_dtype: str = "bfloat16"
    length: int | None = None  # T the bases are amortized at; None: the report's probe T
    tolerance: float = DEFAULT_TOLERANCE  # on the eval loss change, nats per token
    advice_eps: float = 0.1  # HF: the eps of the report whose advice is checked
    calib_size: int | None = None  # calibration sequences (zoo: 64; HF: 4)
    eval_size: int | None = None  # evaluation sequences (zoo: the validation split; HF: 4)
    overlap: bool = False  # let calibration and evaluation share data
    batch_size: int | None = None  # sequences per forward pass (zoo: the run's; HF: 1)
    save: str | None = None  # write the compressed model here (a new or empty directory)
    heal: int | None = None  # tokens to heal a setting for (heal.py)
    heal_at: float | None = None  # the target ratio healed; None: the largest of ratios
    heal_loss: str = "distill"  # distill (against the full model's logits) or lm

    def __post_init__(self) -> None:
        self._check_targets()
        unknown = set(self.allocations) - set(ALLOCATIONS)
        if unknown or not self.allocations:
            raise ValueError(f"alloc={','.join(self.allocations)}: expected a list of "
                             f"{', '.join(ALLOCATIONS)}")
        if self.keys not in KEYS:
            raise ValueError(f"keys={self.keys}: one of {', '.join(KEYS)}")
        if self.bases not in BASES:
            raise ValueError(f"bases={self.bases}: one of {', '.join(BASES)}")
        cache_dtype(self.cache_dtype)
        if not 0 <= self.tolerance < math.inf:  # inf: no JSON number, and no test at all
            raise ValueError(f"tolerance={self.tolerance:g}: expected a finite number >= 0")
        self._check_heal()
        for name in ("length", "calib_size", "eval_size", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: expected a positive int")

    def _check_targets(self) -> None:
        """The ratios and eps to measure at, and the eps of the advice checked."""
        for r in self.ratios:
            if not 1.0 < r < math.inf:
                raise ValueError(f"ratios={','.join(f'{x:g}' for x in self.ratios)}: each "
                                 f"ratio must be > 1 and finite (a cache that many times smaller "
                                 f"than the full one), got {r:g}")
        for e in self.eps:
            if not 0.0 < e < 1.0:
                raise ValueError(f"eps={','.join(f'{x:g}' for x in self.eps)}: each eps must "
                                 f"lie in (0, 1), got {e:g}")
        if not 0.0 < self.advice_eps < 1.0:
            raise ValueError(f"advice_eps={self.advice_eps:g}: expected 0 < eps < 1")
        if not self.ratios and not self.eps:
            raise ValueError("ratios= and eps= are both empty: nothing to measure")

    def _check_heal(self) -> None:
        if self.heal_loss not in HEAL_OBJECTIVES:
            raise ValueError(f"heal_loss={self.heal_loss}: one of {', '.join(HEAL_OBJECTIVES)}")
        if self.heal is None:
            if self.heal_at is not None or self.heal_loss != "distill":
                raise ValueError("heal_at= and heal_loss= only apply with heal=TOKENS")
            return
        if self.heal < 1:
            raise ValueError(f"heal={self.heal}: expected a positive number of tokens")
        if self.heal_at is not None and self.heal_at not in self.ratios:
            raise ValueError(f"heal_at={self.heal_at:g}: not among ratios="
                             f"{','.join(f'{x:g}' for x in self.ratios)} (the setting healed "
                             f"is one measured)")
        if self.heal_at is None and not self.ratios:
            raise ValueError("heal= needs a target ratio to heal (ratios= is empty)")

    @property
    def nbytes(self) -> int:
        return dtype_bytes(cache_dtype(self.cache_dtype))


def resolve_keys(keys: str, rope: bool, what: str) -> Keys:
    """Which keys get a basis (auto: before RoPE where there is RoPE; a model without
    RoPE caches its keys as computed, called post-rope here)."""
    if keys == "auto":
        return Keys.PRE_ROPE if rope else Keys.POST_ROPE
    if keys == Keys.PRE_ROPE and not rope:
        raise ValueError(f"keys=pre-rope: {what} has no RoPE, so there are no keys before "
                         f"RoPE: its cache holds the keys as computed (keys=auto)")
    return Keys(keys)
