"""The attention shape a Hugging Face config declares.

Geometry reads the attention shape from a config (checked before a model loads). Each
layer's caps, window and projections are found on the loaded model, as its forward shows
them (budgets/capture/attention.py AttentionCall.caps, budgets/hf/capture.py,
budgets/capture/projections.py),
not read here.

Nothing here imports transformers: a config is read by duck typing.
"""

from __future__ import annotations

from dataclasses import dataclass


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
                   head_dim=int(_read(config, "head_dim") or (D // H if H else 0)),
                   d_model=D, max_len=getattr(config, "max_position_embeddings", None))

    def check_seq_len(self, seq_len: int) -> None:
        if self.max_len is not None and seq_len > self.max_len:
            raise ValueError(f"seq_len={seq_len} exceeds the {self.model_type} model's "
                             f"max_position_embeddings ({self.max_len})")


def _read(config, name: str):
    """config.name, or None where the config has none or will not give one value for every
    layer (transformers' per-layer configs raise on a global read of a per-layer size)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError, not an AttributeError
        return None
