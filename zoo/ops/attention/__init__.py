"""Causal attention: one signature, several kernels, a reference beside them.

    fn(q, k, v, *, window, scale, chunk=None, sinks=None) -> o
        q [B, H, Tq, K], k [B, G, Tk, K], v [B, G, Tk, V] -> o [B, H, Tq, V]

Causality is bottom-right aligned: query i sits at absolute position Tk - Tq + i, so a
prefill (Tq = Tk) and a one-token decode step (Tq = 1) use the same call. `window` is W keys
*including* the query itself (None: unbounded). G must divide H (GQA/MQA when G < H).
`chunk` C: a query sees only the keys of its own chunk, chunks of C keys counted from key
0 (so a cache hands over keys from a chunk's start). `sinks` [H]: a sink logit per query
head joins each row's normalizer, with no value behind it (gpt-oss). A backend that
cannot serve an option refuses it in `unsupported(spec)` (AttnSpec.chunk, .sinks).
"""

from ..registry import Backend, BackendUnavailable, OpRegistry, always_available, import_probe
from .flex import flex_attention_fn, flex_unsupported
from .reference import attention_probs, reference_attention
from .sdpa import sdpa_attention
from .spec import AttnSpec
from .vendor import (
    flash_attn_attention,
    flash_attn_unsupported,
    xformers_attention,
    xformers_unsupported,
)


class AttentionRegistry(OpRegistry):
    """`auto` takes the backends in `windowed_only` for windowed calls alone.

    FlexAttention earns its place on a band (its block mask skips the tiles outside it);
    for full causal attention SDPA's flash/cuDNN kernels are as fast and need no
    compilation. Asked for by name, such a backend serves any call it supports.
    """

    windowed_only = frozenset({"flex"})

    def resolve(self, requested: str, spec: AttnSpec) -> Backend:
        if requested != "auto" or spec.window is not None:
            return super().resolve(requested, spec)
        for name in self.preference.get(spec.device_type, ["reference"]):
            if name not in self.windowed_only and name in self.names() \
                    and self.why_not(name, spec) is None:
                self._log_choice(name, spec.device_type)
                return self.get(name)
        raise BackendUnavailable(f"no {self.op} backend can serve {spec}")


ATTENTION = AttentionRegistry("attention", preference={
    "cuda": ["flash_attn", "flex", "sdpa", "reference"],
    "cpu": ["sdpa", "reference"],
})


ATTENTION.register(Backend("reference", reference_attention, always_available, lambda s: None))
ATTENTION.register(Backend("sdpa", sdpa_attention, always_available, lambda s: None))
ATTENTION.register(Backend("flash_attn", flash_attn_attention,
                           import_probe("flash_attn", "flash_attn_2_cuda"), flash_attn_unsupported))
ATTENTION.register(Backend("xformers", xformers_attention,
                           import_probe("xformers.ops"), xformers_unsupported))
ATTENTION.register(Backend("flex", flex_attention_fn,
                           import_probe("torch.nn.attention.flex_attention"), flex_unsupported))

__all__ = ["ATTENTION", "AttnSpec", "attention_probs", "reference_attention", "sdpa_attention"]
