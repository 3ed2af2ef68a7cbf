"""A check experiment's run read back: each cheaper-block or hybrid suggestion verified or
refuted against the variant it was advised for.

    attach_checks(report, recorded_checks("runs/check"))   # report["advice_checks"]

A variant whose config carries `check: {of: <variant>, advice: cheaper_block, state: N}`
(written by emit.py, kept in its run's config.yaml) beside <variant> in the same run is the
check of <variant>'s advice "a block with a fixed state of N", whatever its name; one with
`check: {of: <variant>, advice: hybrid, state: N, layers: [...]}` (a layer pattern) checks
the hybrid advice that swaps those layers alone, and its item also states both variants'
declared cache per sequence (their reports' budgets, in the report's cache dtype). In a
sweep, each grid point is checked against <variant>'s run at the same point. It is
verified when, at the end of training, its validation accuracy is at most
ACCURACY_TOLERANCE below the original's and its validation loss at most LOSS_TOLERANCE
nats per token above (each metric the runs log; MQAR logs both, the Markov language its
loss); refuted when either is beyond; inconclusive when a run did not finish or logs
neither.
"""

from __future__ import annotations

from pathlib import Path

from budgets.advice.hybrid import KIND as HYBRID_ADVICE
from budgets.advice.hybrid import numbered
from budgets.cache import dtype_bytes

from ...config.layers import HYBRID
from ...config.parse import advice_checks, parse_variant_check
from ...config.stage_sections import run_name
from ...rundir.read import is_variant_dir, run_config, variant_dirs

ACCURACY_TOLERANCE = 0.02  # absolute, of val/accuracy
LOSS_TOLERANCE = 0.02  # nats per token, of val/loss: rankzoo compress's default tolerance


def block_text(block: str, advice: str, state: int) -> str:
    """How a check's verdict names the block that checked `advice` at `state`: the text
    of the block's own Check (zoo/facts.py), 'an SSM with N = 5'."""
    texts = [check.text for name, check in advice_checks(advice) if name == block]
    if not texts:
        raise ValueError(f"a {block} block declares no check of {advice} advice")
    return texts[0].format(n=state)


def compare(original: dict, candidate: dict) -> dict[str, dict]:
    """Per metric logged by both: the two values, the difference (candidate - original),
    its tolerance and whether it is within (accuracy may not drop, loss may not grow, by
    more than the tolerance)."""
    out = {}
    for metric, tol, sign in (("val/accuracy", ACCURACY_TOLERANCE, -1),
                              ("val/loss", LOSS_TOLERANCE, 1)):
        a, b = original["metrics"].get(metric), candidate["metrics"].get(metric)
        if a is None or b is None:
            continue
        out[metric] = {"original": a, "candidate": b, "difference": b - a,
                       "tolerance": tol, "within": sign * (b - a) <= tol}
    return out


def _finished(variant: dict) -> bool:
    return (variant.get("status") or {}).get("state", "finished") == "finished"


def check_item(original: dict, candidate: dict, block: str, state: int,
               advice: str, layers: list[int] | None = None,
               dtype: str = "bfloat16") -> dict:
    """The advice_check item of one check variant against its original (`layers`: the
    layers a hybrid check swapped)."""
    metrics = compare(original, candidate)
    if not metrics or not (_finished(original) and _finished(candidate)):
        verdict = "inconclusive"
    else:
        verdict = "verified" if all(m["within"] for m in metrics.values()) else "refuted"
    shown = "; ".join(f"{k} {m['original']:.4g} -> {m['candidate']:.4g} "
                      f"({m['difference']:+.4f}, tolerance {m['tolerance']:g})"
                      for k, m in metrics.items()) or "no val/accuracy or val/loss in both"
    name = original["variant"]
    item = {"kind": "advice_check", "variant": name, "candidate": candidate["variant"],
            "block": block, "state": state, "metrics": metrics, "verdict": verdict,
            "text": f"{name}: the cheaper-block advice (a fixed state of {state}: "
                    f"{block_text(block, advice, state)}, in every layer) is {verdict} by "
                    f"{candidate['variant']}: {shown}"}
    if advice != HYBRID_ADVICE:
        return item
    cache = declared_cache(original, candidate, dtype)
    return {**item, "advice": advice, "layers": list(layers or []), "cache_bytes": cache,
            "text": f"{name}: the hybrid advice ({numbered('layer', layers or [])} at a "
                    f"fixed state of {state}: {block_text(block, advice, state)}; the other "
                    f"layers as trained) is {verdict} by {candidate['variant']}: {shown}"
                    + _cache_text(cache)}


def declared_cache(original: dict, candidate: dict, dtype: str) -> dict | None:
    """Both variants' declared cache per sequence at their probe's T (their reports'
    budgets), in bytes of `dtype`; None when a report declares none."""
    def of(v: dict) -> int | None:
        n = ((v.get("budget") or {}).get("model") or {}).get("cache_elements")
        return n * dtype_bytes(dtype) if n else None

    a, b = of(original), of(candidate)
    if a is None or b is None:
        return None
    return {"dtype": dtype, "seq_len": candidate.get("seq_len"), "original": a,
            "candidate": b}


def _cache_text(c: dict | None) -> str:
    if c is None:
        return ""
    ratio = f" ({c['original'] / c['candidate']:.2f}x smaller)" if c["candidate"] else ""
    return (f"; declared cache per sequence at T = {c['seq_len']} in {c['dtype']}: "
            f"{c['original']} B -> {c['candidate']} B{ratio}")


def recorded_checks(run_dir) -> dict[str, dict]:
    """Run name -> {of: the original's run name, block, state, advice (and a hybrid's
    layers)}, for each run of the experiment directory `run_dir` whose config.yaml records
    a check (none for a variant directory: a check needs its original beside it). The key
    is the record: a variant's name is never read."""
    run_dir = Path(run_dir)
    if is_variant_dir(run_dir):
        return {}
    found = {}
    for vdir in variant_dirs(run_dir):
        try:
            config = run_config(vdir)
            check = _read_check(config, vdir.name)
        except (OSError, ValueError, TypeError, KeyError):  # unreadable or edited config.yaml
            continue
        if check:
            point = {k: v for k, v in (config.get("sweep") or {}).items() if k != "variant"}
            found[config.get("variant", vdir.name)] = {
                **check, "of": run_name(check["of"], point) if point else check["of"]}
    return found


def _read_check(config: dict, where: str) -> dict:
    """A run config's check record, validated as the config key is: {of, block, state,
    advice} (the block the check trained; a hybrid's, that of its swapped layers, and its
    layers), or {}."""
    layers = [ly["name"] for ly in config.get("layers") or []]
    block = HYBRID if layers else (config.get("block") or {}).get("name")
    check = parse_variant_check(config.get("check"), where, block, layers)
    if not check:
        return {}
    out = {"of": check["of"], "state": check["state"], "advice": check["advice"]}
    if check["advice"] == HYBRID_ADVICE:
        return {**out, "block": layers[check["layers"][0]], "layers": check["layers"]}
    return {**out, "block": config["block"]["name"]}


def attach_checks(report: dict, checks: dict[str, dict]) -> list[dict]:
    """report["advice_checks"]: one item per check variant of `checks` (recorded_checks)
    whose original is in the same report (none: the key is left out). Returns the items."""
    by_name = {v["variant"]: v for v in report["variants"]}
    dtype = (report.get("thresholds") or {}).get("cache_dtype", "bfloat16")
    items = []
    for name, variant in by_name.items():
        check = checks.get(name)
        if check is not None and check["of"] in by_name:
            items.append(check_item(by_name[check["of"]], variant, check["block"],
                                    check["state"], check["advice"], check.get("layers"),
                                    dtype))
    if items:
        report["advice_checks"] = items
    return items
