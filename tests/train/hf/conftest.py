"""What the HF tests share: the report as `rankzoo report --hf` builds it."""

from __future__ import annotations

from budgets.hf.probe import build_hf_report
from train.hf import probe_hf, zoo_blocks


def probe_report(model_dir, text, **options) -> dict:
    """The report train/cli/report.py builds from a saved model: probe_hf (`options` are
    its own), then build_hf_report naming the zoo block each kind of layer mirrors."""
    name, entry = probe_hf(model_dir, text, **options)
    return build_hf_report(name, entry, zoo_blocks=zoo_blocks())
