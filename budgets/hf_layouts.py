"""Where Hugging Face causal LMs keep their attention, and the caps their configs declare.

Architectures differ only in where the projections live: LAYOUT_OF maps a config's
model_type to a layout, EXTRACTORS maps a layout to a function returning each layer's
projections in nn.Linear's (out, in) convention. Geometry reads the attention shape from
a config; declared_budget turns it into one layer's caps through attention_budget, the
formula zoo's softmax and sliding_window blocks declare through as well.

Nothing here imports transformers: a model or config is read by duck typing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .budget import RankBudget, attention_budget


@dataclass(frozen=True)
class AttnWeights:
    """One layer's attention projections, each [out, in] like nn.Linear.weight."""

    wq: torch.Tensor  # [H*K, D]
    wk: torch.Tensor  # [G*K, D]
    wv: torch.Tensor  # [G*V, D]
    wo: torch.Tensor  # [D, H*V]


def _llama_weights(model) -> list[tuple[nn.Module, AttnWeights]]:
    # Llama, Mistral, Qwen2: separate q/k/v/o Linear layers; GQA via fewer k/v rows.
    return [(a, AttnWeights(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight))
            for a in (layer.self_attn for layer in model.base_model.layers)]


def _gpt2_weights(model) -> list[tuple[nn.Module, AttnWeights]]:
    # GPT-2's Conv1D stores its weight as [in, out]; c_attn fuses q, k and v along out.
    out = []
    for a in (block.attn for block in model.base_model.h):
        wq, wk, wv = a.c_attn.weight.T.chunk(3, dim=0)  # each [D, D]
        out.append((a, AttnWeights(wq, wk, wv, a.c_proj.weight.T)))  # wo: [D, H*V]
    return out


# layout -> (attention module, its projections) per layer, in layer order
EXTRACTORS: dict[str, Callable[[nn.Module], list[tuple[nn.Module, AttnWeights]]]] = {
    "llama": _llama_weights,
    "gpt2": _gpt2_weights,
}


def _llama_kv_biases(attention: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return attention.k_proj.bias, attention.v_proj.bias


def _gpt2_kv_biases(attention: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    _, bk, bv = attention.c_attn.bias.chunk(3)  # views of the fused [3 * D] bias
    return bk, bv


# layout -> (key bias [G*K], value bias [G*V]) of one attention module (None: no bias),
# views of the parameters, ordered as the rows of AttnWeights.wk and .wv
KV_BIASES: dict[str, Callable[[nn.Module], tuple[torch.Tensor | None, torch.Tensor | None]]] = {
    "llama": _llama_kv_biases,
    "gpt2": _gpt2_kv_biases,
}

# model types with Llama's layout (their extras, e.g. Qwen3's q/k norms or Gemma 2's logit
# soft-capping, shape the attention probabilities, which are measured as the model made them)
LAYOUT_OF = {**dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe",
                              "gemma", "gemma2", "olmo2", "granite"), "llama"),
             "gpt2": "gpt2"}


def layout_of(model_type: str, where: Path | str = "") -> str:
    if model_type not in LAYOUT_OF:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(LAYOUT_OF))}")
    return LAYOUT_OF[model_type]


@dataclass(frozen=True)
class Geometry:
    """The attention shape of a config, in the letters of docs/ARCHITECTURE.md."""

    model_type: str
    n_layers: int  # L
    n_heads: int  # H
    n_kv_heads: int  # G
    head_dim: int  # K (= V for every supported layout)
    d_model: int  # D
    max_len: int | None  # the longest sequence the position embedding covers

    @classmethod
    def from_config(cls, config) -> Geometry:
        # GPT2Config maps these standard names onto n_head, n_embd, n_layer, n_positions.
        H, D = int(config.num_attention_heads), int(config.hidden_size)
        return cls(model_type=config.model_type, n_layers=int(config.num_hidden_layers),
                   n_heads=H, n_kv_heads=int(getattr(config, "num_key_value_heads", None) or H),
                   head_dim=int(getattr(config, "head_dim", None) or D // H), d_model=D,
                   max_len=getattr(config, "max_position_embeddings", None))

    def check(self, i: int, w: AttnWeights) -> None:
        H, G, K, D = self.n_heads, self.n_kv_heads, self.head_dim, self.d_model
        want = {"wq": (H * K, D), "wk": (G * K, D), "wv": (G * K, D), "wo": (D, H * K)}
        for name, shape in want.items():
            got = tuple(getattr(w, name).shape)
            if got != shape:
                raise ValueError(f"layer {i}: {name} has shape {got}, but the config "
                                 f"(H={H}, G={G}, K={K}, D={D}) implies {shape}")

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
