"""Multi-head latent attention (MLA), as in DeepSeek-V2 (DeepSeek-AI, 2024, arXiv:2405.04434).

Keys and values of every head come from one latent of rank R per token:

    c   = RMSNorm(W_DKV x)                       # [B, T, R]      the cached latent
    k_r = RoPE(W_KR x)                           # [B, T, dr]     one RoPE key shared by heads
    k_h = [W_UK^h c ; k_r],  v_h = W_UV^h c      # per head: nope part from the latent
    q_h = [W_UQ^h q' ; RoPE(W_QR^h q')],  q' = RMSNorm(W_DQ x) (or x when q_lora_rank is None)

The inference cache holds only c and k_r: R + dr elements per token per layer, against
2*H*K for MHA. Decoding uses the absorbed form: W_UK^h folds into the query
(q_h W_UK^h . c = q_h . W_UK^h c) and W_UV^h into the output, so each step attends
directly over the cached latents as one shared key/value head of width R + dr / R,
without ever rebuilding per-head keys or values.

The rank story: the value path W_UV diag(g) W_DKV has rank <= min(D, R); the cached state
[c ; k_r] has rank <= min(T, R + dr); logits are capped by the query-key width dn + dr;
the mixing matrix is a full softmax (T/2).

Options as the softmax block's (zoo/softmax.py): `rope: false` leaves the dr-wide shared key
and its query part unrotated (NoPE: the same widths and caps), `sinks: true` a learned sink
logit per head in every row's softmax (rows of M sum to less than 1; no cap moves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

import budgets
from budgets import RankBudget

from .block import Block, CacheReadout, CacheSlot, apply_linear
from .config import StrictConfig, positive_int, require
from .facts import Facts, Sizing
from .ops.attention import ATTENTION, AttnSpec, attention_probs
from .registry import register
from .rope import apply_rope


@dataclass(frozen=True)
class MLAConfig(StrictConfig):
    owner: ClassVar[str] = "mla"

    d_model: int
    n_heads: int
    kv_lora_rank: int | None = None  # R; None: d_model // 2
    q_lora_rank: int | None = None  # None: full-rank queries
    qk_nope_head_dim: int | None = None  # dn; None: d_model // n_heads
    qk_rope_head_dim: int | None = None  # dr; None: dn // 2 rounded down to even (>= 2)
    v_head_dim: int | None = None  # dv; None: d_model // n_heads
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    backend: str = "auto"
    rope: bool = True  # false: NoPE, the dr-wide part unrotated
    sinks: bool = False  # a learned sink logit per head (gpt-oss)

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads)
        if self.qk_nope_head_dim is None or self.v_head_dim is None:
            require(self.d_model % self.n_heads == 0,
                    f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        for name in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim"):
            if getattr(self, name) is not None:
                positive_int(self.owner, **{name: getattr(self, name)})
        for name in ("kv_lora_rank", "q_lora_rank"):
            value = getattr(self, name)
            require(value is None or value <= self.d_model,
                    f"{name} ({value}) must not exceed d_model ({self.d_model})")
        require(self.rope_dim % 2 == 0, f"RoPE needs an even qk_rope_head_dim, got {self.rope_dim}")
        require(self.rope_base > 0, f"rope_base must be positive, got {self.rope_base}")
        require(self.norm_eps > 0, f"norm_eps must be positive, got {self.norm_eps}")
        ATTENTION.check(self.backend)

    @property
    def latent(self) -> int:  # R
        return self.kv_lora_rank or max(1, self.d_model // 2)

    @property
    def nope_dim(self) -> int:  # dn
        return self.qk_nope_head_dim or self.d_model // self.n_heads

    @property
    def rope_dim(self) -> int:  # dr
        if self.qk_rope_head_dim is not None:
            return self.qk_rope_head_dim
        return max(2, self.nope_dim // 2 // 2 * 2)

    @property
    def value_dim(self) -> int:  # dv
        return self.v_head_dim or self.d_model // self.n_heads

    @property
    def qk_dim(self) -> int:  # dn + dr, the width the scores are taken over
        return self.nope_dim + self.rope_dim


@dataclass
class LatentCache:
    """Preallocated latents and shared RoPE keys; `length` tokens are filled."""

    latent: torch.Tensor  # [B, max_len, R], after the norm
    rope_key: torch.Tensor  # [B, max_len, dr], rotated
    length: int = 0

    def append(self, c: torch.Tensor, k_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + c.shape[1]
        if end > self.latent.shape[1]:
            raise ValueError(f"latent cache overflow: {self.length} cached + {c.shape[1]} new "
                             f"> max_len {self.latent.shape[1]}")
        self.latent[:, self.length:end] = c
        self.rope_key[:, self.length:end] = k_r
        self.length = end
        return self.latent[:, :end], self.rope_key[:, :end]  # [B, end, R], [B, end, dr]


def _attend(backend, q, k, v, scale: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention with the value width padded to the query width when it is smaller (fused
    kernels want equal head dims; zero columns change nothing), then cut back."""
    dv = v.shape[-1]
    if dv < q.shape[-1]:
        v = F.pad(v, (0, q.shape[-1] - dv))
    return backend.fn(q, k, v, window=None, scale=scale, sinks=sinks)[..., :dv]


@register("mla")
class MultiHeadLatentAttention(Block):
    Config = MLAConfig
    facts = Facts(
        Sizing("kv_lora_rank", lambda kw, D, T: range(1, D + 1),  # R <= d_model
               "R",
               "R = kv_lora_rank: the latent cached per token (DeepSeek-V2), beside one "
               "shared RoPE key of width dr",
               lambda c: f"R={c.latent}, dr={c.rope_dim}"),
        cache="latent", state_row="inference.latent")

    def __init__(self, config: MLAConfig):
        super().__init__(config)
        c = config
        D, H, R = c.d_model, c.n_heads, c.latent
        if c.q_lora_rank is None:
            self.add_projections(q=H * c.qk_dim)
        else:
            self.q_down = nn.Linear(D, c.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(c.q_lora_rank, eps=c.norm_eps)
            self.q_up = nn.Linear(c.q_lora_rank, H * c.qk_dim, bias=False)
        self.kv_down = nn.Linear(D, R + c.rope_dim, bias=False)  # W_DKV and W_KR together
        self.kv_norm = nn.RMSNorm(R, eps=c.norm_eps)
        self.kv_up = nn.Linear(R, H * (c.nope_dim + c.value_dim), bias=False)  # W_UK, W_UV
        self.add_projections(o=H * c.value_dim)
        # sink logits [H], zero at the start (after the projections: their seeds stay)
        self.sinks = nn.Parameter(torch.zeros(H)) if c.sinks else None

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """Latents of D/2 and D/4, and D/4 with low-rank (D/2) queries."""
        half, quarter = max(1, d_model // 2), max(1, d_model // 4)
        return [(f"mla (R={half})", {"kv_lora_rank": half}),
                (f"mla (R={quarter})", {"kv_lora_rank": quarter}),
                (f"mla (R={quarter}, q_lora={half})",
                 {"kv_lora_rank": quarter, "q_lora_rank": half})]

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.config.qk_dim)

    def _w(self, linear: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
        return linear.weight.to(dtype)

    def _rms(self, norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.eps)

    def queries(self, x: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q_nope [B, H, T, dn] and rotated q_rope [B, H, T, dr] for positions offset + t."""
        c = self.config
        B, T, _ = x.shape
        if c.q_lora_rank is None:
            q = apply_linear(self.q_proj, x)
        else:
            q = apply_linear(self.q_up, self._rms(self.q_norm, apply_linear(self.q_down, x)))
        q = q.view(B, T, c.n_heads, c.qk_dim).transpose(1, 2)  # [B, H, T, dn + dr]
        q_nope, q_rope = q.split([c.nope_dim, c.rope_dim], dim=-1)
        return q_nope, (apply_rope(q_rope, offset, c.rope_base) if c.rope else q_rope)

    def latents(self, x: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached state: latent c [B, T, R] (normed) and rotated RoPE key [B, T, dr]."""
        c = self.config
        down = apply_linear(self.kv_down, x)  # [B, T, R + dr]
        latent, k_rope = down.split([c.latent, c.rope_dim], dim=-1)
        if c.rope:
            k_rope = apply_rope(k_rope[:, None], offset, c.rope_base)[:, 0]  # [B, T, dr]
        return self._rms(self.kv_norm, latent), k_rope

    def _up(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys' nope part [B, H, T, dn] and values [B, H, T, dv] from the latent."""
        c = self.config
        B, T, _ = latent.shape
        kv = apply_linear(self.kv_up, latent)
        kv = kv.view(B, T, c.n_heads, c.nope_dim + c.value_dim).transpose(1, 2)
        return kv.split([c.nope_dim, c.value_dim], dim=-1)

    def project(self, x: torch.Tensor, offset: int = 0):
        """The explicit (training) form: q, k [B, H, T, dn + dr] and v [B, H, T, dv]."""
        q_nope, q_rope = self.queries(x, offset)
        latent, k_rope = self.latents(x, offset)
        k_nope, v = self._up(latent)
        k_rope = k_rope[:, None].expand(-1, self.config.n_heads, -1, -1)  # shared by heads
        return torch.cat((q_nope, q_rope), -1), torch.cat((k_nope, k_rope), -1), v

    def absorbed_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, dn, R] and W_UV [H, dv, R], split out of kv_up."""
        c = self.config
        w = self._w(self.kv_up, dtype).view(c.n_heads, c.nope_dim + c.value_dim, c.latent)
        return w.split([c.nope_dim, c.value_dim], dim=1)

    def _forward(self, x: torch.Tensor, cache: LatentCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        if cache is None:  # explicit form: per-head keys and values, H-head attention
            q, k, v = self.project(x)
            backend = ATTENTION.resolve(self.config.backend,
                                        AttnSpec.of(q, k, v, window=None, sinks=self.sinks))
            o = _attend(backend, q, k, v, self.scale, self.sinks)  # [B, H, T, dv]
        else:  # absorbed form over the cached latents: one shared key/value head
            q_nope, q_rope = self.queries(x, cache.length)
            latent, k_rope = cache.append(*self.latents(x, cache.length))  # [B, Tk, R], [.., dr]
            w_uk, w_uv = self.absorbed_weights(x.dtype)
            q_lat = torch.cat((q_nope @ w_uk, q_rope), -1)  # [B, H, T, R + dr]
            k_lat = torch.cat((latent, k_rope), -1)[:, None]  # [B, 1, Tk, R + dr]
            v_lat = latent[:, None]  # [B, 1, Tk, R]
            backend = ATTENTION.resolve(self.config.backend,
                                        AttnSpec.of(q_lat, k_lat, v_lat, window=None,
                                                    sinks=self.sinks))
            o = _attend(backend, q_lat, k_lat, v_lat, self.scale, self.sinks) \
                @ w_uv.transpose(1, 2)
        self._backend = backend.name
        return F.linear(o.transpose(1, 2).reshape(B, T, -1), self._w(self.o_proj, x.dtype))

    def _init_cache(self, batch: int, max_len: int) -> LatentCache:
        c, p = self.config, self.kv_down.weight
        return LatentCache(p.new_zeros(batch, max_len, c.latent),
                           p.new_zeros(batch, max_len, c.rope_dim))

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """softmax probabilities [B, H, T, T], recomputed on the reference path."""
        q, k, _ = self.project(x)
        return attention_probs(q, k, window=None, scale=self.scale, sinks=self.sinks)

    def _mixing_operator(self, x: torch.Tensor) -> budgets.AttentionMixing:
        q, k, _ = self.project(x)  # [B, H, T, dn + dr] each
        return budgets.AttentionMixing(q, k, self.scale, sinks=self.sinks)

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The value path per head [B, H, T, dv]: y = o_proj(P @ value_heads(x))."""
        return self._up(self.latents(x, 0)[0])[1]

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        """qk [H, D, D] (per head W_Q^h^T W_K^h, the nope part through the latent and the
        shared RoPE key), value [D, H*dv] (W_UV diag(g) W_DKV), out [D, H*dv]. The norms'
        gains are folded in; their per-token 1/rms scale is not a weight and is left out."""
        c = self.config
        H, R = c.n_heads, c.latent
        if c.q_lora_rank is None:
            wq = self.q_proj.weight.float()  # [H*(dn+dr), D]
        else:
            wq = self.q_up.weight.float() @ (self.q_norm.weight.float()[:, None]
                                             * self.q_down.weight.float())
        wq = wq.view(H, c.qk_dim, c.d_model)
        w_down = self.kv_down.weight.float()
        w_dkv = self.kv_norm.weight.float()[:, None] * w_down[:R]  # [R, D]
        w_kr = w_down[R:]  # [dr, D]
        w_uk, w_uv = (w.float() for w in self.absorbed_weights(torch.float32))
        wk = torch.cat((w_uk @ w_dkv, w_kr.expand(H, -1, -1)), dim=1)  # [H, dn + dr, D]
        return {
            "qk": wq.transpose(1, 2) @ wk,  # [H, D, D], rank <= dn + dr
            "value": (w_uv.reshape(H * c.value_dim, R) @ w_dkv).T,  # [D, H*dv]
            "out": self.o_proj.weight.float().clone(),  # [D, H*dv]
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """The latent, one head of width R; the RoPE key beside it cached in full."""
        c = self.config
        return (CacheSlot("latent", 1, c.latent, fixed_per_token=c.rope_dim),)

    def describe_cache(self) -> str:
        c = self.config
        return f"latent R {c.latent} (+ RoPE key {c.rope_dim}, kept)"

    def cache_readout(self, x: torch.Tensor) -> CacheReadout:
        """What reads the latent: each head's queries of the keys' nope part (the RoPE
        part reads the RoPE key, not the latent), the attention, the values per head and
        W_O, for x [B, T, D]."""
        q, _, v = self.project(x)  # [B, H, T, dn + dr], [B, H, T, dv]
        q_nope = q[..., :self.config.nope_dim]
        return CacheReadout(q_nope, self.mixing_matrices(x), v, self.o_proj.weight,
                            self.scale ** 2, False)

    def inference_state(self, cache: LatentCache) -> dict[str, torch.Tensor]:
        n = cache.length
        return {"latent": cache.latent[:, :n], "rope_key": cache.rope_key[:, :n]}

    def _budget(self, seq_len: int) -> RankBudget:
        c = self.config
        D, H, R, T = c.d_model, c.n_heads, c.latent, seq_len
        dn, dr, dv = c.nope_dim, c.rope_dim, c.value_dim
        if c.q_lora_rank is None:
            q_flops = 2 * D * H * (dn + dr)
        else:
            q_flops = 2 * c.q_lora_rank * (D + H * (dn + dr))
        return RankBudget(
            block=self.kind, seq_len=T, n_heads=H,
            mixing=T // 2,  # a full softmax over the past
            logits=dn + dr,
            value_path=min(D, R, H * dv),  # W_UV W_DKV factors through the latent
            inference=min(T, R + dr),  # the cache [c ; k_r] is T x (R + dr)
            params=self.param_count(),
            cache_elements=T * (R + dr),
            # projections (explicit form), plus QK^T over dn + dr and PV over dv per head
            flops_per_token=(q_flops + 2 * D * (R + dr) + 2 * R * H * (dn + dv)
                             + 2 * H * dv * D + 2 * H * (dn + dr + dv) * (T + 1) // 2),
        )
