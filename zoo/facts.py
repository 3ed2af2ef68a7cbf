"""What the rest of rankzoo needs to know about a block family, declared by the family itself.

    SoftmaxAttention.facts.sizing.knob      -> "n_kv_heads"   (what pick sizes)
    SSM.facts.cache                         -> "state"        (what compress projects)
    SSM.facts.checks[0].kwargs(5)           -> {"block": "ssm", "d_state": 5}
    SlidingWindowAttention.facts.mirrors    -> ("sliding",)   (the HF layer kinds it mirrors)

Each block module sets `facts = Facts(...)` on its class, beside its math and its budget, so
that a new block is one module and one registry row: pick, `rankzoo blocks`, matching,
compress, the advice checks and the Hugging Face per-kind table all read this declaration
(tests/zoo/test_contract.py checks that every registered block makes it whole).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# a knob's values, ascending, from (block kwargs, d_model, seq_len); values the block's
# config rejects (an odd MoE head_dim under RoPE, kv_lora_rank > d_model) are skipped
# where they are tried
Values = Callable[[dict, int, int], Iterable[int]]

# what a block keeps for decoding, as compress projects it: keys and values per KV head,
# a latent per token (MLA), or a fixed-size recurrent state (linear attention, SSMs)
CACHE_KINDS = ("kv", "latent", "state")
# the layer kinds of a Hugging Face report's per-kind table (budgets/report/kinds.py
# mirror_kind); delta: Gated DeltaNet's and KDA's layers (their math: budgets/mixing/delta.py);
# chunked: Llama 4's chunked attention; dsa: an indexer's top-k (DeepSeek V3.2, GLM-5)
HF_KINDS = ("global", "sliding", "chunked", "ssm", "delta", "dsa")


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt n): n_heads may be as large as d_model."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True)
class Sizing:
    """How pick sizes the family: the knob and its values (ascending; costs never shrink
    along them), its symbol and what the symbols mean, the resolved knobs of a built
    block's config as a table cell, and, where it is another knob, the one that sizes the
    cache (MoE: top_k sets the FLOPs, head_dim the cache)."""

    knob: str
    values: Values
    symbol: str
    legend: str
    describe: Callable[[Any], str]
    state: tuple[str, Values] | None = None

    @property
    def state_knob(self) -> tuple[str, Values]:
        """(knob, values) that size the cache: what match.state sizes to equal cache."""
        return self.state if self.state is not None else (self.knob, self.values)


@dataclass(frozen=True)
class Check:
    """An advice the report may give that training this block checks: the advice kind,
    the check variant's name suffix and its block knobs for the advised state n, and how
    the check's verdict names the block."""

    advice: str  # e.g. "cheaper_block" (budgets/advice/annotate.py)
    suffix: str  # "ssm_n{n}": the check variant is "<variant>.ssm_n5"
    kwargs: Callable[[int], dict[str, Any]]  # n -> {"block": ..., knobs}
    text: str  # "an SSM with N = {n}"


@dataclass(frozen=True)
class Facts:
    """A family's declaration: sizing, cache kind, the report row its cache's measured
    rank is read from, the advice it checks, and the HF layer kinds whose caps it
    declares (a window layer declares what sliding_window declares)."""

    sizing: Sizing
    cache: str  # one of CACHE_KINDS
    state_row: str | None = None  # e.g. "inference.state"; None: the KV advice's ranks
    checks: tuple[Check, ...] = ()
    mirrors: tuple[str, ...] = ()  # of HF_KINDS

    def __post_init__(self):
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"Facts.cache must be one of {CACHE_KINDS}, got {self.cache!r}")
        bad = [k for k in self.mirrors if k not in HF_KINDS]
        if bad:
            raise ValueError(f"Facts.mirrors: unknown layer kinds {bad} (known: {HF_KINDS})")
