"""`rankzoo report RUN_DIR --emit-check check.yaml`: the experiment that checks a variant's
cheaper-block or hybrid advice by training the suggested blocks beside it.

    raw = emit_check(report, "runs/quick", "check.yaml")   # written, and loaded back first

The report advises "a block with a fixed state of N (linear attention with F = N, an SSM
with N = N, or a delta rule (Gated DeltaNet, KDA) with K = N)" for layers whose
past->future rank stays <= N, and, when some layers but not all are so advised, the hybrid
that swaps exactly those layers (budgets/advice/hybrid.py).
The emitted experiment is the original run's own (its data, model, train and monitor
sections, its seed) with the variant the advice is about, as it was trained, and one
variant per block that checks the advice (each registered family's `facts.checks`,
zoo/facts.py, in listing order), matched in parameters to the first.

Cheaper-block advice for every layer (no hybrid item): every layer is replaced,

  <variant>.linear_f<N>         linear attention with F = N: feature_map identity with
                                feature_dim N (unnormalized: identity features can be
                                negative)
  <variant>.ssm_n<N>            an SSM with d_state N in every layer
  <variant>.delta_k<N>          Gated DeltaNet with key_dim N in every layer

where N is the largest state advised over the variant's layers; each carries the record
`check: {of: <variant>, advice: cheaper_block, state: N}`. Hybrid advice: a layer pattern
with one spec per layer, the advised layers the Check's block, the others as trained,

  <variant>.l1_linear_f<N>      layer 1 linear attention with F = N, the others kept
  <variant>.l1_ssm_n<N>         layer 1 an SSM with N = N, the others kept
  <variant>.l1_delta_k<N>       layer 1 Gated DeltaNet with K = N, the others kept

each with `check: {of: <variant>, advice: hybrid, state: N, layers: [1]}`, and the header
states each variant's declared cache per sequence at the report's T (its blocks' own
budgets). The record is a config key (train/config/parse.py CHECK_KEYS): its run's
config.yaml keeps it, and `rankzoo report` on the run reads it back (outcome.py); the names
only read well. The file is written through `rankzoo pick --emit`'s writer
(train/commands/pick/emit.py): loaded back first, an existing file kept unless forced.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from budgets.advice.hybrid import KIND as HYBRID_ADVICE
from budgets.advice.hybrid import numbered
from budgets.cache import dtype_bytes

from ...config import Experiment, parse_experiment
from ...config.load import load_experiment
from ...config.parse import advice_checks
from ...rundir.layout import EXPERIMENT_FILE
from ...rundir.read import is_variant_dir
from ...sizing.costs import MATCH_TOLERANCE, block_cost
from ..pick.emit import check_target, experiment_name, write_experiment

FLAG = "--emit-check"
ADVICE = "cheaper_block"


def candidates(state: int) -> dict[str, dict[str, Any]]:
    """The blocks whose fixed state is `state`, by the suffix of their variant's name:
    each Check of the advice a registered family declares."""
    return {check.suffix.format(n=state): check.kwargs(state)
            for _, check in advice_checks(ADVICE)}


def advised(report: dict, variant: str | None) -> tuple[str, list[dict]]:
    """(variant, its cheaper_block and hybrid advice items): the one variant named, or
    the one that has such advice; a clear error otherwise."""
    items = [a for a in report.get("advice", []) if a["kind"] in (ADVICE, HYBRID_ADVICE)]
    names = list(dict.fromkeys(a["variant"] for a in items))
    if variant is None and len(names) > 1:
        raise ValueError(f"{FLAG}: {len(names)} variants have cheaper-block advice "
                         f"({', '.join(names)}); name one: rankzoo report RUN_DIR/<variant> "
                         f"{FLAG} FILE")
    name = variant or (names[0] if names else None)
    mine = [a for a in items if a["variant"] == name]
    if not mine:
        kinds = sorted({a["kind"] for a in report.get("advice", [])})
        raise ValueError(f"{FLAG}: {name or 'no variant'} has {'no ' if name else ''}"
                         f"cheaper-block advice to check (its advice: "
                         f"{', '.join(kinds) or 'none'}); nothing was written")
    return name, mine


def check_experiment(exp: dict[str, Any], variant: str, state: int, name: str,
                     hybrid: tuple[list[int], list[dict]] | None = None) -> dict[str, Any]:
    """The original experiment `exp` (resolved) reduced to `variant` and its checks; with
    `hybrid` = (the layers to swap, the original's block spec per layer), hybrids."""
    if variant not in exp["variants"]:  # a sweep's grid point, or a fine-tune
        raise ValueError(f"{FLAG}: {variant} is not a variant of the experiment "
                         f"({', '.join(exp['variants'])}); check a trained variant")
    # a check variant checked in turn: its own record names a variant left out here
    original = {k: v for k, v in exp["variants"][variant].items() if k != "check"}
    checks = {variant: original}
    for suffix, block in candidates(state).items():
        if hybrid is None:
            checks[f"{variant}.{suffix}"] = _check_variant(
                block, original, {"of": variant, "advice": ADVICE, "state": state})
        else:
            swapped, specs = hybrid
            checks[f"{variant}.{'_'.join(f'l{i}' for i in swapped)}_{suffix}"] = \
                _check_variant({"layers": [block if i in swapped else spec
                                           for i, spec in enumerate(specs)]}, original,
                               {"of": variant, "advice": HYBRID_ADVICE, "state": state,
                                "layers": list(swapped)})
    keep = ("seed", "data", "model", "train", "monitor", "block_defaults")
    return {"name": name, **{k: exp[k] for k in keep if k in exp},
            "match": {"params": True, "tolerance": MATCH_TOLERANCE}, "variants": checks}


def _check_variant(block: dict, original: dict, check: dict) -> dict[str, Any]:
    """One check variant: its block (or layers), the original's own train settings and
    the record, each a fresh copy (shared objects would be written as YAML anchors and
    aliases)."""
    extra = {"train": copy.deepcopy(original["train"])} if "train" in original else {}
    return {**copy.deepcopy(block), **extra, "check": copy.deepcopy(check)}


def original_layers(exp: Experiment, variant: str) -> list[dict]:
    """The variant's block spec per layer, as trained ({block, **kwargs})."""
    return [s.to_dict() for s in exp.variants[variant].layer_specs(exp.model.n_layers)]


def emit_check(report: dict, run_dir, path, force: bool = False) -> dict[str, Any]:
    """Write the check experiment of the cheaper-block or hybrid advice in `report` (of
    `run_dir`, an experiment or one variant directory) to `path`; return it."""
    path, run_dir = check_target(path, force, FLAG), Path(run_dir)
    exp_dir = run_dir.parent if is_variant_dir(run_dir) else run_dir
    if not (exp_dir / EXPERIMENT_FILE).is_file():
        raise FileNotFoundError(f"{FLAG}: {exp_dir / EXPERIMENT_FILE} not found; the check "
                                "reuses the run's own experiment")
    loaded = load_experiment(exp_dir / EXPERIMENT_FILE)
    exp = loaded.to_dict()
    variant, items = advised(report, run_dir.name if is_variant_dir(run_dir) else None)
    hybrid = next((a for a in items if a["kind"] == HYBRID_ADVICE), None)
    name = experiment_name(path, f"check_{variant}")
    if hybrid is None:
        state = max(a["state"] for a in items)
        raw = check_experiment(exp, variant, state, name)
        header = _header(variant, exp_dir, items, state, path, name)
    else:
        state = hybrid["state"]
        specs = original_layers(loaded, variant) if variant in loaded.variants else []
        raw = check_experiment(exp, variant, state, name, (hybrid["layers"], specs))
        header = _hybrid_header(report, variant, exp_dir, hybrid, raw, path)
    write_experiment(path, header + "\n" + yaml.safe_dump(raw, sort_keys=False), force, FLAG)
    return raw


def _header(variant: str, exp_dir: Path, items: list[dict], state: int, path: Path,
            name: str) -> str:
    """The emitted file's comment lines: what it checks and the commands that run it."""
    layers = [str(a["layer"]) for a in items]
    return "\n".join([
        f"# Written by rankzoo report {FLAG}: checks the cheaper-block advice of {variant} "
        f"({exp_dir}): layer{'s' * (len(layers) > 1)} {', '.join(layers)} "
        f"realize{'s' * (len(layers) == 1)}",
        f"# past->future rank <= {state}, so a block with a fixed state of {state} should do "
        f"as well. Every layer is replaced; matched in parameters to {variant}.",
        *_run_lines(path, name)])


def _run_lines(path: Path, name: str) -> list[str]:
    return ["# Each check variant's `check:` key records what it checks; `rankzoo report` "
            "reads it back.",
            f"#   rankzoo train {path}",
            f"#   rankzoo report runs/{name}   # the advice, verified or refuted"]


def _hybrid_header(report: dict, variant: str, exp_dir: Path, item: dict, raw: dict,
                   path: Path) -> str:
    """The hybrid check's comment lines: what it swaps, each variant's declared cache at
    the report's T, the commands."""
    swapped, kept, state = item["layers"], item["kept"], item["state"]
    caches = declared_caches(raw, report, variant)
    return "\n".join([
        f"# Written by rankzoo report {FLAG}: checks the hybrid advice of {variant} "
        f"({exp_dir}): {numbered('layer', swapped)} realize{'s' * (len(swapped) == 1)}",
        f"# past->future rank <= {state} and {numbered('layer', kept)} "
        f"do{'es' * (len(kept) == 1)} not, so swapping {numbered('layer', swapped)} alone "
        f"for a block with a fixed state of {state} should do as well.",
        f"# The other layers are kept as trained; matched in parameters to {variant}.",
        f"# Declared cache per sequence at T = {caches['seq_len']} in {caches['dtype']}: "
        + "; ".join(f"{n} {b} B" for n, b in caches["bytes"].items()),
        *_run_lines(path, raw["name"])])


def declared_caches(raw: dict, report: dict, variant: str) -> dict[str, Any]:
    """Each variant of the experiment `raw`: its blocks' declared cache per sequence, in
    bytes at the report's T and cache dtype (every layer's block built on the meta
    device: the budget it declares, train/sizing/costs.py)."""
    exp = parse_experiment(raw)
    T = next(v["seq_len"] for v in report["variants"] if v["variant"] == variant)
    dtype = (report.get("thresholds") or {}).get("cache_dtype", "bfloat16")
    nbytes, D = dtype_bytes(dtype), exp.model.d_model
    return {"seq_len": T, "dtype": dtype, "bytes": {
        name: sum(block_cost(s.block, s.kwargs, D, T, dtype_bytes=nbytes).cache_bytes
                  for s in v.layer_specs(exp.model.n_layers))
        for name, v in exp.variants.items()}}
