"""`rankzoo report RUN_DIR --emit-check check.yaml`: the experiment that checks a variant's
cheaper-block advice by training the suggested blocks beside it.

    raw = emit_check(report, "runs/quick", "check.yaml")   # written, and loaded back first

The report advises "a block with a fixed state of N (linear attention with F = N, or an
SSM with N = N)" for layers whose past->future rank stays <= N. The emitted experiment is
the original run's own (its data, model, train and monitor sections, its seed) with the
variant the advice is about, as it was trained, and one variant per block that checks the
advice (each registered family's `facts.checks`, zoo/facts.py, in listing order), matched
in parameters to the first:

  <variant>                     the variant the advice is about, as it was trained
  <variant>.linear_f<N>         linear attention with F = N: feature_map identity with
                                feature_dim N (unnormalized: identity features can be
                                negative)
  <variant>.ssm_n<N>            an SSM with d_state N in every layer

where N is the largest state advised over the variant's layers (the zoo's decoder has one
block in every layer, so every layer is replaced: a stronger change than the advice's).
Each check variant carries the record `check: {of: <variant>, advice: cheaper_block,
state: N}` (a config key, train/config/parse.py CHECK_KEYS): its run's config.yaml keeps
it, and `rankzoo report` on the run reads it back (outcome.py); the names only read well.
The file is written through `rankzoo pick --emit`'s writer (train/commands/pick/emit.py):
loaded back first, an existing file kept unless forced.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ...config.load import load_experiment
from ...config.parse import advice_checks
from ...rundir.layout import EXPERIMENT_FILE
from ...rundir.read import is_variant_dir
from ...sizing.costs import MATCH_TOLERANCE
from ..pick.emit import check_target, experiment_name, write_experiment

FLAG = "--emit-check"
ADVICE = "cheaper_block"


def candidates(state: int) -> dict[str, dict[str, Any]]:
    """The blocks whose fixed state is `state`, by the suffix of their variant's name:
    each Check of the advice a registered family declares."""
    return {check.suffix.format(n=state): check.kwargs(state)
            for _, check in advice_checks(ADVICE)}


def advised(report: dict, variant: str | None) -> tuple[str, list[dict]]:
    """(variant, its cheaper_block advice items): the one variant named, or the one that
    has such advice; a clear error otherwise."""
    items = [a for a in report.get("advice", []) if a["kind"] == ADVICE]
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


def check_experiment(exp: dict[str, Any], variant: str, state: int,
                     name: str) -> dict[str, Any]:
    """The original experiment `exp` (resolved) reduced to `variant` and its checks."""
    if variant not in exp["variants"]:  # a sweep's grid point, or a fine-tune
        raise ValueError(f"{FLAG}: {variant} is not a variant of the experiment "
                         f"({', '.join(exp['variants'])}); check a trained variant")
    # a check variant checked in turn: its own record names a variant left out here
    original = {k: v for k, v in exp["variants"][variant].items() if k != "check"}
    variants = {variant: original, **{f"{variant}.{suffix}": _check_variant(
        block, original, {"of": variant, "advice": ADVICE, "state": state})
        for suffix, block in candidates(state).items()}}
    keep = ("seed", "data", "model", "train", "monitor", "block_defaults")
    return {"name": name, **{k: exp[k] for k in keep if k in exp},
            "match": {"params": True, "tolerance": MATCH_TOLERANCE}, "variants": variants}


def _check_variant(block: dict, original: dict, check: dict) -> dict[str, Any]:
    """One check variant: its block, the original's own train settings and the record,
    each a fresh copy (shared objects would be written as YAML anchors and aliases)."""
    extra = {"train": copy.deepcopy(original["train"])} if "train" in original else {}
    return {**block, **extra, "check": dict(check)}


def emit_check(report: dict, run_dir, path, force: bool = False) -> dict[str, Any]:
    """Write the check experiment of the cheaper-block advice in `report` (of `run_dir`,
    an experiment or one variant directory) to `path`; return it."""
    path, run_dir = check_target(path, force, FLAG), Path(run_dir)
    exp_dir = run_dir.parent if is_variant_dir(run_dir) else run_dir
    if not (exp_dir / EXPERIMENT_FILE).is_file():
        raise FileNotFoundError(f"{FLAG}: {exp_dir / EXPERIMENT_FILE} not found; the check "
                                "reuses the run's own experiment")
    exp = load_experiment(exp_dir / EXPERIMENT_FILE).to_dict()
    variant, items = advised(report, run_dir.name if is_variant_dir(run_dir) else None)
    state = max(a["state"] for a in items)
    raw = check_experiment(exp, variant, state, experiment_name(path, f"check_{variant}"))
    header = _header(variant, exp_dir, items, state, path, raw["name"])
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
        "# Each check variant's `check:` key records what it checks; `rankzoo report` reads "
        "it back.",
        f"#   rankzoo train {path}",
        f"#   rankzoo report runs/{name}   # the advice, verified or refuted"])
