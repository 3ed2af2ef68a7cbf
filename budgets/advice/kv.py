"""The KV-cache advice: what a low-rank cache of a layer's keys and values would cost in
bytes, from the ranks the probe measured per KV head (budgets/advice/annotate.py emits it).

    kv_option(layer["kv_heads"], "k_pre_rope", nbytes=2, T=1024)
    # {"rank_k": [...], "rank_v": [...], "cost_model": "shared_basis", "ratio": ...}

One cost model, the one `rankzoo compress` measures (CostModel.SHARED, budgets/cache.py):
one basis per KV head fitted once on calibration data and shared by every sequence. Its
bytes (K r_k + V r_v per head) are a weight, paid once per model; the cache holds the
codes alone, (r_k + r_v) per token and KV head, against (K + V) for the full cache. The
rank such a basis needs is that of the probe's sequences stacked, [B*T, K] per head
(`rank_eps_pooled`, rounded up): per-sequence ranks understate it.

A probe written before rankzoo measured pooled ranks has only the per-sequence maxima
(`rank_eps_max`): its advice is for a basis fitted online per sequence
(CostModel.PER_SEQUENCE), its bytes paid once per sequence at the probe's T
(lowrank_cache_bytes, the one formula), and says so. Keys after RoPE and, with RoPE,
before it (what low-rank KV methods compress).
"""

from __future__ import annotations

import math

from ..cache import CostModel, Keys, cache_size, full_cache_bytes, lowrank_cache_bytes
from .rows import mixer_of, row_text
from .verdicts import VerdictThresholds

COMPRESS = "to be checked with `rankzoo compress`"


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


def rests_on(variant: dict, pooled: bool = False) -> str:
    b = variant.get("batch_size")
    samples = f"{b} samples" if b else "the probe's samples"
    how = f"the {samples} stacked" if pooled else f"max over {samples}"
    return (f"{how} and every head, eps {variant['eps']:g}, "
            f"T = {variant['seq_len']}")


def cost_model_of(kv: dict, key: str) -> CostModel | None:
    """SHARED when the probe has pooled ranks for `key` and v, PER_SEQUENCE when it has
    only per-sample maxima; None when it lacks those too."""
    for model in CostModel:
        if max_of(kv.get(key, {}).get(model.rank_field)) is not None and \
                max_of(kv.get("v", {}).get(model.rank_field)) is not None:
            return model
    return None


def kv_full_bytes(kv: dict, nbytes: int) -> int:
    """The full cache of one layer's kv_heads figures, bytes per token: K + V per KV head."""
    K = kv["head_dim"]
    return full_cache_bytes([K, kv.get("v_head_dim", K)] * kv["n_kv_heads"], nbytes)


def kv_option(kv: dict, key: str, nbytes: int, T: int) -> dict | None:
    """Bytes of a low-rank cache holding `key` (k or k_pre_rope) and v of one layer, per
    KV head and summed, under the cost model the probe's figures allow (cost_model_of);
    None when some head lacks its rank."""
    model = cost_model_of(kv, key)
    if model is None:
        return None
    field = model.rank_field
    K = kv["head_dim"]
    V = kv.get("v_head_dim", K)
    rk = [ceil_rank(x) for x in kv[key][field]]
    rv = [ceil_rank(x) for x in kv["v"][field]]
    heads = [lowrank_cache_bytes((K, V), (a, c), nbytes, T)
             for a, c in zip(rk, rv, strict=True)]
    per_token = [h["bytes_per_token"] for h in heads]
    basis = [h["basis_bytes"] for h in heads]
    full = kv_full_bytes(kv, nbytes)
    return {"rank_k": rk, "rank_v": rv, "cost_model": model, "rank_field": field,
            "bytes_per_token": sum(per_token), "basis_bytes": sum(basis),
            **cache_size(sum(per_token), sum(basis), full, T, model),
            "per_head_bytes_per_token": per_token, "per_head_basis_bytes": basis}


def _kv_keys(kv: dict) -> list[Keys]:
    """The keys the probe measured: before RoPE too where there is RoPE."""
    both = kv.get("rope") and Keys.PRE_ROPE.field in kv
    return [Keys.PRE_ROPE, Keys.POST_ROPE] if both else [Keys.POST_ROPE]


def bytes_text(opt: dict, T: int) -> str:
    """`12 B/token of codes (2.67x; bases 1536 B, once per model)`, or the per-sequence
    form `12 B/token + 160 B of bases per sequence = 17.0 B/token at T = 32 (1.88x)`."""
    ratio = "-" if opt["ratio"] is None else f"{opt['ratio']:.2f}x"
    if opt["cost_model"] == CostModel.SHARED:
        return (f"{opt['bytes_per_token']} B/token of codes ({ratio}; bases "
                f"{opt['basis_bytes']} B, once per model)")
    return (f"{opt['bytes_per_token']} B/token + {opt['basis_bytes']} B of bases per sequence "
            f"= {opt['cache_bytes_per_token']:.1f} B/token at T = {T} ({ratio})")


def _option_text(keys: Keys, opt: dict, T: int, rope: bool) -> str:
    return (f"{keys.label_for(rope)} (ranks {opt['rank_k']}) + values (ranks "
            f"{opt['rank_v']}): " + bytes_text(opt, T))


def _kv_layer(variant: dict, layer: dict, th: VerdictThresholds) -> dict | None:
    kv, T, b = layer["kv_heads"], variant["seq_len"], th.cache_bytes
    keys = _kv_keys(kv)
    options = {k.field: kv_option(kv, k.field, b, T) for k in keys}
    if any(opt is None for opt in options.values()):
        return None
    model = CostModel(next(iter(options.values()))["cost_model"])
    K, G = kv["head_dim"], kv["n_kv_heads"]
    V = kv.get("v_head_dim", K)
    full = kv_full_bytes(kv, b)
    observed = {key: kv[key][model.rank_field] for key in (*options, "v")}
    top = max(max_of(xs) for xs in observed.values())
    name, i = variant["variant"], layer["layer"]
    pooled = model == CostModel.SHARED
    return {
        "kind": "kv_cache", "variant": name, "layer": i, **mixer_of(layer),
        "dtype": th.cache_dtype,
        "bytes_per_element": b, "seq_len": T, "n_kv_heads": G, "head_dim": K, "v_head_dim": V,
        "rope": bool(kv.get("rope")), "full_bytes_per_token": full, "options": options,
        "cost_model": model,
        "observed": observed,  # per KV head, the figure (rank_field) each rank bounds
        "conditions": conditions(variant, top),
        "text": f"{name} layer {row_text(layer)}: KV cache at {th.cache_dtype} ({b} "
                f"B/element), {G} KV heads x (K {K} + V {V}): full {full} B/token. A "
                f"low-rank cache, "
                + "; ".join(_option_text(k, options[k.field], T, bool(kv.get("rope")))
                            for k in keys)
                + f". Ranks: {rests_on(variant, pooled)}; cost model: {model.text}; "
                  f"{COMPRESS}"}


def _kv_summary(variant: dict, items: list[dict], th: VerdictThresholds) -> dict:
    name, T = variant["variant"], variant["seq_len"]
    full = sum(it["full_bytes_per_token"] for it in items)
    models = {CostModel(it["cost_model"]) for it in items}
    model = models.pop() if len(models) == 1 else CostModel.PER_SEQUENCE
    options, keys = {}, []
    for k in Keys:
        if all(k.field in it["options"] for it in items):
            per_token = sum(it["options"][k.field]["bytes_per_token"] for it in items)
            basis = sum(it["options"][k.field]["basis_bytes"] for it in items)
            options[k.field] = {"cost_model": model, "bytes_per_token": per_token,
                                "basis_bytes": basis,
                                **cache_size(per_token, basis, full, T, model)}
            keys.append(k)
    rope = any(it["rope"] for it in items)
    parts = [f"{k.label_for(rope)} + values: {bytes_text(options[k.field], T)}" for k in keys]
    pooled = model == CostModel.SHARED
    return {"kind": "kv_cache_summary", "variant": name, "layers": len(items),
            "dtype": th.cache_dtype, "full_bytes_per_token": full, "options": options,
            "cost_model": model, "conditions": conditions(variant, None),
            "text": f"{name}: KV cache over {len(items)} layers at {th.cache_dtype}: full "
                    f"{full} B/token; a low-rank cache of " + "; ".join(parts)
                    + f" (sum over layers; ranks: {rests_on(variant, pooled)}; cost model: "
                      f"{model.text}); {COMPRESS}: "
                    + compress_command(name, best_ratio({"options": options}) or None,
                                       variant.get("probed_from"))}


def compress_command(name: str, ratio: float | None = None,
                     probed_from: dict | None = None) -> str:
    """The command that measures what the KV advice of variant `name` costs in loss
    (train/commands/compress/__init__.py): on a Hugging Face model the report probed
    (probed_from: its directory and text), else for a run's variant, with the Hugging
    Face form beside it. The sweep's ratios bracket the advised one; the advised ranks
    themselves are always measured."""
    ratios = {1.5, 2.0, 4.0} | ({math.floor(ratio * 100) / 100} if ratio and ratio > 1 else set())
    listed = ",".join(f"{r:g}" for r in sorted(ratios))
    if probed_from:
        return (f"`rankzoo compress --hf {probed_from['hf']} --text {probed_from['text']} "
                f"--eval-text EVAL --ratios {listed}` (EVAL: a text the bases are not "
                f"fitted on)")
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
    return max((o["ratio"] or 0.0 for o in item["options"].values()), default=0.0)


def no_saving(summary: dict, variant: dict, th: VerdictThresholds) -> dict:
    """The summary of a cache no low-rank form shrinks enough, as a finding: the ranks
    the probe needs are near the widths (or, per sequence, the bases cost about what the
    codes save at this T)."""
    T = variant["seq_len"]
    how = ("one basis shared by every sequence" if summary["cost_model"] == CostModel.SHARED
           else "a basis per sequence, counted once per sequence")
    return {**summary, "kind": "finding", "topic": "no_saving",
            "text": f"{variant['variant']}: no low-rank KV saving at T = {T}: a low-rank cache "
                    f"({how}) gives full / low-rank = "
                    f"{best_ratio(summary):.2f}x at best (full "
                    f"{summary['full_bytes_per_token']} B/token), below the "
                    f"{th.min_compression:g}x worth advising"}
