"""Adapter ranks: exact singular values of s*B@A from QR factors, and LoRA discovery."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from budgets import adapter_ranks, lowrank_singular_values


def test_matches_dense_svd_fp64():
    g = torch.Generator().manual_seed(0)
    B = torch.randn(40, 6, generator=g, dtype=torch.float64)
    A = torch.randn(6, 30, generator=g, dtype=torch.float64)
    s = lowrank_singular_values(B, A, scale=0.5)
    dense = torch.linalg.svdvals(0.5 * B @ A)[:6]
    assert s.shape == (6,) and s.dtype == torch.float64
    torch.testing.assert_close(s, dense, rtol=1e-10, atol=1e-12)


def test_batched_and_rank_deficient():
    g = torch.Generator().manual_seed(1)
    B = torch.randn(3, 20, 4, generator=g, dtype=torch.float64)
    A = torch.randn(3, 4, 25, generator=g, dtype=torch.float64)
    B[1, :, 3] = B[1, :, 0]  # adapter 1 realizes rank 3 of its cap 4
    s = lowrank_singular_values(B, A)
    assert s.shape == (3, 4)
    torch.testing.assert_close(s, torch.linalg.svdvals(B @ A)[..., :4], rtol=1e-9, atol=1e-9)
    assert s[1, 3] < 1e-10 * s[1, 0] and (s[0] > 1e-6).all()


def test_r_larger_than_d_and_shape_mismatch():
    B, A = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    s = lowrank_singular_values(B, A)
    assert s.shape == (3,)  # rank <= min(d, r, k)
    torch.testing.assert_close(s, torch.linalg.svdvals(B @ A)[:3])
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(4, 7\).*do not chain"):
        lowrank_singular_values(B, torch.randn(4, 7))


def test_the_declared_cap_is_never_above_the_projection():
    """B A [d, k] has rank <= min(r, d, k): r = 10000 on a 12 x 16 projection declares 12,
    on a 32 x 8 one 8; an r below both is r."""
    for d_in, d_out, r, cap in [(16, 12, 10000, 12), (8, 32, 10000, 8), (16, 12, 5, 5)]:
        row, = adapter_ranks(nn.ModuleDict({"q": PlainLoRA(d_in, d_out, r)}))
        assert row["declared"] == cap and row["shape"] == [d_out, d_in]


class PeftLinear(nn.Module):
    """Stand-in with peft's LoraLayer attribute layout (peft is not installed here)."""

    def __init__(self, d_in, d_out, ranks: dict[str, int], alpha=8):
        super().__init__()
        self.base_layer = nn.Linear(d_in, d_out)
        self.lora_A = nn.ModuleDict({n: nn.Linear(d_in, r, bias=False) for n, r in ranks.items()})
        self.lora_B = nn.ModuleDict({n: nn.Linear(r, d_out, bias=False) for n, r in ranks.items()})
        self.scaling = {n: alpha / r for n, r in ranks.items()}
        for n in ranks:
            nn.init.normal_(self.lora_B[n].weight)


class PlainLoRA(nn.Module):
    def __init__(self, d_in, d_out, r):
        super().__init__()
        self.lora_A = nn.Parameter(torch.randn(r, d_in))
        self.lora_B = nn.Parameter(torch.zeros(d_out, r))  # LoRA's init: dW = 0
        self.scaling = 2.0


def test_adapter_ranks_finds_peft_and_plain_pairs():
    torch.manual_seed(0)
    model = nn.ModuleDict({"q": PeftLinear(16, 12, {"default": 4, "other": 2}),
                           "v": PlainLoRA(16, 12, 3), "o": nn.Linear(12, 12)})
    rows = {(r["module"], r["adapter"]): r for r in adapter_ranks(model, eps=0.01)}
    assert set(rows) == {("q", "default"), ("q", "other"), ("v", "default")}
    q = rows["q", "default"]
    assert q["declared"] == 4 and q["shape"] == [12, 16] and q["scale"] == 2.0
    assert q["metrics"]["rank_eps"] <= 4 and q["metrics"]["numerical_rank"] == 4
    dense = torch.linalg.svdvals(2.0 * model["q"].lora_B["default"].weight
                                 @ model["q"].lora_A["default"].weight)
    assert q["spectrum"] == pytest.approx(dense[:4].tolist(), rel=1e-4)
    assert rows["q", "other"]["declared"] == 2
    v = rows["v", "default"]  # zero B: no realized rank, and no NaN
    assert v["declared"] == 3 and v["metrics"]["rank_eps"] == 0.0
    assert adapter_ranks(nn.Linear(3, 3)) == []


def test_probe_and_report_account_adapters_on_a_block(tiny_lm, tokens):
    from budgets import build_report, probe_model

    block = tiny_lm.blocks[0]
    block.lora_q = PeftLinear(12, 8, {"default": 4})  # attached; the probe finds it by shape
    probe = probe_model(tiny_lm, tokens, with_spectra=True)
    layer = probe["layers"][0]
    assert [a["module"] for a in layer["adapters"]] == ["lora_q"]
    assert len(layer["spectra"]["adapter.lora_q.default"][0]) == 4
    assert "adapters" not in probe["layers"][1]
    # the attached pairs declare the layer's adapter cap; the bare layer declares none
    assert (layer["budget"]["adapter"], probe["layers"][1]["budget"]["adapter"]) == (4, 0)
    del layer["spectra"], probe["layers"][1]["spectra"]
    report = build_report({"t": {"probe": probe, "step": 0, "params": 1}})
    rows = [a for a in report["variants"][0]["layers"][0]["axes"] if a["axis"] == "adapter"]
    assert [(r["quantity"], r["declared"]) for r in rows] == [("adapter.lora_q.default", 4)]
    assert any(a["kind"] == "lora_rank" for a in report["advice"])
