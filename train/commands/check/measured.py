"""The loss change `rankzoo compress` measured at the report's advised KV ranks, put
beside each KV advice item of that variant.

    docs = read_compressed(["runs/quick/mha.compress.json"])   # --compressed FILE ...
    docs, notes = read_recorded(run_dir, report)   # each variant's compress.json (--record)
    notes = check_kv(run_dir, report)              # --check: measured now, attached
    notes = attach_measured(report, docs)

A compress document (docs/SCHEMAS.md, rankzoo.compress) measures every layer at its
advised ranks at once, so each KV item of a variant (per layer and the summary) carries the
same model-wide measurement, under "measured": {ratio, delta_loss, verdict, tolerance,
source}. Nothing is written: the report on disk stays as training left it.

`rankzoo compress RUN_DIR/<variant> --record` keeps its document in the variant's
directory (train/commands/compress/saved/record.py); `rankzoo report` attaches every such record
unless `--compressed FILE` names the same variant (the file wins) or `--check` measures
anew.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ...rundir.layout import VariantFiles
from ...rundir.read import is_variant_dir
from ..compress import CompressOptions, compress_run
from ..compress.options import SCHEMA
from ..compress.saved.record import RECORD_FILE

KV_KINDS = ("kv_cache", "kv_cache_summary")


def read_compressed(paths) -> list[dict]:
    """The compress documents in `paths` (`rankzoo compress ... --format json > FILE`),
    each checked to be one: a clear error naming the file otherwise."""
    docs = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"--compressed {path}: no such file")
        docs.append(read_document(path, "--compressed"))
    return docs


def read_document(path: Path, what: str) -> dict:
    """One compress document, its path under "path"; a ValueError naming `what` and the
    file when it is none."""
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{what} {path}: not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{what} {path}: not JSON (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{what} {path}: not a {SCHEMA} document (write one with "
                         f"`rankzoo compress RUN_DIR/<variant> --format json > {path}`)")
    return {**doc, "path": str(path)}


def read_recorded(run_dir, report: dict, skip=()) -> tuple[list[dict], list[str]]:
    """The compress documents recorded in the directories of the report's variants
    (`rankzoo compress RUN_DIR/<variant> --record`), those of variants in `skip` left out,
    and notes: what was read, what could not be, what measured older weights. A record
    that does not read is a note, not an error: the report stands without it."""
    docs, notes = [], []
    for variant in report["variants"]:
        vdir = _variant_dir(run_dir, variant["variant"])
        path = vdir / RECORD_FILE
        if variant["variant"] in skip or not path.is_file():
            continue
        try:
            doc = read_document(path, "recorded")
        except (OSError, ValueError) as e:
            notes.append(f"{e}; left out")
            continue
        if "rows" not in doc:  # what `compress --save DIR` writes beside a saved model
            notes.append(f"{path}: the record of a model compress --save wrote, not a "
                         "measurement; left out")
            continue
        docs.append(doc)
        notes += _stale(path, vdir)
    if docs:
        notes.insert(0, "KV advice measured by rankzoo compress --record: "
                        + ", ".join(d["path"] for d in docs))
    return docs, notes


def _stale(path: Path, vdir: Path) -> list[str]:
    """A note when the run's checkpoint was written after the record (a resumed run): the
    record measured older weights."""
    ckpt = VariantFiles(vdir).checkpoint
    if not ckpt.is_file() or ckpt.stat().st_mtime <= path.stat().st_mtime:
        return []
    return [f"{path} measured the weights before {ckpt} was last written; measure again "
            f"with `rankzoo compress {vdir} --record --force`"]


def kv_variants(report: dict) -> list[str]:
    """The variants with KV advice, in the report's order."""
    names = {a["variant"] for a in report.get("advice", []) if a["kind"] in KV_KINDS}
    return [v["variant"] for v in report["variants"] if v["variant"] in names]


def check_kv(run_dir, report: dict, options: CompressOptions | None = None,
             say=None) -> list[str]:
    """`report --check`: compress each variant with KV advice at its advised ranks (one
    calibration and two evaluations each; what that costs is said first) and attach the
    measurements. Returns the notes."""
    say = say or (lambda text: print(f"rankzoo: {text}", file=sys.stderr))
    names = kv_variants(report)
    if not names:
        return ["--check: no variant has KV advice; nothing was measured"]
    options = options or CompressOptions(ratios=(2.0,), allocations=("uniform",))
    say(f"--check: measuring the KV advice of {len(names)} variant(s) ({', '.join(names)}) "
        f"with rankzoo compress: per variant, one calibration pass over "
        f"{options.calib_size or 'the run default of'} training sequences and two evaluations "
        f"of the validation split (the advised ranks and a 2x cache)")
    docs, notes = [], []
    for name in names:
        began = time.perf_counter()
        docs.append(compress_run(_variant_dir(run_dir, name), options, notes=notes))
        say(f"--check: {name} measured in {time.perf_counter() - began:.1f} s")
    return notes + attach_measured(report, docs)


def _variant_dir(run_dir, name: str) -> Path:
    """RUN_DIR/<variant>, or RUN_DIR itself when the report is of one variant directory."""
    run_dir = Path(run_dir)
    return run_dir if is_variant_dir(run_dir) else run_dir / name


def measurement(doc: dict) -> dict | None:
    """What a compress document measured at the advised ranks, or None when it measured
    no advised setting (a model without KV advice, or one the document had none for)."""
    v = doc.get("verdict") or {}
    if v.get("verdict") is None:
        return None
    return {"ratio": v["advised_ratio"], "delta_loss": v["advised_delta_loss"],
            "verdict": v["verdict"], "tolerance": v["tolerance"],
            "largest_ratio_within": v.get("largest_ratio_within"),
            "source": doc.get("path", "rankzoo compress (--check)")}


def attach_measured(report: dict, docs: list[dict]) -> list[str]:
    """Put each document's measurement beside the KV advice of its variant (matched by
    source.variant). Returns notes on documents that matched nothing or measured nothing."""
    notes, by_variant = [], {}
    for doc in docs:
        name = (doc.get("source") or {}).get("variant")
        where = doc.get("path", name)
        m = measurement(doc)
        if m is None:
            notes.append(f"{where}: measured no advised ranks (no KV advice checked)")
        elif not any(v["variant"] == name for v in report["variants"]):
            notes.append(f"{where}: variant {name!r} is not in this report")
        else:
            by_variant[name] = m
    for item in [*report.get("advice", []), *report.get("findings", [])]:
        if is_kv(item) and item.get("variant") in by_variant:
            item["measured"] = by_variant[item["variant"]]
    return notes


def is_kv(item: dict) -> bool:
    """A KV advice item, or the summary that became a no_saving finding."""
    return item["kind"] in KV_KINDS or item.get("topic") == "no_saving"

