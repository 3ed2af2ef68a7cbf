"""Top-k selected attention (DeepSeek Sparse Attention, DSA): the keys an indexer picks for
each query, as the capture folds them into the call it reads.

    sel = Selection(indices, topk=2048, dense_mask=mask)   # indices [B, T, k]
    call.mask = sel.fold(mask, T, Tk, dtype)               # unpicked keys hidden
    call.selection = sel

DSA (deepseek_v32, glm_moe_dsa) has a small "lightning indexer" score every (query, key)
pair, I(t, s) = sum_j w_tj relu(q_tj . k_s) over its own H_I heads against one key of d_I
per token, and lets each query attend to the k keys of highest score (k = index_topk;
min(k, t + 1) of them are keys it can see). The model folds that choice into the
attention's mask itself on its eager and SDPA paths, and hands it to any other attention
function as `indices` [B, T, k]; the capture folds it the same way (hidden keys at the
dtype's min for an additive mask, False for a boolean one), so P is the attention as
computed: softmax over the picked keys, zero elsewhere. The indexer's own scores and keys
(budgets/hf/indexer.py watches it) ride along for the selector's figures
(budgets/probe/selector.py). Its caps are the sparse family's (budgets/mixing/sparse.py
sparse_caps): the past->future mixing stays T/2 (each query picks its own keys, so k does
not bound the block's rank), the cache gains the indexer's d_I per token. Nothing here
imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..budget import RankBudget
from ..mixing.sparse import SparseShape, sparse_caps


@dataclass
class Selection:
    """One call's top-k choice: the keys each query attends to."""

    indices: torch.Tensor  # [B, T, k] key positions, as the indexer's topk gave them
    topk: int  # the indexer's k (index_topk); min(k, Tk) keys are picked per query
    dense_mask: torch.Tensor | None = None  # the call's mask before the selection
    scores: torch.Tensor | None = None  # [B, T, Tk] the indexer's logits, masked keys low
    keys: torch.Tensor | None = None  # [B, Tk, d_I] the indexer's keys, as it caches them
    shared_from: str | None = None  # the indexer (module path) whose choice this reuses
    index_heads: int = 0  # H_I, the indexer's heads (0: not known)
    index_dim: int = 0  # d_I, its key width (0: not known)

    @property
    def picked(self) -> int:
        return int(self.indices.shape[-1])

    def chosen(self, Tk: int) -> torch.Tensor:
        """[B, 1, T, Tk] bool: True at the keys each query attends to."""
        B, T, _ = self.indices.shape
        return torch.zeros(B, T, Tk, dtype=torch.bool, device=self.indices.device).scatter(
            -1, self.indices.long(), True)[:, None]

    def fold(self, mask: torch.Tensor | None, T: int, Tk: int, dtype: torch.dtype
             ) -> torch.Tensor:
        """The call's mask with every key not picked hidden, as the model folds it: an
        additive mask [B, 1, T, Tk] at dtype's min there, a boolean one False there (None,
        purely causal: the causal mask written out first)."""
        chosen = self.chosen(Tk)  # [B, 1, T, Tk]
        if mask is None:
            t = torch.arange(T, device=chosen.device)[:, None] + (Tk - T)
            mask = torch.arange(Tk, device=chosen.device)[None, :] <= t  # [T, Tk]
        if mask.dtype == torch.bool:
            return mask & chosen
        return mask.masked_fill(~chosen, torch.finfo(dtype).min)

    def caps(self, block: str, seq_len: int, d_model: int, n_heads: int, n_kv_heads: int,
             head_dim: int, params: int) -> RankBudget:
        """The sparse family's caps of a layer making this selection (token top-k), its
        projections' FLOPs counted as attention_budget counts them."""
        H, G, K, D = n_heads, n_kv_heads, head_dim, d_model
        shape = SparseShape(D, H, G, K, "token", self.topk, index_heads=self.index_heads,
                            index_dim=self.index_dim)
        return sparse_caps(block, seq_len, shape, params, 2 * D * (2 * H * K + 2 * G * K))

    def release(self) -> None:
        self.dense_mask = self.scores = self.keys = None
