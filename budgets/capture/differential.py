"""A captured differential-attention call (the Differential Transformer, transformers'
diffllama): one softmax over H heads, its heads combined in pairs into signed mixing.

    call = DifferentialCall(module, q, k, v, scaling, lam=lam, pair_values=pv, ...)
    M = call.exact()                 # [B, H/2, T, T]: P[:, j] - lam[j] P[:, j + H/2]
    d = M @ call.values()            # [B, H/2, T, 2V]: the difference the module forms
    y = call.readout(d)              # [B, T, H/2, 2V]: what its W_O reads (call.output)

The H softmax heads P = softmax(q k^T * scaling + mask) are AttentionCall's (its P V
engine, mask, window, soft-cap and sinks: `probs` is P itself); output head j subtracts
lam[j] times head j + H/2 from head j, both applied to the same 2V-wide values (two value
heads side by side), so M_j is the one matrix mixing its tokens. M's rows sum to 1 - lam
and its entries take either sign: only the singular-value metrics apply to it (`signed`,
budgets/probe/signed.py). Its caps are budgets/budget.py's differential_budget; its
matrix-free form budgets/rank/difference.py's. Nothing here imports transformers:
budgets/hf/differential.py reads a model's two interface calls into one of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..budget import RankBudget, differential_budget
from ..rank.difference import DifferenceMixing
from .attention import AttentionCall


@dataclass
class DifferentialCall(AttentionCall):
    """One differential-attention layer's call: AttentionCall's fields for its H softmax
    heads (`value`: the layer's values as cached [B, G, T, V]; `output`: what its W_O
    reads), and per output head its lambda and values."""

    lam: torch.Tensor | None = None  # [H/2] each output head's lambda
    pair_values: torch.Tensor | None = None  # [B, H/2, T, 2V] the values M_j mixes
    mixed: torch.Tensor | None = None  # [B, T, H/2, 2V] the module's difference, pre-norm
    # the module's own map from its difference to what W_O reads (diffllama: a group norm)
    norm: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)

    signed = True  # M's entries take either sign (the probe's figures: signed.py)

    def kind(self, moe: bool) -> dict:
        """AttentionCall's kind, named `differential`, with each head's lambda (one
        number when the layer has one lambda, as diffllama's does)."""
        kind = super().kind(moe)
        lam = [float(x) for x in self.lam]
        kind["attention"] = "differential"
        kind["lambda"] = lam[0] if len(set(lam)) == 1 else lam
        # "differential", "differential sliding W=8", "differential no RoPE", ...
        kind["label"] = " ".join(["differential", *kind["label"].removeprefix("global").split()])
        return kind

    def exact(self) -> torch.Tensor:
        P = self.probs  # [B, H, T, T]
        h = P.shape[1] // 2
        return P[:, :h] - self.lam.to(P.dtype).view(1, h, 1, 1) * P[:, h:]  # [B, H/2, T, T]

    def operator(self) -> DifferenceMixing:
        return DifferenceMixing(super().operator(), self.lam)

    def values(self) -> torch.Tensor:
        return self.pair_values  # [B, H/2, T, 2V]

    @torch.no_grad()
    def readout(self, mixed: torch.Tensor) -> torch.Tensor:
        """What the module's W_O reads [B, T, H/2, 2V] from M @ values [B, H/2, T, 2V]."""
        d = mixed.transpose(1, 2).to(self.pair_values.dtype)
        return d if self.norm is None else self.norm(d)

    def caps(self, seq_len: int, d_model: int, params: int, block: str) -> RankBudget:
        H, G, K = self.query.shape[1], self.key.shape[1], self.key.shape[-1]
        return differential_budget(block, seq_len, n_heads=H, n_kv_heads=G, head_dim=K,
                                   d_model=d_model, window=self.window, params=params,
                                   chunk=self.chunk)

    def release(self) -> None:
        super().release()
        self.pair_values = self.mixed = None
