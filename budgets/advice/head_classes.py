"""Head classes: what each attention head does, from the probe's per-head figures.

    classify_heads(layer["heads"], HeadRules())   # adds "class", "centered_ok", "summary"

The figures (the probe's `heads`, docs/METRICS.md) are per head: first_token_mass (mean
attention on token 0 over queries t >= 1), diagonal_mass (mean attention on the query and
its two predecessors), centered_energy (||P - 1 mean_rows(P)||_F^2 / ||P||_F^2) and the raw
mixing erank. The first rule that matches names the class:

  sink    first_token_mass > sink_mass (0.5): the head parks its attention on token 0
  dead    centered_energy < dead_energy (1e-3): every query reads nearly the same mix, so
          the head adds a constant to every token
  local   diagonal_mass > local_mass (0.5): the head reads the last few tokens
  rank-1  raw erank < rank1_erank (1.5): one direction carries the whole matrix
  broad   none of the above

sink is tested before dead because the two coincide on a causal softmax: row 0 of P is
always e_0, so rows that are all nearly the same are all nearly e_0, which is a sink; a
head forced onto token 0 is reported as the sink it is. Where the centered energy is below
dead_energy the centered matrix is rounding noise (its sigma_1 ~1e-4 of the raw one; fp32
and fp64 disagree), so the head's centered metrics are "not applicable": centered_ok is
false and layer averages of centered figures leave the head out. A figure the probe could
not measure (None: matrix-free mode) matches no rule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

HEAD_CLASSES = ("sink", "dead", "local", "rank-1", "broad")  # in rule order
PLURAL = {"sink": "sinks", "dead": "dead", "local": "local", "rank-1": "rank-1",
          "broad": "broad"}


@dataclass(frozen=True)
class HeadRules:
    sink_mass: float = 0.5      # first_token_mass above this: sink
    dead_energy: float = 1e-3   # centered_energy below this: dead, centered metrics n/a
    local_mass: float = 0.5     # diagonal_mass above this: local
    rank1_erank: float = 1.5    # raw erank below this: rank-1

    def __post_init__(self) -> None:
        for name in ("sink_mass", "dead_energy", "local_mass"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"HeadRules.{name} must lie in (0, 1), got {value}")
        if self.rank1_erank < 1.0:
            raise ValueError(f"HeadRules.rank1_erank must be >= 1 (erank is never below 1), "
                             f"got {self.rank1_erank}")

    def text(self) -> str:
        """The rules in words, for report["head_rules"] and the legends drawn from it."""
        return (f"first rule that matches: sink (attention on token 0 > {self.sink_mass:g}, "
                f"mean over queries t >= 1), dead (centered energy < {self.dead_energy:g} of "
                f"raw: every query reads the same mix), local (attention on the query and "
                f"its 2 predecessors > {self.local_mass:g}), rank-1 (raw erank < "
                f"{self.rank1_erank:g}), else broad; centered metrics are n/a for heads with "
                f"centered energy < {self.dead_energy:g} of raw")


def _above(x: float | None, bound: float) -> bool:
    return x is not None and x > bound


def _below(x: float | None, bound: float) -> bool:
    return x is not None and x < bound


def classify_head(first_token: float | None, diagonal: float | None, energy: float | None,
                  raw_erank: float | None, rules: HeadRules) -> str:
    """One head's class (module docstring); None figures match no rule."""
    if _above(first_token, rules.sink_mass):
        return "sink"
    if _below(energy, rules.dead_energy):
        return "dead"
    if _above(diagonal, rules.local_mass):
        return "local"
    if _below(raw_erank, rules.rank1_erank):
        return "rank-1"
    return "broad"


def summary(classes: list[str]) -> str:
    """'7 of 9 heads are sinks, 1 local, 1 broad': the commonest class first."""
    if not classes:
        return "no heads"
    counts = Counter(classes).most_common()  # ties keep first-seen order
    (top, n), rest = counts[0], counts[1:]
    verb = "are" if n > 1 else "is"
    name = PLURAL[top] if n > 1 else ("a sink" if top == "sink" else top)
    head = f"{n} of {len(classes)} heads {verb} {name}"
    return ", ".join([head, *(f"{k} {PLURAL[c] if k > 1 else c}" for c, k in rest)])


def _column(heads: dict, key: str, n: int) -> list:
    values = heads.get(key)
    return list(values) if values is not None else [None] * n


def classify_heads(heads: dict, rules: HeadRules) -> dict:
    """Add "class", "centered_ok" and "summary" to a report layer's `heads` (in place)."""
    n = len(heads["first_token_mass"])
    columns = [_column(heads, k, n) for k in ("first_token_mass", "diagonal_mass",
                                               "centered_energy", "raw_erank")]
    heads["class"] = [classify_head(*figs, rules) for figs in zip(*columns, strict=True)]
    heads["centered_ok"] = [not _below(e, rules.dead_energy) for e in columns[2]]
    heads["summary"] = summary(heads["class"])
    return heads
