"""Sparse attention: DeepSeek-V3.2's DSA (a lightning indexer's top-k keys), NSA (selected
blocks, compressed slots and a window under sigmoid gates) and MoBA (top-k blocks by their
mean keys), one family told apart by its knobs:

    selection: token    score(t, s) = sum_i w_i(t) relu(q_i(t) . k(s))   I heads of width d_I,
                        top_k keys per query among the causal ones (DSA's indexer)
               block    top_k blocks of block_size tokens by q . mean(k_block), the query's
                        own block always included (NSA's selected branch, MoBA)
    compress: none | mean | gated   slots of `rate` tokens, keys and values pooled by their
                        mean or by a softmax of learned per-token logits within the slot;
                        a slot is seen once complete
    local_window: W     the last W keys, the query included
    gate: sigmoid       y = o_proj(sum_b sigmoid(W_g x)_{h,b} o_b) per head (NSA); none: the
                        selection alone (DSA, MoBA)

Queries, keys and values are softmax's (RoPE, G KV heads; V = K). The token selection is
shared by all heads (DSA's MQA), the block selection is per KV head (NSA's GQA groups: the
group's queries summed). top_k >= T at forward time keeps every causal key: the selection
cannot bite there, and `budget(seq_len)` logs that it does not.

What trains the indexer: top-k is not differentiable, so the main loss never reaches the
indexer's weights (index_q, index_k, index_w). As DSA's sparse stage, every forward with
gradients sets `self.aux_loss` = indexer_loss_weight x KL(p || softmax(indexer scores)) over
the selected keys, where p is the selected branch's attention summed over heads and
detached, and the indexer reads x detached (its loss trains it alone). The harness adds
`aux_loss` to the training loss (train/harness/module.py); a loop that does not leaves the
indexer at its initialization. `dense_warmup: N` is DSA's dense warm-up
stage before it: for the first N training steps every query attends to every causal key
and the indexer's KL runs over all of them (the step: `set_step`, which the harness calls
every step and a resume restores; a loop that never calls it counts the block's own
training forwards, recomputed ones included). Unlike DeepSeek's, the rest of the model
trains through the warm-up too. Without it, an indexer starts from chance: at top 4 of 64
keys it rarely selects the one a query needs, and what it learns from is only the
attention over what it selected (configs/sparse.yaml).
The block selection has no weights of its own: its queries and keys learn as attention.

The rank story (budgets/mixing/sparse.py): M = sum of gated branches, token to token (a
slot's weight folded back through its pooling), and y = o_proj(M @ V) exactly; each query
picks its own keys, so M's past->future block reaches T/2 whatever top_k (mixing T/2, as
softmax); logits rank K; the cache keeps every token's keys and values, the indexer's keys
and the complete slots.

Paths (zoo/ops/sparse): `gathered` (chunks of queries over their gathered keys: T x k,
beside the indexer's T x T scores) and `reference` (every branch materialized). The
config, its validation and its text: zoo/sparse_config.py.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from budgets import RankBudget
from budgets.mixing.sparse import (
    compress,
    expand_heads,
    pending_elements,
    pool_weights,
    pooling_matrix,
    selection_mask,
    sparse_caps,
    sparse_mixing,
)

from .block import Block, CacheReadout, CacheSlot, apply_linear, split_heads
from .facts import Facts, Sizing, divisors
from .ops.precision import upcast_16bit
from .ops.sparse import SPARSE, SparseSpec
from .ops.sparse.select import block_selection, indexer_kl, slot_selection, token_selection
from .ops.sparse.stream import stream_slots, window_keys
from .registry import register
from .rope import apply_rope
from .sparse_config import COMPRESSED_ONLY, SparseConfig, covering, describe

__all__ = ["SparseAttention", "SparseCache", "SparseConfig", "covering", "describe"]

log = logging.getLogger("rankzoo")

@dataclass
class SparseCache:
    """Every token's keys and values, the indexer's keys, the complete slots and the
    pooling logits (empty where the config has no such part); `length` tokens filled. A
    compressed-only layer (selection slots or none) keeps instead its window's last W keys
    and values as a ring in k and v, and the incomplete slot's running pooling
    (zoo/ops/sparse/stream.py)."""

    k: torch.Tensor  # [B, G, max_len, K]
    v: torch.Tensor  # [B, G, max_len, V]
    index_k: torch.Tensor  # [B, max_len, d_I] (token selection; else d_I = 0)
    slot_k: torch.Tensor  # [B, G, max_len // rate, K] (compressed branch; else 0 slots)
    slot_v: torch.Tensor  # [B, G, max_len // rate, V]
    pool: torch.Tensor  # [B, G, max_len] gated pooling's logits (else 0 wide)
    pending: torch.Tensor  # [B, G, 2 K + 2] the incomplete slot (compressed-only; else 0)
    max_len: int
    length: int = 0


def write(buffer: torch.Tensor, rows: torch.Tensor, start: int, dim: int) -> torch.Tensor:
    """Write rows into buffer along dim from start; return the buffer up to their end."""
    end = start + rows.shape[dim]
    buffer.narrow(dim, start, rows.shape[dim]).copy_(rows)
    return buffer.narrow(dim, 0, end)


@register("sparse")
class SparseAttention(Block):
    Config = SparseConfig
    facts = Facts(
        Sizing("top_k",
               lambda kw, D, T: range(1, max(2, T if kw.get("selection", "token") == "token"
                                             else -(-T // kw.get("block_size", 64)))),
               "k",
               "k = top_k: keys (token selection) or blocks (block selection) each query "
               "attends to, below T; caches every token's keys and values (G = n_kv_heads), "
               "the indexer's keys (d_I per token) and T/rate compressed slots. Its "
               "compressed-only presets (HCA-like, CSA-like) size r = rate instead: "
               "their cache is T/r slots per KV head, W = 128 window keys and the "
               "incomplete slot; k = the slots each query reads (CSA-like)",
               lambda c: describe(c),
               state=("n_kv_heads", lambda kw, D, T: divisors(kw["n_heads"]))),
        cache="kv", mirrors=("dsa",))  # DSA's layers: its token selection
    # what pick sizes for a compressed-only shape (selection slots or none): the rate, its
    # values descending so that the slots, and the cache, never shrink along them
    compressed_sizing = Sizing(
        "rate", lambda kw, D, T: range(max(1, T), 0, -1), "r",
        "r = rate: tokens pooled into one compressed slot; caches T/r slots' keys and "
        "values per KV head (G = n_kv_heads, 1 in the presets), the window's W (128) and "
        "the incomplete slot's running pooling: nothing that grows as T but the slots; "
        "k = top_k slots each query reads (CSA-like)",
        lambda c: describe(c))

    def __init__(self, config: SparseConfig):
        super().__init__(config)
        c = config
        H, G, K, D = c.n_heads, c.kv_heads, c.k_dim, c.d_model
        self.add_projections(q=H * K, k=G * K, v=G * K, o=H * K)
        if c.selection == "token":  # DSA's lightning indexer: one key per token
            self.index_q = nn.Linear(D, c.index_heads * c.i_dim, bias=False)
            self.index_k = nn.Linear(D, c.i_dim, bias=False)
            self.index_w = nn.Linear(D, c.index_heads, bias=False)
        if c.compress == "gated":
            self.pool_proj = nn.Linear(D, G, bias=False)  # per-token pooling logits
        if c.gate == "sigmoid":
            self.gate_proj = nn.Linear(D, H * len(c.branches), bias=False)
        self.aux_loss: torch.Tensor | None = None  # set by every forward with gradients
        self.step: int | None = None  # the training step (set_step); None: count forwards
        self.forwards = 0  # training forwards seen, where no step is set
        self._said: tuple = ()  # the last (config, seq_len) budget() was asked for

    @classmethod
    def variants(cls, d_model: int, n_heads: int) -> list[tuple[str, dict]]:
        """DSA-like (the indexer's top 256 keys, MQA), NSA-like (top 4 blocks of 64, gated
        slots of 16, a window of 128, sigmoid gates, GQA) and MoBA-like (top 3 blocks of
        128, MHA): each scaled to bite at a few thousand tokens. HCA-like (every gated slot
        of 128 tokens beside a window of 128, MQA) and CSA-like (the top 512 gated slots of
        4 tokens, 2048 tokens' worth, beside a window of 128, MQA) are DeepSeek V4's
        compressed layers: they cache no token's keys beyond the window."""
        groups = n_heads // 4 if n_heads >= 8 and n_heads % 4 == 0 else 1
        compressed = {"local_window": 128, "gate": "sigmoid", "n_kv_heads": 1}
        return [("sparse (DSA-like)", {"selection": "token", "top_k": 256, "n_kv_heads": 1}),
                ("sparse (NSA-like)", {"selection": "block", "top_k": 4, "block_size": 64,
                                       "compress": "gated", "rate": 16, "local_window": 128,
                                       "gate": "sigmoid", "n_kv_heads": groups}),
                ("sparse (MoBA-like)", {"selection": "block", "top_k": 3, "block_size": 128,
                                        "n_kv_heads": None}),
                ("sparse (HCA-like)", {"selection": "none", "compress": "gated", "rate": 128,
                                       **compressed}),
                ("sparse (CSA-like)", {"selection": "slots", "top_k": 512, "compress": "gated",
                                       "rate": 4, **compressed})]

    # ---------------------------------------------------------------- paths

    def keys_values(self, x: torch.Tensor, offset: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated for positions offset + t) and values as cached: [B, G, T, K]."""
        c = self.config
        k = split_heads(self.k_proj, x, c.kv_heads)  # [B, G, T, K]
        v = split_heads(self.v_proj, x, c.kv_heads)  # [B, G, T, V]
        return (apply_rope(k, offset, c.rope_base) if c.rope else k), v

    def project(self, x: torch.Tensor, offset: int = 0):
        c = self.config
        q = split_heads(self.q_proj, x, c.n_heads)  # [B, H, T, K]
        return ((apply_rope(q, offset, c.rope_base) if c.rope else q),
                *self.keys_values(x, offset))

    def indexer(self, x: torch.Tensor, offset: int = 0):
        """DSA's indexer on x (detached by the caller): queries [B, T, I, d_I], one key per
        token [B, T, d_I], head weights [B, T, I] scaled by (I d_I)^-1/2."""
        c = self.config
        B, T, _ = x.shape
        qi = apply_linear(self.index_q, x).view(B, T, c.index_heads, c.i_dim)
        ki = apply_linear(self.index_k, x)  # [B, T, d_I]
        if c.rope:
            qi = apply_rope(qi.transpose(1, 2), offset, c.rope_base).transpose(1, 2)
            ki = apply_rope(ki[:, None], offset, c.rope_base)[:, 0]
        wi = apply_linear(self.index_w, x) * (c.index_heads * c.i_dim) ** -0.5
        return qi, ki, wi

    def set_step(self, step: int) -> None:
        """The training step, for the dense warm-up (the harness sets it every step)."""
        self.step = int(step)

    def warming_up(self) -> bool:
        """Whether this forward attends to every causal key: training, with gradients,
        within the first dense_warmup steps (counted, where no step is set)."""
        c = self.config
        if not (c.dense_warmup and self.training and torch.is_grad_enabled()):
            return False
        if self.step is not None:
            return self.step < c.dense_warmup
        self.forwards += 1
        return self.forwards <= c.dense_warmup

    def select(self, x, q, k, offset: int, cache: SparseCache | None):
        """The selected keys [B, G, Tq, n] and their validity, and the indexer's tensors
        for its loss (None under the block selection)."""
        c = self.config
        if c.selection == "block":
            idx, valid = block_selection(*upcast_16bit(q, k), c.top_k, c.block_size, offset,
                                         c.chunk_size)
            return idx, valid, None
        qi, ki, wi = self.indexer(x.detach(), offset)
        if cache is not None:
            ki = write(cache.index_k, ki.to(cache.index_k.dtype), offset, 1)
        top_k = k.shape[2] if self.warming_up() else c.top_k  # warm-up: every causal key
        idx, valid = token_selection(*upcast_16bit(qi, ki, wi), top_k, offset,
                                     c.chunk_size)  # [B, Tq, n]: one for all heads
        B, G = k.shape[0], c.kv_heads
        expand = (B, G, *idx.shape[1:])
        return idx[:, None].expand(expand), valid[:, None].expand(expand), (qi, ki, wi, idx)

    def slots(self, x, k, v, offset: int, cache: SparseCache | None):
        """The complete slots' keys and values [B, G, S, K], [B, G, S, V], or None."""
        c = self.config
        if c.compress == "none":
            return None
        logits = None
        if c.compress == "gated":
            logits = apply_linear(self.pool_proj, x).transpose(1, 2)  # [B, G, T]
        if cache is None:
            return compress(k, v, pool_weights(logits, k.shape[2], c.rate, k), c.rate)
        if logits is not None:
            logits = write(cache.pool, logits.to(cache.pool.dtype), offset, 2)
        done, now = offset // c.rate, k.shape[2] // c.rate  # slots complete before, after
        span = slice(done * c.rate, now * c.rate)
        weights = pool_weights(None if logits is None else logits[..., span],
                               (now - done) * c.rate, c.rate, k)
        sk, sv = compress(k[:, :, span], v[:, :, span], weights, c.rate)
        return (write(cache.slot_k, sk.to(cache.slot_k.dtype), done, 2),
                write(cache.slot_v, sv.to(cache.slot_v.dtype), done, 2))

    def gates(self, x: torch.Tensor) -> torch.Tensor | None:
        """NSA's per-head branch gates [B, H, T, n_branches], or None (the selection alone)."""
        c = self.config
        if c.gate == "none":
            return None
        g = apply_linear(self.gate_proj, x).unflatten(-1, (c.n_heads, len(c.branches)))
        return torch.sigmoid(g).transpose(1, 2)

    def compressed(self, x, q, k, v, offset: int, cache: SparseCache | None):
        """Selection slots or none: keys and values from position `first` (the window's
        last W - 1 and the new, from the ring; all of x without a cache), the complete
        slots, and the slots each query may read ([B, G, Tq, S]; None: every complete)."""
        c, first = self.config, 0
        slots = None
        if cache is None:
            slots = self.slots(x, k, v, 0, None)
        else:
            if c.compress != "none":
                logits = (apply_linear(self.pool_proj, x).transpose(1, 2)
                          if c.compress == "gated" else None)  # [B, G, T]
                slots = stream_slots(cache, k, v, logits, offset, c.rate)
            if c.local_window is not None:
                k, v, first = window_keys(cache.k, cache.v, k, v, offset, c.local_window)
        mask = None
        if c.selection == "slots":
            mask = slot_selection(*upcast_16bit(q, slots[0]), c.top_k, c.rate, offset)
        return k, v, slots, {"key_offset": first, "slot_mask": mask}

    def _forward(self, x: torch.Tensor, cache: SparseCache | None) -> torch.Tensor:
        c = self.config
        B, T, _ = x.shape
        offset = 0 if cache is None else cache.length
        if cache is not None and offset + T > cache.max_len:
            raise ValueError(f"sparse cache overflow: {offset} cached + {T} new > max_len "
                             f"{cache.max_len}")
        q, k, v = self.project(x, offset)
        if c.selection in COMPRESSED_ONLY:
            idx = valid = index = None
            k, v, slots, extra = self.compressed(x, q, k, v, offset, cache)
        else:
            if cache is not None:
                k = write(cache.k, k.to(cache.k.dtype), offset, 2)  # [B, G, Tk, K]: all
                v = write(cache.v, v.to(cache.v.dtype), offset, 2)
            idx, valid, index = self.select(x, q, k, offset, cache)
            slots, extra = self.slots(x, k, v, offset, cache), {}
        op = SPARSE.resolve(c.backend, SparseSpec.of(q, k, v, c.branches))
        self._backend = op.name
        o, chosen = op.fn(q, k, v, idx, valid, scale=1 / math.sqrt(c.k_dim), offset=offset,
                          gates=self.gates(x), window=c.local_window, slots=slots, rate=c.rate,
                          chunk_size=c.chunk_size, **extra)
        self.aux_loss = self.indexer_loss(index, valid, chosen)
        if cache is not None:
            cache.length += T
        return apply_linear(self.o_proj, o.transpose(1, 2).reshape(B, T, -1))  # [B, T, D]

    def indexer_loss(self, index, valid: torch.Tensor | None, chosen: torch.Tensor | None
                     ) -> torch.Tensor | None:
        """weight x the indexer's KL to the selected attention (select.py's indexer_kl); None
        without gradients, without an indexer or at weight 0."""
        weight = self.config.indexer_loss_weight
        if index is None or weight == 0 or not torch.is_grad_enabled():
            return None
        return weight * indexer_kl(*index, valid[:, 0], chosen)

    def _init_cache(self, batch: int, max_len: int) -> SparseCache:
        c, p = self.config, self.q_proj.weight
        G, K = c.kv_heads, c.k_dim
        slots = max_len // c.rate if c.compress != "none" else 0
        shape = c.shape()
        only = c.selection in COMPRESSED_ONLY
        keys = (c.local_window or 0) if only else max_len  # a ring of W, or every token
        return SparseCache(p.new_zeros(batch, G, keys, K), p.new_zeros(batch, G, keys, K),
                           p.new_zeros(batch, max_len, c.i_dim if c.selection == "token"
                                       else 0),
                           p.new_zeros(batch, G, slots, K), p.new_zeros(batch, G, slots, K),
                           p.new_zeros(batch, G, max_len if c.compress == "gated" and not only
                                       else 0),
                           p.new_zeros(batch, G, pending_elements(shape) // G if only else 0),
                           max_len)

    def _mixing_matrices(self, x: torch.Tensor) -> torch.Tensor:
        """M [B, H, T, T] (budgets/mixing/sparse.py), so that y == o_proj(M @ value_heads(x))
        with the selection the forward makes."""
        c = self.config
        q, k, v = self.project(x)
        selected, pool, slots, mask = None, None, None, None
        if c.selection in COMPRESSED_ONLY:
            _, _, slots, extra = self.compressed(x, q, k, v, 0, None)
            mask = extra["slot_mask"]
        else:
            idx, valid, _ = self.select(x, q, k, 0, None)
            selected = selection_mask(idx, valid, x.shape[1])
        if c.compress != "none":
            logits = (apply_linear(self.pool_proj, x).transpose(1, 2)
                      if c.compress == "gated" else None)
            pool = pooling_matrix(pool_weights(logits, x.shape[1], c.rate, k), x.shape[1],
                                  c.rate)  # [B, G, S, T]
        return sparse_mixing(q, k, selected, scale=1 / math.sqrt(c.k_dim),
                             gates=self.gates(x), window=c.local_window, pool=pool,
                             rate=c.rate, slot_keys=None if slots is None else slots[0],
                             slot_mask=mask)

    def value_heads(self, x: torch.Tensor) -> torch.Tensor:
        """The value path per query head [B, H, T, V]: y = o_proj(M @ value_heads(x))."""
        return expand_heads(self.keys_values(x)[1], self.config.n_heads)

    def _weight_matrices(self) -> dict[str, torch.Tensor]:
        c = self.config
        wq = self.q_proj.weight.float().view(c.n_heads, c.k_dim, c.d_model)
        wk = expand_heads(self.k_proj.weight.float().view(1, c.kv_heads, c.k_dim, c.d_model),
                          c.n_heads)[0]  # [H, K, D]
        return {"qk": wq.transpose(1, 2) @ wk,  # [H, D, D]: rank <= K
                "value": self.v_proj.weight.float().T,  # [D, G*V]
                "out": self.o_proj.weight.float()}  # [D, H*V]

    def cache_slots(self) -> tuple[CacheSlot, ...]:
        """Keys and values per KV head, every token; the indexer's keys (and the gated
        pooling's logits) cached in full beside them. A cache of compressed slots (2 G K
        per `rate` tokens) is not one compress projects: a ValueError saying so."""
        c = self.config
        if c.compress != "none" or c.selection in COMPRESSED_ONLY:
            # its cache holds pooled slots (a ring of W keys, too, for selections none and
            # slots): counted as every token's keys and values, compress's bytes and loss
            # would be another cache's
            raise ValueError(f"sparse ({self.describe_cache()}): its cache holds compressed "
                             f"slots of {c.rate} tokens, which compress does not project; "
                             f"compress reads sparse blocks that cache every token's keys "
                             f"and values (compress: none)")
        beside = (c.i_dim if c.selection == "token" else 0) + (
            c.kv_heads if c.compress == "gated" else 0)
        return (CacheSlot("k", c.kv_heads, c.k_dim, fixed_per_token=beside),
                CacheSlot("v", c.kv_heads, c.k_dim))

    def describe_cache(self) -> str:
        c = self.config
        if c.selection in COMPRESSED_ONLY:
            return (f"{c.kv_heads} KV heads x (K {c.k_dim} + V {c.k_dim}) x (T/{c.rate} "
                    f"slots + window {c.local_window or 0})")
        extra = f" + indexer keys {c.i_dim}" if c.selection == "token" else ""
        if c.compress != "none":
            extra += f" + slots of {c.rate} tokens"
        return f"{c.kv_heads} KV heads x (K {c.k_dim} + V {c.k_dim}){extra}"

    def cache_readout(self, x: torch.Tensor) -> CacheReadout:
        q, _, v = self.project(x)
        c = self.config
        return CacheReadout(q, self.mixing_matrices(x), v, self.o_proj.weight, 1 / c.k_dim,
                            c.rope)

    def inference_state(self, cache: SparseCache) -> dict[str, torch.Tensor]:
        """Keys and values [B, T, G*K] (a compressed-only layer: its window's [B, W, G*K]),
        the indexer's keys [B, T, d_I] and the complete slots [B, S, G*K] (each present
        where the config has it)."""
        B, n, c = cache.k.shape[0], cache.length, self.config

        def tokens(t: torch.Tensor) -> torch.Tensor:  # [B, G, m, K] -> [B, m, G*K]
            return t.transpose(1, 2).reshape(B, t.shape[2], -1)

        kept = min(n, cache.k.shape[2])  # a compressed-only layer's ring: the last W
        state = ({"k": tokens(cache.k[:, :, :kept]), "v": tokens(cache.v[:, :, :kept])}
                 if kept else {})  # no window, no ring
        if c.selection == "token":
            state["index_k"] = cache.index_k[:, :n]
        if c.compress != "none" and n >= c.rate:
            state["slot_k"] = tokens(cache.slot_k[:, :, :n // c.rate])
            state["slot_v"] = tokens(cache.slot_v[:, :, :n // c.rate])
        return state

    def _budget(self, seq_len: int) -> RankBudget:
        c = self.config
        shape = c.shape()
        said, self._said = self._said, (c, seq_len)
        if said != (c, seq_len + 1):  # not twice for pick's and blocks' decode step (T - 1)
            for note in covering(c, seq_len):
                log.warning("rankzoo: sparse %s", note)
        linears = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return sparse_caps(self.kind, seq_len, shape, self.param_count(), 2 * linears)
