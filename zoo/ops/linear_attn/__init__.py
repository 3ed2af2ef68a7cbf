"""Causal linear attention: one signature, several kernels, a reference beside them.

    fn(q, k, v, *, initial_state=None, chunk_size=64) -> (o, state)
        q, k [B, H, T, F] (feature-mapped and scaled by the caller), v [B, H, T, V],
        initial_state [B, H, F, V] or None  ->  o [B, H, T, V], state [B, H, F, V]

    o_t   = q_t^T (S_0 + sum_{s <= t} k_s v_s^T)        (causal, the diagonal included)
    state = S_0 + sum_s k_s v_s^T

The op is unnormalized. A block that normalizes appends a ones column to v: the last column
of o is then the denominator q_t . (z_0 + sum_{s <= t} k_s), and the state carries the key
sum z as its last column, so one kernel and one state serve both.

Backends: `reference` (quadratic: materializes the masked kernel matrix), `chunked` (pure
torch, C x C blocks inside chunks and states between them: linear in T), `recurrent` (one
token at a time: the decoding path), and `fla` (flash-linear-attention's chunked Triton
kernel, optional, CUDA only, opt-in). The torch paths accumulate in fp32 for 16-bit inputs.
"""

from ..registry import Backend, OpRegistry, always_available, import_probe
from .chunked import chunked_linear_attn
from .recurrent import recurrent_linear_attn
from .reference import linear_attn_matrix, reference_linear_attn
from .spec import LinearAttnSpec
from .vendor import fla_linear_attn, fla_unsupported

# fla is opt-in (backend="fla"), not in `auto`'s list: on one H200 run (fla-core 0.6.0, torch
# 2.11, triton 3.6) it matched the reference in fp32 at F=16, V=17, but its bf16 case and its
# F=153 (Taylor) case missed the test tolerances, undiagnosed. Promote it once they pass.
LINEAR_ATTN = OpRegistry("linear_attn", preference={
    "cuda": ["chunked", "reference"],
    "cpu": ["chunked", "reference"],
})

LINEAR_ATTN.register(Backend("reference", reference_linear_attn, always_available,
                             lambda s: None))
LINEAR_ATTN.register(Backend("chunked", chunked_linear_attn, always_available, lambda s: None))
LINEAR_ATTN.register(Backend("recurrent", recurrent_linear_attn, always_available,
                             lambda s: None))
LINEAR_ATTN.register(Backend("fla", fla_linear_attn,
                             import_probe("fla.ops.linear_attn"), fla_unsupported))

__all__ = ["LINEAR_ATTN", "LinearAttnSpec", "chunked_linear_attn", "linear_attn_matrix",
           "recurrent_linear_attn", "reference_linear_attn"]
