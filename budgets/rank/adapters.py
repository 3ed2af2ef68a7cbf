"""Adapter rank: exact singular values of LoRA updates, and the adapters of a model.

    s = lowrank_singular_values(B, A, scale)    # B [..., d, r], A [..., r, k] -> [..., r]
    rows = adapter_ranks(model, eps=0.1)        # one row per adapted projection

dW = scale * B @ A is d x k but has rank <= r. With B = Q_B R_B and A^T = Q_A R_A (reduced
QR), dW = Q_B (scale R_B R_A^T) Q_A^T and Q_B, Q_A have orthonormal columns, so the singular
values of dW are those of the r x r core: O((d + k) r^2) instead of a dense d x k SVD
(docs/METRICS.md).

Adapters are found by duck typing (budgets knows nothing of peft): a module with `lora_A`
and `lora_B` that are either
  - PEFT-style ModuleDicts of Linear keyed by adapter name, with a `scaling` dict, or
  - a plain pair of Parameters [r, k] / [d, r] or Linear modules, with a float `scaling`.
"""

from __future__ import annotations

import torch
from torch import nn

from .metrics import as_matrices, check_eps, spectrum_metrics
from .spectra import product_spectrum


def lowrank_singular_values(B, A, scale: float = 1.0) -> torch.Tensor:
    """Singular values [..., r] (descending) of scale * B @ A, never forming B @ A."""
    B, A = as_matrices(B), as_matrices(A)
    if B.shape[-1] != A.shape[-2]:
        raise ValueError(f"B {tuple(B.shape)} and A {tuple(A.shape)} do not chain: "
                         f"B's last dim must equal A's second-to-last")
    return product_spectrum(B, A.mT, scale)  # the r x r core of their QR factors


def _weight(m) -> torch.Tensor:
    """The matrix of a Linear (out x in) or a bare Parameter."""
    return m.weight if isinstance(m, nn.Linear) else m


def _pairs(module: nn.Module):
    """(adapter name, B [d, r], A [r, k], scale) for each LoRA pair of one module."""
    lora_a, lora_b, scaling = module.lora_A, module.lora_B, getattr(module, "scaling", 1.0)
    if isinstance(lora_a, nn.ModuleDict):  # PEFT: one pair per adapter name
        for name in lora_a:
            if name in lora_b:
                scale = scaling.get(name, 1.0) if isinstance(scaling, dict) else scaling
                yield name, _weight(lora_b[name]), _weight(lora_a[name]), float(scale)
        return
    yield "default", _weight(lora_b), _weight(lora_a), float(scaling)


def is_adapted(module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "lora_B")


def adapter_ranks(model: nn.Module, eps: float = 0.1) -> list[dict]:
    """Declared cap r and realized metrics of every LoRA pair in `model`.

    Each row: {"module", "adapter", "declared" (min(r, d, k)), "shape" [d, k], "scale",
    "metrics": {metric: float}, "spectrum": [float]}; empty when no adapters are attached.
    """
    check_eps(eps)
    rows = []
    for mname, module in model.named_modules():
        if not is_adapted(module):
            continue
        for aname, B, A, scale in _pairs(module):
            with torch.no_grad():
                s = lowrank_singular_values(B, A, scale)
            shape = (B.shape[-2], A.shape[-1])
            metrics = spectrum_metrics(s, shape, eps)
            # B A [d, k] has rank <= min(r, d, k): an r past the projection's width
            # declares nothing more than the width does
            declared = min(int(A.shape[-2]), *shape)
            rows.append({"module": mname, "adapter": aname, "declared": declared,
                         "shape": list(shape), "scale": scale,
                         "metrics": {k: float(v) for k, v in metrics.items()},
                         "spectrum": [float(x) for x in s]})
    return rows
