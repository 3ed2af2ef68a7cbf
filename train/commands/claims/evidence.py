"""The evidence claims are judged on: the runs of configs/claims/ under one directory
(`rankzoo claims runs/claims`), and a checkpoint probed on a text (`--hf MODEL --text FILE`).

Runs are read through train/rundir (read-only): each run's config.yaml (seed, optimizer,
task), its ranks.jsonl (the probes over training), its report.json metrics, and its
TensorBoard scalars (validation accuracy and train loss over steps, for grokking). A
probe, from a run's last rank record or from the checkpoint, has the probe format of
docs/SCHEMAS.md: per layer, per quantity, per head.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...rundir.files import read_yaml
from ...rundir.layout import EXPERIMENT_FILE, VariantFiles
from ...rundir.read import is_variant_dir, rank_records, run_config

LORA_DIR = re.compile(r"^(?P<base>.+)\.lora-r(?P<r>\d+)$")  # <variant>.lora-r<r>
SCALARS = ("val/accuracy", "train/loss", "val/loss")


@dataclass(frozen=True)
class Run:
    """One finished (or stopped) run of a claims experiment."""

    experiment: str
    name: str  # its directory: adamw_s1, mha.lora-r4
    config: dict[str, Any]  # its config.yaml
    records: list[dict]  # ranks.jsonl, in step order
    metrics: dict[str, float]  # report.json's final metrics
    scalars: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # report.json's status.learned: whether the run beat its task's baseline (None: not
    # judged, e.g. a task without a baseline, or no report)
    learned: bool | None = None

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def optimizer(self) -> str:
        return str((self.config.get("train") or {}).get("optimizer", "adamw"))

    @property
    def data(self) -> dict[str, Any]:
        return self.config.get("data") or {}

    @property
    def d_model(self) -> int:
        return int((self.config.get("model") or {}).get("d_model", 0))

    @property
    def lora_rank(self) -> int | None:
        match = LORA_DIR.match(self.name)
        return int(match["r"]) if match else None

    @property
    def last(self) -> dict:
        return self.records[-1]


@dataclass(frozen=True)
class Probed:
    """A checkpoint probed on a text: its probe and its sizes."""

    name: str
    probe: dict  # budgets' probe format
    d_model: int
    n_heads: int
    head_dim: int
    logits: Any = None  # [T, V] next-token logits of one sequence (a torch tensor), or None


@dataclass(frozen=True)
class Evidence:
    runs: tuple[Run, ...] = ()
    probed: Probed | None = None
    runs_dir: str | None = None

    def of(self, experiment_prefix: str) -> list[Run]:
        """The runs of the experiments whose names start with `experiment_prefix`."""
        return [r for r in self.runs if r.experiment.startswith(experiment_prefix)]

    def probes(self, min_layers: int = 1) -> list[tuple[str, dict, int]]:
        """(name, probe, d_model) of every probed model with at least `min_layers` layers,
        the one a claim reads first: the checkpoint, then each pretrain run's last record,
        the longest probe first (a 3-token modular-addition probe says little of token
        mixing), text before synthetic tasks, then the deeper model, then by name."""
        out = [] if self.probed is None else [(self.probed.name, self.probed.probe,
                                                self.probed.d_model)]
        runs = sorted((r for r in self.runs if r.lora_rank is None and r.records),
                      key=lambda r: (-r.last["seq_len"], r.data.get("task") != "text",
                                     -len(r.last["layers"]), r.experiment, r.name))
        out += [(f"{r.experiment}/{r.name}", r.last, r.d_model) for r in runs]
        return [o for o in out if len(o[1]["layers"]) >= min_layers]


# ---------------------------------------------------------------- reading runs

def read_runs(runs_dir: str | Path) -> Evidence:
    """Every run under `runs_dir` (a directory of experiment directories, or one
    experiment directory); an empty or missing directory is an error naming it."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"runs directory {root} not found; train the claims' "
                                f"experiments first (docs/CLAIMS.md)")
    experiments = [root] if (root / EXPERIMENT_FILE).is_file() else sorted(
        p for p in root.iterdir() if (p / EXPERIMENT_FILE).is_file())
    runs = [_read_run(e.name, v) for e in experiments for v in sorted(e.iterdir())
            if v.is_dir() and is_variant_dir(v) and VariantFiles(v).ranks.is_file()]
    if not runs:
        raise ValueError(f"no runs with rank records under {root}: expected "
                         f"<experiment>/<run>/ranks.jsonl (docs/CLAIMS.md)")
    return Evidence(runs=tuple(runs), runs_dir=str(root))


def _read_run(experiment: str, vdir: Path) -> Run:
    files = VariantFiles(vdir)
    metrics, learned = {}, None
    if files.report.is_file():
        report = read_yaml(files.report) or {}  # JSON is YAML
        variant = (report.get("variants") or [{}])[0]
        metrics = variant.get("metrics") or {}
        learned = (variant.get("status") or {}).get("learned")
    return Run(experiment, vdir.name, run_config(vdir), rank_records(files.ranks), metrics,
               read_scalars(vdir), learned)


def read_scalars(vdir: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars SCALARS of a run directory: tag -> [(step, value)]."""
    if not any(vdir.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(vdir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags().get("scalars", ()))
    return {tag: [(int(e.step), float(e.value)) for e in events.Scalars(tag)]
            for tag in SCALARS if tag in tags}


# ---------------------------------------------------------------- figures of a probe

def quantity(layer: dict, name: str) -> dict | None:
    """A layer's measured quantity (value, mixing, mixing_centered, ...) or None."""
    return (layer.get("quantities") or {}).get(name)


def layer_mean(layer: dict, name: str, metric: str) -> float | None:
    """The mean over heads of one metric of one quantity of a layer, or None."""
    q = quantity(layer, name)
    if q is None or not q.get(metric):
        return None
    values = q[metric]
    return float(sum(values) / len(values))


def value_figures(record: dict) -> dict[str, float]:
    """W_V's erank, stable rank and rank_eps, each the mean over the layers of a probe."""
    out = {}
    for metric in ("erank", "stable_rank", "rank_eps"):
        values = [layer_mean(layer, "value", metric) for layer in record["layers"]]
        values = [v for v in values if v is not None]
        if values:
            out[metric] = sum(values) / len(values)
    return out
