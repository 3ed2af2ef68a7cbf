"""`rankzoo pick --emit pick.yaml`: the shortlist (the front, or every candidate) as an
experiment `rankzoo train` runs as is.

    raw = emit(doc, "pick.yaml", which="front")   # written, and loaded back first

The experiment is matched in parameters (the candidate with the most parameters first, so
that every other one's MLP widens to it), on MQAR with the requested associations at the
target length, so that its runs come back to `rankzoo pick --runs` as evidence. A hybrid
is a layer-pattern variant (`pattern` + `blocks`, docs/CONFIG.md): its cheap layers, then
its global one, the unit repeating over model.n_layers. The file is YAML in
configs/quick.yaml's layout, with a header saying where it came from and what to run
next; an existing file is kept unless forced.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ...config import parse_experiment
from ...config.layers import HYBRID
from ...sizing.costs import MATCH_TOLERANCE, MLP_RATIO
from ...sizing.units import byte_flag, format_bytes

EMIT_SHORTLISTS = ("front", "all")


def emit(doc: dict[str, Any], path: str | Path, force: bool = False,
         which: str = "front") -> dict[str, Any]:
    """Write the shortlist's experiment to `path` (a .yaml file) and return it. It is
    loaded back before writing (the same parse `rankzoo train` does), and an existing file
    is kept unless `force`."""
    path = check_target(path, force)
    raw = emitted_experiment(doc, experiment_name(path, "pick"), which)
    write_experiment(path, experiment_yaml(raw, doc, path, which), force)
    return raw


def check_target(path: str | Path, force: bool, flag: str = "--emit") -> Path:
    """`path` as a .yaml file that may be written: in a directory that exists, and new
    unless `force`; errors name `flag`."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"{flag} {path}: expected a .yaml file")
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {path}: is a directory")
    if path.exists() and not force:
        raise FileExistsError(f"{flag} {path}: exists; pass --force to overwrite it "
                              "(nothing was written)")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{flag} {path}: the directory {path.parent} does not exist")
    return path


def experiment_name(path: Path, default: str) -> str:
    """The experiment name of an emitted file: its stem, fit for a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem).lstrip("_.-") or default


def write_experiment(path: Path, text: str, force: bool, flag: str = "--emit") -> None:
    """The experiment `text` into `path`, loaded back first (the same parse `rankzoo
    train` does): one that would not load is not written."""
    try:
        parse_experiment(yaml.safe_load(text), source=str(path))
    except ValueError as e:
        raise ValueError(f"{flag} {path}: the experiment would not load, so it was not "
                         f"written: {e}") from None
    write_new(path, text, force, flag)


def write_new(path: Path, text: str, force: bool, flag: str = "--emit") -> None:
    """`text` into `path`: created exclusively (a file that appeared meanwhile is kept),
    or with `force` replaced atomically through a temporary file beside it."""
    if not force:
        try:
            with open(path, "x") as f:
                f.write(text)
        except FileExistsError:
            raise FileExistsError(f"{flag} {path}: exists; pass --force to overwrite it "
                                  "(nothing was written)") from None
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emitted_experiment(doc: dict[str, Any], name: str, which: str = "front") -> dict[str, Any]:
    """The experiment of the shortlisted candidates: matched in parameters (the one with
    the most parameters first, so that every other one's MLP widens to it), on MQAR with
    the constraints' associations at the target length."""
    c = doc["constraints"]
    D, T, n = c["d_model"], c["seq_len"], c["associations"]
    if 4 * n > T:
        raise ValueError(f"--associations {n}: MQAR needs 4 x associations <= seq_len, so "
                         f"at most {T // 4} at --seq-len {T}")
    rows = sorted(shortlist(doc, which), key=lambda r: -r["params"]["layers"])
    taken: set[str] = set()
    variants = {variant_name(r, taken): variant_spec(r) for r in rows}
    return experiment_sections(name, D, c["n_heads"], c["n_layers"], T, n, variants)


def experiment_sections(name: str, D: int, n_heads: int, n_layers: int, T: int, pairs: int,
                       variants: dict[str, Any]) -> dict[str, Any]:
    """An emitted experiment's sections around its variants: MQAR with `pairs` key-value
    pairs at T, parameters matched, and train settings that start the flow at D (a
    smaller learning rate and bf16 as the model grows), to adjust with overrides."""
    steps = 2000
    return {
        "name": name, "seed": 0, "data": mqar_data(T, pairs),
        "model": {"d_model": D, "n_layers": n_layers, "mlp_ratio": MLP_RATIO},
        "match": {"params": True, "tolerance": MATCH_TOLERANCE},
        "block_defaults": {"n_heads": n_heads},
        "variants": variants,
        "train": {"max_steps": steps, "lr": 3.0e-3 if D <= 128 else 1.0e-3 if D <= 512
                  else 5.0e-4, "warmup_steps": steps // 20, "accelerator": "auto",
                  "precision": "bf16-mixed" if D >= 512 else "32-true",
                  "val_every_n_steps": steps // 10, "checkpoint_every_n_steps": steps // 4,
                  "log_every_n_steps": 10},
        "monitor": {"every_n_steps": steps // 10, "probe_len": min(256, T)},
    }


def shortlist(doc: dict[str, Any], which: str = "front") -> list[dict[str, Any]]:
    """The candidates an emitted experiment trains: the Pareto front, or all of them."""
    if which not in EMIT_SHORTLISTS:
        raise ValueError(f"--shortlist {which}: expected one of {list(EMIT_SHORTLISTS)}")
    return [r for r in doc["candidates"] if which == "all" or r["front"]]


def variant_spec(row: dict[str, Any]) -> dict[str, Any]:
    """A candidate as a variant: its block and knobs (n_heads is in block_defaults), or a
    hybrid's unit as `pattern` + `blocks`, each layer kind named by its block."""
    def spec(block: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"block": block, **{k: v for k, v in kwargs.items() if k != "n_heads"}}

    if row["family"] != HYBRID:
        return spec(row["block"], row["kwargs"])
    cheap, glob = row["layers"]
    return {"pattern": [cheap["block"]] * (row["unit"]["every"] - 1) + [glob["block"]],
            "blocks": {k["block"]: spec(k["block"], k["kwargs"]) for k in (cheap, glob)}}


def shape_text(block: str, label: str, knob: str) -> str:
    """`sliding_window mqa w42`: a shape's block, tag and knob."""
    tag = "" if block in ("ssm", "mla", "moe") else label.removeprefix(
        block).strip(" ()").lower().replace("gqa g=", "gqa").replace("+", "")
    return f"{block} {tag} {knob}"


def variant_name(row: dict[str, Any], taken: set[str]) -> str:
    """`sliding_window_mqa_w42`: block, tag and knob, fit for a directory name; a hybrid's
    `sliding_window_mqa_w512_x5_softmax_g4`, its cheap layers' then its global one's."""
    knob = f"{row['knob']['symbol']}{row['knob']['value']}"
    if row["family"] == HYBRID:
        cheap, glob = row["layers"]
        groups = glob["kwargs"].get("n_kv_heads")
        text = (f"{shape_text(cheap['block'], cheap['label'], knob)} "
                f"x{row['unit']['every'] - 1} {glob['block']}"
                + ("" if groups is None else f" g{groups}"))
    else:
        text = shape_text(row["block"], row["label"], knob)
    name = re.sub(r"[^a-z0-9.]+", "_", text.lower()).strip("_.")
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name}_{i}", i + 1
    taken.add(unique)
    return unique


def mqar_data(T: int, n: int) -> dict[str, Any]:
    """The data section: MQAR at seq_len T with n associations, validated at n/4, n/2 and
    n pairs, about 64k tokens a step."""
    batch = min(64, max(1, 2 ** 16 // T))
    pairs = sorted({max(1, n // 4), max(1, n // 2), n})
    data = {"task": "mqar", "vocab_size": max(128, 2 ** math.ceil(math.log2(4 * n))),
            "seq_len": T, "num_kv_pairs": n,
            "train_size": min(20000, max(1024, 2 ** 24 // T)),
            "val_size": min(256, max(len(pairs) * 8, 2 ** 20 // T)), "batch_size": batch}
    if len(pairs) > 1:
        data["val_kv_pairs"] = pairs
    return data


def experiment_yaml(raw: dict[str, Any], doc: dict[str, Any], path: Path, which: str) -> str:
    """The experiment as YAML in configs/quick.yaml's layout, with a header saying where it
    came from and what to run next, and each variant's knob and cache beside it."""
    by_name = {}
    rows = sorted(shortlist(doc, which), key=lambda r: -r["params"]["layers"])
    for name, row in zip(raw["variants"], rows, strict=True):
        by_name[name] = (f"# {row.get('pattern', row['knob']['shown'])}: "
                         f"{format_bytes(row['cache_bytes'])} per sequence, p->f "
                         f"{row['carried']} per head")

    def section(key: str) -> str:
        return yaml.safe_dump({key: raw[key]}, sort_keys=False, default_flow_style=False)

    lines = [yaml_header(raw, doc, path, which), f"name: {raw['name']}",
             f"seed: {raw['seed']}"]
    lines += [section("data").rstrip(), section("model").rstrip(), section("match").rstrip(),
              section("block_defaults").rstrip(), "variants:"]
    width = max((len(n) for n, v in raw["variants"].items() if "pattern" not in v), default=0)
    for name, spec in raw["variants"].items():
        if "pattern" in spec:  # a layer pattern: its keys on lines of their own
            lines.append(f"  {name}:   {by_name[name]}")
            lines += [f"    {key}: {flow(value)}" for key, value in spec.items()]
        else:
            lines.append(f"  {name + ':':<{width + 1}} {flow(spec)}   {by_name[name]}")
    lines += [section("train").rstrip(), section("monitor").rstrip()]
    return "\n".join(lines) + "\n"


def flow(value: Any) -> str:
    """`value` as one line of flow-style YAML."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False,
                          width=10 ** 6).strip()


def yaml_header(raw: dict[str, Any], doc: dict[str, Any], path: Path, which: str) -> str:
    """The emitted file's comment lines: what was picked, for what, and the commands that
    train it, report on it, and bring its runs back to pick."""
    c = doc["constraints"]
    runs_dir = f"runs/{raw['name']}"
    return "\n".join([
        f"# Written by rankzoo pick: {len(raw['variants'])} candidates "
        f"({'the Pareto front' if which == 'front' else 'all that fit'}) for d_model="
        f"{c['d_model']}, n_heads={c['n_heads']}, n_layers={c['n_layers']},",
        f"# {format_bytes(c['cache_budget_bytes'])} of {c['cache_dtype']} cache per sequence "
        f"at {c['seq_len']} tokens, matched in parameters, on MQAR with "
        f"{c['associations']} key-value pairs",
        "# at the target length (so that these runs are evidence for the pick). The train "
        "settings are a start:",
        "# sweep the lr (configs/sweep.yaml shows how) before reading much into one run.",
        f"#   rankzoo train {path}",
        f"#   rankzoo report {runs_dir}",
        f"#   {pick_command(c, [runs_dir], doc.get('hybrids'))}",
    ])


def pick_command(c: dict[str, Any], runs: Sequence[str] = (),
                 hybrids: dict[str, Any] | None = None) -> str:
    """The `rankzoo pick` command line of these constraints (and of the hybrids' flags
    that were asked for)."""
    parts = ["rankzoo pick", f"--d-model {c['d_model']}", f"--n-heads {c['n_heads']}",
             f"--n-layers {c['n_layers']}", f"--seq-len {c['seq_len']}",
             f"--cache-budget {byte_flag(c['cache_budget_bytes'])}",
             f"--cache-dtype {c['cache_dtype']}", f"--associations {c['associations']}"]
    if c["params_budget"] is not None:
        parts.append(f"--params-budget {c['params_budget']}")
    if c["flops_budget"] is not None:
        parts.append(f"--flops-budget {c['flops_budget']}")
    parts += hybrid_flags(hybrids or {})
    if runs:
        parts.append("--runs " + " ".join(runs))
    return " ".join(parts)


def hybrid_flags(h: dict[str, Any]) -> list[str]:
    """The flags of the hybrids a document proposed, where they are not the defaults."""
    asked = h.get("asked") or {}
    flags = [] if h.get("keep", "best") == "best" else [f"--hybrids {h['keep']}"]
    if asked.get("every"):
        flags.append("--global-every " + " ".join(str(n) for n in asked["every"]))
    if asked.get("global_kv_heads") is not None:
        flags.append(f"--global-kv-heads {asked['global_kv_heads']}")
    return flags
