"""Checkpoints that a resume continues exactly, and what a resume drops.

A run killed at any moment and resumed from checkpoints/last.ckpt (saved at step k) must
go on as if it had never stopped: the same batches in the same order, the same RNG
streams, and run files holding only what the uninterrupted run would. So:

- StepCheckpoint saves last.ckpt every n steps after everything step k logs is on disk
  (TensorBoard flushed; at a step that validates, after the validation), through a
  temporary file flushed to disk and renamed over the old one (train/rundir/files.py
  atomic_path), so a kill or a full disk mid-write leaves the previous checkpoint. It
  stores the RNG states and the step's metrics beside Lightning's state, and on loading
  moves the train sampler (train/data/loaders.py EpochBatches) to step k and restores
  the RNG.
- TrainScalars logs the train/* scalars (the module logs them with logger=False)
  before the checkpoint: Lightning would log them after its checkpoint callbacks ran.
- On resume, train/harness/fit.py drops what the killed process wrote after the checkpoint:
  TensorBoard points at steps > k (SummaryWriter's purge_step), ranks.jsonl records at
  steps > k (drop_records_from). Everything of step k was written before its checkpoint,
  so it stays, and the resumed fit goes on from step k + 1.

TensorBoard steps as the console shows them: every point of the update that makes global
step g sits at step g (train and validation scalars, rank scalars and histograms), where
Lightning would put the train and validation scalars at g - 1 (TrainScalars logs the
train ones at g, and the module logs its validation step as the loggers' "step").
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from budgets.schema import read_text

from ..data import EpochBatches
from ..rundir.files import atomic_path, write_text
from ..rundir.layout import RANKS_FILE
from ..rundir.read import Checkpoint, load_checkpoint

STATE_KEY = "rankzoo"  # the checkpoint entry with the RNG states and the step's metrics


class StepEnd(Callback):
    """A callback that acts at the end of each optimizer step: Lightning calls
    on_train_batch_end after every micro-batch, train.accumulate_grad_batches of them a
    step, all but the last with global_step unchanged. `step_ended(trainer)` is True once
    per step, after its last micro-batch (every call without accumulation)."""

    seen_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.seen_step = trainer.global_step

    def step_ended(self, trainer) -> bool:
        if trainer.global_step == self.seen_step:
            return False
        self.seen_step = trainer.global_step
        return True


class StepCheckpoint(StepEnd):
    """Save `path` every `every_n_steps` optimizer steps, exactly resumable (the module
    docstring). `on_save(step)` runs on global rank zero after each save."""

    def __init__(self, path: Path, every_n_steps: int, val_every_n_steps: int,
                 batches: EpochBatches | None = None,
                 on_save: Callable[[int], None] | None = None):
        self.path, self.every_n_steps = Path(path), every_n_steps
        self.val_every_n_steps, self.batches, self.on_save = val_every_n_steps, batches, on_save
        self.saved_step = -1
        self.restored: dict[str, Any] = {}  # the loaded checkpoint's STATE_KEY entry
        self.metrics: dict[str, float] | None = None  # what the save in progress records

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.step_ended(trainer):
            return
        step = trainer.global_step
        # a step that validates is saved after its validation (on_validation_end): its
        # figures are logged by then, and Lightning resumes such a checkpoint past them
        if self.due(trainer, step) and not self.validates_at(trainer, step):
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if (trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
                and self.due(trainer, step) and step != self.saved_step):
            self.save(trainer)

    def due(self, trainer, step: int) -> bool:
        # the last step's checkpoint is train/harness/fit.py's, after the final measurement and
        # validation: then nothing is logged at a step after its checkpoint
        return step % self.every_n_steps == 0 and step != trainer.max_steps

    def validates_at(self, trainer, step: int) -> bool:
        return trainer.enable_validation and step % self.val_every_n_steps == 0

    def save(self, trainer, metrics: dict[str, float] | None = None) -> None:
        """Flush the loggers, then write the checkpoint whole or not at all; it records
        `metrics` as the step's (default: the trainer's callback metrics)."""
        for logger in trainer.loggers:
            logger.save()  # TensorBoard's writer buffers events; these belong to the checkpoint
        self.metrics = metrics
        try:
            if trainer.is_global_zero:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(self.path) as tmp:
                    trainer.save_checkpoint(tmp)
            else:  # every rank takes part in the save (a collective); only rank zero writes
                trainer.save_checkpoint(self.path)
        finally:
            self.metrics = None
        if trainer.is_global_zero and self.on_save is not None:
            self.on_save(trainer.global_step)
        self.saved_step = trainer.global_step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        metrics = (dict(self.metrics) if self.metrics is not None else
                   {k: float(v) for k, v in trainer.callback_metrics.items()})
        checkpoint[STATE_KEY] = {"rng": rng_states(), "metrics": metrics}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # called before the train loader is first iterated: its first batch is step k's
        if self.batches is not None:
            self.batches.start_at(checkpoint["global_step"])
        self.restored = checkpoint.get(STATE_KEY, {})
        self.saved_step = checkpoint["global_step"]  # what self.path holds

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        # the last hook before the first step: nothing draws from the RNG after it
        if "rng" in self.restored:
            set_rng_states(self.restored["rng"])

    @property
    def restored_metrics(self) -> dict[str, float]:
        """The metrics at the loaded checkpoint's step (empty without one)."""
        return dict(self.restored.get("metrics", {}))


class TrainScalars(StepEnd):
    """The train/* scalars (logged by the module with logger=False) to the loggers, every
    `every_n_steps` steps at step global_step (the console's, the rank monitor's) with the
    epoch beside them, in on_train_batch_end: before StepCheckpoint, which runs last."""

    def __init__(self, every_n_steps: int):
        self.every_n_steps = every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.step_ended(trainer):
            return
        step = trainer.global_step
        if step % self.every_n_steps and not trainer.should_stop:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith("train/")}
        metrics["epoch"] = trainer.current_epoch
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def resume_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint a resume continues from (train/rundir/read.py load_checkpoint); one
    that does not read, or records no step, is a ValueError naming it."""
    try:
        checkpoint = load_checkpoint(path)
    except ValueError as e:
        raise ValueError(f"cannot resume from {e}; --overwrite redoes the run") from None
    if checkpoint.step is None:
        raise ValueError(f"cannot resume from {path}: not a readable checkpoint (it records "
                         "no global_step); --overwrite redoes the run")
    return checkpoint


def drop_records_from(path: Path, step: int) -> int:
    """Keep the ranks.jsonl records before `step` (and no half-written last line); returns
    how many were dropped. Rewritten whole or not at all (train/rundir/files.py)."""
    if not path.is_file():
        return 0
    lines = read_text(path).splitlines(keepends=True)  # not UTF-8: names the file
    keep = [line for line in lines if line.endswith("\n") and record_step(line, path) < step]
    if len(keep) < len(lines):
        write_text(path, "".join(keep))
    return len(lines) - len(keep)


def record_step(line: str, path: Path | str = RANKS_FILE) -> int:
    """The step of a ranks.jsonl line; -1 for a blank line (kept, harmless)."""
    if not line.strip():
        return -1
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a rank record ({e}): {line[:80]!r}") from None


# ---------------------------------------------------------------- RNG states

def rng_states() -> dict[str, Any]:
    """Every RNG a step could draw from (torch CPU and CUDA, Python, NumPy), as values
    that a weights_only checkpoint load accepts."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return states
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss),
                       float(cached)]
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy as np

        kind, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
