"""The SSD scan of Mamba-2 (Dao & Gu 2024): one signature, several kernels, a reference.

    fn(x, dt, A, B, C, *, initial_state=None, chunk_size=64) -> (y, state)
        x [B, T, H, P], dt [B, T, H] (positive: softplus already applied), A [H] (negative),
        B, C [B, T, G, N] (head h reads group h // (H / G)),
        initial_state [B, H, P, N] or None  ->  y [B, T, H, P], state [B, H, P, N]

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,    y_t = h_t C_t       (per head)

Equivalently y = M x per head and channel, with the N-semiseparable matrix

    M[t, s] = (C_t . B_s) * exp(dt_{s+1} A + ... + dt_t A) * dt_s   for s <= t, else 0

(`ssd_mixing_matrix`). The layout is mamba-ssm's, so its kernel needs no transposes. The D
skip term and the gate are the block's, not the scan's.

Backends: `reference` (the sequential recurrence), `chunked` (pure torch, the four-step
chunked SSD with a stable segment sum: linear in T), and `mamba_ssm`
(`mamba_chunk_scan_combined`, optional, CUDA only). The torch paths compute decays and
states in fp32 for 16-bit inputs.
"""

from ..registry import Backend, OpRegistry, always_available, import_probe
from .chunked import chunked_ssd
from .reference import expand_groups, reference_ssd, segsum, ssd_mixing_matrix
from .spec import SSDSpec
from .vendor import mamba_ssd, mamba_unsupported

# mamba_ssm is opt-in (backend="mamba_ssm") until its gpu-marked comparison with the
# reference has run and passed on a GPU: it has not yet (it needs a CUDA build to install).
SSD = OpRegistry("ssd", preference={
    "cuda": ["chunked", "reference"],
    "cpu": ["chunked", "reference"],
})

SSD.register(Backend("reference", reference_ssd, always_available, lambda s: None))
SSD.register(Backend("chunked", chunked_ssd, always_available, lambda s: None))
SSD.register(Backend("mamba_ssm", mamba_ssd,
                     import_probe("mamba_ssm.ops.triton.ssd_combined"), mamba_unsupported))

__all__ = ["SSD", "SSDSpec", "chunked_ssd", "expand_groups", "reference_ssd", "segsum",
           "ssd_mixing_matrix"]
