"""Which projections of a variant a LoRA target names, read from a weightless build.

An experiment mixes blocks (q_proj in attention, in_proj in the SSM), so each variant
adapts the targets it has; the parser checks that every variant has one, and the
fine-tune stage records the ones it adapted.
"""

from __future__ import annotations

import torch

from ..lm.decoder import build_model
from ..lm.lora import target_matches
from .experiment import Experiment


def linear_names(exp: Experiment, variant: str) -> list[str]:
    """Dotted names of a variant's nn.Linear modules, from a weightless (meta) build."""
    with torch.device("meta"):
        model = build_model(exp.variant_config(exp.base_variants().get(variant, variant)))
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def variant_targets(exp: Experiment, variant: str, targets: list[str]) -> list[str]:
    """The targets that match at least one of the variant's projections."""
    names = linear_names(exp, variant)
    return [t for t in targets if any(target_matches(n, t) for n in names)]
