"""The rank monitor for any training loop (core.py): a plain loop calls `monitor.step`;
Lightning (train/harness/callbacks.py MonitorCallback) and Hugging Face's Trainer
(train/hf/trainer.py) call it from their hooks."""

from .core import DEFAULT_HISTOGRAMS, DEFAULT_SCALARS, Monitor

__all__ = ["DEFAULT_HISTOGRAMS", "DEFAULT_SCALARS", "Monitor"]
