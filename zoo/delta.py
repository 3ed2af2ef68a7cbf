"""The delta rule: DeltaNet (Yang et al. 2024), Gated DeltaNet (Yang, Kautz & Hatamizadeh
2025; Qwen3-Next's linear layers) and Kimi Delta Attention (Kimi Linear, 2025), one family
told apart by `gate`: none, scalar (GDN) or channel (KDA).

    q, k, v = silu(causal depthwise conv(q_proj x, k_proj x, v_proj x))     width d_conv
    q, k = l2norm(q) / sqrt(K), l2norm(k);  b = sigmoid(b_proj x)
    log a = -exp(A_log) softplus(a_proj x + dt_bias)        one per head (GDN), or per key
                                                            channel from f_proj (KDA)
    S_t = (I - b_t k_t k_t^T) D_t S_{t-1} + b_t k_t v_t^T,  o_t = S_t^T q_t   (D_t = diag(a_t))
    y = o_proj(rmsnorm(o) * act(g_proj x))                  per head; act silu (GDN), sigmoid (KDA)

Value heads may outnumber query/key heads (n_v_heads, a multiple of n_heads: each group of
value heads reads one key head, as Qwen3-Next does); gates and b are per value head. KDA's
decay comes through a low-rank f_proj (D -> V -> H K) as Kimi's; its output gate here is
one full projection like GDN's (Kimi's is low-rank).

The rank story (budgets/mixing/delta.py): every value channel of a head is mixed by one
T x T matrix M in closed form, whose past->future block has rank <= K (one K x K product of
transitions carries the past), the logits q . k rank K, the state K x V per value head
(plus the conv state of d_conv - 1 inputs).

Paths: the chunked WY/UT form in pure torch (the training path, linear in T), the per-token
recurrence (the reference; one-token decoding steps take it under `auto`), fla's chunk
kernels on CUDA (opt-in: `backend: fla`; see zoo/ops/delta). The short convolution runs on
torch's conv1d, or causal-conv1d's kernel on CUDA when installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

import budgets
from budgets import RankBudget
from budgets.mixing.delta import delta_caps, delta_factors, delta_mixing

from .block import Block, CacheSlot, apply_linear, decode_step_backend
from .config import StrictConfig, positive_int, require
from .facts import Check, Facts, Sizing
from .ops.conv import CONV, ConvSpec
from .ops.delta import DELTA, DeltaSpec
from .registry import register
from .ssm import check_decay_init, decay_init

GATES = {"none": "DeltaNet", "scalar": "GDN", "channel": "KDA"}
OUTPUT_GATES = ("silu", "sigmoid", "none")
L2_EPS = 1e-6  # under the square root of q's and k's norms, as fla's kernels add it


@dataclass(frozen=True)
class DeltaConfig(StrictConfig):
    owner: ClassVar[str] = "delta"

    d_model: int
    n_heads: int  # H: query and key heads
    gate: str = "scalar"  # none (DeltaNet), scalar (Gated DeltaNet), channel (KDA)
    key_dim: int | None = None  # K per head; None: d_model / n_heads
    value_dim: int | None = None  # V per value head; None: d_model / n_heads
    n_v_heads: int | None = None  # value heads, a multiple of n_heads; None: n_heads
    d_conv: int = 4  # width of the causal short convolution on q, k and v
    output_gate: str = "silu"  # on the normed output: silu (GDN), sigmoid (KDA), none
    chunk_size: int = 64  # C, of the chunked path
    dt_min: float = 1e-3  # initial step sizes are log-uniform in [dt_min, dt_max]
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    a_init_min: float = 1.0  # initial exp(A_log) is uniform in [a_init_min, a_init_max]
    a_init_max: float = 16.0
    norm_eps: float = 1e-5
    conv_bias: bool = False
    backend: str = "auto"  # the delta rule's kernel
    conv_backend: str = "auto"  # the causal conv

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads,
                     d_conv=self.d_conv, chunk_size=self.chunk_size)
        for name in ("key_dim", "value_dim", "n_v_heads"):
            if getattr(self, name) is not None:
                positive_int(self.owner, **{name: getattr(self, name)})
        require(self.gate in GATES, f"gate {self.gate!r} unknown; known: {list(GATES)} "
                                    f"({', '.join(GATES.values())})")
        require(self.output_gate in OUTPUT_GATES,
                f"output_gate {self.output_gate!r} unknown; known: {list(OUTPUT_GATES)}")
        require((self.key_dim and self.value_dim) or self.d_model % self.n_heads == 0,
                f"n_heads ({self.n_heads}) must divide d_model ({self.d_model}), or set "
                f"key_dim and value_dim")
        require(self.v_heads % self.n_heads == 0,
                f"n_v_heads ({self.n_v_heads}) must be a multiple of n_heads ({self.n_heads})")
        require(self.d_conv >= 2, f"d_conv ({self.d_conv}) must be at least 2: the short "
                                  f"convolution reads the current token and the ones before")
        check_decay_init(self)
        DELTA.check(self.backend)
        CONV.check(self.conv_backend)

    @property
    def k_dim(self) -> int:  # K
        return self.key_dim or self.d_model // self.n_heads

    @property
    def v_dim(self) -> int:  # V
        return self.value_dim or self.d_model // self.n_heads

    @property
    def v_heads(self) -> int:  # Hv
        return self.n_v_heads or self.n_heads

    @property
    def conv_dim(self) -> int:  # channels through the conv: q, k and v
        return 2 * self.n_heads * self.k_dim + self.v_heads * self.v_dim


@dataclass
class DeltaCache:
    """The last d_conv - 1 conv inputs and the delta-rule state per value head."""

    conv_state: torch.Tensor  # [B, conv_dim, d_conv - 1]
    state: torch.Tensor  # [B, Hv, K, V]
    length: int = 0


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2_EPS)


@register("delta")
class DeltaRule(Block):
    Config = DeltaConfig
    facts = Facts(
        Sizing("key_dim", lambda kw, D, T: range(1, 4 * D + 1),
               "K",
               "K = key_dim: the delta rule's key width per head; its state is K x V per "
               "value head (V = value_dim), plus the short convolution's last d_conv - 1 "
               "inputs, at any length",
               lambda c: (f"K={c.k_dim}, V={c.v_dim}"
                          + (f", Hv={c.v_heads}" if c.v_heads != c.n_heads else ""))),
        cache="state", state_row="inference.state", mirrors=("delta",),
        checks=(Check("cheaper_block", "delta_k{n}", lambda n: {"block": "delta", "key_dim": n},
                      "a delta rule (Gated DeltaNet, KDA) with K = {n}"),))

    def __init__(self, config: DeltaConfig):
        super().__init__(config)
        c = config
        H, Hv, K, V, D = c.n_heads, c.v_heads, c.k_dim, c.v_dim, c.d_model
        self.add_projections(q=H * K, k=H * K, v=Hv * V, o=Hv * V)
        self.conv1d = nn.Conv1d(c.conv_dim, c.conv_dim, c.d_conv, groups=c.conv_dim,
                                bias=c.conv_bias)
        self.b_proj = nn.Linear(D, Hv, bias=False)
        if c.gate == "scalar":
            self.a_proj = nn.Linear(D, Hv, bias=False)
        elif c.gate == "channel":  # Kimi's low-rank decay projection
            self.f_proj = nn.Sequential(nn.Linear(D, V, bias=False),
                                        nn.Linear(V, Hv * K, bias=False))
        if c.gate != "none":
            # GDN's initialization for both gates (Kimi starts dt_bias at zero)
            width = Hv if c.gate == "scalar" else Hv * K
            dt_bias, A_log = decay_init(c, width, Hv)
            self.dt_bias, self.A_log = nn.Parameter(dt_bias), nn.Parameter(A_log)
        if c.output_gate != "none":
            self.g_proj = nn.Linear(D, Hv * V, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(V))
        self._conv_backend = "unresolved"

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """DeltaNet, Gated DeltaNet and KDA, each with K = V = D/H."""
        return [("delta (DeltaNet)", {"gate": "none"}),
                ("delta (GDN)", {"gate": "scalar"}),
                ("delta (KDA)", {"gate": "channel", "output_gate": "sigmoid"})]

    @property
    def backend(self) -> str:
        """The delta rule's backend and the conv's, as `rule+conv`, e.g. `chunked+conv1d`."""
        return f"{self._backend}+{self._conv_backend}"

    # ---------------------------------------------------------------- paths

    def features(self, x: torch.Tensor, cache: DeltaCache | None = None):
        """q, k per query/key head [B, H, T, K] as the recurrence reads them (k through
        write_rows), v per value head [B, Hv, T, V], and the conv state after x."""
        c = self.config
        qkv = torch.cat([apply_linear(p, x) for p in (self.q_proj, self.k_proj, self.v_proj)],
                        dim=-1).transpose(1, 2)  # [B, conv_dim, T]; bf16 under autocast
        weight = self.conv1d.weight[:, 0].to(qkv.dtype)  # [conv_dim, W]
        bias = None if self.conv1d.bias is None else self.conv1d.bias.to(qkv.dtype)
        requested = decode_step_backend(c.conv_backend, cache, x.shape[1], step="reference")
        conv = CONV.resolve(requested, ConvSpec.of(qkv, weight))
        self._conv_backend = conv.name
        qkv, conv_state = conv.fn(qkv, weight, bias, activation="silu",
                                  initial_state=None if cache is None else cache.conv_state)
        HK = c.n_heads * c.k_dim
        q, k, v = qkv.transpose(1, 2).split([HK, HK, c.v_heads * c.v_dim], dim=-1)
        q = l2norm(q.unflatten(-1, (c.n_heads, -1)).transpose(1, 2)) * c.k_dim ** -0.5
        k = self.write_rows(l2norm(k.unflatten(-1, (c.n_heads, -1)).transpose(1, 2)))
        v = v.unflatten(-1, (c.v_heads, -1)).transpose(1, 2)  # [B, Hv, T, V]
        return q, k, v, conv_state

    def log_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """log a_t = -exp(A_log) softplus(proj x + dt_bias): [B, Hv, T] (scalar), [B, Hv, T,
        K] (channel), None (DeltaNet)."""
        c = self.config
        if c.gate == "none":
            return None
        A = -torch.exp(self.A_log.to(x.dtype))  # [Hv]
        if c.gate == "scalar":
            dt = F.softplus(apply_linear(self.a_proj, x) + self.dt_bias.to(x.dtype))  # [B,T,Hv]
            return (A * dt).transpose(1, 2)
        f = apply_linear(self.f_proj[1], apply_linear(self.f_proj[0], x))  # [B, T, Hv * K]
        dt = F.softplus(f + self.dt_bias.to(x.dtype)).unflatten(-1, (c.v_heads, c.k_dim))
        return (A[:, None] * dt).transpose(1, 2)  # [B, Hv, T, K]

    def project(self, x: torch.Tensor, cache: DeltaCache | None = None):
        """The op's inputs per value head: q, k [B, Hv, T, K] (each key head repeated for
        its value heads), v [B, Hv, T, V], beta [B, Hv, T], the log gate; the conv state."""
        q, k, v, conv_state = self.features(x, cache)
        group = self.config.v_heads // self.config.n_heads
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        beta = torch.sigmoid(apply_linear(self.b_proj, x)).transpose(1, 2)  # [B, Hv, T]
        return q, k, v, beta, self.log_gate(x), conv_state

    def write_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """k [B, H, T, K], the writer of the state's K rows, as every path takes it: the
        identity (compress wraps it to project the rows)."""
        return rows

    def state_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What writes the state's rows and what reads them: k, q [B, H, T, K]."""
        q, k = self.features(x)[:2]
        return k, q

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The values the rule mixes, per value head [B, Hv, T, V]: the conv's v channels."""
        return self.features(x)[2]

    def readout(self, mixed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[B, Hv, T, V] mixed values -> y [B, T, D]: RMSNorm per head, the output gate
        (needs x), o_proj."""
        c = self.config
        o = mixed.transpose(1, 2)  # [B, T, Hv, V]
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + c.norm_eps)
        o = o * self.norm_weight.to(o.dtype)
        if c.output_gate != "none":
            gate = apply_linear(self.g_proj, x).unflatten(-1, (c.v_heads, c.v_dim))
            o = o * (F.silu(gate) if c.output_gate == "silu" else torch.sigmoid(gate))
        return apply_linear(self.o_proj, o.flatten(2))  # [B, T, D]

    def _forward(self, x: torch.Tensor, cache: DeltaCache | None) -> torch.Tensor:
        c = self.config
        want = (c.v_heads, c.k_dim, c.v_dim)
        if cache is not None and tuple(cache.state.shape[1:]) != want:
            raise ValueError(f"delta cache holds a state of shape {tuple(cache.state.shape)}; "
                             f"this block needs [B, {', '.join(map(str, want))}]")
        q, k, v, beta, g, conv_state = self.project(x, cache)
        requested = decode_step_backend(c.backend, cache, x.shape[1], step="reference")
        op = DELTA.resolve(requested, DeltaSpec.of(q, v, beta, g))
        self._backend = op.name
        o, state = op.fn(q, k, v, beta, g, chunk_size=c.chunk_size,
                         initial_state=None if cache is None else cache.state)
        if cache is not None:
            cache.conv_state = conv_state.to(cache.conv_state.dtype)
            cache.state = state.to(cache.state.dtype)
            cache.length += x.shape[1]
        return self.readout(o, x)

    def _init_cache(self, batch: int, max_len: int) -> DeltaCache:
        """Zero states; their size does not depend on max_len (accepted for the contract)."""
        c, p = self.config, self.q_proj.weight
        return DeltaCache(p.new_zeros(batch, c.conv_dim, c.d_conv - 1),
                          p.new_zeros(batch, c.v_heads, c.k_dim, c.v_dim))

    def _closed_form_inputs(self, x: torch.Tensor):
        """q, k, beta and the log gate in fp64: the closed form's T x T triangular solve and
        its running gate sums keep the digits in fp64 that the rank metrics read."""
        q, k, _, beta, g, _ = self.project(x)
        return q.double(), k.double(), beta.double(), None if g is None else g.double()

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """M [B, Hv, T, T] in closed form (budgets/mixing/delta.py), so that

            y == self.readout(M @ self.value_heads(x), x)

        where readout norms each head, gates it and projects."""
        return delta_mixing(*self._closed_form_inputs(x)).to(x.dtype)

    def _mixing_operator(self, x: torch.Tensor) -> budgets.FactoredMixing:
        """M's past->future block as L R^T through the K x K transition products at the
        split: rank <= K, no T x T tensor."""
        f = delta_factors(*self._closed_form_inputs(x))
        return budgets.FactoredMixing(f.L.to(x.dtype), f.R.to(x.dtype))

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        c = self.config
        wq = self.q_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        wk = self.k_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        return {
            "qk": wq.transpose(1, 2) @ wk,  # [H, D, D]: W_Q^h W_K^h^T (before conv), rank <= K
            "value": self.v_proj.weight.float().T,  # [D, Hv*V]
            "out": self.o_proj.weight.float(),  # [D, Hv*V]
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """The state per key head: K rows of V columns for each of its value heads; the conv
        state cached in full beside it."""
        c = self.config
        return (CacheSlot("state", c.n_heads, c.k_dim,
                          columns=c.v_heads // c.n_heads * c.v_dim,
                          fixed_per_sequence=c.conv_dim * (c.d_conv - 1)),)

    def describe_cache(self) -> str:
        c = self.config
        return (f"{c.n_heads} key heads x state K {c.k_dim} (x {c.v_heads // c.n_heads} value "
                f"heads x V {c.v_dim}), conv state kept")

    def inference_state(self, cache: DeltaCache) -> dict[str, torch.Tensor]:
        """The state S per value head [B, Hv, K, V] and the conv state [B, conv_dim,
        d_conv - 1] (its last inputs: rank <= d_conv - 1)."""
        return {"state": cache.state, "conv": cache.conv_state}

    def _budget(self, seq_len: int) -> RankBudget:
        c = self.config
        linears = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return delta_caps(self.kind, seq_len, c.d_model, c.v_heads, c.k_dim, c.v_dim,
                          self.param_count(), conv_state=c.conv_dim * (c.d_conv - 1),
                          proj_flops=2 * linears + 2 * c.conv_dim * c.d_conv)
