"""Evidence from finished runs (`rankzoo pick --runs`): what each run measured, joined to
the candidate it trained.

    notes = []
    records = read_runs(["runs/pick"], c, notes)   # one record per run at the target's sizes
    join_evidence(list(zip(sized, rows)), records, c, notes)  # row["evidence"], best first

A run counts for a candidate when it is the same shape (block and fixed settings) with
the same declared budget at its knob value; measured at another value of that knob it is
still shown, marked as such. A layer-pattern run counts for a hybrid when its layers are
the hybrid's unit repeated, its global layers declare the same budget and its cheap
layers are the same shape (at the hybrid's knob value, or another). A run trained at
another d_model, n_heads or seq_len is left out with a note: its figures do not carry
over.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...config.layers import HYBRID
from ...rundir.files import read_yaml
from ...rundir.layout import VariantFiles
from ...rundir.lock import in_progress_note
from ...rundir.read import has_results, is_variant_dir, variant_dirs, variant_report
from ...sizing.families import resolved
from .constraints import Constraints, Sized
from .hybrids import Hybrid


def read_runs(dirs: Sequence[str | Path], c: Constraints, notes: list[str]) -> list[dict]:
    """What the finished runs under `dirs` (experiment or variant directories) measured,
    one record per run; a run trained at another d_model, n_heads or seq_len is left out
    with a note."""
    records, seen = [], set()
    for d in dirs:
        path = Path(d)
        if not path.exists():
            raise FileNotFoundError(f"--runs {d}: no such run directory")
        if not path.is_dir():
            raise NotADirectoryError(f"--runs {d}: not a run directory (a file)")
        writing = in_progress_note(path)
        if writing is not None:
            notes.append(writing)
        vdirs = [path] if is_variant_dir(path) else [
            v for v in variant_dirs(path) if has_results(v)]
        if not vdirs:
            notes.append(f"{path}: no results (no report.json or ranks.jsonl): ignored")
        for vdir in vdirs:
            if vdir.resolve() in seen:  # named twice (itself and its experiment): once
                notes.append(f"{vdir}: given more than once in --runs; counted once")
                continue
            seen.add(vdir.resolve())
            record = run_record(vdir, c, notes)
            if record is not None:
                records.append(record)
    return records


def run_record(vdir: Path, c: Constraints, notes: list[str]) -> dict | None:
    """What one variant directory measured; None, with a note, when it cannot count."""
    config = target_config(vdir, c, notes)
    if config is None:
        return None
    block = dict(config.get("block") or {})
    name = block.pop("name", HYBRID)
    layers = [(spec["name"], {k: v for k, v in spec.items() if k != "name"})
              for spec in config.get("layers") or []]
    variant = variant_report(vdir)["variants"][0]
    metrics = variant.get("metrics", {})
    status = variant.get("status")
    state = status.get("state") if isinstance(status, dict) else None
    if state not in (None, "finished"):
        notes.append(f"{vdir}: {state} at step {variant['step']}: its figures are not final")
    n_layers = (config.get("model") or {}).get("n_layers")
    if n_layers is not None and n_layers != c.n_layers:
        notes.append(f"{vdir}: measured with {n_layers} layers, the target has {c.n_layers}")
    by_kv = {k.rsplit("/kv", 1)[1]: v for k, v in metrics.items()
             if k.startswith("val/accuracy/kv")}
    return {"run": str(vdir), "variant": variant["variant"], "block": name, "kwargs": block,
            **({"layers": layers} if layers else {}),
            "n_layers": n_layers, "step": variant["step"],
            "state": state,
            "accuracy": metrics.get("val/accuracy"), "accuracy_by_kv": by_kv,
            "probe_len": variant["seq_len"], **axis_means(variant)}


def target_config(vdir: Path, c: Constraints, notes: list[str]) -> dict | None:
    """The run's config.yaml when it names its block (or, for a layer pattern, each
    layer's) and trained at the target's d_model, n_heads and seq_len; else None, with a
    note saying why."""
    config_path = VariantFiles(vdir).config
    if not config_path.is_file():
        notes.append(f"{vdir}: no config.yaml, so its block is unknown: ignored")
        return None
    config = read_yaml(config_path) or {}
    layers = config.get("layers") or []
    block = dict(config.get("block") or (layers[0] if layers else {}))
    d_model = (config.get("model") or {}).get("d_model")
    seq_len = (config.get("data") or {}).get("seq_len")
    if block.get("name") is None or d_model is None or seq_len is None:
        notes.append(f"{vdir}: config.yaml lacks block.name (or layers), model.d_model or "
                     "data.seq_len: ignored")
        return None
    trained = {"d_model": d_model, "n_heads": block.get("n_heads"), "seq_len": seq_len}
    target = {"d_model": c.d_model, "n_heads": c.n_heads, "seq_len": c.seq_len}
    differ = [k for k in trained if trained[k] != target[k]]
    if differ:
        notes.append(f"{vdir}: trained at {', '.join(f'{k}={trained[k]}' for k in differ)}, "
                     f"not the target's {', '.join(f'{k}={target[k]}' for k in differ)}: "
                     "its figures do not carry over; ignored")
        return None
    return config


def axis_means(variant: dict) -> dict[str, dict[str, float | None]]:
    """The realized rank and utilization of the mixing (past->future) and inference axes,
    each the mean over layers and quantities of the report's rows."""
    sums: dict[str, dict[str, list[float]]] = {"mixing": {}, "inference": {}}
    for layer in variant["layers"]:
        for row in layer["axes"]:
            if row["axis"] in sums:
                for key in ("realized_mean", "utilization", "declared"):
                    if row.get(key) is not None:
                        sums[row["axis"]].setdefault(key, []).append(float(row[key]))

    def mean(xs: list[float] | None) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {"realized": {a: mean(s.get("realized_mean")) for a, s in sums.items()},
            "utilization": {a: mean(s.get("utilization")) for a, s in sums.items()},
            "declared_at_probe": {a: mean(s.get("declared")) for a, s in sums.items()}}


def same_setting(s: Sized, record: dict, c: Constraints) -> int | None:
    """The run's knob value when the run is shape `s` at some value of its knob (same
    block, same fixed settings, and the same declared budget at that value), else None."""
    if record["block"] != s.shape.block:
        return None
    kwargs = record["kwargs"]
    candidate = s.shape.base_kwargs(c.n_heads)
    if s.shape.knob in kwargs:
        candidate[s.shape.knob] = kwargs[s.shape.knob]
    try:
        run = c.cost(record["block"], kwargs)
        ours = c.cost(s.shape.block, candidate)
    except (ValueError, TypeError):
        return None
    if run.budget != ours.budget:
        return None
    if any(resolved(run.config, k) != resolved(ours.config, k) for k, _ in s.shape.fixed):
        return None
    return resolved(run.config, s.shape.knob)


def same_hybrid(h: Hybrid, record: dict, c: Constraints) -> int | None:
    """The run's cheap knob value when the run is hybrid `h` at some value of it: its
    layers are h's unit repeated, its global layers declare h's budget, and its cheap
    layers are h's cheap shape (same_setting), all alike; else None."""
    layers, unit = record.get("layers") or [], h.unit()
    if not layers or len(layers) % len(unit) or any(
            block != unit[i % len(unit)][0] for i, (block, _) in enumerate(layers)):
        return None
    glob = [kw for i, (_, kw) in enumerate(layers) if i % len(unit) == len(unit) - 1]
    cheap = [kw for i, (_, kw) in enumerate(layers) if i % len(unit) != len(unit) - 1]
    if any(kw != glob[0] for kw in glob) or any(kw != cheap[0] for kw in cheap):
        return None
    try:
        if c.cost(h.glob.block, glob[0]).budget != h.glob_cost.budget:
            return None
    except (ValueError, TypeError):
        return None
    return same_setting(h.cheap, {"block": h.cheap.shape.block, "kwargs": cheap[0]}, c)


def join_evidence(pairs: list[tuple[Sized | Hybrid, dict]], records: list[dict],
                  c: Constraints, notes: list[str]) -> None:
    """Each record to the candidate it measured (exactly, or at another value of the same
    knob); the exact ones first, then by distance of the knob."""
    def knob(s: Sized | Hybrid) -> int:
        return s.cheap.value if isinstance(s, Hybrid) else s.value

    for record in records:
        for s, row in pairs:
            value = (same_hybrid(s, record, c) if isinstance(s, Hybrid)
                     else same_setting(s, record, c))
            if value is not None:
                row["evidence"].append({**record, "knob_value": value,
                                        "exact": value == knob(s)})
                break
        else:
            notes.append(f"{record['run']}: {setting_text(record)} is none of the "
                         "candidates' settings: ignored")
    for s, row in pairs:
        row["evidence"].sort(key=lambda e, s=s: (not e["exact"], abs(e["knob_value"] - knob(s)),
                                                 -(e.get("accuracy") or 0.0)))


def setting_text(record: dict) -> str:
    """`linear (feature_map=relu)`; a layer pattern's as `hybrid of ssm, softmax`."""
    if record.get("layers"):
        blocks = ", ".join(dict.fromkeys(block for block, _ in record["layers"]))
        return f"{record['block']} of {blocks}"
    settings = ", ".join(f"{k}={v}" for k, v in record["kwargs"].items())
    return f"{record['block']} ({settings})"

