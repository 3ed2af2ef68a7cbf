"""MoE-routed attention: a router sends each token to the top-k of E expert heads.

Follows MoA, "Mixture of Attention Heads: Selecting Attention Heads Per Token" (Zhang,
Shen, Huang, Ge, Wang, Zhou & Xiong, EMNLP 2022, arXiv:2210.05144): the E experts are
attention heads with their own query and output projections, sharing one key and one value
projection, so keys and values are computed (and cached) once per token, like MQA:

    p        = softmax(W_g x_t)                               # [E] router probabilities
    e_1..e_k = top-k of p (ordered by p, largest first)       # the token's heads ("slots")
    o_j      = softmax(q_{e_j}(x_t) . K^T / sqrt(K)) V        # head e_j's attention for x_t
    y_t      = sum_j p_{e_j} W_O^{e_j} o_j

Gates are the router's probabilities of the chosen heads as in the Switch Transformer,
not renormalized over the top-k, so that even at k = 1 the router learns from the main loss.

Fused path (`forward`): tokens are sorted by expert and each expert's query and output
projection runs on its own tokens only; attention runs once over k query "slots" per token
against the shared K/V (an MQA call: H = k, G = 1) on the configured attention backend. Its
cost grows with k, not E (beside the router's D x E). `dense_forward` is the reference: all
E heads for every token, combined with zero gates for the unchosen ones.

Auxiliary loss: every forward sets `self.aux_loss`, a scalar tensor with grad through the
router: `aux_loss_weight * E * sum_e f_e * P_e` (Switch Transformer's load-balancing loss;
MoA uses the same kind), where f_e is the fraction of (token, slot) assignments routed to
head e and P_e the mean router probability of e. It is 1 * weight at perfect balance and
E * weight when one head takes everything. The harness adds `aux_loss` to the training
loss of each block that has it, and logs it; `self.balance` holds the unweighted value.

The rank story: as softmax attention per active head (mixing T/2, logits K), with the
value path and the KV cache of the single shared head: min(D, V) and min(T, K).
`mixing_matrices` returns the routed heads' weights per slot: [B, k, T, T], where row t of
slot j is the attention of token t's j-th head (`routing(x)` says which head and gate).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from budgets import RankBudget, attention_budget

from .block import Block, CacheSlot, apply_linear
from .config import StrictConfig, positive_int, require
from .facts import Facts, Sizing
from .ops.attention import ATTENTION, AttnSpec, attention_probs, reference_attention
from .registry import register
from .rope import apply_rope
from .softmax import KVCache


@dataclass(frozen=True)
class MoEConfig(StrictConfig):
    owner: ClassVar[str] = "moe"

    d_model: int
    n_heads: int  # E: expert heads
    top_k: int = 2  # k: heads each token uses
    head_dim: int | None = None  # K (= V); None: d_model // n_heads
    rope: bool = True
    rope_base: float = 10000.0
    aux_loss_weight: float = 0.01
    backend: str = "auto"

    def validate(self) -> None:
        positive_int(self.owner, d_model=self.d_model, n_heads=self.n_heads, top_k=self.top_k)
        require(self.top_k <= self.n_heads,
                f"top_k ({self.top_k}) must not exceed n_heads ({self.n_heads}), the number "
                "of expert heads E")
        if self.head_dim is None:
            require(self.d_model % self.n_heads == 0,
                    f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        else:
            positive_int(self.owner, head_dim=self.head_dim)
        require(not self.rope or self.k_dim % 2 == 0,
                f"RoPE needs an even head_dim, got {self.k_dim}")
        require(self.rope_base > 0, f"rope_base must be positive, got {self.rope_base}")
        require(self.aux_loss_weight >= 0,
                f"aux_loss_weight must be >= 0, got {self.aux_loss_weight}")
        ATTENTION.check(self.backend)

    @property
    def k_dim(self) -> int:
        return self.head_dim or self.d_model // self.n_heads


def _expert_init(*shape: int, fan_in: int) -> nn.Parameter:
    """nn.Linear's default init for a stack of E weight matrices."""
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


@register("moe")
class MoEAttention(Block):
    Config = MoEConfig
    facts = Facts(
        Sizing("top_k", lambda kw, D, T: range(1, kw["n_heads"] + 1),  # k of E heads
               "k",
               "k = top_k: expert heads each token uses, of E = n_heads; one key/value head "
               "is shared by all (it caches like MQA), so k sets the FLOPs, not the cache",
               lambda c: f"k={c.top_k} of E={c.n_heads}",
               state=("head_dim", lambda kw, D, T: range(1, 4 * D + 1))),  # K = V of all
        cache="kv")

    def __init__(self, config: MoEConfig):
        super().__init__(config)
        c = config
        E, K, D = c.n_heads, c.k_dim, c.d_model
        self.router = nn.Linear(D, E, bias=False)
        self.q_experts = _expert_init(E, K, D, fan_in=D)  # W_Q^e [K, D]
        self.add_projections(k=K, v=K)  # one key and one value, shared by all heads
        self.o_experts = _expert_init(E, D, K, fan_in=K)  # W_O^e [D, V]
        self.aux_loss: torch.Tensor | None = None  # set by every forward
        self.balance: torch.Tensor | None = None

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """E = n_heads expert heads with k = 1 and k = 2 (when E allows it)."""
        presets = [(f"moe (top-1 of {n_heads})", {"top_k": 1})]
        if n_heads >= 2:
            presets.append((f"moe (top-2 of {n_heads})", {"top_k": 2}))
        return presets

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.config.k_dim)

    # -- routing -------------------------------------------------------------------------
    def router_probs(self, x: torch.Tensor) -> torch.Tensor:
        """softmax(W_g x) [B, T, E], in fp32 for a stable top-k and loss."""
        return torch.softmax(apply_linear(self.router, x).float(), dim=-1)

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """experts [B, T, k] (largest probability first) and their gates [B, T, k] (fp32)."""
        gates, experts = self.router_probs(x).topk(self.config.top_k, dim=-1, sorted=True)
        return experts, gates

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """routing(x), and the load-balancing loss it implies stored on the block."""
        c = self.config
        probs = self.router_probs(x)  # [B, T, E]
        gates, experts = probs.topk(c.top_k, dim=-1, sorted=True)
        counts = torch.bincount(experts.reshape(-1), minlength=c.n_heads).to(probs.dtype)
        share = counts / experts.numel()  # f_e: fraction of assignments, sums to 1
        self.balance = c.n_heads * (share * probs.mean(dim=(0, 1))).sum()
        self.aux_loss = c.aux_loss_weight * self.balance
        return experts, gates

    # -- projections ---------------------------------------------------------------------
    def _rope(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        return apply_rope(t, offset, self.config.rope_base) if self.config.rope else t

    def keys_values(self, x: torch.Tensor, offset: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The one key [B, 1, T, K] (rotated) and value [B, 1, T, V] all heads share: what
        the cache holds, the one place every path takes them from."""
        k = apply_linear(self.k_proj, x)[:, None]
        v = apply_linear(self.v_proj, x)[:, None]
        return self._rope(k, offset), v

    def _dispatch(self, experts: torch.Tensor):
        """Sort the B*T*k (token, slot) assignments by expert: order, tokens, counts."""
        flat = experts.reshape(-1)  # [N k]
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.config.n_heads).tolist()
        return order, order // self.config.top_k, counts

    def _slot_queries(self, x: torch.Tensor, order, tokens, counts) -> torch.Tensor:
        """Each (token, slot)'s query from its own expert only: [N k, K] in slot order."""
        x_flat = x.reshape(-1, x.shape[-1])[tokens]  # [N k, D], sorted by expert
        w = self.q_experts.to(x.dtype)
        pieces = [chunk @ w[e].T for e, chunk in enumerate(x_flat.split(counts)) if counts[e]]
        q_sorted = torch.cat(pieces)  # [N k, K]
        return torch.empty_like(q_sorted).index_copy(0, order, q_sorted)

    def _combine(self, o: torch.Tensor, gates, order, tokens, counts, n_tokens) -> torch.Tensor:
        """sum_j gate_j W_O^{e_j} o_j per token: o [N k, V] in slot order -> [N, D]."""
        o_sorted = o[order] * gates.reshape(-1)[order, None].to(o.dtype)  # [N k, V]
        w = self.o_experts.to(o.dtype)
        pieces = [chunk @ w[e].T for e, chunk in enumerate(o_sorted.split(counts)) if counts[e]]
        y = o.new_zeros(n_tokens, self.config.d_model)
        return y.index_add(0, tokens, torch.cat(pieces))  # [N, D]

    # -- forward paths -------------------------------------------------------------------
    def _forward(self, x: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """The fused path: k heads per token, never all E (see the module docstring)."""
        c = self.config
        B, T, D = x.shape
        offset = cache.length if cache is not None else 0
        experts, gates = self._route(x)  # [B, T, k]
        order, tokens, counts = self._dispatch(experts)
        q = self._slot_queries(x, order, tokens, counts).view(B, T, c.top_k, -1)
        q = self._rope(q.transpose(1, 2), offset)  # [B, k, T, K]: slot j of every token
        k, v = self.keys_values(x, offset)
        if cache is not None:
            k, v = cache.append(k, v)  # [B, 1, Tk, K]
        backend = ATTENTION.resolve(c.backend, AttnSpec.of(q, k, v, window=None))
        self._backend = backend.name
        o = backend.fn(q, k, v, window=None, scale=self.scale)  # [B, k, T, V]
        o = o.transpose(1, 2).reshape(B * T * c.top_k, -1)  # [N k, V] in slot order
        return self._combine(o, gates, order, tokens, counts, B * T).view(B, T, D)

    def dense_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reference: all E heads for every token, zero gates for the unchosen ones."""
        self.check_input(x)
        c = self.config
        experts, gates = self._route(x)
        dense_gates = torch.zeros(*x.shape[:2], c.n_heads, dtype=gates.dtype, device=x.device)
        dense_gates = dense_gates.scatter(-1, experts, gates).to(x.dtype)  # [B, T, E]
        q = torch.einsum("btd,ekd->betk", x, self.q_experts.to(x.dtype))  # [B, E, T, K]
        k, v = self.keys_values(x)
        o = reference_attention(self._rope(q, 0), k, v, window=None, scale=self.scale)
        heads = torch.einsum("betv,edv->betd", o, self.o_experts.to(x.dtype))  # [B, E, T, D]
        return torch.einsum("bte,betd->btd", dense_gates, heads)

    def _init_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.k_proj.weight
        shape = (batch, 1, max_len, self.config.k_dim)
        return KVCache(p.new_zeros(shape), p.new_zeros(shape))

    # -- probes --------------------------------------------------------------------------
    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """The routed heads' weights per slot [B, k, T, T] (reference path): row t of slot j
        is token t's attention through its j-th head, routing(x)[0][:, t, j].

        y = sum_j gate_j * W_O^{e_j} (P[:, j] @ value_heads(x))  (see `routing`)."""
        experts, _ = self.routing(x)  # [B, T, k]
        q_all = torch.einsum("btd,ekd->btek", x, self.q_experts.float())  # [B, T, E, K]
        q = q_all.gather(2, experts[..., None].expand(-1, -1, -1, q_all.shape[-1]))
        k, _ = self.keys_values(x)
        return attention_probs(self._rope(q.transpose(1, 2), 0), k, window=None,
                               scale=self.scale)

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The shared value head [B, 1, T, V]."""
        return self.keys_values(x)[1]

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        wq, wk = self.q_experts.float(), self.k_proj.weight.float()  # [E, K, D], [K, D]
        return {
            "qk": wq.transpose(1, 2) @ wk,  # [E, D, D]: each expert's W_Q^e^T W_K
            "value": self.v_proj.weight.float().T.clone(),  # [D, V]
            "out": self.o_experts.float().transpose(0, 1).reshape(self.config.d_model, -1),
        }

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """The shared key and value, one KV head (as MQA)."""
        K = self.config.k_dim
        return CacheSlot("k", 1, K), CacheSlot("v", 1, K)

    def describe_cache(self) -> str:
        K = self.config.k_dim
        return f"1 KV heads x (K {K} + V {K})"

    def cache_readout(self, x: torch.Tensor) -> None:
        """None: the queries and outputs that read the cache are the routed experts', no
        one W_O (compress fits energy bases)."""
        return None

    def inference_state(self, cache: KVCache) -> dict[str, torch.Tensor]:
        n = cache.length
        return {"k": cache.k[:, 0, :n], "v": cache.v[:, 0, :n]}  # [B, T, K], [B, T, V]

    def _budget(self, seq_len: int) -> RankBudget:
        """Per active head (n_heads = k, as mixing_matrices returns): softmax's caps for k
        query heads over the one shared K/V head (MQA), plus the router's FLOPs."""
        c = self.config
        shared = attention_budget(self.kind, seq_len, c.top_k, 1, c.k_dim, c.d_model,
                                  params=self.param_count())
        router = 2 * c.d_model * c.n_heads  # W_g x: D x E
        return dataclasses.replace(shared, flops_per_token=shared.flops_per_token + router)
