"""Sparse attention (DSA's top-k, NSA's and MoBA's blocks, compressed slots, a window): one
signature, two backends.

    fn(q, k, v, idx, valid, *, scale, offset=0, gates=None, window=None, slots=None,
       rate=None, chunk_size=128, key_offset=0, slot_mask=None) -> (o, chosen)
        q [B, H, Tq, K] at positions offset .. offset + Tq - 1; k [B, G, Tk, K] and v
        [B, G, Tk, V] the keys at positions key_offset .. offset + Tq - 1 (every key so
        far; a compressed-only layer's window: the last W - 1 and the new); idx [B, G, Tq,
        n] the selected keys (distinct per row) and valid [B, G, Tq, n] which of them count
        (None: no selected branch); gates [B, H, Tq, n_branches] or None (ones); window W
        or None; slots (keys [B, G, S, K], values [B, G, S, V]) of `rate` tokens each, or
        None; slot_mask [B, G, Tq, S] the slots each query may read (None: all complete)
        ->  o [B, H, Tq, V], chosen [B, H, Tq, n] the selected branch's attention at idx
            (None without a selected branch)

The branches and their mixing matrix are budgets/mixing/sparse.py's. The selection itself
(which keys, by the indexer or by block means) is the block's (zoo/sparse.py, with
zoo/ops/sparse/select.py): both backends take the same indices.

Backends: `gathered` (chunks of queries, the selected keys gathered: cost T x n, not
T x T; the CPU and CUDA path) and `reference` (every branch materialized with masks). Both
compute in fp32 for 16-bit inputs.
"""

from ..registry import Backend, OpRegistry, always_available
from .gathered import gathered_sparse
from .reference import reference_sparse
from .spec import SparseSpec

SPARSE = OpRegistry("sparse", preference={
    "cuda": ["gathered", "reference"],
    "cpu": ["gathered", "reference"],
})

SPARSE.register(Backend("reference", reference_sparse, always_available, lambda s: None))
SPARSE.register(Backend("gathered", gathered_sparse, always_available, lambda s: None))

__all__ = ["SPARSE", "SparseSpec", "gathered_sparse", "reference_sparse"]
