"""Reading finished runs back: report.json files, ranks.jsonl, the variant summary.

Nothing here imports Lightning and nothing here writes: `rankzoo report` uses it to read
a run directory without touching it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table

import budgets
from budgets.report import RANK_RECORD
from budgets.schema import check, read_text

from .io import read_yaml
from .render import to_markdown
from .status import status_notes

EXPERIMENT_FILE = "experiment.yaml"  # the resolved experiment, at runs/<experiment>/
VARIANT_FILES = ("report.json", "ranks.jsonl", "config.yaml")
DIVERGED_FILE = "diverged.txt"  # a sweep run whose loss went NaN: listed by the sweep only
SUMMARY_METRICS = ("val/accuracy", "val/loss", "train/loss")


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
    record's schema (budgets.report.RANK_RECORD); a corrupt line is named by number."""
    records = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(check(json.loads(line), RANK_RECORD))
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            what = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise ValueError(f"{path}:{number}: corrupt rank record ({what})") from None
    if not records:
        raise ValueError(f"{path} holds no rank records")
    return records


def last_record(path: Path) -> dict:
    """The last record of a ranks.jsonl file (every line is checked, so that a corrupt line
    anywhere is reported rather than silently skipped)."""
    return rank_records(path)[-1]


def finished_entry(vdir: Path, max_steps: int) -> dict | None:
    """The report entry of a run that already reached max_steps (report.json and
    ranks.jsonl written), else None: a resume returns it rather than refit and rewrite."""
    if not (vdir / "report.json").is_file() or not (vdir / "ranks.jsonl").is_file():
        return None
    reported = budgets.load_report(vdir / "report.json")["variants"][0]
    if reported["step"] < max_steps:
        return None
    config: dict[str, Any] = {}
    if (vdir / "config.yaml").is_file():
        config = read_yaml(vdir / "config.yaml") or {}
    record = last_record(vdir / "ranks.jsonl")
    return {"probe": {k: v for k, v in record.items() if k != "step"}, "step": reported["step"],
            "params": config.get("params", reported["params"]), "metrics": reported["metrics"]}


def merge_reports(reports: list[dict], experiment: str = "") -> dict:
    """One report with the variant sections of several (same schema and version)."""
    if not reports:
        raise ValueError("no reports to merge")
    head = {k: v for k, v in reports[0].items() if k != "variants"}
    head["experiment"] = experiment or head.get("experiment", "")
    return {**head, "variants": [v for r in reports for v in r["variants"]]}


def is_variant_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in VARIANT_FILES)


def variant_report(vdir: Path) -> dict:
    """A variant's report: its report.json, else rebuilt from ranks.jsonl's last line."""
    if (vdir / "report.json").is_file():
        return budgets.load_report(vdir / "report.json")
    ranks = vdir / "ranks.jsonl"
    if not ranks.is_file():
        raise FileNotFoundError(f"no results in {vdir}: neither report.json nor ranks.jsonl")
    record = last_record(ranks)
    config: dict[str, Any] = {}
    if (vdir / "config.yaml").is_file():
        config = read_yaml(vdir / "config.yaml") or {}
    probe = {k: v for k, v in record.items() if k != "step"}
    entry = {"probe": probe, "step": record["step"], "params": config.get("params", 0)}
    return budgets.build_report({config.get("variant", vdir.name): entry},
                                experiment=config.get("experiment", ""))


def variant_dirs(exp_dir: Path) -> list[Path]:
    """An experiment's variant directories, in the experiment's order when it is recorded."""
    order: list[str] = []
    if (exp_dir / EXPERIMENT_FILE).is_file():
        raw = read_yaml(exp_dir / EXPERIMENT_FILE) or {}
        order = list((raw.get("variants") or {}).keys())
    found = sorted(p for p in exp_dir.iterdir()
                   if p.is_dir() and is_variant_dir(p) and not (p / DIVERGED_FILE).is_file())
    rank = {name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda p: (rank.get(p.name, len(order)), p.name))


def has_results(vdir: Path) -> bool:
    return (vdir / "report.json").is_file() or (vdir / "ranks.jsonl").is_file()


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
            notes += [f"{v} has no results yet (interrupted before its first measurement?); "
                      "left out" for v in vdirs if v not in ready]
            notes += status_notes(ready)
        report = merge_reports([variant_report(v) for v in ready], experiment=run_dir.name)
    # Verdicts and advice from the figures, for all variants together and under the current
    # thresholds (a report.json written before verdicts existed lacks them).
    return budgets.annotate(report, thresholds)


def _why_none(run_dir: Path) -> str:
    """'; 4 runs diverged (e.g. .../diverged.txt)' when that is why there are no results."""
    diverged = sorted(p / DIVERGED_FILE for p in run_dir.iterdir()
                      if (p / DIVERGED_FILE).is_file())
    if not diverged:
        return ""
    runs = "1 run" if len(diverged) == 1 else f"{len(diverged)} runs"
    return f"; {runs} diverged (e.g. {diverged[0]})"


SUMMARY_COLUMNS = ("variant", "step", "params", "budget total", "final Hc", *SUMMARY_METRICS)


def _summary_cells(v: dict) -> list[str]:
    """variant, step, parameters, declared total, the final hidden states' centered erank
    (pooled over the probe batch), then the headline metrics."""
    m, final = v.get("metrics", {}), v.get("final_hidden_centered_erank")
    return [v["variant"], str(v["step"]), f"{v['params']:,}", str(v["budget_total"]),
            "-" if final is None else f"{final:.2f}",
            *("-" if k not in m else f"{m[k]:.4g}" for k in SUMMARY_METRICS)]


def summary_table(report: dict) -> Table:
    """One row per variant (see _summary_cells)."""
    table = Table(title=f"variants: {report.get('experiment') or '(unnamed)'}",
                  caption="final Hc: centered erank of the hidden states the output head "
                          "reads, pooled over the probe batch")
    for col in SUMMARY_COLUMNS:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for v in report["variants"]:
        table.add_row(*_summary_cells(v))
    return table


def summary_markdown(report: dict) -> str:
    lines = ["## Variants", "", "| " + " | ".join(SUMMARY_COLUMNS) + " |",
             "|" + "|".join("---" for _ in SUMMARY_COLUMNS) + "|"]
    lines += ["| " + " | ".join(_summary_cells(v)) + " |" for v in report["variants"]]
    return "\n".join(lines) + "\n"


def report_markdown(report: dict) -> str:
    return to_markdown(report) + "\n" + summary_markdown(report)
