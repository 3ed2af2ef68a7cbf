"""From a nested dict (a YAML experiment) to a validated Experiment.

Parsing order: the top-level keys and the plain sections; each variant's block config,
built without weights so that a bad value fails before any training; matching (state,
then params); the sweep's expansion into one Variant per grid point; last the finetune
section, which is checked against everything parsed before it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import fields
from typing import Any

import zoo
from zoo.config import positive_int, require, seed_value, unknown_key_error
from zoo.facts import Check

from ..sizing.match import matched_states, matched_widths
from .experiment import SECTIONS, Experiment, Variant
from .layers import HYBRID, expand, is_hybrid, parse_unit
from .sections import DataConfig, TrainConfig, check_data_keys, check_mlp, parse_section
from .stage_sections import FINETUNE_KEYS, FinetuneConfig, SweepConfig, lora_name, run_name
from .targets import linear_names, variant_targets

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# a name is a directory: most file systems take at most 255 bytes (NAME_RE's are ASCII)
MAX_NAME = 255
TOP_LEVEL = ["name", "seed", *SECTIONS, "block_defaults", "variants", "sweep", "finetune"]


def parse_experiment(raw: Any, source: str = "<config>") -> Experiment:
    """Build a validated Experiment from a nested dict; errors are prefixed by `source`."""
    try:
        exp = parse_body(raw)
        if raw.get("finetune") is not None:  # checked against the variants parsed above
            exp = dataclasses.replace(exp, finetune=parse_finetune(raw["finetune"], exp))
        return exp
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def parse_body(raw: Any) -> Experiment:
    """Everything but the finetune section."""
    check_top_level(raw)
    sections = {s: parse_section(raw.get(s), cls, s) for s, cls in SECTIONS.items()}
    defaults = raw.get("block_defaults") or {}
    require(isinstance(defaults, dict), f"block_defaults must be a mapping, got {defaults!r}")
    variants = parse_variants(raw.get("variants"), defaults, sections["model"].d_model,
                              sections["model"].n_layers)
    check_variant_train(sections["train"], variants)
    check_variant_checks(variants)
    # state first: the matched knob changes the block's parameters, which params then match
    state = match_states(sections, variants) if sections["match"].state else {}
    d_mlp = match_widths(sections, variants, state) if sections["match"].params else {}
    sweep = None
    if raw.get("sweep") is not None:
        sweep = parse_section(raw["sweep"], SweepConfig, "sweep")
        variants, d_mlp = expand_sweep(sweep, variants, d_mlp)
        state = {run: state[v.base] for run, v in variants.items() if v.base in state}
    return Experiment(name=raw["name"], seed=raw.get("seed", 0), variants=variants,
                      block_defaults=dict(defaults), d_mlp=d_mlp, state=state, sweep=sweep,
                      **sections)


def check_top_level(raw: Any) -> None:
    """A mapping of known keys, with a name fit for a directory and a usable seed."""
    require(isinstance(raw, dict),
            f"an experiment must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in TOP_LEVEL:
            raise unknown_key_error("experiment", str(key), TOP_LEVEL)
    name = raw.get("name")
    require(isinstance(name, str) and bool(NAME_RE.match(name)),
            f"name must be letters, digits, '_', '.' or '-' (it names the run directory), "
            f"got {name!r}")
    check_name_length("name", name)
    seed_value("seed", raw.get("seed", 0))


def check_name_length(what: str, name: str) -> None:
    """A name that becomes a directory, refused here rather than by the file system
    after training."""
    require(len(name) <= MAX_NAME,
            f"{what} is {len(name)} characters long; a directory name takes at most "
            f"{MAX_NAME}")


# ---------------------------------------------------------------- variants

def parse_variants(raw: Any, defaults: dict[str, Any], d_model: int,
                   n_layers: int) -> dict[str, Variant]:
    require(isinstance(raw, dict) and bool(raw),
            "variants must be a non-empty mapping of name -> {block: ..., ...}")
    return {n: parse_variant(n, v, defaults, d_model, n_layers) for n, v in raw.items()}


def parse_variant(name: Any, raw: Any, defaults: dict[str, Any], d_model: int,
                  n_layers: int) -> Variant:
    """One variant, one block for every layer or a layer pattern (train/config/layers.py),
    each block config built (without weights) to validate every value."""
    where = f"variants.{name}"
    require(isinstance(name, str) and bool(NAME_RE.match(name)),
            f"variant name {name!r} must be letters, digits, '_', '.' or '-' (it names a "
            "directory)")
    check_name_length(f"variant name {name[:20]}...", name)
    require(isinstance(raw, dict),
            f"{where} must be a mapping with at least 'block', got {raw!r}")
    raw = dict(raw)
    train = parse_variant_train(raw.pop("train", None), where)
    model = parse_variant_model(raw.pop("model", None), where)
    check = raw.pop("check", None)  # a record of the run, not a block setting
    if is_hybrid(raw):
        unit = parse_unit(raw, where, n_layers,
                          lambda at, spec: parse_block(at, spec, defaults, d_model))
        return Variant(name, HYBRID, {}, train=train, unit=unit, model=model,
                       check=parse_variant_check(check, where, HYBRID,
                                                 [s.block for s in expand(unit, n_layers)]))
    block, kwargs = parse_block(where, raw, defaults, d_model)
    return Variant(name, block, kwargs, train=train, model=model,
                   check=parse_variant_check(check, where, block))


def parse_block(where: str, raw: Any, defaults: dict[str, Any],
                d_model: int) -> tuple[str, dict[str, Any]]:
    """One block spec {block: <name>, **kwargs}: its name and kwargs (block_defaults
    merged under them), the config built without weights to validate every value."""
    require(isinstance(raw, dict),
            f"{where} must be a mapping with at least 'block', got {raw!r}")
    raw = dict(raw)
    block = raw.pop("block", None)
    require(block is not None, f"{where}.block is missing; one of {zoo.names()}")
    require(isinstance(block, str), f"{where}.block must be one of {zoo.names()}, got "
                                    f"{block!r}")  # a list would not even hash
    try:
        cls = zoo.block_class(block)
    except ValueError as e:
        raise ValueError(f"{where}.block: {e}") from None
    kwargs = {**defaults, **raw}
    require("d_model" not in kwargs,
            f"{where}: set model.d_model ({d_model}), not the block's d_model")
    check_block_keys(cls, block, kwargs, where, raw)
    try:
        cls.Config.from_dict(kwargs, d_model=d_model)  # validates every value
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
    return block, kwargs


# what a variant may set for itself under `train:`; the rest of train is shared, so that
# the variants stay comparable (same steps, data, schedule length)
VARIANT_TRAIN_KEYS = ("optimizer", "lr", "weight_decay", "warmup_steps")


def _variant_section(raw: Any, where: str, section: str, keys: tuple[str, ...]) -> dict:
    """A variant's own `section:` (train or model), holding only the keys it may set."""
    if raw is None:
        return {}
    require(isinstance(raw, dict), f"{where}.{section} must be a mapping of "
                                   f"{', '.join(keys)}, got {raw!r}")
    unknown = sorted(set(raw) - set(keys))
    require(not unknown, f"{where}.{section}: {unknown} cannot differ between variants; a "
                         f"variant sets only {', '.join(keys)}")
    return dict(raw)


def parse_variant_train(raw: Any, where: str) -> dict[str, Any]:
    return _variant_section(raw, where, "train", VARIANT_TRAIN_KEYS)


# what a variant may set for itself under `model:`: the MLP's kind (the matched width
# follows it); the sizes stay the experiment's
VARIANT_MODEL_KEYS = ("mlp",)


def parse_variant_model(raw: Any, where: str) -> dict[str, Any]:
    model = _variant_section(raw, where, "model", VARIANT_MODEL_KEYS)
    check_mlp(f"{where}.model.mlp", model.get("mlp", "gelu"))
    return model


def check_variant_train(train: TrainConfig, variants: dict[str, Variant]) -> None:
    """Each variant's train overrides, validated merged into the train section."""
    for name, v in variants.items():
        if v.train:
            try:
                TrainConfig.from_dict({**train.to_dict(), **v.train})
            except (ValueError, TypeError) as e:
                raise ValueError(f"variants.{name}.train: {e}") from None


# `check:` marks a variant trained to check a suggestion the report made for another
# variant (train/commands/check/): which variant, which advice, the state it named, and for
# a hybrid the layers it swapped.
CHECK_KEYS = ("of", "advice", "state", "layers")
# advice whose check swaps some layers only: each swapped layer checks the per-layer advice
LAYER_ADVICE = {"hybrid": "cheaper_block"}


def advice_checks(advice: str | None = None) -> list[tuple[str, Check]]:
    """(block, Check) for each Check a registered family declares (zoo/facts.py), in
    listing order, of `advice` only when given: the blocks whose training checks an
    advice (a fixed state of N: linear attention's F, an SSM's N). A hybrid's are those of
    its swapped layers' advice (LAYER_ADVICE)."""
    advice = LAYER_ADVICE.get(advice, advice)
    return [(name, check) for name in zoo.families() for check in zoo.facts_of(name).checks
            if advice is None or check.advice == advice]


def parse_variant_check(raw: Any, where: str, block: str,
                        layer_blocks: list[str] | None = None) -> dict[str, Any]:
    """A variant's `check:` mapping, each key validated (`of` against the other variants
    later, in check_variant_checks); {} when absent. `layer_blocks`: a layer pattern's
    block per layer, against which a hybrid check's `layers` are validated."""
    if raw is None:
        return {}
    where = f"{where}.check"
    require(isinstance(raw, dict), f"{where} must be a mapping {{of: <variant>, advice: "
                                   f"cheaper_block, state: <N>}}, got {raw!r}")
    for key in raw:
        if key not in CHECK_KEYS:
            raise unknown_key_error("variant check", f"{where}.{key}",
                                    [f"{where}.{k}" for k in CHECK_KEYS])
    swaps = isinstance(raw.get("advice"), str) and raw["advice"] in LAYER_ADVICE
    required = [k for k in CHECK_KEYS if k != "layers" or swaps]
    missing = [k for k in required if k not in raw]
    require(not missing, f"{where}: missing {', '.join(missing)} (it takes "
                         f"{', '.join(required)})")
    require(isinstance(raw["of"], str), f"{where}.of must name a variant, got {raw['of']!r}")
    advice = raw["advice"]
    known = [*dict.fromkeys(check.advice for _, check in advice_checks()), *LAYER_ADVICE]
    require(isinstance(advice, str) and advice in known,
            f"{where}.advice must be one of {known}, got {advice!r}")
    positive_int(where, state=raw["state"])
    blocks = list(dict.fromkeys(name for name, _ in advice_checks(advice)))
    if advice in LAYER_ADVICE:
        check_swapped_layers(raw["layers"], where, block, layer_blocks or [], blocks)
        return {**raw, "layers": list(raw["layers"])}
    require("layers" not in raw, f"{where}.layers: only a check of "
                                 f"{' or '.join(LAYER_ADVICE)} advice swaps some layers")
    require(block in blocks, f"{where}: a {block} block cannot check {advice} advice (the "
                             f"blocks that do: {', '.join(blocks)})")
    return dict(raw)


def check_swapped_layers(layers: Any, where: str, block: str, layer_blocks: list[str],
                         blocks: list[str]) -> None:
    """A hybrid check's `layers`: ascending layer indices of a layer-pattern variant, some
    but not all of its layers, each swapped for one and the same block that checks."""
    require(block == HYBRID, f"{where}: a hybrid check is a layer pattern (layers: or "
                             f"pattern: + blocks:), not one {block} block in every layer")
    n = len(layer_blocks)
    require(isinstance(layers, list) and bool(layers)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
            and layers == sorted(set(layers)),
            f"{where}.layers must be a non-empty ascending list of layer indices, got "
            f"{layers!r}")
    require(all(0 <= i < n for i in layers) and len(layers) < n,
            f"{where}.layers {layers}: some but not all of the {n} layers (0 to {n - 1})")
    swapped = sorted({layer_blocks[i] for i in layers})
    require(len(swapped) == 1 and swapped[0] in blocks,
            f"{where}.layers {layers} hold {', '.join(swapped)}: the swapped layers hold one "
            f"block that checks it ({', '.join(blocks)})")


def check_variant_checks(variants: dict[str, Variant]) -> None:
    """Each `check.of` names another variant of the experiment."""
    for name, v in variants.items():
        of = v.check.get("of")
        require(of is None or (of in variants and of != name),
                f"variants.{name}.check.of: {of!r} is "
                + ("this variant itself" if of == name else "not a variant of the experiment")
                + f"; one of {[n for n in variants if n != name]}")


def check_block_keys(cls: type, block: str, kwargs: dict[str, Any], where: str,
                     own: dict[str, Any]) -> None:
    """Unknown block keys, named where they were written: the variant or block_defaults."""
    known = [f.name for f in fields(cls.Config) if f.init]
    for key in kwargs:
        if key not in known:
            owner = where if key in own else "block_defaults"
            raise unknown_key_error(f"{block} block", f"{owner}.{key}",
                                    [f"{owner}.{k}" for k in known])


def expand_sweep(sweep: SweepConfig, variants: dict[str, Variant],
                 d_mlp: dict[str, int]) -> tuple[dict[str, Variant], dict[str, int]]:
    """One Variant per variant x grid point, each keeping its variant's matched width."""
    names = [run_name("", p) for p in sweep.points()]
    require(len(set(names)) == len(names),
            f"sweep: two grid points share a run name (lr values equal to 6 significant "
            f"digits?): {sorted(n for n in names if names.count(n) > 1)}")
    runs: dict[str, Variant] = {}
    for v in variants.values():
        for point in sweep.points():
            name = run_name(v.name, point)
            require(name not in runs and (name not in variants or name == v.name),
                    f"sweep: run name {name!r} is taken twice; rename variant {v.name!r}")
            check_name_length(f"sweep run name {name[:20]}...", name)
            runs[name] = dataclasses.replace(v, name=name, base=v.name, point=point)
    widths = {run: d_mlp[r.base] for run, r in runs.items() if r.base in d_mlp}
    return runs, widths


def match_states(sections: dict[str, Any],
                 variants: dict[str, Variant]) -> dict[str, dict[str, int]]:
    hybrids = [n for n, v in variants.items() if v.unit]
    require(not hybrids, f"match.state sizes one block's state knob to the first variant's "
                         f"cache; layer patterns ({', '.join(hybrids)}) set each layer's "
                         f"knob themselves: set match.state: false")
    return matched_states({n: (v.block, v.block_kwargs) for n, v in variants.items()},
                          sections["model"].d_model, sections["model"].n_layers,
                          sections["data"].seq_len, sections["match"].tolerance)


def match_widths(sections: dict[str, Any], variants: dict[str, Variant],
                 state: dict[str, dict[str, int]]) -> dict[str, int]:
    data, model = sections["data"], sections["model"]
    sizes = {**model.to_dict(), "vocab_size": data.vocab_size, "seq_len": data.seq_len}
    blocks = {n: [(s.block, s.kwargs) for s in v.layer_specs(model.n_layers)] if v.unit
              else (v.block, {**v.block_kwargs, **state.get(n, {})})
              for n, v in variants.items()}
    mlps = {n: v.model["mlp"] for n, v in variants.items() if "mlp" in v.model}
    return matched_widths(sizes, blocks, sections["match"].tolerance, mlps)


# ---------------------------------------------------------------- the finetune section

def parse_finetune(raw: Any, exp: Experiment) -> FinetuneConfig:
    """The `finetune` section of `exp`, validated, including against the experiment."""
    require(isinstance(raw, dict), f"finetune must be a mapping of keys to values, got {raw!r}")
    for key in raw:
        if key not in FINETUNE_KEYS:
            raise unknown_key_error("experiment", f"finetune.{key}",
                                    [f"finetune.{k}" for k in FINETUNE_KEYS])
    ft = FinetuneConfig(**{**raw, "data": finetune_data(raw.get("data")),
                           "train": finetune_train(raw.get("train"), exp.train)})
    check_finetune(dataclasses.replace(exp, finetune=ft))
    return ft


def under_finetune(e: ValueError, section: str) -> ValueError:
    """An error of the data or train section, named under finetune."""
    msg = str(e)
    return ValueError(f"finetune.{msg}" if msg.startswith(section + ".")
                      else f"finetune.{section}: {msg}")


def finetune_data(raw: Any) -> DataConfig:
    require(raw is not None, "finetune.data is missing: the second task's data section "
                             "(e.g. {task: mqar, permute_seed: 1})")
    try:
        if isinstance(raw, dict):  # first: a key of another task is named as such
            check_data_keys(raw)
        return parse_section(raw, DataConfig, "data")
    except ValueError as e:
        raise under_finetune(e, "data") from None


def finetune_train(raw: Any, base: TrainConfig) -> dict:
    """The overrides of the train section, checked merged onto the experiment's."""
    overrides = dict(raw or {}) if isinstance(raw, dict) or raw is None else raw
    try:
        parse_section(overrides, TrainConfig, "train")  # unknown keys, types
        TrainConfig(**{**base.to_dict(), **overrides})  # the merged values
    except ValueError as e:
        raise under_finetune(e, "train") from None
    return overrides


def check_finetune(exp: Experiment) -> None:
    """What the section can only be checked on against the experiment."""
    ft, base = exp.finetune, exp.data
    # the best run of a sweep is chosen on rank zero from the written reports; other ranks
    # of a distributed run could not know it
    require(exp.sweep is None or exp.train.devices in (1, "1"),
            f"finetune after a sweep runs on one device, got train.devices "
            f"{exp.train.devices!r}")
    unknown = [v for v in ft.from_variants or () if v not in exp.base_variants()]
    require(not unknown, f"finetune.from_variants {unknown} are not variants of this "
                         f"experiment: {list(exp.base_variants())}")
    require(ft.data.vocab_size <= base.vocab_size,
            f"finetune.data.vocab_size ({ft.data.vocab_size}) exceeds the pretrained "
            f"models' embedding (data.vocab_size {base.vocab_size})")
    require(ft.data.seq_len <= base.seq_len,
            f"finetune.data.seq_len ({ft.data.seq_len}) exceeds the pretrained "
            f"models' max length (data.seq_len {base.seq_len})")
    for variant in exp.finetune_variants():
        check_finetune_variant(exp, variant)


def check_finetune_variant(exp: Experiment, variant: str) -> None:
    ft = exp.finetune
    clash = [lora_name(variant, r) for r in ft.ranks if lora_name(variant, r) in exp.variants]
    for r in ft.ranks:
        check_name_length(f"fine-tune directory name {lora_name(variant, r)[:20]}...",
                          lora_name(variant, r))
    require(not clash, f"finetune: directory names {clash} are taken by variants")
    if not variant_targets(exp, variant, ft.targets):  # only then are the names listed
        raise ValueError(f"finetune.targets {ft.targets} match no nn.Linear of variant "
                         f"{variant!r}; its Linear names: {linear_names(exp, variant)}")
