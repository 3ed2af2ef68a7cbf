"""RankMonitor: measure realized ranks on a fixed probe batch every N steps.

On global rank zero only, every `every_n_steps` optimizer steps and once at the end of
training, the monitor runs `budgets.probe_model` on the probe batch and

- appends one JSON line `{"step": global_step, **probe}` to `ranks.jsonl`; the final
  measurement's (at max_steps) keeps each layer's singular-value spectra, {quantity:
  [heads][k] floats to 6 significant digits}, so that every report can draw them (only
  that one record: the file stays a few records' size, whatever the number of steps);
- logs a handful of per-layer/per-head scalars through the trainer's loggers, e.g.
  `rank/L0/mixing_centered/erank/h0` and the layer mean `rank/L0/mixing_centered/erank/mean`;
- adds singular-value histograms (`spectrum/L0/qk`) to TensorBoard.

Sparse metrics go through `logger.log_metrics(..., step=global_step)`, never
`pl_module.log`, which would re-emit stale values at every logging flush. A step already
recorded in `ranks.jsonl` is never measured again, so a resumed run continues the file
without duplicates (a resume first drops the records after its checkpoint's step,
train/harness/checkpoint.py; on_train_start measures the checkpoint's step if its record is gone).
"""

from __future__ import annotations

import json
import sys
import warnings
from functools import partial
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

import budgets
from zoo.config import positive_int, require

from ..rundir.files import append_line, write_text
from ..rundir.layout import RANKS_FILE

# (quantity, metric) pairs logged as scalars: a few, so TensorBoard stays readable.
DEFAULT_SCALARS = (
    ("mixing_centered", "erank"),
    ("mixing", "erank"),
    ("past_future", "rank_eps"),
    ("qk", "rank_eps"),
    ("value", "rank_eps"),
    ("inference.k", "erank"),
)
DEFAULT_HISTOGRAMS = ("mixing_centered", "qk", "value", "inference.k", "inference.v")


def read_steps(path: Path) -> list[int]:
    """Steps recorded in a ranks.jsonl file (empty when it does not exist)."""
    if not path.exists():
        return []
    steps = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a ranks record ({e})") from None
    return steps


def _repair_tail(path: Path) -> None:
    """Drop a last line cut short by a crash mid-write (it has no newline and no JSON)."""
    if not path.exists():
        return
    text = path.read_text()
    if not text or text.endswith("\n"):
        return
    head, _, tail = text.rpartition("\n")
    try:
        json.loads(tail)
        write_text(path, text + "\n")
    except ValueError:
        warnings.warn(f"{path}: dropping an incomplete last line left by an interrupted run",
                      stacklevel=2)
        write_text(path, head + "\n" if head else "")


def report_progress(step: int, p: budgets.ProbeProgress) -> None:
    """A measurement's progress on stderr, once it has taken more than a second (the
    quick ones stay silent): `rankzoo: ranks at step 400: layer 3/8 · 2.1 s · ETA 3 s`."""
    if p.elapsed > 1.0:
        print(f"rankzoo: ranks at step {step}: layer {p.done}/{p.total} · {p.elapsed:.1f} s"
              f" · ETA {p.eta:.0f} s", file=sys.stderr, flush=True)


def spectra_lists(spectra: dict[str, torch.Tensor]) -> dict[str, list[list[float]]]:
    """Spectra as ranks.jsonl holds them: {quantity: [rows][k]} (a 1-D spectrum is one
    row), each value to 6 significant digits (a plot needs no more; half the bytes)."""
    out = {}
    for quantity, s in spectra.items():
        rows = s.detach().float().cpu().reshape(-1, s.shape[-1]).tolist() if s.numel() else []
        if rows:
            out[quantity] = [[float(f"{x:.6g}") for x in row] for row in rows]
    return out


class RankMonitor(Callback):
    def __init__(self, every_n_steps: int, probe_batch: torch.Tensor, eps: float = 0.1,
                 out_path: str | Path = RANKS_FILE,
                 scalars: tuple[tuple[str, str], ...] = DEFAULT_SCALARS,
                 histograms: tuple[str, ...] | None = DEFAULT_HISTOGRAMS):
        positive_int("RankMonitor", every_n_steps=every_n_steps)
        require(probe_batch.dim() == 2, f"RankMonitor.probe_batch must be tokens [B, T], "
                                        f"got shape {tuple(probe_batch.shape)}")
        self.every_n_steps = every_n_steps
        self.probe_batch = probe_batch
        self.eps = eps
        self.out_path = Path(out_path)
        self.scalars = tuple(scalars)
        self.histograms = tuple(histograms or ())
        self.last_step = -1
        self.labels: list[str] = []  # a hybrid's label per layer (its config's pattern)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.labels = list((getattr(pl_module, "config", None) or {}).get("pattern") or [])
        if trainer.is_global_zero:
            _repair_tail(self.out_path)
            steps = read_steps(self.out_path)
            self.last_step = max(steps, default=-1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # already counts this batch's optimizer step
        if step % self.every_n_steps == 0:
            self.measure(trainer, pl_module)

    def on_train_start(self, trainer, pl_module) -> None:
        # A resumed fit starts at its checkpoint's step k, whose record was written before
        # the checkpoint (train/harness/fit.py keeps it): measure it only if it is missing.
        step = trainer.global_step
        if step > 0 and step % self.every_n_steps == 0:
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.measure(trainer, pl_module)

    def measure(self, trainer, pl_module) -> dict | None:
        """Probe, record and log at the current step; None if skipped."""
        step = trainer.global_step
        if not trainer.is_global_zero or step <= self.last_step:
            return None
        model = getattr(pl_module, "model", pl_module)
        batch = self.probe_batch.to(pl_module.device)
        final = step >= trainer.max_steps > 0
        with torch.autocast(pl_module.device.type, enabled=False):
            probe = budgets.probe_model(model, batch, eps=self.eps,
                                        with_spectra=bool(self.histograms) or final,
                                        progress=partial(report_progress, step))
        spectra = {layer["layer"]: layer.pop("spectra", {}) for layer in probe["layers"]}
        record = {"step": step, **probe}
        if final:  # the last measurement keeps them in ranks.jsonl, for the report's plots
            record["layers"] = [{**layer, "spectra": spectra_lists(spectra[layer["layer"]])}
                                for layer in probe["layers"]]
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        # one write per line, cut off again if it fails: the file holds whole lines
        append_line(self.out_path, json.dumps(record, allow_nan=True))
        self.last_step = step
        self._log(trainer, probe, spectra, step)
        return record

    def _layer_tag(self, i: int) -> str:
        """`L3`, or for a hybrid's layer `L3.global`: TensorBoard then lists a pattern's
        kinds apart (a uniform run's tags are as they always were)."""
        return f"L{i}.{self.labels[i]}" if i < len(self.labels) else f"L{i}"

    def _log(self, trainer, probe: dict, spectra: dict, step: int) -> None:
        metrics: dict[str, float] = {}
        for layer in probe["layers"]:
            i, quantities = layer["layer"], layer["quantities"]
            for quantity, metric in self.scalars:
                values = quantities.get(quantity, {}).get(metric)
                if not values:
                    continue
                tag = f"rank/{self._layer_tag(i)}/{quantity}/{metric}"
                if len(values) > 1:
                    for h, v in enumerate(values):
                        metrics[f"{tag}/h{h}"] = v
                metrics[f"{tag}/mean"] = sum(values) / len(values)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            writer = getattr(logger, "experiment", None)
            if not hasattr(writer, "add_histogram"):
                continue
            for i, by_quantity in spectra.items():
                for quantity in self.histograms:
                    s = by_quantity.get(quantity)
                    if s is not None and s.numel() and torch.isfinite(s).all():
                        writer.add_histogram(f"spectrum/{self._layer_tag(i)}/{quantity}",
                                             s.float().flatten(), global_step=step)
