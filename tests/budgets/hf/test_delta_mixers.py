"""The delta-rule layers of today's hybrids, read at their chunk functions
(budgets/hf/delta.py): Gated DeltaNet (qwen3_next, qwen3_5, olmo_hybrid) and KDA
(kimi_linear, bailing_hybrid), on tiny random fp64 models (tests/hf_tiny.py), on the torch
fallback path (no fla): each layer's M (budgets/mixing/delta.py) rebuilds the chunk
function's output to its fp32 precision, equals the fp64 recurrence, factors within its
cap K, and the probe measures every decoder layer (tests/budgets/hf/mixer_checks.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers",
                    reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

from budgets.hf.delta import capture_delta  # noqa: E402
from tests.budgets.hf.mixer_checks import (  # noqa: E402
    captured,
    check_factors,
    check_probe,
    check_readout,
    relative,
)

TYPES = ("qwen3_next", "qwen3_5_text", "olmo_hybrid", "kimi_linear", "bailing_hybrid")
LABELS = {**dict.fromkeys(TYPES[:3], ["GDN K=16"] * 3 + ["global"]),
          "kimi_linear": ["KDA K=16"] * 3 + ["global no RoPE"],
          "bailing_hybrid": ["KDA K=16"] * 3 + ["global"]}
# the chunk functions compute in fp32 whatever the model's dtype
REPRODUCTION = 1e-5


@pytest.fixture(scope="module", params=TYPES)
def calls(request) -> tuple[str, list]:
    return request.param, captured(request.param, [capture_delta])


def test_m_rebuilds_the_chunk_functions_output(calls):
    model_type, found = calls
    assert len(found) == 3 and all(c.module is not None for c in found)
    check_readout(found, REPRODUCTION)


def _recurrence(call) -> torch.Tensor:
    """o [B, T, H, V] of S_t = a_t (I - b k k^T) S_{t-1} + b k v^T, o_t = S_t^T q_t, in
    fp64, from the captured q, k, v, beta and log gate (scalar or per key channel)."""
    q, k, v, beta, g = call.q, call.k, call.v.double(), call.beta, call.log_gate
    S = torch.zeros(*k.shape[:2], k.shape[-1], v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(k.shape[2]):
        a = torch.exp(g[:, :, t])
        S = S * (a[..., None, None] if g.dim() == 3 else a[..., :, None])
        kt = k[:, :, t, :, None]  # [B, H, K, 1]
        error = v[:, :, t, None, :] - (kt * S).sum(-2, keepdim=True)  # [B, H, 1, V]
        S = S + beta[:, :, t, None, None] * kt * error
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, 1)


def test_m_equals_the_recurrence(calls):
    for call in calls[1]:
        assert relative(call.readout(call.exact() @ call.values()), _recurrence(call)) < 1e-10


def test_the_factors_give_the_past_future_block_within_the_cap(calls):
    model_type, found = calls
    check_factors(found, model_type)


def test_chunks_are_read_across_their_boundaries():
    """At 72 tokens the chunk functions (chunks of 64) carry a state from one to the next."""
    for model_type in ("qwen3_next", "kimi_linear"):
        check_readout(captured(model_type, [capture_delta], T=72), REPRODUCTION)


@pytest.mark.parametrize("model_type", TYPES)
def test_every_layer_is_measured_on_both_paths(model_type):
    check_probe(model_type, LABELS[model_type])
