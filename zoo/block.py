"""The block contract every zoo block keeps (see docs/ARCHITECTURE.md, "The block contract").

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

`Block` holds these public methods: each checks its arguments and sets up once (no grad,
fp32, autocast off, ...), then calls the block's hook, so that a block is its math and
its budget only:

  _forward(x, cache)           x checked
  _budget(seq_len)             seq_len checked
  _mixing_matrices(x)          x checked and in fp32, under no_grad with autocast off
  _init_cache(batch, max_len)  both checked
  _weight_matrices()           under no_grad; what it returns is detached
  inference_state(cache)       overridden directly: there is nothing to check or set up

Helpers the blocks share: `Block.add_projections` (the q/k/v/o projections every attention
block builds), `apply_linear` (a projection, adapters included), `split_heads` (a projection
split into heads) and `decode_step_backend` (the backend of a one-token decoding step); the
torch kernels share `zoo.ops.precision.upcast_16bit`.

What `rankzoo compress` reads of a block's cache
(train/commands/compress/target/zoo_projections.py), by the kind its facts declare
(Facts.cache), so that a new block of a known kind needs no edit there:

  every kind   cache_slots()          the matrices cached per layer, as CacheSlots
               describe_cache()       `4 KV heads x (K 16 + V 16)`: the cache in words
  kv           keys_values(x, offset) keys (rotated) and values as cached [B, G, T, K]; the
                                      method compress wraps to project rotated keys
               k_proj, v_proj         the linears whose rows give keys before RoPE and
                                      values per KV head (add_projections' names)
               cache_readout(x)       what reads the cache (CacheReadout), or None where no
                                      one W_O reads it (MoE's routed experts)
  latent       latents(x, offset)     (the latent cached per token [B, T, R], ...)
               kv_up                  the linear that reads the latent
               absorbed_weights(dt)   its per-head key and value parts [H, dn, R], [H, dv, R]
               cache_readout(x)       the queries of the part keys read from the latent
  state        state_rows(x)          what writes the state's rows and what reads them,
                                      [B, G, T, N] each (linear: phi(k), phi(q); SSM: B, C)
               write_rows(rows)       the identity the forward passes the writer through:
                                      the method compress patches to project the rows
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

import budgets
from budgets import RankBudget

from .config import StrictConfig, positive_int
from .facts import Facts


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


def split_heads(proj: nn.Module, x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """proj(x) for x [B, T, D], split into n_heads heads: [B, n_heads, T, width / n_heads]."""
    B, T, _ = x.shape
    return apply_linear(proj, x).view(B, T, n_heads, -1).transpose(1, 2)


@dataclass(frozen=True)
class CacheSlot:
    """One matrix kind a block caches per layer, as compress projects it: per head a basis
    of its own, of dimension `width`."""

    name: str  # "k" (keys), "v" (values), "latent", "state"
    heads: int
    width: int
    window: int | None = None  # a sliding window's W: the cache holds min(W, T) tokens
    # a state's elements per kept direction and sequence (linear attention: the V + 1
    # columns of its state); None: one code per token and kept direction
    columns: int | None = None
    fixed_per_token: int = 0  # elements cached in full beside it, per token (MLA's RoPE key)
    fixed_per_sequence: int = 0  # ... per sequence (an SSM's conv state)


class CacheReadout(NamedTuple):
    """What reads an attention cache, for bases that weigh its errors as the output sees
    them (train/commands/compress/bases/readout.py)."""

    queries: torch.Tensor  # [B, H, T, K] the queries (or the part of them) reading the keys
    probs: torch.Tensor  # [B, H, T, S] the attention
    values: torch.Tensor  # [B, G, S, V] per KV head (MLA: per query head, G = H)
    w_o: torch.Tensor  # [D, H*V] the output projection, nn.Linear's [out, in]
    scale2: float  # the logits' scale squared: 1 / K for q . k / sqrt(K)
    rope: bool  # the keys read are rotated: their weight is averaged over the rotation


def decode_step_backend(requested: str, cache: Any, seq_len: int, step: str) -> str:
    """The backend to ask a registry for: `requested`, except that `auto` takes `step` for
    a one-token decoding step (a cache and T = 1), whose few multiply-adds cost less than
    a chunked or fused kernel's setup."""
    if requested == "auto" and cache is not None and seq_len == 1:
        return step
    return requested


class Block(nn.Module):
    kind: ClassVar[str] = ""  # the registry name, set by zoo.register
    Config: ClassVar[type[StrictConfig]]
    facts: ClassVar[Facts]  # what pick, compress and the advice read (zoo/facts.py)

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
        if x.shape[0] == 0 or x.shape[1] == 0:  # heads are split with view(B, T, H, -1)
            raise ValueError(f"{self.kind}: expected at least one sequence of at least one "
                             f"token, got {tuple(x.shape)}")
        weight = next(self.parameters(), None)
        if (weight is not None and x.dtype != weight.dtype
                and not torch.is_autocast_enabled(x.device.type)):
            raise ValueError(f"{self.kind}: x is {x.dtype} but the weights are {weight.dtype}; "
                             "cast one of them or run under torch.autocast")

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def add_projections(self, *, q: int | None = None, k: int | None = None,
                        v: int | None = None, o: int | None = None, bias: bool = False) -> None:
        """The attention projections, under the names checkpoints and PEFT targets use:
        q_proj, k_proj, v_proj (d_model -> the width given) and o_proj (the width given ->
        d_model), nn.Linear each; a width left None is not built. Always built in the order
        q, k, v, o: the order fixes their seeded initialization."""
        d_model = self.config.d_model
        for name, width in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            if width is not None:
                setattr(self, name, nn.Linear(d_model, width, bias=bias))
        if o is not None:
            self.o_proj = nn.Linear(o, d_model, bias=bias)

    # The contract: checks and setup here, the math in each block's hooks.
    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        self.check_input(x)
        if cache is not None:
            self.check_cache(x, cache)
        return self._forward(x, cache)

    def check_cache(self, x: torch.Tensor, cache: Any) -> None:
        """A cache holds one state per sequence, made by init_cache(batch, ...): its batch
        must be x's. Every cache keeps its per-sequence tensors with the batch first."""
        held = next((t.shape[0] for t in getattr(cache, "__dict__", {}).values()
                     if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        if held is not None and held != x.shape[0]:
            raise ValueError(f"{self.kind}: the cache holds {held} sequences (init_cache("
                             f"batch={held}, ...)) but x has {x.shape[0]}, shape "
                             f"{tuple(x.shape)}; make the cache with batch={x.shape[0]}")

    def init_cache(self, batch: int, max_len: int) -> Any:
        positive_int("init_cache", batch=batch, max_len=max_len)
        return self._init_cache(batch, max_len)

    def budget(self, seq_len: int) -> RankBudget:
        positive_int("budget", seq_len=seq_len)
        return self._budget(seq_len)

    def mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        # the reference path in fp32: measured ranks must not depend on the training dtype
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            return self._mixing_matrices(x.float())

    def mixing_operator(self, x: torch.Tensor
                        ) -> budgets.AttentionMixing | budgets.FactoredMixing | None:
        """The mixing matrix in a form that never holds a [T, T] tensor, for long probes
        (budgets/rank/matfree.py): queries and keys for softmax attention, the past->future
        block's low-rank factors for linear attention and SSMs; None for a block that has
        no such form (the probe then materializes mixing_matrices)."""
        self.check_input(x)
        with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
            return self._mixing_operator(x.float())

    def weight_matrices(self) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            # detached: an entry may be a parameter itself (`.float()` of an fp32 weight)
            return {name: w.detach() for name, w in self._weight_matrices().items()}

    def inference_state(self, cache: Any) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    # What compress reads of the cache (module docstring), besides the kind's own members.
    def cache_slots(self) -> tuple[CacheSlot, ...]:
        raise NotImplementedError(f"{type(self).__name__} declares no cache slots")

    def describe_cache(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not describe its cache")

    # The hooks each block implements.
    def _forward(self, x: torch.Tensor, cache: Any) -> torch.Tensor:
        raise NotImplementedError

    def _init_cache(self, batch: int, max_len: int) -> Any:
        raise NotImplementedError

    def _budget(self, seq_len: int) -> RankBudget:
        raise NotImplementedError

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _mixing_operator(self, x: torch.Tensor) -> Any:
        return None

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError
