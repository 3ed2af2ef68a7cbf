"""Advice: what a report's figures suggest changing, each advised bound checked first.

    annotate(report)                      # adds verdicts, head classes, "advice", ...
    annotate(report, VerdictThresholds(saturated=0.8, cache_dtype="float16"))

annotate adds the verdicts per axis row and the collapse per layer (budgets/advice/verdicts.py),
then the advice below.

Advice is given only for a variant that finished and learned (its `status`, when it has
one): otherwise one "no_advice" item says why. Every advised bound holds on the probe: it is
rank_eps_max (max over every sample of the batch) maxed over heads, rounded up; it is
checked against those figures before it is emitted (CHECKS: one check per kind of bound,
each naming what it finds broken) and carries "conditions": {eps, batch_size, seq_len,
checked, max_observed}. A probe without rank_eps_max (older files) gets no bound
advice on data-dependent ranks, and one note saying so.
  cheaper_block per layer: the past->future rank m (max over samples and heads) is <=
                cheaper_block_util * declared, decided (not a matrix-free lower bound), and
                flat over the probe's lengths whose T/2 exceeds m (shorter ones cap the
                rank themselves): max at the longest <= max at the shortest + max(flat_abs,
                flat_rel * that) (1, 10%). Then a block whose fixed state caps that rank
                (linear attention's F, an SSM's N = m: their mixing matrices are
                m-semiseparable) could represent what the layer realized. A rank of an
                unbounded block that grows with T gets a "grows_with_t" item instead: no
                fixed state serves it (growth within a block's own fixed state is a
                finding). Not a window: a low-rank past->future block says nothing about
                locality, and a window's rank bound W - 1 does not work the other way.
  kv_cache      per layer with KV heads (softmax family; budgets/advice/kv.py): the
                bytes of the cache at cache_dtype (bfloat16: 2 B), per KV head g with
                ranks r_k, r_v (rank_eps_pooled, the probe's sequences stacked, rounded
                up): full (K + V) B per token; low-rank (r_k + r_v) B per token of codes,
                its bases (K r_k + V r_v) B a weight shared by every sequence (older probes
                without pooled ranks: rank_eps_max, bases paid once per sequence at T).
                Keys after RoPE and, with RoPE, before it (what low-rank KV methods
                compress).
                Emitted when a ratio reaches min_compression; one "kv_cache_summary" per
                variant sums the layers and names the `rankzoo compress` command that
                checks it (compress_command), or below min_compression becomes a
                "no_saving" finding.
  hybrid        per variant where some layers but not all have cheaper_block items
                (budgets/advice/hybrid.py): those layers swapped for a block with a fixed
                state of N (the largest of their states), the others kept; with the cache
                it saves per sequence at T (cache_saved). All layers served: the
                cheaper_block items stand alone. A hybrid that saves nothing becomes a
                "hybrid_no_saving" finding.
  lora_rank     per variant with adapters: the largest realized adapter rank vs declared r
                (an adapter is a weight: its rank_eps is exact, no samples involved).
  collapsed     per collapsed layer (budgets/advice/verdicts.py); a finding, not a bound.

Cuts (a cheaper block, a hybrid, a low-rank cache, a smaller r) are advised only to a run
that solved its task (`solved`); a run that learned but did not gets one "under_used" finding
instead. annotate puts advice under "advice" and what advises nothing under "findings".
"""

from __future__ import annotations

from dataclasses import asdict

from .hybrid import hybrid_advice, hybrid_rows, state_blocks
from .kv import ceil_rank, conditions, kv_cache_advice, max_of, rests_on
from .rows import key_text, mixer_of, row_key, row_text, rows_text
from .verdicts import VerdictThresholds, annotate_verdicts, is_flat


def _rows(variant: dict, axis: str):
    for layer in variant["layers"]:
        for row in layer["axes"]:
            if row["axis"] == axis:
                yield layer, row


# ---------------------------------------------------------------- collapse

def collapse_advice(variant: dict) -> list[dict]:
    return [{"kind": "collapsed", "variant": variant["variant"], "layer": layer["layer"],
             **mixer_of(layer), "erank": layer["mixing_centered_erank"],
             "text": f"{variant['variant']} layer {row_text(layer)}: centered mixing erank "
                     f"{layer['mixing_centered_erank']:.2f}: token mixing has collapsed"}
            for layer in variant["layers"] if layer.get("collapsed")]


# ---------------------------------------------------------------- cheaper block

def _length_maxima(layer: dict) -> list[tuple[int, float]] | None:
    """(t, max over samples and heads of the past->future rank at length t), ascending;
    None when some length is undecided (a matrix-free lower bound) or lacks maxima."""
    out = []
    for entry in layer.get("past_future_lengths") or []:
        m = max_of(entry.get("rank_eps_max"))
        if entry.get("lower_bound") or m is None:
            return None
        out.append((int(entry["seq_len"]), m))
    return sorted(out)


def _layers(rows: list[dict]) -> str:
    """'layer 1 realizes' or 'layers 0, 1 realize'."""
    return f"{rows_text('layer', rows)} realize{'s' * (len(rows) == 1)}"


def fixed_state(layer: dict, T: int) -> bool:
    """Whether the layer's block carries a fixed-size state across the sequence: a
    recurrent state (linear attention, SSMs) or a mixing cap below T/2 (a window). Its
    past->future rank can grow with T only up to that state."""
    rows = layer["axes"]
    return (any(r["quantity"] == "inference.state" for r in rows)
            or any(r["axis"] == "mixing" and r["declared"] < T // 2 for r in rows))


def judged_lengths(lengths: list[tuple[int, float]], state: int) -> list[tuple[int, float]]:
    """The probe lengths at which a state of `state` is not capped by the length itself
    (T/2 > state): at a shorter length the past->future block has fewer than `state` rows
    or columns, so a rank that looks flat or growing there says nothing about the layer."""
    return [(t, m) for t, m in lengths if t / 2 > state]


def _cheaper_block(variant: dict, layer: dict, row: dict, m: float,
                   judged: list[tuple[int, float]], state: int) -> dict:
    name, (_, m0), (_, m1) = variant["variant"], judged[0], judged[-1]
    shown = ", ".join(str(t) for t, _ in judged)
    return {
        "kind": "cheaper_block", "variant": name, "layer": layer["layer"], **mixer_of(layer),
        "realized": ceil_rank(m), "declared": row["declared"], "state": state,
        "lengths": [t for t, _ in judged], "conditions": conditions(variant, m),
        "text": f"{name} layer {row_text(layer)}: the past->future mixing realizes rank "
                f"<= {state} of {row['declared']} ({rests_on(variant)}), flat over T = "
                f"{shown} ({ceil_rank(m0)} -> {ceil_rank(m1)}): a block with a fixed state "
                f"of {state} ({state_blocks(state)}) caps the same rank"}


def cheaper_block_advice(variant: dict, th: VerdictThresholds) -> list[dict]:
    """cheaper_block items for flat low-rank layers; one grows_with_t item naming the
    low-rank layers of unbounded blocks whose rank grows with T (a fixed-state block
    cannot outgrow its state: its growth is a finding); one note for the layers whose
    lengths cannot tell (fewer than two lengths with T/2 > the state)."""
    name, T, out = variant["variant"], variant["seq_len"], []
    growing, within, unmeasured = [], [], []
    for layer, row in _rows(variant, "mixing"):
        m = row.get("realized_max_sample")
        if m is None or row.get("lower_bound") or not row["declared"]:
            continue
        if ceil_rank(m) > th.cheaper_block_util * row["declared"]:
            continue
        lengths = _length_maxima(layer)
        state = max(1, ceil_rank(max([m, *(x for _, x in lengths or [])])))
        judged = judged_lengths(lengths or [], state)
        if len(judged) < 2:
            unmeasured.append(layer)
            continue
        (t0, m0), (t1, m1) = judged[0], judged[-1]
        if is_flat(m0, m1, th):
            out.append(_cheaper_block(variant, layer, row, m, judged, state))
            continue
        growth = (f"layer {row_text(layer)}: {ceil_rank(m0)} at T = {t0} -> {ceil_rank(m1)} "
                  f"at T = {t1}")
        (within if fixed_state(layer, T) else growing).append(growth)
    if growing:
        out.append({"kind": "grows_with_t", "variant": name,
                    "text": f"{name}: past->future rank grows with T ({'; '.join(growing)}): "
                            f"no fixed state serves these layers"})
    if within:
        out.append({"kind": "finding", "variant": name,
                    "text": f"{name}: past->future rank grows with T within the block's own "
                            f"fixed state ({'; '.join(within)}): the state is used more as "
                            f"sequences grow; no smaller state is advised"})
    if unmeasured:
        out.append({"kind": "note", "variant": name,
                    "text": f"{name}: {_layers(unmeasured)} a low "
                            f"past->future rank, but the probe did not measure it at two "
                            f"lengths with T/2 above that rank (a longer probe is needed): "
                            f"whether a fixed state serves "
                            f"{'it' if len(unmeasured) == 1 else 'them'} is unknown"})
    return out


# ---------------------------------------------------------------- adapters

def lora_advice(variant: dict) -> list[dict]:
    rows = [row for _, row in _rows(variant, "adapter")]
    if not rows:
        return []
    declared = max(r["declared"] for r in rows)
    observed = max(r.get("realized_max_sample", r["realized_max"]) or 0 for r in rows)
    realized = ceil_rank(observed)
    suggested = max(1, realized)
    tail = (f"r = {suggested} would serve" if suggested < declared
            else f"r = {declared} binds; try a larger r")
    return [{"kind": "lora_rank", "variant": variant["variant"], "declared": declared,
             "realized": realized, "suggested": suggested,
             "conditions": conditions(variant, observed),
             "text": f"{variant['variant']}: adapters realize rank <= {realized} of "
                     f"r = {declared} (eps {variant['eps']:g}): {tail}"}]


# ---------------------------------------------------------------- checking advice

def _layer(variant: dict, item: dict) -> dict | None:
    """The variant's layer entry an item names (its layer and, where several, its mixer)."""
    return next((ly for ly in variant["layers"] if row_key(ly) == row_key(item)), None)


def _check_cheaper_block(item: dict, variant: dict) -> list[str]:
    where = (f"{variant['variant']} layer {row_text(item)}: cheaper_block state "
             f"{item['state']}")
    layer = _layer(variant, item)
    row = None if layer is None else next(
        (r for r in layer["axes"] if r["axis"] == "mixing"), None)
    if row is None or row.get("realized_max_sample") is None:
        return [f"{where}: no per-sample maxima to check it against"]
    observed = dict(_length_maxima(layer) or [])  # {t: max over samples and heads}
    T = variant["seq_len"]
    observed[T] = max(observed.get(T, 0.0), row["realized_max_sample"])
    return [f"{where} < rank {m:g} observed at T = {t} (max over samples and heads)"
            for t, m in sorted(observed.items()) if item["state"] < ceil_rank(m)]


def _check_hybrid(item: dict, variant: dict) -> list[str]:
    """Each swapped layer's state against its observed ranks, and at least one layer kept
    (a hybrid of every layer is the whole-model cheaper_block advice)."""
    where = f"{variant['variant']}: hybrid"
    every = {row_key(ly) for ly in variant["layers"]}
    swapped = hybrid_rows(item, "layers")
    bad = [f"{where}: layer {key_text(k)} is not a layer of the variant" for k in swapped
           if k not in every]
    if not every - set(swapped):
        bad.append(f"{where}: swaps every layer; that is the cheaper_block advice")
    return bad + [line for k in swapped if k in every
                  for line in _check_cheaper_block(
                      {**item, "layer": k[0], **({"mixer": k[1]} if k[1] else {})}, variant)]


def _check_kv(item: dict, variant: dict) -> list[str]:
    where = f"{variant['variant']} layer {row_text(item)}: kv_cache"
    layer = _layer(variant, item)
    kv = None if layer is None else layer.get("kv_heads")
    if kv is None:
        return [f"{where}: the layer has no KV head figures to check it against"]
    bad = []
    for key, opt in item["options"].items():
        field = opt.get("rank_field", "rank_eps_max")  # the figure the ranks were read from
        for q, ranks in ((key, opt["rank_k"]), ("v", opt["rank_v"])):
            maxima = kv.get(q, {}).get(field) or []
            if len(maxima) != len(ranks):
                bad.append(f"{where}: {len(ranks)} {q} ranks for {len(maxima)} KV heads")
            for g, (r, m) in enumerate(zip(ranks, maxima, strict=False)):
                if m is None:
                    bad.append(f"{where}: KV head {g} has no {q} maximum to check against")
                elif r < ceil_rank(m):
                    bad.append(f"{where}: {q} rank {r} of KV head {g} < {m:g} observed")
    return bad


def _check_lora(item: dict, variant: dict) -> list[str]:
    rows = [row for _, row in _rows(variant, "adapter")]
    observed = max((r.get("realized_max_sample", r["realized_max"]) or 0 for r in rows),
                   default=0)
    if item["suggested"] < ceil_rank(observed):
        return [f"{variant['variant']}: lora_rank r = {item['suggested']} < adapter rank "
                f"{observed:g} observed"]
    return []


# kind -> check(item, variant): one line per bound of the item that the figures break, []
# when all hold; annotate emits only the items whose check is empty (_verified)
CHECKS = {"cheaper_block": _check_cheaper_block, "hybrid": _check_hybrid,
          "kv_cache": _check_kv, "lora_rank": _check_lora}


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
    """(advice and findings for one variant, whether its bound advice was skipped for
    lack of maxima)."""
    reason = no_advice_reason(variant)
    if reason:
        return [{"kind": "no_advice", "variant": variant["variant"], "text": reason}], False
    items = collapse_advice(variant)
    lacking = _lacks_maxima(variant)
    if not lacking:
        # the hybrid is built from the checked cheaper_block items only, and follows them
        cheaper = _verified(cheaper_block_advice(variant, th), variant)
        items += cheaper + hybrid_advice(variant, cheaper, th) + kv_cache_advice(variant, th)
    items = _verified(items + lora_advice(variant), variant)
    return gate_cuts(items, variant, th), lacking


# ---------------------------------------------------------------- the outcome

def solved(variant: dict, th: VerdictThresholds) -> tuple[bool | None, str]:
    """(whether the run solved its task, the figure that says so): its validation figure
    at least solved_fraction of the way from the task's baseline to a perfect model (MQAR:
    accuracy from chance to 1; Markov: loss from the unigram loss down to the entropy
    floor). None without a baseline or the metric (an HF probe, an older run)."""
    base = (variant.get("status") or {}).get("baseline") or {}
    metrics, f = variant.get("metrics") or {}, th.solved_fraction
    acc, loss = metrics.get("val/accuracy"), metrics.get("val/loss")
    if base.get("chance_accuracy") is not None and acc is not None:
        bar = base["chance_accuracy"] + f * (1 - base["chance_accuracy"])
        return acc >= bar, f"val/accuracy {acc:.3g}, solved from {bar:.3g}"
    floor, unigram = base.get("entropy_floor"), base.get("unigram_loss")
    if floor is not None and unigram is not None and loss is not None:
        bar = unigram - f * (unigram - floor)
        return loss <= bar, f"val/loss {loss:.3g}, solved from {bar:.3g}"
    return None, ""


def _cuts(item: dict) -> bool:
    """Whether an advice item shrinks what the model holds (a state, a cache, an r)."""
    return (item["kind"] in ("cheaper_block", "hybrid", "kv_cache", "kv_cache_summary")
            or (item["kind"] == "lora_rank" and item["suggested"] < item["declared"]))


def gate_cuts(items: list[dict], variant: dict, th: VerdictThresholds) -> list[dict]:
    """A run that learned but did not solve its task under-uses its directions: cutting
    them is the wrong conclusion (an optimization problem, not an over-provisioned
    block). Its cuts become one finding saying so; a solved run keeps them."""
    is_solved, figure = solved(variant, th)
    withheld = [it for it in items if _cuts(it)]
    if is_solved is not False or not withheld:
        return items
    what = "; ".join(sorted({_cut_name(it) for it in withheld}))
    return [it for it in items if not _cuts(it)] + [{
        "kind": "finding", "topic": "under_used", "variant": variant["variant"],
        "text": f"{variant['variant']}: the task is not solved ({figure}): the directions it "
                f"leaves unused ({what}) are under-used, not over-provisioned; no cut is "
                f"advised (more steps, another lr or optimizer may use them)"}]


def _cut_name(item: dict) -> str:
    if item["kind"] == "cheaper_block":
        return f"layer {row_text(item)} past->future rank <= {item['state']}"
    if item["kind"] == "hybrid":
        return f"a hybrid with {rows_text('layer', hybrid_rows(item, 'layers'))} at a fixed " \
               f"state of {item['state']}"
    if item["kind"] == "lora_rank":
        return f"adapter rank <= {item['realized']} of r = {item['declared']}"
    return "a low-rank KV cache"


def annotate(report: dict, thresholds: VerdictThresholds | None = None) -> dict:
    """Add verdicts per axis row, head classes and `collapsed` per layer
    (budgets/advice/verdicts.py), and the advice list, in place.

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
    report["advice"] = [a for a in advice if a["kind"] != "finding"]
    report["findings"] = [a for a in advice if a["kind"] == "finding"]
    return report
