"""Attention that is not one softmax over the sequence's tokens (tests/hf_tiny.py's tiny
random models, built offline): differential attention (diffllama) read as one layer whose
mixing M = P1 - lambda P2 rebuilds the module's difference in fp64, and DeepSeek-V4's
compressed slots refused in one line."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

from budgets.budget import difference_cap, differential_budget  # noqa: E402
from budgets.capture.differential import DifferentialCall  # noqa: E402
from budgets.hf.capture import capture  # noqa: E402
from budgets.hf.probe import build_hf_report, probe_hf_model  # noqa: E402
from budgets.probe.signed import NOT_APPLICABLE  # noqa: E402
from tests.budgets.hf.mixer_checks import relative  # noqa: E402
from tests.hf_tiny import VOCAB, tiny_model  # noqa: E402
from train.cli import main  # noqa: E402

B, T = 2, 64


def _ids(T: int = T) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def _lambda(module) -> float:
    """The Differential Transformer's lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
    from the module's parameters, in fp64."""
    def term(q, k):
        return torch.exp((q.detach().double() * k.detach().double()).sum())
    return float(term(module.lambda_q1, module.lambda_k1)
                 - term(module.lambda_q2, module.lambda_k2) + module.lambda_init)


@pytest.fixture(scope="module")
def diff64():
    """The fp64 model, its calls (P kept), each layer's difference as the module formed it
    (its group norm's input), and the logits with and without the capture."""
    model = tiny_model("diffllama", fp64=True)
    before_norm = {}
    hooks = [layer.self_attn.groupnorm.register_forward_pre_hook(
        lambda m, args, i=i: before_norm.__setitem__(i, args[0]))
        for i, layer in enumerate(model.model.layers)]
    calls: list = []
    try:
        with torch.no_grad():
            plain = model(input_ids=_ids()).logits
            with capture(model, calls.append, keep_probs=True):
                captured = model(input_ids=_ids()).logits
    finally:
        for h in hooks:
            h.remove()
    return model, calls, before_norm, plain, captured


def test_differential_attention_is_one_call_per_layer_and_leaves_the_logits(diff64):
    model, calls, _, plain, captured = diff64
    layers = [layer.self_attn for layer in model.model.layers]
    assert [c.module for c in calls] == layers  # one call per layer, not two
    assert all(isinstance(c, DifferentialCall) for c in calls)
    torch.testing.assert_close(captured, plain, rtol=0, atol=1e-12)


def test_m_rebuilds_the_modules_difference_in_fp64(diff64):
    """M @ values is what the module subtracts (its group norm's input), read out it is
    what W_O reads, and each layer's lambda is the module's own."""
    model, calls, before_norm, _, _ = diff64
    signs = set()
    for i, call in enumerate(calls):
        M = call.exact()  # [B, H/2, T, T]
        H = model.config.num_attention_heads
        assert M.shape == (B, H // 2, T, T) and M.dtype == torch.float64
        d = M @ call.values()  # [B, H/2, T, 2V]
        assert relative(d.transpose(1, 2), before_norm[i]) < 1e-12
        assert relative(call.readout(d), call.output) < 1e-12
        lam = _lambda(call.module)
        assert call.kind(False)["lambda"] == pytest.approx(lam, rel=1e-6)  # fp32 exp
        # rows sum to 1 - lambda, not 1 (P's softmax runs in fp32, as eager's does)
        torch.testing.assert_close(M.sum(-1), torch.full_like(M[..., 0], 1 - float(call.lam[0])),
                                   rtol=0, atol=1e-6)
        signs.add(lam > 0)
    assert signs == {True, False}  # the tiny model has both signs of lambda


def test_the_probe_reports_signed_mixing_with_its_caps():
    model = tiny_model("diffllama")
    probe, _ = probe_hf_model(model, _ids(), matfree_from=None)
    H, L = model.config.num_attention_heads, model.config.num_hidden_layers
    assert [ly["layer"] for ly in probe["layers"]] == list(range(L))
    for ly, block in zip(probe["layers"], model.model.layers, strict=True):
        kind, q = ly["kind"], ly["quantities"]
        assert kind["label"] == "differential" and kind["attention"] == "differential"
        assert kind["lambda"] == pytest.approx(_lambda(block.self_attn), rel=1e-6)
        assert ly["budget"]["n_heads"] == H // 2 and ly["budget"]["mixing"] == T // 2
        assert "mixing_centered" not in q and len(q["past_future"]["rank_eps"]) == H // 2
        assert max(q["past_future"]["rank_eps"]) <= ly["budget"]["mixing"]
        assert ly["heads"]["first_token_mass"] == [None] * (H // 2)
        assert ly["signed"]["not_applicable"] == list(NOT_APPLICABLE)
        assert {"mixing", "past_future"} <= set(ly["signed"]["computed"])
        assert {"qk", "value", "out", "inference.k", "inference.v"} <= set(q)
    entry = {"probe": probe, "step": 0, "params": 0, "metrics": {},
             "source": {"model_type": "diffllama"}}
    report = build_hf_report("diffllama", entry)
    assert [(k["kind"], k["layers"]) for k in report["kinds"]] == [
        ("differential", list(range(L)))]
    assert all("signed" in ly for ly in report["variants"][0]["layers"])


def test_matrix_free_differential_ranks_equal_the_exact_path(diff64):
    """The difference operator's products and energy are the dense block's; the probe's
    past->future ranks agree on both paths."""
    _, calls, _, _, _ = diff64
    call = calls[1]
    h = T // 2
    dense = call.exact()[..., h:, :h].float()  # [B, H/2, T - h, h]
    op = call.operator().past_future()
    X = torch.randn(*dense.shape[:2], h, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(op.matmul(X), dense @ X, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(op.rmatmul(X), dense.mT @ X, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(op.fro2(), dense.double().square().sum((-2, -1)), rtol=1e-5,
                               atol=0)
    model = tiny_model("diffllama")
    exact, loss = probe_hf_model(model, _ids(), matfree_from=None)
    free, loss_free = probe_hf_model(model, _ids(), matfree_from=16)
    assert loss_free == pytest.approx(loss, rel=1e-6)
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["kind"] == b["kind"] and a["budget"] == b["budget"]
        assert b["quantities"]["past_future"]["rank_eps"] == \
            a["quantities"]["past_future"]["rank_eps"]
        assert b["signed"]["computed"] == ["past_future", "past_future_lengths"]


@pytest.mark.parametrize("window", [None, 8])
def test_the_declared_cap_bounds_any_difference_of_two_softmaxes(window):
    """rank(P1 - lambda P2) on the past->future block stays within difference_cap: the
    sum of the parts' caps, within the block's nonzero corner (T/2, or W - 1 with a
    window), whatever the logits and lambda."""
    g = torch.Generator().manual_seed(0)
    S = torch.randn(2, 8, T, T, generator=g, dtype=torch.float64) * 4  # 8 heads, 4 pairs
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (s > t) | (s <= t - window) if window else s > t
    P = torch.softmax(S.masked_fill(hidden, float("-inf")), -1)
    lam = torch.tensor([-3.21, 0.5, 1.0, 4.8], dtype=torch.float64)
    M = P[:, :4] - lam.view(1, 4, 1, 1) * P[:, 4:]
    cap = differential_budget("m", T, n_heads=8, n_kv_heads=2, head_dim=16, d_model=64,
                              window=window).mixing
    assert cap == (T // 2 if window is None else window - 1)
    assert int(torch.linalg.matrix_rank(M[..., T // 2:, :T // 2]).max()) <= cap
    assert difference_cap((3, 4), 32) == 7 and difference_cap((16, 16), 16) == 16


def _report(path, text_file) -> int:
    return main(["report", "--hf", str(path), "--text", str(text_file), "--seq-len", str(T),
                 "--probe-size", "1", "--format", "json"])


def test_deepseek_v4_compressed_slots_are_refused_in_one_line(tmp_path, text_file, capsys):
    tiny_model("deepseek_v4").save_pretrained(tmp_path / "v4")
    code = _report(tmp_path / "v4", text_file)
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("rankzoo: error:")]
    assert code == 2 and not out and "Traceback" not in err and len(errors) == 1
    assert "deepseek_v4 layer 1 (compressed_sparse_attention)" in errors[0]
    assert "not of the layer's values" in errors[0] and "W_pool" in errors[0]


@pytest.mark.parametrize("branch", ["heavily_compressed_attention",
                                    "compressed_sparse_attention"])
def test_each_compressed_branch_is_named(branch):
    model = tiny_model("deepseek_v4", num_hidden_layers=2,
                       layer_types=["sliding_attention", branch],
                       mlp_layer_types=["hash_moe", "moe"])
    with pytest.raises(ValueError, match=rf"layer 1 \({branch}\): its attention appends "
                                         r"compressed key/value slots"):
        probe_hf_model(model, _ids(), matfree_from=None)

