"""The SSD mixing of Mamba-2-family mixers and Mamba-1 selective scans (budgets/hf/scans.py),
captured from the scan calls of tiny random mamba2, bamba, falcon_h1 and mamba models
(tests/hf_tiny.py, offline): the
rebuilt mixing gives the scan's output, equals an independent recurrence, and is probed
the same on the exact and the matrix-free path."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")
if not hasattr(pytest.importorskip("transformers.models.mamba2.modeling_mamba2"),
               "mamba2_chunk_scan"):  # the functions capture_scans wraps, from 5.15 on
    pytest.skip(f"transformers {transformers.__version__}: its Mamba mixers call no "
                "mamba2_chunk_scan / mamba_selective_scan (transformers >= 5.15 do)",
                allow_module_level=True)

from budgets.capture.scan import (  # noqa: E402
    ScanCall,
    factored_mixing,
    rebuild,
    ssd_mixing,
    step_sizes,
)
from budgets.hf.probe import probe_hf_model  # noqa: E402
from budgets.hf.scans import capture_scans  # noqa: E402
from tests.hf_tiny import SSM_TYPES, VOCAB, tiny_model  # noqa: E402

B, T = 2, 40  # T not a multiple of the 16-token chunks: the scan pads


def _ids(T: int = T) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=SSM_TYPES)
def scans(request) -> list[ScanCall]:
    model = tiny_model(request.param)
    with torch.no_grad(), capture_scans(model, lambda call: None) as calls:
        model(input_ids=_ids(), use_cache=False)
    assert calls and all(c.module is not None for c in calls)
    return calls


def _recurrence(call: ScanCall) -> torch.Tensor:
    """y [B, T, Hs, P] by the SSM's recurrence h_t = exp(A dt_t) h_{t-1} + dt_t B_t x_t^T,
    y_t = C_t h_t + D x_t (times silu(z) where gated), in fp64 (nothing shared with
    ssd_mixing but step_sizes); A per head [Hs] or per head and state entry [Hs, N]."""
    dt = step_sizes(call)  # [B, T, Hs]
    rep = call.heads // call.groups
    Bm = call.B.double().repeat_interleave(rep, 2)  # [B, T, Hs, N]
    Cm = call.C.double().repeat_interleave(rep, 2)
    x = call.x.double()  # [B, T, Hs, P]
    h = torch.zeros(*x.shape[:1], x.shape[2], call.state, x.shape[3], dtype=torch.float64)
    A = call.A.double() if call.A.dim() == 2 else call.A.double()[:, None]  # [Hs, N or 1]
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(A * dt[:, t, :, None])[..., None]  # [B, Hs, N or 1, 1]
        h = decay * h + (dt[:, t, :, None, None] * Bm[:, t, :, :, None] * x[:, t, :, None, :])
        ys.append((Cm[:, t, :, :, None] * h).sum(-2) + call.D.double()[:, None] * x[:, t])
    y = torch.stack(ys, dim=1)
    return y if call.gate is None else y * torch.nn.functional.silu(call.gate.double())


def test_the_rebuilt_mixing_gives_the_scans_output(scans):
    for call in scans:
        torch.testing.assert_close(rebuild(call), call.y.double(), rtol=1e-5, atol=1e-6)


def test_the_mixing_equals_the_recurrence(scans):
    for call in scans:
        torch.testing.assert_close(rebuild(call), _recurrence(call), rtol=1e-9, atol=1e-12)


def test_the_factors_give_the_past_future_block(scans):
    for call in scans:
        M = ssd_mixing(call)  # [B, Hs, T, T]
        f = factored_mixing(call)
        h = T // 2
        torch.testing.assert_close((f.L @ f.R.mT).double(), M[..., h:, :h], rtol=1e-4,
                                   atol=1e-7)
        assert torch.linalg.matrix_rank(M[..., h:, :h]).max() <= call.state


@pytest.mark.parametrize("model_type", SSM_TYPES)
def test_ssm_layers_on_both_paths(model_type):
    model, ids = tiny_model(model_type), _ids(48)
    exact, loss = probe_hf_model(model, ids, matfree_from=None)
    free, loss_free = probe_hf_model(model, ids, matfree_from=16)
    assert loss_free == pytest.approx(loss, rel=1e-6)
    ssm = [ly for ly in exact["layers"] if ly["kind"]["attention"] == "ssm"]
    assert ssm and all(ly["budget"]["mixing"] == 16 for ly in ssm)  # min(N, T / 2)
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["kind"] == b["kind"]
        assert b["quantities"]["past_future"]["rank_eps"] == a["quantities"]["past_future"][
            "rank_eps"]
