"""The KV-cache advice: what a low-rank cache of a layer's keys and values would cost in
bytes, from the ranks the probe measured per KV head (budgets/advice.py emits it).

    kv_option(layer["kv_heads"], "k_pre_rope", nbytes=2, T=1024)
    # {"rank_k": [...], "rank_v": [...], "bytes_per_token": ..., "ratio_at_T": ...}

Per KV head g with ranks r_k, r_v (rank_eps_max rounded up): a full cache holds (K + V)
bytes-per-element per token; a low-rank one (r_k + r_v) per token plus its bases
(K r_k + V r_v) once per sequence, amortized at the probe's T (lowrank_cache_bytes, the one
formula `rankzoo compress` counts with too). Keys after RoPE and, with RoPE, before it
(what low-rank KV methods compress).

Cost model (COST_MODEL, stated in every item): the ranks are measured per sequence, so the
advice is for a basis fitted online per sequence, its bytes paid once per sequence at T.
A basis shared by every sequence (fitted once on calibration data, what `rankzoo
compress` measures) is a weight paid once per model, and needs the rank the pooled
sequences reach, which per-sequence ranks understate: compress measures that one.
"""

from __future__ import annotations

import math

from .verdicts import VerdictThresholds

COMPRESS = "to be checked with `rankzoo compress`"
COST_MODEL = "per_sequence_basis"
COST_TEXT = ("a basis fitted per sequence, paid once per sequence at T; a basis shared by "
             "every sequence is a weight, measured by `rankzoo compress`")
KEY_LABEL = {"k_pre_rope": "keys before RoPE", "k": "keys after RoPE"}


def ceil_rank(x: float) -> int:
    """A measured rank rounded up; rank_eps is an integer per sample and head, so the
    1e-9 guards float noise in a max or mean of them."""
    return math.ceil(x - 1e-9)


def max_of(xs) -> float | None:
    """The max of measured values; None when any is missing (nothing to bound)."""
    xs = list(xs or [])
    return None if not xs or any(x is None for x in xs) else float(max(xs))


def conditions(variant: dict, max_observed, checked: bool = True) -> dict:
    """What an advised bound rests on: eps, the probe batch and length, the max seen."""
    return {"eps": variant["eps"], "batch_size": variant.get("batch_size"),
            "seq_len": variant["seq_len"], "checked": checked, "max_observed": max_observed}


def rests_on(variant: dict) -> str:
    b = variant.get("batch_size")
    samples = f"{b} samples" if b else "the probe's samples"
    return (f"max over {samples} and every head, eps {variant['eps']:g}, "
            f"T = {variant['seq_len']}")


def lowrank_cache_bytes(widths, ranks, nbytes: int, T: int) -> dict:
    """The one formula of a low-rank cache's bytes (kv advice here, `rankzoo compress`):
    each cached matrix i of width_i kept as r_i codes per token, plus its width_i x r_i
    basis once per sequence, at nbytes per element; amortized over T tokens."""
    per_token = sum(r * nbytes for r in ranks)
    basis = sum(w * r * nbytes for w, r in zip(widths, ranks, strict=True))
    return {"bytes_per_token": per_token, "basis_bytes": basis,
            "bytes_per_token_at_T": per_token + basis / T}


def kv_option(kv: dict, key: str, nbytes: int, T: int) -> dict | None:
    """Bytes of a low-rank cache holding `key` (k or k_pre_rope) and v of one layer, per
    KV head and summed; None when some head lacks its rank_eps_max."""
    K = kv["head_dim"]
    V = kv.get("v_head_dim", K)
    maxima_k, maxima_v = kv[key].get("rank_eps_max"), kv["v"].get("rank_eps_max")
    if max_of(maxima_k) is None or max_of(maxima_v) is None:
        return None
    rk, rv = [ceil_rank(x) for x in maxima_k], [ceil_rank(x) for x in maxima_v]
    heads = [lowrank_cache_bytes((K, V), (a, c), nbytes, T)
             for a, c in zip(rk, rv, strict=True)]
    per_token = [h["bytes_per_token"] for h in heads]
    basis = [h["basis_bytes"] for h in heads]
    at_T = sum(per_token) + sum(basis) / T
    full = (K + V) * kv["n_kv_heads"] * nbytes
    return {"rank_k": rk, "rank_v": rv, "bytes_per_token": sum(per_token),
            "basis_bytes": sum(basis), "bytes_per_token_at_T": at_T,
            "ratio_at_T": full / at_T if at_T else None,
            "per_head_bytes_per_token": per_token, "per_head_basis_bytes": basis}


def _kv_keys(kv: dict) -> list[str]:
    return ["k_pre_rope", "k"] if kv.get("rope") and "k_pre_rope" in kv else ["k"]


def _option_text(key: str, opt: dict, T: int, rope: bool) -> str:
    label = KEY_LABEL[key] if rope else "keys"
    ratio = "-" if opt["ratio_at_T"] is None else f"{opt['ratio_at_T']:.2f}x"
    return (f"{label} (ranks {opt['rank_k']}) + values (ranks {opt['rank_v']}): "
            f"{opt['bytes_per_token']} B/token + {opt['basis_bytes']} B of bases per sequence "
            f"= {opt['bytes_per_token_at_T']:.1f} B/token at T = {T} ({ratio})")


def _kv_layer(variant: dict, layer: dict, th: VerdictThresholds) -> dict | None:
    kv, T, b = layer["kv_heads"], variant["seq_len"], th.cache_bytes
    options = {key: kv_option(kv, key, b, T) for key in _kv_keys(kv)}
    if any(opt is None for opt in options.values()):
        return None
    K, G = kv["head_dim"], kv["n_kv_heads"]
    V = kv.get("v_head_dim", K)
    full = (K + V) * G * b
    observed = {key: kv[key]["rank_eps_max"] for key in (*options, "v")}
    top = max(max_of(xs) for xs in observed.values())
    name, i = variant["variant"], layer["layer"]
    return {
        "kind": "kv_cache", "variant": name, "layer": i, "dtype": th.cache_dtype,
        "bytes_per_element": b, "seq_len": T, "n_kv_heads": G, "head_dim": K, "v_head_dim": V,
        "rope": bool(kv.get("rope")), "full_bytes_per_token": full, "options": options,
        "cost_model": COST_MODEL,
        "observed": observed,  # rank_eps_max per KV head, of each matrix the ranks bound
        "conditions": conditions(variant, top),
        "text": f"{name} layer {i}: KV cache at {th.cache_dtype} ({b} B/element), {G} KV "
                f"heads x (K {K} + V {V}): full {full} B/token. A low-rank cache, "
                + "; ".join(_option_text(k, o, T, bool(kv.get("rope")))
                            for k, o in options.items())
                + f". Ranks: {rests_on(variant)}; cost model: {COST_TEXT}; {COMPRESS}"}


def _kv_summary(variant: dict, items: list[dict], th: VerdictThresholds) -> dict:
    name, T = variant["variant"], variant["seq_len"]
    full = sum(it["full_bytes_per_token"] for it in items)
    options = {}
    for key in ("k_pre_rope", "k"):
        if all(key in it["options"] for it in items):
            per_token = sum(it["options"][key]["bytes_per_token"] for it in items)
            basis = sum(it["options"][key]["basis_bytes"] for it in items)
            at_T = per_token + basis / T
            options[key] = {"bytes_per_token": per_token, "basis_bytes": basis,
                            "bytes_per_token_at_T": at_T,
                            "ratio_at_T": full / at_T if at_T else None}
    rope = any(it["rope"] for it in items)
    parts = [f"{KEY_LABEL[k] if rope else 'keys'} + values: {o['bytes_per_token']} B/token + "
             f"{o['basis_bytes']} B of bases = {o['bytes_per_token_at_T']:.1f} B/token at "
             f"T = {T} ({'-' if o['ratio_at_T'] is None else format(o['ratio_at_T'], '.2f')}x)"
             for k, o in options.items()]
    return {"kind": "kv_cache_summary", "variant": name, "layers": len(items),
            "dtype": th.cache_dtype, "full_bytes_per_token": full, "options": options,
            "cost_model": COST_MODEL, "conditions": conditions(variant, None),
            "text": f"{name}: KV cache over {len(items)} layers at {th.cache_dtype}: full "
                    f"{full} B/token; a low-rank cache of " + "; ".join(parts)
                    + f" (sum over layers; ranks: {rests_on(variant)}; cost model: "
                      f"{COST_TEXT}); {COMPRESS}: "
                    + compress_command(name, max((o["ratio_at_T"] or 0) for o in options.values())
                                       if options else None)}


def compress_command(name: str, ratio: float | None = None) -> str:
    """The command that measures what the KV advice of variant `name` costs in loss
    (train/commands/compress/__init__.py): for a run's variant, and for a Hugging Face
    model. The sweep's ratios bracket the advised one; the advised ranks themselves are
    always measured."""
    ratios = {1.5, 2.0, 4.0} | ({math.floor(ratio * 100) / 100} if ratio and ratio > 1 else set())
    listed = ",".join(f"{r:g}" for r in sorted(ratios))
    return (f"`rankzoo compress RUN_DIR/{name} --ratios {listed}` (a Hugging Face model: "
            f"`rankzoo compress --hf MODEL_DIR --text CALIB --eval-text EVAL --ratios {listed}`)")


def kv_cache_advice(variant: dict, th: VerdictThresholds) -> list[dict]:
    items = [it for layer in variant["layers"] if layer.get("kv_heads")
             if (it := _kv_layer(variant, layer, th)) is not None]
    if not items:
        return []
    worth = [it for it in items if best_ratio(it) >= th.min_compression]
    summary = _kv_summary(variant, items, th)
    if best_ratio(summary) < th.min_compression:  # the bases cost what the codes save
        summary = no_saving(summary, variant, th)
    return [*worth, summary]


def best_ratio(item: dict) -> float:
    return max((o["ratio_at_T"] or 0.0 for o in item["options"].values()), default=0.0)


def no_saving(summary: dict, variant: dict, th: VerdictThresholds) -> dict:
    """The summary of a cache no low-rank form shrinks enough, as a finding: at this T
    the bases (counted once per sequence) cost about what the codes save."""
    T = variant["seq_len"]
    return {**summary, "kind": "finding", "topic": "no_saving",
            "text": f"{variant['variant']}: no low-rank KV saving at T = {T}: a low-rank cache "
                    f"(a basis per sequence, counted once per sequence) gives full / low-rank = "
                    f"{best_ratio(summary):.2f}x at best (full "
                    f"{summary['full_bytes_per_token']} B/token), below the "
                    f"{th.min_compression:g}x worth advising"}
