"""The 16-bit policy of the pure-torch kernels: decays, states and sums in fp32."""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


def upcast_16bit(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors in fp32 when the first (the op's main input) is fp16 or bf16, else as they
    are; None (an absent initial state) stays None. The caller casts its output back to the
    first tensor's dtype: a long sum of 16-bit terms, or a decayed state carried over many
    steps, would lose the low bits that the rank metrics look at."""
    if tensors[0].dtype not in HALF_DTYPES:
        return tensors
    return tuple(None if t is None else t.float() for t in tensors)
