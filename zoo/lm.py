"""A small decoder-only language model whose token mixer is any zoo block: the LM the
harness trains (train/lm/decoder.py builds it from a run config) and the one an exported
Hugging Face model wraps (zoo/hf/modeling.py), so both compute the same logits.

Reading order: Norm, the MLPs (GELU, SwiGLU), Layer (pre-norm residual: norm -> block -> add,
norm -> MLP -> add), DecoderLM (embedding, n_layers x Layer, final norm, LM head),
build_model (a DecoderLM from a resolved run config).

Each layer has its own block: one block for every layer (`block`, `block_kwargs`), or a
layer pattern (`layers`, one (name, kwargs) per layer: Gemma 3's five windowed layers to one
global, a Mamba-2 stack with a few attention layers). Decoding keeps one cache per layer,
each of its block's own type (`init_cache`), so a prefill followed by one-token steps
equals the parallel forward for hybrids too.

MLPs (`mlp`): "gelu", GPT-2's two matrices, the default; "swiglu", LLaMA's three (a gate,
an up and a down projection). Left to `mlp_ratio`, SwiGLU's hidden width is 2/3 of GELU's
(LLaMA's rule), so both have the same parameters at the same ratio (`mlp_width`).

Weight init: the MLP and the LM head as in GPT-2/nanoGPT (N(0, 0.02), the MLP's output
projection scaled by 1/sqrt(2 * n_layers) because each layer adds into the residual stream
twice); the zoo blocks keep the initialization their own family defines (the LM does not
reach into them); the token embedding N(0, 1), PyTorch's default, so that a token's own
identity is not drowned in the residual stream by the blocks' outputs at init. With
N(0, 0.02) embeddings the mixer outputs are ~20x larger than the embedding at init, and a
2-layer model sat on MQAR's "guess a value from the context" plateau for thousands of
steps; with N(0, 1) it left it within a few hundred. The head is untied by default: tied to
N(0, 1) embeddings it starts with logits of size ~d_model (initial loss ~60, not ln V).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import registry
from .config import positive_int, positive_number, require

NORMS = ("rmsnorm", "layernorm")


def make_norm(kind: str, d_model: int) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=1e-6)
    if kind == "layernorm":
        return nn.LayerNorm(d_model)
    raise ValueError(f"norm must be one of {list(NORMS)}, got {kind!r}")


class MLP(nn.Module):
    """GPT-2's MLP: down(gelu(up(x)))."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_mlp, bias=False)
        self.down = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        return self.down(F.gelu(self.up(x)))  # [B, T, D]


class SwiGLU(nn.Module):
    """LLaMA's gated MLP: down(silu(gate(x)) * up(x)), three matrices."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_mlp, bias=False)
        self.up = nn.Linear(d_model, d_mlp, bias=False)
        self.down = nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, D]
        return self.down(F.silu(self.gate(x)) * self.up(x))  # [B, T, D]


# model.mlp -> (the module, its d_model x d_mlp matrices, its width per mlp_ratio x d_model):
# at the same ratio SwiGLU's 3 x 2/3 matrices hold GELU's 2 x 1 parameters
MLPS: dict[str, tuple[type[nn.Module], int, float]] = {
    "gelu": (MLP, 2, 1.0),
    "swiglu": (SwiGLU, 3, 2 / 3),
}


def mlp_kind(mlp: str) -> tuple[type[nn.Module], int, float]:
    if mlp not in MLPS:
        raise ValueError(f"mlp must be one of {list(MLPS)}, got {mlp!r}")
    return MLPS[mlp]


def mlp_width(d_model: int, mlp_ratio: float, d_mlp: int | None, mlp: str = "gelu") -> int:
    """The MLP's hidden width: d_mlp when set, else mlp_ratio x d_model scaled by the
    kind's rule (SwiGLU: 2/3 of it)."""
    if d_mlp is not None:
        return d_mlp
    return max(1, round(mlp_ratio * d_model * mlp_kind(mlp)[2]))


def mlp_matrices(mlp: str) -> int:
    """The d_model x d_mlp matrices one layer's MLP holds: its parameters per unit of width."""
    return mlp_kind(mlp)[1]


class Layer(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)); `mixer` is the zoo block."""

    def __init__(self, d_model: int, d_mlp: int, mixer: nn.Module, norm: str,
                 mlp: str = "gelu"):
        super().__init__()
        self.norm1 = make_norm(norm, d_model)
        self.mixer = mixer
        self.norm2 = make_norm(norm, d_model)
        self.mlp = mlp_kind(mlp)[0](d_model, d_mlp)

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:  # x: [B, T, D]
        x = x + self.mixer(self.norm1(x), cache)  # [B, T, D]
        x = x + self.mlp(self.norm2(x))  # [B, T, D]
        return x


def layer_specs(n_layers: int, block: str | None, block_kwargs: dict[str, Any] | None,
                layers: list[tuple[str, dict[str, Any]]] | None) -> list[tuple[str, dict]]:
    """One (block name, kwargs) per layer: `block` repeated, or `layers` as given."""
    if (block is None) == (layers is None):
        raise ValueError(f"DecoderLM takes either block (one block for every layer) or "
                         f"layers (one per layer), got block={block!r} and layers={layers!r}")
    if layers is None:
        return [(block, dict(block_kwargs or {}))] * n_layers
    require(block_kwargs is None, "block_kwargs goes with block; with layers, each layer "
                                  "carries its own kwargs")
    require(len(layers) == n_layers, f"layers holds {len(layers)} block specs for "
                                     f"n_layers = {n_layers}; give one per layer")
    return [(name, dict(kwargs)) for name, kwargs in layers]


class DecoderLM(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        block: str | None = None,
        block_kwargs: dict[str, Any] | None = None,
        mlp_ratio: float = 4.0,
        d_mlp: int | None = None,
        max_len: int = 2048,
        norm: str = "rmsnorm",
        tie_embeddings: bool = False,
        layers: list[tuple[str, dict[str, Any]]] | None = None,
        mlp: str = "gelu",
    ):
        super().__init__()
        positive_int("DecoderLM", vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                     max_len=max_len)
        if d_mlp is None:
            positive_number("DecoderLM", mlp_ratio=mlp_ratio)
        d_mlp = mlp_width(d_model, mlp_ratio, d_mlp, mlp)
        positive_int("DecoderLM", d_mlp=d_mlp)
        specs = layer_specs(n_layers, block, block_kwargs, layers)
        for i, (_, kwargs) in enumerate(specs):
            require("d_model" not in kwargs, f"layer {i}'s block kwargs must not set d_model: "
                    f"the LM passes its own d_model ({d_model}) to every block")
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.d_mlp, self.mlp_name = d_mlp, mlp

        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            Layer(d_model, d_mlp, registry.build(name, d_model=d_model, **kwargs), norm, mlp)
            for name, kwargs in specs
        )
        self.norm = make_norm(norm, d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

        self._init_weights(n_layers)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    @property
    def blocks(self) -> list[nn.Module]:
        """The zoo blocks, one per layer, in order."""
        return [layer.mixer for layer in self.layers]

    def _init_weights(self, n_layers: int) -> None:
        block_params = {id(p) for b in self.blocks for p in b.parameters()}
        for module in self.modules():
            if any(id(p) in block_params for p in module.parameters(recurse=False)):
                continue  # a zoo block's own module: its family's init stands
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=1.0)
        for layer in self.layers:
            nn.init.normal_(layer.mlp.down.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    def set_step(self, step: int) -> None:
        """The training step, for blocks whose forward depends on it (the sparse family's
        dense warm-up); the harness calls it before every training step."""
        for block in self.blocks:
            if hasattr(block, "set_step"):
                block.set_step(step)

    def param_count(self) -> int:
        """Trainable parameters, the tied embedding/head counted once."""
        return sum(p.numel() for p in self.parameters())

    def init_cache(self, batch: int, max_len: int | None = None) -> list[Any]:
        """One empty cache per layer, each of its block's own type, for up to max_len
        tokens (the LM's max_len by default)."""
        max_len = self.max_len if max_len is None else max_len
        return [layer.mixer.init_cache(batch, max_len) for layer in self.layers]

    def forward(self, tokens: torch.Tensor, cache: list[Any] | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T]; with a cache (init_cache), the tokens
        continue the sequences it holds, and it is updated in place."""
        self._check_tokens(tokens)
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"DecoderLM: the cache holds {len(cache)} layers, the model "
                             f"has {len(self.layers)}; use model.init_cache(batch)")
        x = self.embed(tokens)  # [B, T, D]
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache[i])  # [B, T, D]
        x = self.norm(x)  # [B, T, D]
        return self.head(x)  # [B, T, vocab]

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"DecoderLM: expected tokens of shape [B, T], "
                             f"got {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"DecoderLM: expected integer tokens, got {tokens.dtype}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"DecoderLM: sequence length {tokens.shape[1]} exceeds "
                             f"max_len {self.max_len}")
