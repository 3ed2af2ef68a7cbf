"""A Mamba-2 block: the SSD state-space layer (Dao & Gu 2024, "Transformers are SSMs").

    [z, x, B, C, dt] = in_proj(u)                       u [B, T, D]
    x, B, C = silu(causal depthwise conv(x, B, C))      width d_conv
    dt = softplus(dt + dt_bias),  A = -exp(A_log)       one decay per head
    y = SSD(x, dt, A, B, C) + D * x                     state N per head, B/C in G groups
    out = out_proj(rmsnorm(y * silu(z)))                gated norm, per group

The rank story: per head the scan is y = M x with M[t, s] = (C_t . B_s) exp(dt_{s+1} A + ...
+ dt_t A) dt_s, an N-semiseparable matrix (every block below the diagonal has rank <= N), so
the past->future block M[T/2:, :T/2] has rank <= N; the logits C_t . B_s have rank <= N; the
inference state is P x N per head (plus a conv state of d_conv - 1 inputs).

Paths: chunked SSD in pure torch with a stable segment sum (the CPU training path, linear
in T), the sequential recurrence (the reference; one-token decoding steps take it under
`auto`), and mamba-ssm's `mamba_chunk_scan_combined` on CUDA when installed. The short
convolution runs on torch's conv1d, or causal-conv1d's kernel on CUDA when installed; a
one-token decoding step under `auto` takes the reference conv (W multiply-adds).
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
from budgets.mixing.ssd import ssd_caps, ssd_factors, ssd_mixing

from .block import Block, CacheSlot, apply_linear, decode_step_backend
from .config import StrictConfig, positive_int, positive_number, require
from .facts import Check, Facts, Sizing
from .ops.conv import CONV, ConvSpec
from .ops.ssd import SSD, SSDSpec
from .registry import register


@dataclass(frozen=True)
class SSMConfig(StrictConfig):
    owner: ClassVar[str] = "ssm"

    d_model: int
    n_heads: int  # H; the head dim P is expand * d_model / n_heads
    d_state: int = 16  # N
    expand: int = 2  # d_inner = expand * d_model
    n_groups: int = 1  # G: heads sharing one B and C
    d_conv: int = 4  # width of the causal depthwise convolution
    chunk_size: int = 64  # C, of the chunked path
    dt_min: float = 1e-3  # initial step sizes are log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    a_init_min: float = 1.0  # initial -A is uniform in [a_init_min, a_init_max]
    a_init_max: float = 16.0
    norm_eps: float = 1e-5
    bias: bool = False  # in_proj and out_proj
    conv_bias: bool = True
    backend: str = "auto"  # the SSD scan
    conv_backend: str = "auto"  # the causal conv

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads, d_state=self.d_state,
                     expand=self.expand, n_groups=self.n_groups, d_conv=self.d_conv,
                     chunk_size=self.chunk_size)
        require(self.d_inner % self.n_heads == 0,
                f"n_heads ({self.n_heads}) must divide d_inner = expand * d_model "
                f"({self.expand} * {self.d_model} = {self.d_inner})")
        require(self.n_heads % self.n_groups == 0,
                f"n_groups ({self.n_groups}) must divide n_heads ({self.n_heads})")
        check_decay_init(self)
        SSD.check(self.backend)
        CONV.check(self.conv_backend)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def head_dim(self) -> int:  # P
        return self.d_inner // self.n_heads

    @property
    def conv_dim(self) -> int:  # channels through the conv: x, B and C
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclass
class SSMCache:
    """The last d_conv - 1 conv inputs and the SSM state per head."""

    conv_state: torch.Tensor  # [B, conv_dim, d_conv - 1]
    ssm_state: torch.Tensor  # [B, H, P, N]
    length: int = 0


def check_decay_init(c) -> None:
    """The decay initialization's settings (dt_min, dt_max, dt_init_floor, a_init_min,
    a_init_max, norm_eps) of a block with Mamba-2's decay: ssm, and delta's gates."""
    positive_number(c.owner, dt_min=c.dt_min, dt_max=c.dt_max,
                    dt_init_floor=c.dt_init_floor, a_init_min=c.a_init_min,
                    a_init_max=c.a_init_max, norm_eps=c.norm_eps)
    require(c.dt_min <= c.dt_max, f"dt_min ({c.dt_min}) must not exceed dt_max ({c.dt_max})")
    require(c.a_init_min <= c.a_init_max,
            f"a_init_min ({c.a_init_min}) must not exceed a_init_max ({c.a_init_max})")


def decay_init(c, n_dt: int, n_a: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dt_bias [n_dt], A_log [n_a]), Mamba-2's initialization: dt log-uniform in
    [dt_min, dt_max] through the inverse softplus, -A uniform in [a_init_min, a_init_max]."""
    dt = torch.exp(torch.rand(n_dt) * (math.log(c.dt_max) - math.log(c.dt_min))
                   + math.log(c.dt_min)).clamp(min=c.dt_init_floor)
    A_log = torch.log(torch.empty(n_a).uniform_(c.a_init_min, c.a_init_max))
    return dt + torch.log(-torch.expm1(-dt)), A_log


@register("ssm")
class Mamba2(Block):
    Config = SSMConfig
    facts = Facts(
        Sizing("d_state", lambda kw, D, T: range(1, 4 * D + 1),
               "N",
               "N = d_state: the Mamba-2 state per head, P x N with P = expand x D / H, plus "
               "the short convolution's last d_conv - 1 inputs, at any length",
               lambda c: f"N={c.d_state}, P={c.head_dim}"),
        cache="state", state_row="inference.state", mirrors=("ssm",),
        checks=(Check("cheaper_block", "ssm_n{n}", lambda n: {"block": "ssm", "d_state": n},
                      "an SSM with N = {n}"),))

    def __init__(self, config: SSMConfig):
        super().__init__(config)
        c = config
        H, N, G = c.n_heads, c.d_state, c.n_groups
        self.in_proj = nn.Linear(c.d_model, 2 * c.d_inner + 2 * G * N + H, bias=c.bias)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.d_conv, groups=c.conv_dim,
                                bias=c.conv_bias)
        dt_bias, A_log = decay_init(c, H, H)  # Mamba-2's; D = 1
        self.dt_bias, self.A_log = nn.Parameter(dt_bias), nn.Parameter(A_log)  # [H] each
        self.D = nn.Parameter(torch.ones(H))  # [H]
        self.norm_weight = nn.Parameter(torch.ones(c.d_inner))
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=c.bias)
        self._conv_backend = "unresolved"

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """Mamba-2 with N = 16 (the small-model default) and with N = 64."""
        return [("ssm (Mamba-2, N=16)", {"d_state": 16}),
                ("ssm (Mamba-2, N=64)", {"d_state": 64})]

    @property
    def backend(self) -> str:
        """The scan's backend and the conv's, as `scan+conv`, e.g. `chunked+conv1d`."""
        return f"{self._backend}+{self._conv_backend}"

    # ---------------------------------------------------------------- paths

    def project(self, x: torch.Tensor, cache: SSMCache | None = None):
        """z [B, T, d_inner], the scan's inputs x [B, T, H, P], dt [B, T, H], A [H],
        B, C [B, T, G, N], and the conv state [B, conv_dim, d_conv - 1] after x."""
        c = self.config
        b, T, _ = x.shape
        z, xbc, dt = apply_linear(self.in_proj, x).split([c.d_inner, c.conv_dim, c.n_heads],
                                                          dim=-1)
        xbc = xbc.transpose(1, 2)  # [B, conv_dim, T]; bf16 under autocast
        weight = self.conv1d.weight[:, 0].to(xbc.dtype)  # [conv_dim, W]
        conv_bias = None if self.conv1d.bias is None else self.conv1d.bias.to(xbc.dtype)
        requested = decode_step_backend(c.conv_backend, cache, T, step="reference")
        conv = CONV.resolve(requested, ConvSpec.of(xbc, weight))
        self._conv_backend = conv.name
        xbc, conv_state = conv.fn(xbc, weight, conv_bias, activation="silu",
                                  initial_state=None if cache is None else cache.conv_state)
        xs, B, C = xbc.transpose(1, 2).split(
            [c.d_inner, c.n_groups * c.d_state, c.n_groups * c.d_state], dim=-1)
        xs = xs.reshape(b, T, c.n_heads, c.head_dim)  # [B, T, H, P]
        B = B.reshape(b, T, c.n_groups, c.d_state)  # [B, T, G, N]
        B = self.write_rows(B.transpose(1, 2)).transpose(1, 2)  # the state's writer
        C = C.reshape(b, T, c.n_groups, c.d_state)  # [B, T, G, N]
        dt = F.softplus(dt + self.dt_bias.to(x.dtype))  # [B, T, H]
        A = -torch.exp(self.A_log.to(x.dtype))  # [H]
        return z, xs, dt, A, B, C, conv_state

    def write_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """B [B, G, T, N], the writer of the state's N rows per group, as every path takes
        it: the identity (compress wraps it to project the rows)."""
        return rows

    def state_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What writes the state's rows and what reads them: B, C [B, G, T, N]."""
        B, C = self.project(x)[4:6]  # [B, T, G, N] each
        return B.transpose(1, 2), C.transpose(1, 2)

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The values the scan mixes, per head [B, H, T, P]: the conv's x channels."""
        return self.project(x)[1].transpose(1, 2)

    def readout(self, mixed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[B, H, T, P] scan output -> y [B, T, D]: + D * x skip, gate by silu(z), group
        RMSNorm, out_proj. Needs x [B, T, D] for the gate z and the skip term."""
        z, xs = self.project(x)[:2]
        return self._readout(mixed.transpose(1, 2), xs, z)

    def _readout(self, y: torch.Tensor, xs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, T = y.shape[:2]
        y = y + self.D.to(y.dtype)[:, None] * xs  # [B, T, H, P]
        y = y.reshape(b, T, c.d_inner) * F.silu(z)  # gate before the norm (Mamba-2)
        g = y.view(b, T, c.n_groups, -1)  # [B, T, G, d_inner / G]
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        y = g.reshape(b, T, c.d_inner) * self.norm_weight.to(y.dtype)
        return apply_linear(self.out_proj, y)  # [B, T, D]

    def _forward(self, x: torch.Tensor, cache: SSMCache | None) -> torch.Tensor:
        c = self.config
        want = (c.n_heads, c.head_dim, c.d_state)
        if cache is not None and tuple(cache.ssm_state.shape[1:]) != want:
            raise ValueError(f"ssm cache holds a state of shape {tuple(cache.ssm_state.shape)}; "
                             f"this block needs [B, {', '.join(map(str, want))}]")
        z, xs, dt, A, B, C, conv_state = self.project(x, cache)
        requested = decode_step_backend(c.backend, cache, x.shape[1], step="reference")
        scan = SSD.resolve(requested, SSDSpec.of(xs, dt, B, C))
        self._backend = scan.name
        y, state = scan.fn(xs, dt, A, B, C, chunk_size=c.chunk_size,
                           initial_state=None if cache is None else cache.ssm_state)
        if cache is not None:
            cache.conv_state = conv_state.to(cache.conv_state.dtype)
            cache.ssm_state = state.to(cache.ssm_state.dtype)
            cache.length += x.shape[1]
        return self._readout(y, xs, z)

    def _init_cache(self, batch: int, max_len: int) -> SSMCache:
        """Zero states; their size does not depend on max_len (accepted for the contract)."""
        c, p = self.config, self.in_proj.weight
        return SSMCache(p.new_zeros(batch, c.conv_dim, c.d_conv - 1),
                        p.new_zeros(batch, c.n_heads, c.head_dim, c.d_state))

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """Each head's semiseparable matrix [B, H, T, T] (Mamba's "hidden attention",
        Ali et al. 2024): M[t, s] = (C_t . B_s) exp(sum_{s<r<=t} dt_r A) dt_s for s <= t,
        from budgets/mixing/ssd.py, where the captures of Hugging Face scans read it too.

        The scan's output is M @ value_heads(x) per head; the block's output is rebuilt as
            y == self.readout(M @ self.value_heads(x), x)
        where readout adds the D skip term, gates with silu(z), normalizes and projects.
        """
        _, _, dt, A, B, C, _ = self.project(x)  # dt [B, T, H], A [H], B and C [B, T, G, N]
        return ssd_mixing(dt, A, B, C)  # [B, H, T, T]

    def _mixing_operator(self, x: torch.Tensor) -> budgets.FactoredMixing:
        """The past->future block's factors, each decay split at the last past token so
        that neither grows (budgets/mixing/ssd.py): rank <= N."""
        _, _, dt, A, B, C, _ = self.project(x)  # dt [B, T, H], A [H], B and C [B, T, G, N]
        return ssd_factors(dt, A, B, C)  # [B, H, T - T/2, N] x [B, H, T/2, N]

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        c = self.config
        H, G, N, Di = c.n_heads, c.n_groups, c.d_state, c.d_inner
        w = self.in_proj.weight.float()  # rows: z, x, B, C, dt
        wx = w[Di:2 * Di]  # [d_inner, D]
        wb = w[2 * Di:2 * Di + G * N].view(G, N, c.d_model)
        wc = w[2 * Di + G * N:2 * Di + 2 * G * N].view(G, N, c.d_model)
        qk = (wc.transpose(1, 2) @ wb).repeat_interleave(H // G, dim=0)  # [H, D, D]
        return {
            "qk": qk,  # W_C^g W_B^g^T per head (before the conv): rank <= N
            "value": wx.T,  # [D, d_inner]: the x slice of in_proj
            "out": self.out_proj.weight.float(),  # [D, d_inner]
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """The state per B/C group: N rows of P columns for each of its heads (B is shared
        by a group's heads); the conv state cached in full beside it."""
        c = self.config
        return (CacheSlot("state", c.n_groups, c.d_state,
                          columns=c.n_heads // c.n_groups * c.head_dim,
                          fixed_per_sequence=c.conv_dim * (c.d_conv - 1)),)

    def describe_cache(self) -> str:
        c = self.config
        return (f"{c.n_groups} groups x state N {c.d_state} (x {c.n_heads // c.n_groups} "
                f"heads x P {c.head_dim}), conv state kept")

    def inference_state(self, cache: SSMCache) -> dict[str, torch.Tensor]:
        """The SSM state per head [B, H, P, N]. The conv state (d_conv - 1 inputs) is cached
        too but is not a state whose rank the budget caps."""
        return {"state": cache.ssm_state}

    def _budget(self, seq_len: int) -> RankBudget:
        """SSD's caps (budgets/mixing/ssd.py), with the short convolution's state cached
        beside the SSM's and the FLOPs of the projections and the conv counted exactly."""
        c = self.config
        H, N, G, D = c.n_heads, c.d_state, c.n_groups, c.d_model
        outside = (2 * D * (2 * c.d_inner + 2 * G * N + H)  # in_proj
                   + 2 * c.conv_dim * c.d_conv + 2 * c.d_inner * D)  # the conv, out_proj
        return ssd_caps(self.kind, seq_len, D, H, c.head_dim, N, self.param_count(),
                        conv_cache=c.conv_dim * (c.d_conv - 1), projection_flops=outside)
