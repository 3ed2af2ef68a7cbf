"""Causal attention: one signature, several kernels, a reference beside them.

    fn(q, k, v, *, window, scale) -> o
        q [B, H, Tq, K], k [B, G, Tk, K], v [B, G, Tk, V] -> o [B, H, Tq, V]

Causality is bottom-right aligned: query i sits at absolute position Tk - Tq + i, so a
prefill (Tq = Tk) and a one-token decode step (Tq = 1) use the same call. `window` is W keys
*including* the query itself (None: unbounded). G must divide H (GQA/MQA when G < H).
"""

from ..registry import Backend, OpRegistry, always_available, import_probe
from .reference import attention_probs, reference_attention
from .sdpa import sdpa_attention
from .spec import AttnSpec
from .vendor import flash_attn_attention, flash_attn_unsupported, xformers_attention

ATTENTION = OpRegistry("attention", preference={
    "cuda": ["flash_attn", "sdpa", "reference"],
    "cpu": ["sdpa", "reference"],
})


def _cuda_only(spec: AttnSpec) -> str | None:
    return None if spec.device_type == "cuda" else f"needs a CUDA device, got {spec.device_type}"


ATTENTION.register(Backend("reference", reference_attention, always_available, lambda s: None))
ATTENTION.register(Backend("sdpa", sdpa_attention, always_available, lambda s: None))
ATTENTION.register(Backend("flash_attn", flash_attn_attention,
                           import_probe("flash_attn", "flash_attn_2_cuda"), flash_attn_unsupported))
ATTENTION.register(Backend("xformers", xformers_attention,
                           import_probe("xformers.ops"), _cuda_only))

__all__ = ["ATTENTION", "AttnSpec", "attention_probs", "reference_attention", "sdpa_attention"]
