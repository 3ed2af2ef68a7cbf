"""The block contract every zoo block keeps (see DESIGN.md, "The block contract").

A block maps x [B, T, D] to y [B, T, D], causally. Besides `forward` it answers the
questions the rank-budget report asks of it:

  budget(seq_len)        declared caps, from the config alone          -> RankBudget
  mixing_matrices(x)     exact token-mixing weights, fp32 reference    -> [B, H, T, T]
  weight_matrices()      projections whose rank is measured            -> {name: [..., m, n]}
                         ("value": the value projection, "qk": per-head W_Q W_K^T, ...)
  inference_state(cache) cached matrices whose rank is the inference rank
                                                                       -> {name: [B, ..., m, n]}
  init_cache(B, max_len) an empty cache; forward(x, cache) continues from it
  backend                the kernel backend actually in use
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from budgets import RankBudget

from .config import StrictConfig


def apply_linear(proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """proj(x), through the module itself: a wrapper that replaces a projection (PEFT's
    LoRA layers, whose `.weight` stays the base's while their forward adds the adapter)
    then takes effect. Only an input of another dtype than the weights, outside autocast
    (fp64 checks of an fp32 block), is served by a cast copy of the weights instead."""
    # the first parameter's dtype: a wrapper's `.weight` may be computed (a merged W0 + BA)
    if x.dtype == next(proj.parameters()).dtype or torch.is_autocast_enabled(x.device.type):
        return proj(x)
    bias = None if proj.bias is None else proj.bias.to(x.dtype)
    return F.linear(x, proj.weight.to(x.dtype), bias)


class Block(nn.Module):
    kind: ClassVar[str] = ""  # the registry name, set by zoo.register
    Config: ClassVar[type[StrictConfig]]

    def __init__(self, config: StrictConfig):
        super().__init__()
        if not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {config!r}")
        self.config = config
        self._backend = "unresolved"  # the name of the backend the last forward used

    @property
    def backend(self) -> str:
        return self._backend

    def check_input(self, x: torch.Tensor) -> None:
        """Reject inputs the block cannot take, naming the shape or dtype."""
        d_model = self.config.d_model
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.kind}: expected a tensor [B, T, {d_model}], got {type(x)}")
        if x.dim() != 3 or x.shape[-1] != d_model:
            raise ValueError(f"{self.kind}: expected x of shape [B, T, {d_model}], "
                             f"got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{self.kind}: expected a floating-point x, got {x.dtype}")
        if x.shape[1] == 0:
            raise ValueError(f"{self.kind}: expected at least one token, got {tuple(x.shape)}")
        weight = next(self.parameters(), None)
        if (weight is not None and x.dtype != weight.dtype
                and not torch.is_autocast_enabled(x.device.type)):
            raise ValueError(f"{self.kind}: x is {x.dtype} but the weights are {weight.dtype}; "
                             "cast one of them or run under torch.autocast")

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # The contract; each block implements all of these.
    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        raise NotImplementedError

    def init_cache(self, batch: int, max_len: int) -> Any:
        raise NotImplementedError

    def budget(self, seq_len: int) -> RankBudget:
        raise NotImplementedError

    def mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_matrices(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def inference_state(self, cache: Any) -> dict[str, torch.Tensor]:
        raise NotImplementedError
