"""What flows between the blocks: the residual stream, and the keys and values per KV head.

    residual_figures(h, eps)        # h [B, T, D], the stream entering a layer
    kv_head_figures(heads, eps)     # {"k": [B, G, T, K], "v": [B, G, T, V], "k_pre_rope"?}

The probe's `hidden_centered` measures what a block reads, after its layer's pre-norm;
the norm hides the residual stream's massive activations (a few tokens, often the first,
with norms hundreds of times the rest: Sun et al. 2024), which dominate the stream's
spectrum. `residual_figures` measures the stream itself and names those tokens.

`kv_head_figures` measures each KV head's [T, K] key and value matrices on their own
(the probe's inference.k joins the heads, [T, G*K]), keys both after RoPE (what a cache
stores) and before it (what low-rank KV methods compress: RoPE rotates each token by its
own angles, which raises the rank of a low-rank projection's output).
"""

from __future__ import annotations

import torch

from ..rank.metrics import as_matrices, gram_rank_eps, singular_values, spectrum_metrics

# A token of the residual stream is "massive" when its norm exceeds this multiple of the
# layer's median token norm (pretrained LMs show ratios of 100-1000; 20 keeps clear of
# ordinary outliers). Override with residual_figures(..., ratio=...).
MASSIVE_RATIO = 20.0
# The most massive tokens listed per layer (largest first); `n_massive` counts them all.
MASSIVE_LIMIT = 32
KV_METRICS = ("rank_eps", "rank_eps_max", "erank")


def _per_sample(s: torch.Tensor, shape: tuple[int, int], eps: float) -> dict[str, torch.Tensor]:
    """rank_eps and erank [b, ...] from singular values [b, ..., k], rank_eps_max too."""
    m = spectrum_metrics(s, shape, eps)
    return {"rank_eps": m["rank_eps"].double().mean(0),
            "rank_eps_max": m["rank_eps"].double().amax(0),
            "erank": m["erank"].double().mean(0)}


def pooled_rank(A: torch.Tensor, eps: float) -> list[float]:
    """Per head, rank_eps of A [B, G, T, K] with every sample's tokens stacked, [B*T, K],
    uncentered: the rank one basis shared by all of the probe's sequences needs (what a
    cache with a calibrated basis keeps), which the per-sample ranks understate."""
    a = A.detach().double()
    gram = torch.einsum("bgtk,bgtl->gkl", a, a)  # [G, K, K]
    return [float(x) for x in gram_rank_eps(gram, A.shape[0] * A.shape[2], eps).cpu()]


def residual_figures(h: torch.Tensor, eps: float, ratio: float = MASSIVE_RATIO,
                     centered_values: torch.Tensor | None = None) -> dict:
    """{"centered_erank", "norm_median", "massive_ratio", "n_massive", "massive":
    [{"sample", "position", "norm", "ratio"}, ...]} of a residual stream h [B, T, D].
    The erank is per sample, centered over tokens, then the batch mean (as the probe's
    hidden_centered, so the two compare; `centered_values` [B, k]: those singular values,
    when the caller has them); massive tokens are those with norm > ratio x the median
    token norm over the whole batch, largest first, at most MASSIVE_LIMIT."""
    if not ratio > 0:
        raise ValueError(f"ratio (massive-activation multiple of the median norm) must be "
                         f"positive, got {ratio!r}")
    h = as_matrices(h)  # [B, T, D], fp32
    s = singular_values(h, center=True) if centered_values is None else centered_values
    erank = _per_sample(s, tuple(h.shape[-2:]), eps)["erank"]
    norms = h.double().norm(dim=-1)  # [B, T]
    median = float(norms.flatten().median())
    if median <= 0:  # most tokens are zero: no ratio to state
        return {"centered_erank": float(erank), "norm_median": median,
                "massive_ratio": float(ratio), "n_massive": 0, "massive": []}
    b, t = (norms > ratio * median).nonzero(as_tuple=True)  # [n] each
    order = norms[b, t].argsort(descending=True)[:MASSIVE_LIMIT]
    massive = [{"sample": int(b[i]), "position": int(t[i]), "norm": float(norms[b[i], t[i]]),
                "ratio": float(norms[b[i], t[i]]) / median} for i in order.tolist()]
    return {"centered_erank": float(erank), "norm_median": median,
            "massive_ratio": float(ratio), "n_massive": len(b), "massive": massive}


def kv_head_figures(heads: dict[str, torch.Tensor], eps: float) -> dict:
    """{"n_kv_heads": G, "head_dim": K, "v_head_dim": V, "rope": bool, name: {"rank_eps",
    "rank_eps_max", "erank", "rank_eps_pooled": [per KV head]}} for each of heads' "k"
    [B, G, T, K], "v" [B, G, T, V] and, for a RoPE model, "k_pre_rope" [B, G, T, K]; per
    sample, then the batch mean (and max), and of the samples stacked (pooled_rank).
    Matrices of one shape share one spectrum call."""
    missing = {"k", "v"} - set(heads)
    if missing:
        raise ValueError(f"kv heads need 'k' and 'v', missing {sorted(missing)} "
                         f"(got {sorted(heads)})")
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, A in heads.items():
        if A.dim() != 4:
            raise ValueError(f"kv heads[{name!r}] must be [B, G, T, K], got {tuple(A.shape)}")
        by_shape.setdefault(tuple(A.shape), []).append(name)
    out = {}
    for shape, names in by_shape.items():
        s = singular_values(torch.stack([as_matrices(heads[n]) for n in names]))  # [n, B, G, k]
        for name, s_one in zip(names, s, strict=True):
            m = _per_sample(s_one, shape[-2:], eps)
            out[name] = {k: [float(x) for x in m[k].cpu()] for k in KV_METRICS}
            # one sample: its tokens are the pool, whose spectrum s_one holds already
            out[name]["rank_eps_pooled"] = (list(out[name]["rank_eps"]) if shape[0] == 1
                                            else pooled_rank(heads[name], eps))
    G, K, V = heads["k"].shape[1], heads["k"].shape[-1], heads["v"].shape[-1]
    rope = "k_pre_rope" in heads
    order = ("k", "v", "k_pre_rope") if rope else ("k", "v")
    return {"n_kv_heads": G, "head_dim": K, "v_head_dim": V, "rope": rope,
            **{n: out[n] for n in order}}
