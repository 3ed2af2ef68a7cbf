"""The sparse family's config (zoo/sparse.py's block): its knobs, their validation, and how a
config reads as text (`describe`: pick's and `rankzoo blocks`' knob cell) and what of it
cannot bite at a length (`covering`: the budget's notes). Selections:

    token   DSA's indexer (top_k keys)        block   NSA's and MoBA's block means
    slots   CSA's top_k compressed slots      none    HCA's every complete slot

slots and none have no selected branch: they cache no token's keys beyond the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from budgets.mixing.sparse import SparseShape, selection_covers

from .config import StrictConfig, positive_int, require
from .ops.sparse import SPARSE

SELECTIONS = {"token": "DSA's indexer", "block": "NSA's and MoBA's block means",
              "slots": "CSA's top-k compressed slots", "none": "HCA's every complete slot"}
COMPRESSED_ONLY = ("slots", "none")  # no selected branch: nothing cached grows as T
POOLINGS = ("none", "mean", "gated")
GATES = ("none", "sigmoid")


@dataclass(frozen=True)
class SparseConfig(StrictConfig):
    owner: ClassVar[str] = "sparse"

    d_model: int
    n_heads: int
    n_kv_heads: int | None = 1  # G; 1 as DSA's MQA; None: MHA
    head_dim: int | None = None  # K = V; None: d_model // n_heads
    selection: str = "token"  # token (DSA) | block (NSA, MoBA) | slots (CSA) | none (HCA)
    top_k: int = 64  # keys (token), blocks (block) or slots (slots) each query attends to
    block_size: int = 64  # tokens per block of the block selection
    index_heads: int = 4  # I, the indexer's heads (token selection)
    index_dim: int | None = None  # d_I, its width (None: K); cached, d_I per token
    compress: str = "none"  # none | mean | gated: the compressed branch's pooling
    rate: int = 16  # tokens per compressed slot
    local_window: int | None = None  # W: a window branch of the last W keys; None: none
    gate: str = "none"  # none (the selection alone) | sigmoid (NSA's per-head branch gates)
    indexer_loss_weight: float = 1.0  # the indexer's KL loss (it trains nothing else)
    dense_warmup: int = 0  # training steps attending to every causal key (DSA's warm-up)
    chunk_size: int = 128  # queries per chunk of the selection and the gathered path
    rope: bool = True
    rope_base: float = 10000.0
    backend: str = "auto"

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads, top_k=self.top_k,
                     block_size=self.block_size, index_heads=self.index_heads,
                     rate=self.rate, chunk_size=self.chunk_size)
        if self.head_dim is None:
            require(self.d_model % self.n_heads == 0,
                    f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        else:
            positive_int(self.owner, head_dim=self.head_dim)
        if self.n_kv_heads is not None:
            positive_int(self.owner, n_kv_heads=self.n_kv_heads)
            require(self.n_heads % self.n_kv_heads == 0,
                    f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        for name in ("index_dim", "local_window"):
            if getattr(self, name) is not None:
                positive_int(self.owner, **{name: getattr(self, name)})
        require(self.selection in SELECTIONS,
                f"selection {self.selection!r} unknown; known: {list(SELECTIONS)}")
        require(self.compress in POOLINGS,
                f"compress {self.compress!r} unknown; known: {list(POOLINGS)}")
        require(self.gate in GATES, f"gate {self.gate!r} unknown; known: {list(GATES)}")
        require(self.selection != "slots" or self.compress != "none",
                "selection 'slots' picks among compressed slots: set compress: mean or gated")
        require(len(self.branches) > 0, "selection 'none' needs a compressed branch or a "
                "local_window: it has no selected branch")
        require(self.gate == "sigmoid" or len(self.branches) == 1,
                f"gate 'none' takes the selection alone, but the branches are "
                f"{list(self.branches)}: set gate: sigmoid to combine them")
        require(self.compress == "none" or self.selection != "block"
                or self.block_size % self.rate == 0,
                f"rate ({self.rate}) must divide block_size ({self.block_size}): the "
                f"compressed slots tile the selection's blocks")
        require(not self.rope or (self.k_dim % 2 == 0 and self.i_dim % 2 == 0),
                f"RoPE needs an even head_dim and index_dim, got {self.k_dim} and "
                f"{self.i_dim}")
        require(self.rope_base > 0, f"rope_base must be positive, got {self.rope_base}")
        require(self.indexer_loss_weight >= 0,
                f"indexer_loss_weight must be >= 0, got {self.indexer_loss_weight}")
        require(isinstance(self.dense_warmup, int) and self.dense_warmup >= 0,
                f"dense_warmup must be an int >= 0, got {self.dense_warmup!r}")
        require(self.dense_warmup == 0 or (self.selection == "token"
                                           and self.indexer_loss_weight > 0),
                f"dense_warmup ({self.dense_warmup}) trains DSA's indexer on every key: it "
                f"needs selection: token and indexer_loss_weight > 0, got selection "
                f"{self.selection!r}, indexer_loss_weight {self.indexer_loss_weight}")
        SPARSE.check(self.backend)

    @property
    def k_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def i_dim(self) -> int:  # d_I
        return self.index_dim or self.k_dim

    @property
    def branches(self) -> tuple[str, ...]:
        """The branches present, in budgets.mixing.sparse.BRANCHES' order."""
        selected = () if self.selection in COMPRESSED_ONLY else ("selected",)
        return (selected + (("compressed",) if self.compress != "none" else ())
                + (("window",) if self.local_window is not None else ()))

    def shape(self) -> SparseShape:
        token = self.selection == "token"
        return SparseShape(self.d_model, self.n_heads, self.kv_heads, self.k_dim,
                           self.selection, self.top_k, self.block_size,
                           self.index_heads if token else 0, self.i_dim if token else 0,
                           None if self.compress == "none" else self.rate,
                           self.compress == "gated", self.local_window)


def covering(c: SparseConfig, seq_len: int) -> list[str]:
    """What does not bite at length T: a top_k (of keys or blocks) or a window that covers
    every causal key there. The forward accepts both; the budget says so. A slot selection
    that keeps every slot is not said: its layer still caches T / rate slots, not T keys
    (and pick sizes the rate through such values)."""
    notes = []
    if c.selection not in COMPRESSED_ONLY and selection_covers(c.shape(), seq_len):
        blocks = f" blocks of {c.block_size}" if c.selection == "block" else ""
        notes.append(f"top_k ({c.top_k}{blocks}) covers seq_len {seq_len}: the selection "
                     "cannot bite, every causal key is attended")
    if c.local_window is not None and c.local_window >= seq_len:
        notes.append(f"local_window ({c.local_window}) covers seq_len {seq_len}: the window "
                     "branch sees every causal key")
    return notes


def describe(c: SparseConfig) -> str:
    """`token k=256, G=1, I=4x64`, `block k=4x64, G=4, gated/16, W=128, sigmoid`; a
    compressed-only layer `r=4, k=512` (slots) or `r=128` (none; `W=128` without slots)."""
    if c.selection == "token":
        out = f"token k={c.top_k}, G={c.kv_heads}, I={c.index_heads}x{c.i_dim}"
    elif c.selection in COMPRESSED_ONLY:  # short: pick's knob cell (W, G: the preset's)
        return ", ".join([f"r={c.rate}"] * (c.compress != "none")
                         + [f"k={c.top_k}"] * (c.selection == "slots")
                         + [f"W={c.local_window}"] * (c.compress == "none"))
    else:
        out = f"block k={c.top_k}x{c.block_size}, G={c.kv_heads}"
    if c.compress != "none":
        out += f", {c.compress}/{c.rate}"
    if c.local_window is not None:
        out += f", W={c.local_window}"
    return out + (", sigmoid" if c.gate == "sigmoid" else "")
