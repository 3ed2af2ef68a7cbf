"""Reading finished runs back: report.json files, ranks.jsonl, the runs' statuses, the
checkpoint (`load_checkpoint`, the one reader of checkpoints/last.ckpt).

Nothing here imports Lightning and nothing here writes: `rankzoo report` uses it to read
a run directory without touching it. The variant summary and report.md are drawn by
train/render/summary.py and train/render/document.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import budgets
from budgets.report.document import RANK_RECORD
from budgets.schema import check, read_json, read_text, same_lengths

from ..config.sections import DataConfig, parse_section
from .files import read_yaml
from .layout import EXPERIMENT_FILE, RESULT_FILES, VariantFiles
from .lock import in_progress_note
from .status import describe_status, read_status, run_status, status_notes


def finite_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Metrics as floats, non-finite ones dropped (JSON has no NaN)."""
    out = {}
    for k, v in metrics.items():
        v = float(v)
        if math.isfinite(v):
            out[k] = v
    return out


def rank_records(path: Path) -> list[dict]:
    """Every record of a ranks.jsonl file, in order, each checked against the probe
    record's schema (budgets.report.document.RANK_RECORD); a corrupt line is named by number."""
    records = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(check(json.loads(line), RANK_RECORD))
            check_head_lists(records[-1], f"{path}:{number}")
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            what = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise ValueError(f"{path}:{number}: corrupt rank record ({what})") from None
        if len(records) > 1 and records[-1]["step"] <= records[-2]["step"]:
            # a run appends in step order, and a resume drops what it redoes: anything
            # else is a damaged or hand-edited file, and its last line is not the last step
            raise ValueError(f"{path}:{number}: step {records[-1]['step']} after step "
                             f"{records[-2]['step']}; the records must go forward in steps")
    if not records:
        raise ValueError(f"{path} holds no rank records")
    return records


def rank_histories(run_dir: Path) -> dict[str, list[dict]]:
    """Variant name -> its ranks.jsonl records, for an experiment directory or one variant
    directory (variants without a ranks.jsonl are left out)."""
    run_dir = Path(run_dir)
    vdirs = [run_dir] if is_variant_dir(run_dir) else variant_dirs(run_dir)
    return {v.name: rank_records(VariantFiles(v).ranks) for v in vdirs
            if VariantFiles(v).ranks.is_file()}


def check_head_lists(doc: dict, source: str) -> None:
    """Each layer's per-head figures (`heads`), one entry per head: they are read side by
    side, and a short list would end the report in a zip() error naming nothing."""
    for i, variant in enumerate(doc.get("variants", [doc])):
        for j, layer in enumerate(variant["layers"]):
            where = f"variants[{i}].layers[{j}].heads" if "variants" in doc \
                else f"layers[{j}].heads"
            same_lengths(layer.get("heads"), source, where)


def last_record(path: Path) -> dict:
    """The last record of a ranks.jsonl file (every line is checked, so that a corrupt line
    anywhere is reported rather than silently skipped)."""
    return rank_records(path)[-1]


def finished_entry(vdir: Path, max_steps: int) -> dict | None:
    """The report entry of a run that already reached max_steps (report.json and
    ranks.jsonl written), else None: a resume returns it rather than refit and rewrite."""
    files = VariantFiles(vdir)
    if not files.report.is_file() or not files.ranks.is_file():
        return None
    reported = budgets.load_report(files.report)["variants"][0]
    if reported["step"] < max_steps:
        return None
    config = run_config(vdir)
    record = last_record(files.ranks)
    status = reported.get("status") or run_status(
        "finished", reported["step"], max_steps, reported["metrics"], config_baseline(config))
    return {"probe": {k: v for k, v in record.items() if k != "step"}, "step": reported["step"],
            "params": config.get("params", reported["params"]), "metrics": reported["metrics"],
            "status": status, **pattern_of(config)}


def pattern_of(config: dict[str, Any]) -> dict[str, list[str]]:
    """{"pattern": each layer's label} for a layer-pattern run's config, else {}: what
    build_report groups a hybrid's layers by."""
    return {"pattern": list(config["pattern"])} if config.get("pattern") else {}


def run_config(vdir: Path) -> dict[str, Any]:
    """A run's config.yaml (empty when there is none)."""
    path = VariantFiles(vdir).config
    return (read_yaml(path) or {}) if path.is_file() else {}


def config_baseline(config: dict[str, Any]) -> dict | None:
    """The task baseline (the data specs' `baseline`, train/data/mqar.py and
    train/data/markov.py) of a resolved run config: its data section and seed, as
    config.yaml records them; None when they are missing or no longer parse."""
    data, seed = config.get("data"), config.get("seed")
    if not isinstance(data, dict) or not isinstance(seed, int) or isinstance(seed, bool):
        return None
    try:
        spec = parse_section(data, DataConfig, "data").spec()
    except (ValueError, TypeError):
        return None
    return spec.baseline(seed)


def config_max_steps(config: dict[str, Any]) -> int | None:
    steps = (config.get("train") or {}).get("max_steps") if isinstance(config, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def disk_state(vdir: Path, step: int, max_steps: int | None) -> tuple[str, int, str | None] | None:
    """(state, step, reason) of a run from what its directory holds: status.json (a run
    still running, or killed, reads as stopped: its figures are not final), else an older
    sweep's diverged.txt, else the measured step against max_steps; None if none tells."""
    try:
        record = read_status(vdir)
    except ValueError:  # status_notes names the bad file
        record = None
    if record is not None:
        if record["state"] in ("finished", "stopped", "diverged"):
            return record["state"], record["step"], record.get("reason")
        return "stopped", max(record["step"], step), describe_status(record)
    if VariantFiles(vdir).diverged.is_file():
        text = VariantFiles(vdir).diverged.read_text(errors="replace").strip()
        at = re.search(r"at step (\d+)", text)
        return "diverged", int(at[1]) if at else step, text.splitlines()[0][:300] if text else None
    if max_steps is None:
        return None
    if step >= max_steps:
        return "finished", step, None
    return "stopped", step, "no status.json: the last measurement's step"


def variant_status(vdir: Path, variant: dict) -> dict | None:
    """A report variant's status: the one its report.json holds while status.json agrees
    that the run finished, else derived from the run directory and the variant's metrics
    (reports written before statuses existed; runs stopped, diverged or still running);
    None when nothing on disk tells."""
    stored = variant.get("status")
    try:
        record = read_status(vdir)
    except ValueError:
        record = None
    if stored and (record is None or record["state"] == "finished"):
        return stored
    config = run_config(vdir)
    max_steps = config_max_steps(config)
    found = disk_state(vdir, variant["step"], max_steps)
    if found is None:
        return None
    state, step, reason = found
    return run_status(state, step, max_steps, variant.get("metrics", {}),
                      config_baseline(config), reason)


def with_status(vdir: Path, report: dict) -> dict:
    """`report` (one variant's) with its variant's status set (see variant_status) and its
    lm-evaluation-harness scores where `rankzoo eval` kept them (eval.json): "lm_eval",
    {task: {metric: value}}."""
    scores = eval_scores(vdir)
    for variant in report["variants"]:
        status = variant_status(vdir, variant)
        if status is not None:
            variant["status"] = status
        if scores:
            variant["lm_eval"] = scores
    return report


def eval_scores(vdir: Path) -> dict[str, dict[str, float]]:
    """The scores of a variant's eval.json ({} without one); a file that is not one is a
    ValueError naming it."""
    path = VariantFiles(vdir).eval
    if not path.is_file():
        return {}
    doc = read_json(path)
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, dict) or not all(
            isinstance(m, dict) and all(isinstance(v, (int, float)) for v in m.values())
            for m in tasks.values()):
        raise ValueError(f"{path}: not a rankzoo eval document (no tasks of metric values)")
    return tasks


def merge_reports(reports: list[dict], experiment: str = "") -> dict:
    """One report with the variant sections of several (same schema and version)."""
    if not reports:
        raise ValueError("no reports to merge")
    head = {k: v for k, v in reports[0].items() if k != "variants"}
    head["experiment"] = experiment or head.get("experiment", "")
    return {**head, "variants": [v for r in reports for v in r["variants"]]}


def is_variant_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in RESULT_FILES)


def variant_report(vdir: Path) -> dict:
    """A variant's report: its report.json, else rebuilt from ranks.jsonl's last line; its
    variant carries the run's status (variant_status)."""
    files = VariantFiles(vdir)
    if files.report.is_file():
        report = budgets.load_report(files.report)
        check_head_lists(report, str(files.report))
        return with_status(vdir, report)
    ranks = files.ranks
    if not ranks.is_file():
        raise FileNotFoundError(f"no results in {vdir}: neither report.json nor ranks.jsonl")
    record = last_record(ranks)
    config = run_config(vdir)
    probe = {k: v for k, v in record.items() if k != "step"}
    entry = {"probe": probe, "step": record["step"], "params": config.get("params", 0),
             **pattern_of(config)}
    status = variant_status(vdir, {"step": record["step"]})
    if status is not None:
        entry["status"] = status
    # a run the monitor wrote in a user's own loop has no config.yaml: its directory names it
    report = budgets.build_report({config.get("variant", vdir.name): entry},
                                  experiment=config.get("experiment") or vdir.name)
    if status is not None:  # build_report copies it; set here for a budgets that does not
        report["variants"][0]["status"] = status
    return report


def variant_dirs(exp_dir: Path) -> list[Path]:
    """An experiment's variant directories, in the experiment's order when it is recorded."""
    order: list[str] = []
    if (exp_dir / EXPERIMENT_FILE).is_file():
        raw = read_yaml(exp_dir / EXPERIMENT_FILE) or {}
        order = list((raw.get("variants") or {}).keys())
    found = sorted(p for p in exp_dir.iterdir() if p.is_dir() and is_variant_dir(p))
    rank = {name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda p: (rank.get(p.name, len(order)), p.name))


def has_results(vdir: Path) -> bool:
    return VariantFiles(vdir).report.is_file() or VariantFiles(vdir).ranks.is_file()


def load_run(run_dir: str | Path, thresholds: budgets.VerdictThresholds | None = None,
             notes: list[str] | None = None) -> dict:
    """The report of an experiment directory (all variants) or of one variant directory.
    In an experiment, a variant that started but has no results yet (interrupted before
    its first measurement) is left out with a line appended to `notes`."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise ValueError(f"not a run directory: {run_dir} is a file")
    writing = in_progress_note(run_dir)  # read as it is, without taking its lock
    if writing is not None and notes is not None:
        notes.append(writing)
    if is_variant_dir(run_dir):
        report = variant_report(run_dir)
        if notes is not None:  # a run still going, or stopped: its figures are not final
            notes += status_notes([run_dir])
    else:
        vdirs = variant_dirs(run_dir)
        ready = [v for v in vdirs if has_results(v)]
        if not ready:
            raise FileNotFoundError(f"no results in {run_dir}: no report.json or ranks.jsonl in "
                                    f"it or in its variant directories{_why_none(run_dir)}")
        if notes is not None:
            notes += [_left_out(v) for v in vdirs if v not in ready]
            notes += status_notes(ready)
        reports = [r for r in (_diverged_report(v, notes) if diverged(v) else variant_report(v)
                               for v in ready) if r is not None]
        if not reports:
            raise FileNotFoundError(f"no results in {run_dir}: every run with results "
                                    f"diverged{_why_none(run_dir)}")
        report = merge_reports(reports, experiment=run_dir.name)
    # Verdicts and advice from the figures, for all variants together and under the current
    # thresholds (a report.json written before verdicts existed lacks them).
    return budgets.annotate(report, thresholds)


def diverged(vdir: Path) -> bool:
    """Whether the run's loss or weights went non-finite (status.json, or an older sweep's
    diverged.txt)."""
    try:
        record = read_status(vdir)
    except ValueError:
        record = None
    return VariantFiles(vdir).diverged.is_file() or (record or {}).get("state") == "diverged"


def _diverged_report(vdir: Path, notes: list[str] | None) -> dict | None:
    """A diverged run's report, shown with its status; None (and a note) when its last
    measurement does not read back (figures of weights on their way to overflow)."""
    try:
        return variant_report(vdir)
    except ValueError as e:
        if notes is not None:
            notes.append(f"{vdir.name} diverged and its results do not read back; left out "
                         f"({e})")
        return None


def _left_out(vdir: Path) -> str:
    """The note for a variant directory without results."""
    if diverged(vdir):
        found = disk_state(vdir, 0, None)
        step = f" at step {found[1]}" if found else ""
        return f"{vdir} diverged{step} before its first measurement; left out"
    return f"{vdir} has no results yet (interrupted before its first measurement?); left out"


def _why_none(run_dir: Path) -> str:
    """'; 4 runs diverged (e.g. .../diverged.txt)' when that is why there are no results."""
    diverged = sorted(VariantFiles(p).diverged for p in run_dir.iterdir()
                      if VariantFiles(p).diverged.is_file())
    if not diverged:
        return ""
    runs = "1 run" if len(diverged) == 1 else f"{len(diverged)} runs"
    return f"; {runs} diverged (e.g. {diverged[0]})"


# ---------------------------------------------------------------- the checkpoint

MODEL_PREFIX = "model."  # the LightningModule (train/harness/module.py) holds the LM as .model


@dataclass(frozen=True)
class Checkpoint:
    """What rankzoo reads back from a run's checkpoint (a resume hands the file itself to
    Lightning, which restores the rest)."""

    path: Path
    state_dict: dict[str, Any]  # the LightningModule's: the model's weights under "model."
    step: int | None  # the global step it was saved at; None when it records none
    config: dict[str, Any] | None  # the resolved variant config (hyper_parameters)

    @property
    def model_state(self) -> dict[str, Any]:
        """The model's own weights, the "model." prefix taken off."""
        return {k.removeprefix(MODEL_PREFIX): v for k, v in self.state_dict.items()}


def load_checkpoint(path: Path) -> Checkpoint:
    """A run's checkpoint (checkpoints/last.ckpt, or one laid out like it), on the CPU
    and memory-mapped: the weights stay on disk until they are used. Tensors and plain
    values only (weights_only). A file that is not a checkpoint is a ValueError naming it."""
    path = Path(path)
    try:
        raw = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        step = raw.get("global_step")
        return Checkpoint(path, raw["state_dict"], None if step is None else int(step),
                          (raw.get("hyper_parameters") or {}).get("config"))
    except Exception as e:  # torch raises several types for a bad file
        raise ValueError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]})") from None


def check_shapes(model: Any, state: dict[str, Any], source: Path,
                 prefix: str = "") -> None:
    """The weights of `state` (keys `prefix` + the model's) against the model's own: a
    checkpoint of another size is a ValueError naming the file and the first weight,
    before load_state_dict's many-line RuntimeError."""
    own = model.state_dict()
    theirs = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    for key, value in own.items():
        if key not in theirs:
            raise ValueError(f"{source}: holds no weight {key!r}; a checkpoint of another "
                             "model than its config.yaml describes")
        if tuple(theirs[key].shape) != tuple(value.shape):
            raise ValueError(f"{source}: weight {key!r} is {list(theirs[key].shape)}, the "
                             f"config's model has {list(value.shape)}; a checkpoint of "
                             "another model size")


def trained_model(vdir: Path, config: dict[str, Any]) -> tuple[Any, int | None]:
    """The DecoderLM `config` (the variant's config.yaml) builds, in eval mode, with the
    weights of vdir's last checkpoint, and the checkpoint's step; one line naming the
    file where it is missing or of another model size."""
    from ..lm.decoder import build_model

    ckpt = VariantFiles(vdir).checkpoint
    if not ckpt.is_file():
        raise FileNotFoundError(f"{vdir}: no {ckpt.relative_to(vdir)} to load the weights "
                                f"from")
    checkpoint = load_checkpoint(ckpt)
    model = build_model(config)
    check_shapes(model, checkpoint.state_dict, ckpt, prefix=MODEL_PREFIX)  # one line
    model.load_state_dict(checkpoint.model_state)
    return model.eval(), checkpoint.step
