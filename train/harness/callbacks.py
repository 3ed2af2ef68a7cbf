"""The rank monitor as Lightning callbacks: MonitorCallback for any LightningModule, and
RankMonitor, the harness's own (its module's `model`, its layer pattern's labels).

On global rank zero only, every `every_n_steps` optimizer steps and once at the end of
training, the monitor (train/monitor/core.py) probes the model on the probe batch and

- appends one JSON line `{"step": global_step, **probe}` to `ranks.jsonl`; the final
  measurement's (at max_steps) keeps each layer's singular-value spectra, {quantity:
  [heads][k] floats to 6 significant digits}, so that every report can draw them (only
  that one record: the file stays a few records' size, whatever the number of steps);
- logs a handful of per-layer/per-head scalars through the trainer's loggers, e.g.
  `rank/L0/mixing_centered/erank/h0` and the layer mean `rank/L0/mixing_centered/erank/mean`;
- adds singular-value histograms (`spectrum/L0/qk`) to TensorBoard.

Under FSDP (train/harness/sharding.py) each rank holds a shard of each layer and a forward
is a collective; the monitor then gathers the full weights on every rank (a collective
too, so every rank calls measure) into an unsharded replica that global rank zero alone
probes: the replica costs rank zero one more copy of the model.

Sparse metrics go through `logger.log_metrics(..., step=global_step)`, never
`pl_module.log`, which would re-emit stale values at every logging flush. A step already
recorded in `ranks.jsonl` is never measured again, so a resumed run continues the file
without duplicates (a resume first drops the records after its checkpoint's step,
train/harness/checkpoint.py; on_train_start measures the checkpoint's step if its record is gone).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from ..monitor.core import DEFAULT_HISTOGRAMS, DEFAULT_SCALARS, Monitor
from ..rundir.layout import RANKS_FILE
from .checkpoint import StepEnd
from .sharding import full_state, is_sharded

__all__ = ["DEFAULT_HISTOGRAMS", "MonitorCallback", "RankMonitor"]


class MonitorCallback(StepEnd):
    """A Monitor measuring from Lightning's hooks, on global rank zero, logging through
    the trainer's loggers; `model_of(pl_module)` is what it probes (the module itself by
    default). Works with any LightningModule."""

    def __init__(self, monitor: Monitor,
                 model_of: Callable[[object], nn.Module] = lambda pl_module: pl_module):
        self.monitor, self.model_of = monitor, model_of
        self.replica: nn.Module | None = None  # rank zero's unsharded copy under FSDP

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.is_global_zero:
            self.monitor.resume()
            # before configure_model shards it (Lightning calls that after this hook)
            model = self.model_of(pl_module)
            if self.replica is None and isinstance(trainer.strategy, ModelParallelStrategy) \
                    and not is_sharded(model):
                self.replica = copy.deepcopy(model)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.step_ended(trainer):  # a micro-batch before the step's last
            return
        step = trainer.global_step  # already counts this batch's optimizer step
        if step % self.monitor.every_n_steps == 0:
            self.measure(trainer, pl_module)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        # A resumed fit starts at its checkpoint's step k, whose record was written before
        # the checkpoint (train/harness/fit.py keeps it): measure it only if it is missing.
        step = trainer.global_step
        if step > 0 and step % self.monitor.every_n_steps == 0:
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.measure(trainer, pl_module)

    def measure(self, trainer, pl_module) -> dict | None:
        """Probe, record and log at the current step; None if skipped. Every rank calls
        it: under FSDP the weights are gathered first, by all of them."""
        model = self.model_of(pl_module)
        if is_sharded(model):
            state = full_state(model)  # a collective; the whole state on rank zero only
            if trainer.is_global_zero:
                return self.measure_replica(trainer, state, pl_module.device)
        if not trainer.is_global_zero:
            return None
        return self.probe(trainer, model)

    def probe(self, trainer, model: nn.Module) -> dict | None:
        step = trainer.global_step
        final = step >= trainer.max_steps > 0
        return self.monitor.measure(model, step, final=final, sinks=trainer.loggers)

    def measure_replica(self, trainer, state: dict, device: torch.device) -> dict | None:
        """Probe the unsharded replica holding `state` on the training device; between
        measurements it waits on the CPU, so that rank zero's device holds its shard
        alone, as the others' do."""
        if self.replica is None:
            raise RuntimeError("the rank monitor has no unsharded replica of a sharded model "
                               "(its setup ran after the model was sharded)")
        self.replica.load_state_dict(state)
        try:
            return self.probe(trainer, self.replica.to(device))
        finally:
            self.replica.to("cpu")


class RankMonitor(MonitorCallback):
    """The harness's monitor: its LMModule's `model`, each layer tagged by its pattern."""

    def __init__(self, every_n_steps: int, probe_batch: torch.Tensor, eps: float = 0.1,
                 out_path: str | Path = RANKS_FILE,
                 scalars: tuple[tuple[str, str], ...] = DEFAULT_SCALARS,
                 histograms: tuple[str, ...] | None = DEFAULT_HISTOGRAMS):
        super().__init__(Monitor(probe_batch, every_n_steps=every_n_steps, eps=eps,
                                 out_path=out_path, scalars=scalars, histograms=histograms),
                         lambda pl_module: getattr(pl_module, "model", pl_module))

    def setup(self, trainer, pl_module, stage: str) -> None:
        # a hybrid's label per layer (its config's pattern)
        self.monitor.labels = list((getattr(pl_module, "config", None) or {}).get("pattern")
                                   or [])
        super().setup(trainer, pl_module, stage)
