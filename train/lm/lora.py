"""Low-rank adapters (LoRA, Hu et al. 2021) on a model's Linear projections.

    lin = LoRALinear(nn.Linear(D, O), r=4, alpha=4.0)   # y = W0 x + b + (alpha/r) B A x
    names = attach_lora(model, ["q_proj", "v_proj"], r=4, alpha=4.0)

A LoRALinear keeps the pretrained Linear as `base` (frozen) and adds a trainable pair
A [r, in] and B [out, r], B zero so the adapted model starts as the pretrained one. It
exposes `lora_A`, `lora_B` and a float `scaling`: budgets/rank/adapters.py finds it by duck
typing and measures the rank of scaling * B A exactly.

Why `weight` is the *merged* matrix W0 + scaling * B A. The zoo blocks call their
projections (zoo.block.apply_linear), but some paths need the matrix itself: MLA's
absorbed decoding splits kv_up into W_UK / W_UV, an fp64 check casts the weight, and the
probes' weight_matrices (W_V, W_Q W_K^T, ...) read it. A `weight` that returned W0 would
let those paths skip the adapter silently. The merged weight is a differentiable function
of A and B, so every path trains the adapter and the weight probes measure the projection
the fine-tuned model really applies; the adapter's own rank is a separate axis, measured
on B A alone. `forward` takes the cheaper unmerged route, which equals it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.config import positive_int, positive_number


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int, alpha: float):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        positive_int("LoRA", r=r)
        positive_number("LoRA", alpha=alpha)
        self.base = base
        self.r, self.alpha = r, float(alpha)
        self.scaling = float(alpha) / r  # the update's scale, alpha / r
        w = base.weight
        self.lora_A = nn.Parameter(w.new_empty(r, base.in_features))  # [r, in]
        self.lora_B = nn.Parameter(w.new_zeros(base.out_features, r))  # [out, r]: starts at W0
        # A like nn.Linear's own init (kaiming-uniform, a = sqrt(5)): a random start for A
        # while B = 0 keeps the update zero, so B gets a gradient from the first step
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        for p in base.parameters():
            p.requires_grad_(False)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def delta(self) -> torch.Tensor:
        """The update scaling * B A [out, in] (rank <= r)."""
        return self.scaling * (self.lora_B @ self.lora_A)

    @property
    def weight(self) -> torch.Tensor:
        """The merged matrix W0 + scaling * B A [out, in] (see the module docstring)."""
        return self.base.weight + self.delta

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in]
        a = self.lora_A.to(x.dtype)
        b = self.lora_B.to(x.dtype)
        return self.base(x) + self.scaling * (x @ a.T) @ b.T  # [..., out]

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, scaling={self.scaling:g}"


def target_matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def lora_targets(model: nn.Module, targets: list[str]) -> list[str]:
    """Names of the nn.Linear submodules the targets select; a target that selects none
    is an error that lists the Linear names available."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    unmatched = [t for t in targets if not any(target_matches(n, t) for n in linears)]
    if unmatched:
        short = sorted({n.rsplit(".", 1)[-1] for n in linears})
        raise ValueError(f"LoRA targets {unmatched} match no nn.Linear of "
                         f"{type(model).__name__}; Linear names: {short} (a target matches "
                         f"a name equal to it or ending in '.target', e.g. {linears[:3]})")
    return [n for n in linears if any(target_matches(n, t) for t in targets)]


def attach_lora(model: nn.Module, targets: list[str], r: int, alpha: float) -> list[str]:
    """Freeze every parameter of `model`, wrap each targeted nn.Linear in a LoRALinear,
    and return the adapted module names; only the adapters stay trainable."""
    if isinstance(targets, str) or not targets:
        raise ValueError(f"LoRA targets must be a non-empty list of names, got {targets!r}")
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} already has LoRA adapters attached")
    names = lora_targets(model, list(targets))
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), r, alpha))
    return names
