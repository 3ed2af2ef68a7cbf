"""The delta rule (DeltaNet, Gated DeltaNet, KDA): one signature, several kernels, a
reference beside them.

    fn(q, k, v, beta, log_gate=None, *, initial_state=None, chunk_size=64) -> (o, state)
        q, k [B, H, T, K] (L2-normed, q scaled, by the caller), v [B, H, T, V], beta
        [B, H, T], log_gate None, [B, H, T] (one per head) or [B, H, T, K] (per key
        channel), initial_state [B, H, K, V] or None  ->  o [B, H, T, V], state [B, H, K, V]

    S_t = (I - b_t k_t k_t^T) D_t S_{t-1} + b_t k_t v_t^T,     o_t = S_t^T q_t

with D_t = exp(log_gate_t) as a scalar or a diagonal (fla's order: decay, then the delta
update). Its mixing matrix, factors and caps are budgets/mixing/delta.py's
(`delta_mixing_matrix` is its `delta_mixing`).

Backends: `reference` (the per-token recurrence; one-token decoding steps take it under
`auto`), `chunked` (the WY/UT chunked form in pure torch: linear in T, the training path)
and `fla` (flash-linear-attention's chunk kernels, optional, CUDA only, opt-in). The
torch paths compute in fp32 for 16-bit inputs.
"""

from budgets.mixing.delta import delta_mixing as delta_mixing_matrix

from ..registry import Backend, OpRegistry, always_available, import_probe
from .chunked import chunked_delta
from .reference import recurrent_delta
from .spec import DeltaSpec, gate_kind
from .vendor import fla_delta, fla_unsupported

# fla is opt-in (backend="fla"), not in `auto`'s list, until its gpu-marked comparison with
# the reference has run and passed on a GPU: it has not yet.
DELTA = OpRegistry("delta", preference={
    "cuda": ["chunked", "reference"],
    "cpu": ["chunked", "reference"],
})

DELTA.register(Backend("reference", recurrent_delta, always_available, lambda s: None))
DELTA.register(Backend("chunked", chunked_delta, always_available, lambda s: None))
DELTA.register(Backend("fla", fla_delta, import_probe(
    "fla.ops.delta_rule", "fla.ops.gated_delta_rule", "fla.ops.kda"), fla_unsupported))

__all__ = ["DELTA", "DeltaSpec", "chunked_delta", "delta_mixing_matrix", "gate_kind",
           "recurrent_delta"]
