"""Advice: what a report's figures suggest changing, each advised bound checked first.

    annotate(report)                      # adds verdicts, head classes, "advice", ...
    annotate(report, VerdictThresholds(saturated=0.8, cache_dtype="float16"))
    check_advice(report)                  # [] when every advised bound holds on the probe

annotate adds the verdicts per axis row and the collapse per layer (budgets/verdicts.py),
then the advice below.

Advice is given only for a variant that finished and learned (its `status`, when it has
one): otherwise one "no_advice" item says why. Every advised bound holds on the probe: it is
rank_eps_max (max over every sample of the batch) maxed over heads, rounded up; it is
checked against those figures before it is emitted and carries "conditions": {eps,
batch_size, seq_len, checked, max_observed}; check_advice(report) re-verifies the advice of
a report against its figures. A probe without rank_eps_max (older files) gets no bound
advice on data-dependent ranks, and one note saying so.
  cheaper_block per layer: the past->future rank m (max over samples and heads) is <=
                cheaper_block_util * declared, decided (not a matrix-free lower bound), and
                flat over the probe's lengths (T/4, T/2, T): max at T <= max at the shortest
                length + max(flat_abs, flat_rel * that) (1, 10%). Then a block whose fixed
                state caps that rank (linear attention's F, an SSM's N = m: their mixing
                matrices are m-semiseparable) could represent what the layer realized. A
                rank that grows with T gets a "grows_with_t" item instead: no fixed state
                serves it. Not a window: a low-rank past->future block says nothing about
                locality, and a window's rank bound W - 1 does not work the other way.
  kv_cache      per layer with KV heads (softmax family): the bytes of the cache at
                cache_dtype (bfloat16: 2 B), per KV head g with ranks r_k, r_v (rank_eps_max
                rounded up): full (K + V) B per token; low-rank (r_k + r_v) B per token plus
                bases (K r_k + V r_v) B once per sequence, amortized at the probe's T; ratio
                full / low-rank at T. For keys after RoPE and, with RoPE, before it (what
                low-rank KV methods compress). Emitted when a ratio reaches min_compression;
                one "kv_cache_summary" per variant sums the layers and names the
                `rankzoo compress` command that checks it (compress_command).
  lora_rank     per variant with adapters: the largest realized adapter rank vs declared r
                (an adapter is a weight: its rank_eps is exact, no samples involved).
  collapsed     per collapsed layer (budgets/verdicts.py); a finding, not a bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from .verdicts import VerdictThresholds, annotate_verdicts, is_flat

COMPRESS = "to be checked with `rankzoo compress`"
KEY_LABEL = {"k_pre_rope": "keys before RoPE", "k": "keys after RoPE"}


def _ceil(x: float) -> int:
    # rank_eps is an integer per sample and head; ceil guards float noise in the max.
    return math.ceil(x - 1e-9)


def _max(xs) -> float | None:
    """The max of measured values; None when any is missing (nothing to bound)."""
    xs = list(xs or [])
    return None if not xs or any(x is None for x in xs) else float(max(xs))


def _rows(variant: dict, axis: str):
    for layer in variant["layers"]:
        for row in layer["axes"]:
            if row["axis"] == axis:
                yield layer, row


def _conditions(variant: dict, max_observed, checked: bool = True) -> dict:
    return {"eps": variant["eps"], "batch_size": variant.get("batch_size"),
            "seq_len": variant["seq_len"], "checked": checked, "max_observed": max_observed}


def _samples(variant: dict) -> str:
    b = variant.get("batch_size")
    return f"{b} samples" if b else "the probe's samples"


def _rests_on(variant: dict) -> str:
    return (f"max over {_samples(variant)} and every head, eps {variant['eps']:g}, "
            f"T = {variant['seq_len']}")


# ---------------------------------------------------------------- collapse

def collapse_advice(variant: dict) -> list[dict]:
    return [{"kind": "collapsed", "variant": variant["variant"], "layer": layer["layer"],
             "erank": layer["mixing_centered_erank"],
             "text": f"{variant['variant']} layer {layer['layer']}: centered mixing erank "
                     f"{layer['mixing_centered_erank']:.2f}: token mixing has collapsed"}
            for layer in variant["layers"] if layer.get("collapsed")]


# ---------------------------------------------------------------- cheaper block

def _length_maxima(layer: dict) -> list[tuple[int, float]] | None:
    """(t, max over samples and heads of the past->future rank at length t), ascending;
    None when some length is undecided (a matrix-free lower bound) or lacks maxima."""
    out = []
    for entry in layer.get("past_future_lengths") or []:
        m = _max(entry.get("rank_eps_max"))
        if entry.get("lower_bound") or m is None:
            return None
        out.append((int(entry["seq_len"]), m))
    return sorted(out)


def cheaper_block_advice(variant: dict, th: VerdictThresholds) -> list[dict]:
    """cheaper_block items for flat low-rank layers; one grows_with_t item naming the
    low-rank layers whose rank grows with T; one note for those not measured over T."""
    name, out, growing, unmeasured = variant["variant"], [], [], []
    for layer, row in _rows(variant, "mixing"):
        m = row.get("realized_max_sample")
        if m is None or row.get("lower_bound") or not row["declared"]:
            continue
        if _ceil(m) > th.cheaper_block_util * row["declared"]:
            continue
        lengths = _length_maxima(layer)
        if not lengths or len(lengths) < 2:
            unmeasured.append(layer["layer"])
            continue
        (t0, m0), (t1, m1) = lengths[0], lengths[-1]
        if not is_flat(m0, m1, th):
            growing.append(f"layer {layer['layer']}: {_ceil(m0)} at T = {t0} -> {_ceil(m1)} "
                           f"at T = {t1}")
            continue
        state = max(1, _ceil(max(m, *(x for _, x in lengths))))
        out.append({
            "kind": "cheaper_block", "variant": name, "layer": layer["layer"],
            "realized": _ceil(m), "declared": row["declared"], "state": state,
            "lengths": [t for t, _ in lengths],
            "conditions": _conditions(variant, m),
            "text": f"{name} layer {layer['layer']}: the past->future mixing realizes rank "
                    f"<= {state} of {row['declared']} ({_rests_on(variant)}), flat over T = "
                    f"{', '.join(str(t) for t, _ in lengths)} ({_ceil(m0)} -> {_ceil(m1)}): "
                    f"a block with a fixed state of {state} (linear attention with F = "
                    f"{state}, or an SSM with N = {state}) caps the same rank"})
    if growing:
        out.append({"kind": "grows_with_t", "variant": name,
                    "text": f"{name}: past->future rank grows with T ({'; '.join(growing)}): "
                            f"no fixed state serves these layers"})
    if unmeasured:
        out.append({"kind": "note", "variant": name,
                    "text": f"{name}: layers {', '.join(map(str, unmeasured))} realize a low "
                            f"past->future rank, but the probe did not measure it at several "
                            f"lengths (T >= 32 and a current probe needed): whether a fixed "
                            f"state serves them is unknown"})
    return out


# ---------------------------------------------------------------- KV cache in bytes

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
    if _max(maxima_k) is None or _max(maxima_v) is None:
        return None
    rk, rv = [_ceil(x) for x in maxima_k], [_ceil(x) for x in maxima_v]
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
    top = max(_max(xs) for xs in observed.values())
    name, i = variant["variant"], layer["layer"]
    return {
        "kind": "kv_cache", "variant": name, "layer": i, "dtype": th.cache_dtype,
        "bytes_per_element": b, "seq_len": T, "n_kv_heads": G, "head_dim": K, "v_head_dim": V,
        "rope": bool(kv.get("rope")), "full_bytes_per_token": full, "options": options,
        "observed": observed,  # rank_eps_max per KV head, of each matrix the ranks bound
        "conditions": _conditions(variant, top),
        "text": f"{name} layer {i}: KV cache at {th.cache_dtype} ({b} B/element), {G} KV "
                f"heads x (K {K} + V {V}): full {full} B/token. A low-rank cache, "
                + "; ".join(_option_text(k, o, T, bool(kv.get("rope")))
                            for k, o in options.items())
                + f". Ranks: {_rests_on(variant)}; {COMPRESS}"}


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
            "conditions": _conditions(variant, None),
            "text": f"{name}: KV cache over {len(items)} layers at {th.cache_dtype}: full "
                    f"{full} B/token; a low-rank cache of " + "; ".join(parts)
                    + f" (sum over layers; ranks: {_rests_on(variant)}); {COMPRESS}: "
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
    worth = [it for it in items
             if max((o["ratio_at_T"] or 0) for o in it["options"].values())
             >= th.min_compression]
    return [*worth, _kv_summary(variant, items, th)]


# ---------------------------------------------------------------- adapters

def lora_advice(variant: dict) -> list[dict]:
    rows = [row for _, row in _rows(variant, "adapter")]
    if not rows:
        return []
    declared = max(r["declared"] for r in rows)
    observed = max(r.get("realized_max_sample", r["realized_max"]) or 0 for r in rows)
    realized = _ceil(observed)
    suggested = max(1, realized)
    tail = (f"r = {suggested} would serve" if suggested < declared
            else f"r = {declared} binds; try a larger r")
    return [{"kind": "lora_rank", "variant": variant["variant"], "declared": declared,
             "realized": realized, "suggested": suggested,
             "conditions": _conditions(variant, observed),
             "text": f"{variant['variant']}: adapters realize rank <= {realized} of "
                     f"r = {declared} (eps {variant['eps']:g}): {tail}"}]


# ---------------------------------------------------------------- checking advice

def _layer(variant: dict, i: int) -> dict | None:
    return next((ly for ly in variant["layers"] if ly["layer"] == i), None)


def _check_cheaper_block(item: dict, variant: dict) -> list[str]:
    where = f"{variant['variant']} layer {item['layer']}: cheaper_block state {item['state']}"
    layer = _layer(variant, item["layer"])
    row = None if layer is None else next(
        (r for r in layer["axes"] if r["axis"] == "mixing"), None)
    if row is None or row.get("realized_max_sample") is None:
        return [f"{where}: no per-sample maxima to check it against"]
    observed = dict(_length_maxima(layer) or [])  # {t: max over samples and heads}
    T = variant["seq_len"]
    observed[T] = max(observed.get(T, 0.0), row["realized_max_sample"])
    return [f"{where} < rank {m:g} observed at T = {t} (max over samples and heads)"
            for t, m in sorted(observed.items()) if item["state"] < _ceil(m)]


def _check_kv(item: dict, variant: dict) -> list[str]:
    where = f"{variant['variant']} layer {item['layer']}: kv_cache"
    layer = _layer(variant, item["layer"])
    kv = None if layer is None else layer.get("kv_heads")
    if kv is None:
        return [f"{where}: the layer has no KV head figures to check it against"]
    bad = []
    for key, opt in item["options"].items():
        for q, ranks in ((key, opt["rank_k"]), ("v", opt["rank_v"])):
            maxima = kv.get(q, {}).get("rank_eps_max") or []
            if len(maxima) != len(ranks):
                bad.append(f"{where}: {len(ranks)} {q} ranks for {len(maxima)} KV heads")
            for g, (r, m) in enumerate(zip(ranks, maxima, strict=False)):
                if m is None:
                    bad.append(f"{where}: KV head {g} has no {q} maximum to check against")
                elif r < _ceil(m):
                    bad.append(f"{where}: {q} rank {r} of KV head {g} < {m:g} observed")
    return bad


def _check_lora(item: dict, variant: dict) -> list[str]:
    rows = [row for _, row in _rows(variant, "adapter")]
    observed = max((r.get("realized_max_sample", r["realized_max"]) or 0 for r in rows),
                   default=0)
    if item["suggested"] < _ceil(observed):
        return [f"{variant['variant']}: lora_rank r = {item['suggested']} < adapter rank "
                f"{observed:g} observed"]
    return []


CHECKS = {"cheaper_block": _check_cheaper_block, "kv_cache": _check_kv,
          "lora_rank": _check_lora}


def check_advice(report: dict) -> list[str]:
    """Every advised bound of `report` re-verified against the figures it rests on (the
    max over samples and heads); one line per violation, [] when all hold."""
    variants = {v["variant"]: v for v in report["variants"]}
    bad = []
    for item in report.get("advice", []):
        check = CHECKS.get(item["kind"])
        if check is None:
            continue
        variant = variants.get(item.get("variant"))
        if variant is None:
            bad.append(f"{item['kind']} advice for unknown variant {item.get('variant')!r}")
            continue
        bad += check(item, variant)
    return bad


# ---------------------------------------------------------------- annotate

def no_advice_reason(variant: dict) -> str | None:
    """Why a variant gets no advice (its run did not finish, or did not learn), else None."""
    status, name = variant.get("status"), variant["variant"]
    if not status:
        return None  # no status recorded (an older run, an HF model): advice as before
    why = f" ({status['reason']})" if status.get("reason") else ""
    if status.get("state") != "finished":
        of = f" of {status['max_steps']}" if status.get("max_steps") else ""
        return (f"{name}: no architecture advice: the run {status.get('state')} at step "
                f"{status.get('step')}{of}{why}, so its ranks are not those of a trained model")
    if status.get("learned") is False:
        return (f"{name}: no architecture advice: the model did not learn the task{why}, so "
                f"its ranks say nothing about what the task needs")
    return None


def _lacks_maxima(variant: dict) -> bool:
    """Whether the probe lacks per-sample maxima on its data-dependent rows."""
    return any(row.get("realized_max_sample") is None for layer in variant["layers"]
               for row in layer["axes"] if row["axis"] in ("mixing", "inference"))


def _verified(items: list[dict], variant: dict) -> list[dict]:
    """The items whose bound holds on the figures (all, unless a rule above is wrong)."""
    kept = []
    for item in items:
        check = CHECKS.get(item["kind"])
        if check is None or not check(item, variant):
            kept.append(item)
    return kept


def variant_advice(variant: dict, th: VerdictThresholds) -> tuple[list[dict], bool]:
    """(advice for one variant, whether its bound advice was skipped for lack of maxima)."""
    reason = no_advice_reason(variant)
    if reason:
        return [{"kind": "no_advice", "variant": variant["variant"], "text": reason}], False
    items = collapse_advice(variant)
    lacking = _lacks_maxima(variant)
    if not lacking:
        items += cheaper_block_advice(variant, th) + kv_cache_advice(variant, th)
    return _verified(items + lora_advice(variant), variant), lacking


def annotate(report: dict, thresholds: VerdictThresholds | None = None) -> dict:
    """Add verdicts per axis row, head classes and `collapsed` per layer
    (budgets/verdicts.py), and the advice list, in place.

    Recomputed from the figures every time, so a report read from disk gets the verdicts
    of the thresholds in use now, and merged reports get advice for all their variants.
    """
    th = thresholds or VerdictThresholds()
    annotate_verdicts(report, th)
    advice: list[dict] = []
    lacking = []
    for v in report["variants"]:
        items, lacks = variant_advice(v, th)
        advice += items
        if lacks:
            lacking.append(v["variant"])
    if lacking:
        advice.append({"kind": "note", "text": f"no bound advice (cheaper block, low-rank "
                       f"cache) for {', '.join(lacking)}: the probe lacks per-sample maxima "
                       f"(rank_eps_max; a probe from an older rankzoo): re-probe for them"})
    report["thresholds"] = asdict(th)
    report["head_rules"] = th.heads.text()
    report["advice"] = advice
    return report
