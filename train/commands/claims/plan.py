"""configs/claims/plan.yaml: the experiments the claims read, each a config of its own (one
data task per experiment) with key=value overrides. `rankzoo claims RUNS_DIR --train
PLAN` trains each into RUNS_DIR, resuming one that is there and skipping one that
finished, then judges the claims on them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ...rundir.files import read_yaml

PLAN_KEYS, ENTRY_KEYS = {"experiments"}, {"config", "overrides"}


@dataclass(frozen=True)
class Planned:
    config: Path  # the experiment's YAML, resolved against the plan's folder
    overrides: tuple[str, ...] = ()


def read_plan(path: str | Path) -> list[Planned]:
    """The plan's experiments; unknown keys and missing configs are errors naming them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"claims plan {path} not found")
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict) or set(raw) - PLAN_KEYS or not raw.get("experiments"):
        raise ValueError(f"{path}: expected a mapping with the one key `experiments` (a list), "
                         f"got {sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    out = []
    for i, entry in enumerate(raw["experiments"]):
        if not isinstance(entry, dict) or set(entry) - ENTRY_KEYS or "config" not in entry:
            raise ValueError(f"{path}: experiments[{i}] must be {{config, overrides}}, got "
                             f"{entry!r}")
        config = path.parent / entry["config"]
        if not config.is_file():
            raise FileNotFoundError(f"{path}: experiments[{i}].config {config} not found")
        out.append(Planned(config, tuple(entry.get("overrides") or ())))
    return out


def train_plan(path: str | Path, runs_dir: str | Path) -> float:
    """Train every experiment of the plan under runs_dir; the wall time in seconds."""
    from ...config.load import load_experiment
    from ...experiment.stages import train_experiment

    plan = [(p, load_experiment(p.config, list(p.overrides))) for p in read_plan(path)]
    start = time.perf_counter()  # every config is checked before any training
    for _, exp in plan:
        train_experiment(exp, runs_dir=runs_dir, resume=(Path(runs_dir) / exp.name).is_dir())
    return time.perf_counter() - start
