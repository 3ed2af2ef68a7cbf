"""The attention shape a Hugging Face config declares, and the caps it implies.

Geometry reads the attention shape from a config (checked before a model loads);
declared_budget turns it into one layer's caps through attention_budget, the formula
zoo's softmax and sliding_window blocks declare through as well. Where each layer keeps
its projections is found on the loaded model (budgets/hf/projections.py), not read here.

Nothing here imports transformers: a config is read by duck typing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..budget import RankBudget, attention_budget


@dataclass(frozen=True)
class Geometry:
    """The attention shape of a config, in the letters of docs/ARCHITECTURE.md."""

    model_type: str
    n_layers: int  # L
    n_heads: int  # H
    n_kv_heads: int  # G
    head_dim: int  # K
    d_model: int  # D
    max_len: int | None  # the longest sequence the position embedding covers

    @classmethod
    def from_config(cls, config) -> Geometry:
        # GPT2Config maps these standard names onto n_head, n_embd, n_layer, n_positions;
        # an SSM's config (Mamba-2) has no attention heads: H = 0
        H = int(getattr(config, "num_attention_heads", None) or 0)
        D = int(config.hidden_size)
        return cls(model_type=config.model_type, n_layers=int(config.num_hidden_layers),
                   n_heads=H, n_kv_heads=int(getattr(config, "num_key_value_heads", None) or H),
                   head_dim=int(getattr(config, "head_dim", None) or (D // H if H else 0)),
                   d_model=D, max_len=getattr(config, "max_position_embeddings", None))

    def check_seq_len(self, seq_len: int) -> None:
        if self.max_len is not None and seq_len > self.max_len:
            raise ValueError(f"seq_len={seq_len} exceeds the {self.model_type} model's "
                             f"max_position_embeddings ({self.max_len})")


def window_of(config, i: int) -> int | None:
    """Layer i's sliding window W (keys including the query), or None for full attention."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types and i < len(types):  # transformers >= 4.53 names each layer's attention
        return window if types[i] == "sliding_attention" else None
    return window if getattr(config, "use_sliding_window", True) else None


def declared_budget(g: Geometry, seq_len: int, window: int | None, params: int) -> RankBudget:
    """The caps of one layer, as zoo's softmax / sliding_window blocks declare them."""
    return attention_budget(g.model_type, seq_len, n_heads=g.n_heads, n_kv_heads=g.n_kv_heads,
                            head_dim=g.head_dim, d_model=g.d_model, window=window,
                            params=params)
