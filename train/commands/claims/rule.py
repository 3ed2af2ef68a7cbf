"""What a claim is, what its test returns, and the noise rules every claim shares.

A claim is fixed before any run: its sentence, its source, the quantity it names, how
that is measured, and the verdict rule with its thresholds (`thresholds`, printed in the
JSON document and in docs/CLAIMS.md). `judge(evidence)` applies the rule to what the
evidence holds and returns an Outcome; it never tunes a threshold to what it sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HOLDS, REFUTED, PARTLY, UNTESTABLE = "holds", "refuted", "holds partly", "not testable as stated"
VERDICTS = (HOLDS, REFUTED, PARTLY, UNTESTABLE)
NO_EVIDENCE = "no evidence"  # the claim's evidence was not given (no runs, no --hf)


@dataclass(frozen=True)
class Outcome:
    """A claim's verdict on the evidence given, and what it rests on."""

    verdict: str  # one of VERDICTS, or NO_EVIDENCE
    figure: str  # the figure the verdict rests on, in one line
    test: str  # what was compared with what, in one line
    why: str = ""  # the conditions of `holds partly`, what is ill-defined, the noise
    used: str = ""  # the evidence used: models, layers, heads, seeds
    plot: dict[str, Any] = field(default_factory=dict)  # the series its figure draws
    data: dict[str, Any] = field(default_factory=dict)  # the figures, for programs

    def __post_init__(self) -> None:
        if self.verdict not in (*VERDICTS, NO_EVIDENCE):
            raise ValueError(f"verdict must be one of {[*VERDICTS, NO_EVIDENCE]}, "
                             f"got {self.verdict!r}")


@dataclass(frozen=True)
class Claim:
    """One claim of the low-rank-bottleneck theory, as a test (one module each)."""

    name: str  # the registry key, e.g. "optimizers"
    sentence: str  # the claim in one sentence, in our words
    source: str  # where it comes from
    quantity: str  # what it names, and how rankzoo measures it
    metrics: str  # the docs/METRICS.md section that defines the measure
    rule: str  # the verdict rule in words, with its thresholds
    thresholds: dict[str, Any]  # the rule's numbers, fixed before any run
    evidence: tuple[str, ...]  # which evidence it reads: "runs", "hf", "constructed"
    judge: Callable[[Any], Outcome]  # Evidence -> Outcome

    def __post_init__(self) -> None:
        unknown = set(self.evidence) - {"runs", "hf", "constructed"}
        if unknown:
            raise ValueError(f"claim {self.name!r}: unknown evidence {sorted(unknown)}")


def missing(what: str) -> Outcome:
    """The verdict of a claim whose evidence was not given."""
    return Outcome(NO_EVIDENCE, "-", f"needs {what}")


# ---------------------------------------------------------------- noise across seeds

def spread(values: list[float]) -> float:
    """Seed-to-seed spread of a figure: its range (0 for one seed)."""
    return max(values) - min(values) if values else 0.0


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def within_noise(a: list[float], b: list[float]) -> bool:
    """Whether the difference of two figures' seed means is within their seeds' spread
    (the sum of both ranges): with one seed each, no difference is called noise, and the
    verdict says that one seed was all there was."""
    return abs(mean(a) - mean(b)) <= spread(a) + spread(b)


def in_band(x: float, band: tuple[float, float]) -> bool:
    return band[0] <= x <= band[1]


def fmt(x: float) -> str:
    """A figure for a table: 3 significant digits."""
    return f"{x:.3g}"
