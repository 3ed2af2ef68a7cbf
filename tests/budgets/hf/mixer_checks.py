"""Checks shared by the tests of linear mixers (test_linear_mixers.py: short convolutions,
RG-LRU, lightning attention; test_delta_mixers.py: the delta rule), on tiny random fp64
models built offline (tests/hf_tiny.py): a captured layer's M rebuilds what the module
returned, factors on its past->future block within its cap, and the probe measures every
decoder layer by its kind, on the exact and the matrix-free path alike."""

from __future__ import annotations

import contextlib

import pytest
import torch

from budgets.hf.probe import build_hf_report, probe_hf_model
from tests.hf_tiny import VOCAB, tiny_model

B, T = 2, 32
# per label of a linear mixer: its past->future cap at T = 32
CAPS = {"GDN K=16": 16, "KDA K=16": 16, "short conv L=3": 2, "RG-LRU": 1,
        "lightning K=16": 16}


def ids(T: int = T) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def captured(model_type: str, sources, T: int = T) -> list:
    """The calls `sources` capture in one forward of the tiny fp64 `model_type`."""
    model = tiny_model(model_type, fp64=True)
    fp64_decays(model)
    calls: list = []
    with torch.no_grad(), contextlib.ExitStack() as stack:
        for source in sources:
            stack.enter_context(source(model, calls.append))
        model(input_ids=ids(T), use_cache=False)
    return calls


def fp64_decays(model) -> None:
    """MiniMax builds its decay buffers from the slope in fp32 at init; rebuilt in fp64 from
    the same slope, the module applies exactly the decay M is built with."""
    for m in model.modules():
        if hasattr(m, "decay_factors") and hasattr(m, "slope_rate"):
            m.query_decay, m.key_decay, m.diagonal_decay = m.decay_factors(m.slope_rate)


def check_readout(calls: list, tolerance: float) -> float:
    """Each call's M times its values, read out, is what its module returned; the largest
    relative error."""
    errors = [relative(c.readout(c.exact() @ c.values()), c.output) for c in calls]
    assert max(errors) < tolerance
    return max(errors)


def check_factors(calls: list, model_type: str) -> None:
    """The factors give M's past->future block, whose rank is within the declared cap."""
    for call in calls:
        M, f = call.exact(), call.operator()
        h = M.shape[-1] // 2
        assert relative(f.L.double() @ f.R.double().mT, M[..., h:, :h]) < 1e-5
        cap = CAPS[call.kind(False)["label"]]
        assert call.caps(M.shape[-1], 64, 0, model_type).mixing == cap
        assert torch.linalg.matrix_rank(M[..., h:, :h]).max() <= cap


def check_probe(model_type: str, labels: list[str]) -> None:
    """Every decoder layer measured (none named as unmeasured), by the kinds `labels` in
    layer order, within their caps, the same on the matrix-free path; and the report's
    per-kind rows."""
    model, x = tiny_model(model_type), ids()
    exact, loss = probe_hf_model(model, x, matfree_from=None)
    free, loss_free = probe_hf_model(model, x, matfree_from=16)
    assert "unmeasured_mixers" not in exact and "unmeasured_mixers" not in free
    assert loss_free == pytest.approx(loss, rel=1e-6)
    assert [ly["kind"]["label"] for ly in exact["layers"]] == labels
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["kind"] == b["kind"] and a["budget"] == b["budget"]
        label = a["kind"]["label"]
        if label in CAPS:
            assert a["budget"]["mixing"] == CAPS[label] and a["not_measured"]
            assert max(a["quantities"]["past_future"]["rank_eps"]) <= CAPS[label]
            assert b["quantities"]["past_future"]["rank_eps"] == pytest.approx(
                a["quantities"]["past_future"]["rank_eps"])
    entry = {"probe": exact, "step": 0, "params": 0, "metrics": {"probe/loss": loss},
             "source": {"model_type": model_type}}
    kinds = build_hf_report(model_type, entry)["kinds"]
    want: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        want.setdefault(label, []).append(i)
    assert [(k["kind"], k["layers"]) for k in kinds] == list(want.items())
    for k in kinds:
        if k["kind"] in CAPS:
            assert k["rows"]["past_future"]["declared"] == CAPS[k["kind"]]
