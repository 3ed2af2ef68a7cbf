"""`rankzoo eval`: lm-evaluation-harness on an exported model directory, or on a trained
variant (exported to a temporary directory first), whose scores are then kept as the
variant's eval.json, under the run directory's lock, for `rankzoo report` to show."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..hf.evaluate import evaluate_model
from ..hf.export import export_variant
from ..rundir.files import write_json
from ..rundir.layout import EVAL_FILE
from ..rundir.lock import hold_run_dir
from ..rundir.read import is_variant_dir
from .compress.saved.record import locked_dir

SCHEMA = "rankzoo.eval"


def eval_document(source: str, tasks: list[str], include: str, batch_size: int = 1,
                  device: str = "cpu", limit: int | None = None, record: bool = True) -> dict:
    """{"schema", "source", "tasks": {task: {metric: value}}, "notes", "seconds",
    "recorded"}; a variant directory is exported first and (record) its scores kept."""
    start, path = time.perf_counter(), Path(source)
    run = is_variant_dir(path)
    if not run and not (path / "config.json").is_file():
        raise ValueError(f"{source}: neither a trained variant (runs/<experiment>/<variant>) "
                         f"nor a model directory with a config.json (rankzoo export writes one)")
    with tempfile.TemporaryDirectory(prefix="rankzoo-eval-") as tmp:
        model_dir = export_variant(path, Path(tmp) / "model")["out"] if run else path
        scores, notes = evaluate_model(model_dir, tasks, include, batch_size, device, limit)
    doc = {"schema": SCHEMA, "source": str(source), "tasks": scores, "limit": limit,
           "notes": notes, "seconds": round(time.perf_counter() - start, 2),
           "recorded": None}
    if run and record:
        with hold_run_dir(locked_dir(path)):
            doc["recorded"] = str(write_json(path / EVAL_FILE, doc))
    return doc
