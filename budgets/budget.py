"""The declared rank budget of one block (one layer), derived from its config alone.

Every field is a structural upper bound: no choice of weights or inputs can make the
realized rank on that axis exceed it. The report puts each realized figure beside its cap.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

# Which declared axis bounds which realized quantity measured by the probes.
# The keys of the values are the names that blocks use in `weight_matrices()` and that
# the probes use for the mixing matrix's past->future block; every key a block returns from
# `inference_state()` is bounded by the `inference` axis.
AXIS_OF_QUANTITY = {
    "past_future": "mixing",
    "qk": "logits",
    "value": "value_path",
}
AXES = ("mixing", "logits", "value_path", "adapter", "inference")


@dataclass(frozen=True)
class RankBudget:
    """Declared caps for one layer at sequence length `seq_len`.

    pretrain axes:
      mixing      per-head rank of the past->future block M[T/2:, :T/2] of the mixing matrix
      logits      per-head rank of the pre-softmax scores (and of W_Q W_K^T)
      value_path  rank of the value projection
    adapter       sum of LoRA ranks on this block's projections (0 when none are attached)
    inference     rank of the cached state per sequence at length `seq_len`
    cost side: parameters, cached elements per sequence at `seq_len`, FLOPs per token
    (averaged over the sequence).
    """

    block: str
    seq_len: int
    n_heads: int
    mixing: int
    logits: int
    value_path: int
    inference: int
    adapter: int = 0
    params: int = 0
    cache_elements: int = 0
    flops_per_token: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "block" and (not isinstance(value, int) or value < 0):
                raise ValueError(f"RankBudget.{f.name} must be a non-negative int, got {value!r}")

    @property
    def pretrain(self) -> int:
        """The pretrain share of the total: what the block's output can span per token.

        The value path is the one pretrain axis that bounds the rank of the block's output
        (mixing and logits bound how tokens are combined, not what is combined).
        """
        return self.value_path

    @property
    def total(self) -> int:
        """The seed idea: pretrain + adapter capacity + inference buffer."""
        return self.pretrain + self.adapter + self.inference

    def caps(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RankBudget:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown RankBudget keys {unknown}; known: {sorted(known)}")
        return cls(**data)


def past_future_cap(seq_len: int, window: int | None = None, chunk: int | None = None) -> int:
    """The rank cap of the past->future block M[h:, :h], h = T // 2, of causal softmax
    mixing whose query at t sees keys s <= t, s > t - W (a window) and s in t's own chunk
    (chunks of C tokens from position 0: a chunk boundary carries nothing across it).

    Only the chunk holding both h - 1 and h crosses the split: keys lo .. h - 1 of it
    reach queries h .. hi - 1, so the block is nonzero in an (hi - h) x (h - lo) corner
    at most; a band of W keys cuts that corner to (W - 1) x (W - 1). With h a multiple of
    C no chunk crosses and the cap is 0; without chunks lo = 0, hi = T and it is h."""
    T, h = seq_len, seq_len // 2
    lo = 0 if chunk is None else h // chunk * chunk  # the first key of h's chunk
    hi = T if chunk is None else min(lo + chunk, T)  # past the last query of that chunk
    cap = min(h - lo, hi - h)  # h - lo = h % C with chunks: at most min(h % C, C - h % C)
    return cap if window is None else min(window - 1, cap)


def keys_seen(seq_len: int, window: int | None = None, chunk: int | None = None) -> int:
    """Keys seen per query, summed over the sequence: t + 1 for the query at t, at most W
    (a window), counted from its chunk's start (chunks of C)."""
    def run(n: int) -> int:  # queries 0 .. n - 1 of one stretch: min(t + 1, W) each
        span = n if window is None else min(window, n)
        return span * (span + 1) // 2 + (n - span) * span
    if chunk is None:
        return run(seq_len)
    return seq_len // chunk * run(chunk) + run(seq_len % chunk)


def attention_budget(block: str, seq_len: int, n_heads: int, n_kv_heads: int, head_dim: int,
                     d_model: int, window: int | None = None, params: int = 0,
                     chunk: int | None = None, gate: int = 0) -> RankBudget:
    """The caps of one softmax-attention layer (MHA, GQA, MQA; full, sliding window W
    (keys including the query) or chunked (C tokens a chunk); with or without RoPE, sink
    logits and an output gate), from its shape alone: zoo's softmax and sliding_window
    blocks and the Hugging Face probe all declare through this one formula.

    Sinks and a sigmoid output gate scale each row of M by a positive factor (1 - the
    sink's mass; the gate of that token and head): no cap moves. `gate` is the gate
    projection's width (H headwise, H*V elementwise, 0 none): its FLOPs only."""
    H, G, K, D, T = n_heads, n_kv_heads, head_dim, d_model, seq_len
    span = T if window is None else min(window, T)  # keys a query can see, at most
    if chunk is not None:
        span = min(span, chunk)  # the ring a chunked layer keeps
    # the keys the last query saw: the live state (a chunk's own keys, at most C)
    live = span if chunk is None else min(span, (T - 1) % chunk + 1)
    return RankBudget(
        block=block, seq_len=T, n_heads=H,
        # exp(QK^T) has an unbounded kernel: only the block size caps it; a band of W keys
        # leaves a (W-1) x (W-1) corner in M[t:, :t], a chunk what of it crosses t
        mixing=past_future_cap(T, window, chunk),
        logits=K,
        value_path=min(D, G * K),
        inference=min(live, G * K),  # the live keys: all of them, the window's W, the chunk's
        params=params,
        cache_elements=2 * span * G * K,
        # projections (and the gate's), plus QK^T and PV over the keys each query sees
        flops_per_token=(2 * D * (2 * H * K + 2 * G * K + gate)
                         + 2 * H * 2 * K * keys_seen(T, window, chunk) // T),
    )


def difference_cap(caps: tuple[int, ...], support: int) -> int:
    """The past->future rank cap of a signed combination of mixings, differential
    attention's M = P1 - lambda P2: rank(A - lambda B) <= rank A + rank B, the sum of the
    parts' caps, and never above `support`, the rank of the block's nonzero corner
    (past_future_cap of the keys the parts see, T/2 at most). Two softmaxes over the same
    keys each fill that corner already (exp's kernel is unbounded), so their difference's
    cap is the corner's, the same as one softmax's: the sum binds only where a part's cap
    is its kernel's (a feature map, a state), below its corner."""
    return min(sum(caps), support)


def differential_budget(block: str, seq_len: int, n_heads: int, n_kv_heads: int,
                        head_dim: int, d_model: int, window: int | None = None,
                        params: int = 0, chunk: int | None = None) -> RankBudget:
    """The caps of one differential-attention layer: H softmax heads over G KV heads,
    combined in pairs into H/2 output heads M = P1 - lambda P2, each reading a pair of value
    heads (2V wide). Logits, value path and cache are one softmax layer's
    (attention_budget); the mixing cap is difference_cap of the pair's; per token, Q K^T
    once and each head's P applied to its 2V-wide values."""
    one = attention_budget(block, seq_len, n_heads, n_kv_heads, head_dim, d_model, window,
                           params, chunk)
    cap = past_future_cap(seq_len, window, chunk)
    extra_pv = 2 * n_heads * head_dim * keys_seen(seq_len, window, chunk) // seq_len
    return replace(one, n_heads=n_heads // 2, mixing=difference_cap((cap, cap), cap),
                   flops_per_token=one.flops_per_token + extra_pv)
