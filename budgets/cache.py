"""A cache's bytes: the dtype table, the full and low-rank formulas, cost models, keys.

    DTYPE_BYTES["bfloat16"] -> 2;  dtype_bytes("float8") -> 1
    full_cache_bytes([K, V] * G, nbytes)                # a full KV cache, bytes per token
    lowrank_cache_bytes((K, V), (r_k, r_v), nbytes, T)  # the same kept at ranks r
    cache_size(per_token, basis, full, T, CostModel.SHARED)
    Keys.PRE_ROPE.field -> "k_pre_rope";  Keys.PRE_ROPE.label -> "keys before RoPE"

The one home of the arithmetic that the report's KV advice (budgets/advice/kv.py) and
`rankzoo compress` (train/commands/compress/bases/lowrank.py) share, so that the bytes the
advice states are the bytes compress measures.

A low-rank cache keeps each cached matrix of width w as r codes per token and a w x r
basis. Two cost models say who pays for the basis: a basis fitted once on calibration
data and shared by every sequence is a weight, paid once per model, and the cache per
token holds the codes alone (CostModel.SHARED, what compress fits); a basis fitted per
sequence is paid once per sequence, amortized over its T tokens (CostModel.PER_SEQUENCE,
the advice of a probe from before pooled ranks). The enums are `str`s: a document holding
one reads as its value in JSON.
"""

from __future__ import annotations

from enum import Enum

# bytes per cached element; a dtype not here is a ValueError naming the known ones
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a cache dtype as DTYPE_BYTES names it (bfloat16, not bf16)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"cache dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


class _Named(str, Enum):
    """A str enum whose str() and format() are its value, on every Python version."""

    def __new__(cls, value: str, *details: str):
        member = str.__new__(cls, value)
        member._value_ = value
        return member

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class CostModel(_Named):
    """Who pays for a low-rank cache's bases (module docstring), with the per-KV-head
    figure of a probe its ranks come from and the sentence the KV advice states it in."""

    SHARED = ("shared_basis", "rank_eps_pooled",
              "one basis per KV head shared by every sequence: a weight paid once per "
              "model, the cache holding the codes alone (what `rankzoo compress` fits and "
              "measures)")
    PER_SEQUENCE = ("per_sequence_basis", "rank_eps_max",
                    "a basis fitted per sequence, paid once per sequence at T (a probe from "
                    "an older rankzoo, without pooled ranks: re-probe for the shared-basis "
                    "advice)")

    def __init__(self, value: str, rank_field: str, text: str):
        self.rank_field = rank_field  # rank_eps_pooled: every sequence stacked
        self.text = text


class Keys(_Named):
    """Which keys of a RoPE model get a basis: before the rotation (the projection's
    output, what low-rank KV methods compress) or after it (what the cache holds; a model
    without RoPE caches its keys as computed, which counts as post-rope). The values are
    `rankzoo compress --keys`' (beside auto); `field` names the keys in a probe's kv_heads."""

    PRE_ROPE = ("pre-rope", "k_pre_rope", "keys before RoPE")
    POST_ROPE = ("post-rope", "k", "keys after RoPE")

    def __init__(self, value: str, field: str, label: str):
        self.field = field
        self.label = label

    @classmethod
    def of_field(cls, field: str) -> Keys:
        """The keys a probe's kv_heads field holds ("k_pre_rope" or "k")."""
        for keys in cls:
            if keys.field == field:
                return keys
        raise ValueError(f"no keys are probed as {field!r}; known: "
                         f"{', '.join(k.field for k in cls)}")

    def label_for(self, rope: bool) -> str:
        """How a document names these keys: their label, or plain `keys` without RoPE."""
        return self.label if rope else "keys"


# a probe field's keys -> their label (documents name their options by probe field)
KEY_LABEL = {keys.field: keys.label for keys in Keys}


def full_cache_bytes(widths, nbytes: int) -> int:
    """Bytes of a full cache per token (or per sequence, for a state's elements): every
    cached matrix's width at nbytes per element."""
    return sum(widths) * nbytes


def lowrank_cache_bytes(widths, ranks, nbytes: int, T: int) -> dict:
    """The one formula of a low-rank cache's bytes (the KV advice, `rankzoo compress`):
    each cached matrix i of width_i kept as r_i codes per token, plus its width_i x r_i
    basis once per sequence, at nbytes per element; amortized over T tokens."""
    per_token = sum(r * nbytes for r in ranks)
    basis = sum(w * r * nbytes for w, r in zip(widths, ranks, strict=True))
    return {"bytes_per_token": per_token, "basis_bytes": basis,
            "bytes_per_token_at_T": per_token + basis / T}


def cache_per_token(codes: float, basis: float, T: int, model: CostModel) -> float:
    """Bytes per token of a low-rank cache under `model`: its codes, plus per sequence
    its bases amortized over T tokens (a shared basis is a weight, not cache)."""
    return codes + (basis / T if model == CostModel.PER_SEQUENCE else 0.0)


def cache_size(per_token: float, basis: float, full: float, T: int, model: CostModel) -> dict:
    """The cache per token under `model` (cache_per_token) and full / that."""
    cache = cache_per_token(per_token, basis, T, model)
    return {"cache_bytes_per_token": cache, "ratio": full / cache if cache else None}
