"""flash-linear-attention's chunked Triton kernels (`pip install rankzoo[cuda]`), CUDA only:
`chunk_delta_rule` (no gate), `chunk_gated_delta_rule` (a scalar gate) and `chunk_kda` (a
gate per key channel). The imports stay inside the functions: fla's ops need Triton and a
GPU. Opt-in (backend: fla): nobody has compared them with the reference on a GPU yet.
"""

from __future__ import annotations

import torch

from .spec import DeltaSpec, gate_kind


def fla_unsupported(spec: DeltaSpec) -> str | None:
    if spec.device_type != "cuda":
        return f"needs a CUDA device, got {spec.device_type}"
    if spec.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16, bf16 or fp32, got {spec.dtype}"
    if max(spec.key_dim, spec.value_dim) > 256:
        return f"takes K and V up to 256, got K={spec.key_dim}, V={spec.value_dim}"
    return None


def _chunk_fn(gate: str):
    if gate == "none":
        from fla.ops.delta_rule import chunk_delta_rule
        return chunk_delta_rule
    if gate == "scalar":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda
    return chunk_kda


def fla_delta(q, k, v, beta, log_gate=None, *, initial_state=None, chunk_size=None):
    # fla takes [B, T, H, *] and the gate before beta; q comes scaled (scale=1), q and k
    # normed (no l2norm in the kernel), the gate as its log (no gate math in the kernel)
    q, k, v, beta = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2)
    gate = () if log_gate is None else (log_gate.transpose(1, 2),)
    o, state = _chunk_fn(gate_kind(log_gate))(
        q, k, v, *gate, beta, scale=1.0, initial_state=initial_state,
        output_final_state=True)
    return o.transpose(1, 2), state  # [B, H, T, V], [B, H, K, V]
