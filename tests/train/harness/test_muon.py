"""rankzoo's Muon against torch's: the batched orthogonalization, one step, the dtype rule
and the state dict."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz

from train.harness import muon as muon_mod
from train.harness.muon import Muon, ortho_dtype, zeropower_batched

COEFFS = (DEFAULT_A, DEFAULT_B, DEFAULT_C)
SHAPES = [(256, 64), (64, 256), (64, 64), (64, 64), (256, 64)]  # tall, wide, square, repeats


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s) * 0.1) for s in SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _clone(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    out = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for o, p in zip(out, params, strict=True):
        o.grad = p.grad.clone()
    return out


@pytest.mark.parametrize("shape", [(3, 256, 64), (2, 64, 256), (4, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batched_equals_per_matrix(shape, dtype):
    torch.manual_seed(0)
    grads = torch.randn(*shape)
    batched = zeropower_batched(grads, COEFFS, 5, 1e-7, dtype)
    single = torch.stack([zeropower_batched(g[None], COEFFS, 5, 1e-7, dtype)[0] for g in grads])
    atol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(batched, single, rtol=0, atol=atol)


def test_bf16_orthogonalization_is_torchs():
    torch.manual_seed(0)
    grads = torch.randn(3, 256, 64)
    ours = zeropower_batched(grads, COEFFS, 5, 1e-7, torch.bfloat16)
    theirs = torch.stack([_zeropower_via_newtonschulz(g, COEFFS, 5, 1e-7) for g in grads])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-2)


def test_zeropower_batched_names_a_bad_shape():
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        zeropower_batched(torch.randn(4, 4), COEFFS, 5, 1e-7, torch.float32)


def _detect(monkeypatch, dtype: torch.dtype) -> None:
    """Detection that picks `dtype` for every shape (the real one times this machine)."""
    monkeypatch.setattr(muon_mod, "cpu_ortho_dtype", lambda m, k: dtype)


def _step_both(monkeypatch, native: bool, steps: int = 2):
    _detect(monkeypatch, torch.bfloat16 if native else torch.float32)
    theirs, ours = _params(), None
    ours = _clone(theirs)
    kw = {"lr": 1e-2, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    opt_t, opt_o = torch.optim.Muon(theirs, **kw), Muon(ours, **kw)
    for _ in range(steps):
        opt_t.step()
        opt_o.step()
    return theirs, ours


def test_step_equals_torchs_in_bf16(monkeypatch):
    # the same dtype as torch's: the same update up to bf16 rounding of batched matmuls
    theirs, ours = _step_both(monkeypatch, native=True)
    for t, o in zip(theirs, ours, strict=True):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-5)


def test_step_in_fp32_is_within_bf16_tolerance(monkeypatch):
    theirs, ours = _step_both(monkeypatch, native=False)
    for t, o in zip(theirs, ours, strict=True):
        lr_step = 1e-2 * 0.2 * max(t.shape) ** 0.5  # the adjusted lr: an update's scale
        assert (o - t).abs().max() < 0.05 * lr_step


@pytest.mark.parametrize("bf16_ms, fp32_ms, want", [
    (7.8, 1.0, torch.float32),    # emulated bf16 (Zen 2)
    (1.4, 1.0, torch.float32),    # native bf16 at a toy width: its conversions dominate
    (0.8, 1.0, torch.float32),    # faster, but not clearly: a margin against load noise
    (0.17, 1.0, torch.bfloat16),  # native bf16 at a model's width (AMX)
], ids=["emulated", "native-toy", "within-margin", "native-wide"])
def test_cpu_dtype_is_the_clearly_faster(monkeypatch, bf16_ms, fp32_ms, want):
    times = {torch.bfloat16: bf16_ms, torch.float32: fp32_ms}
    monkeypatch.setattr(muon_mod, "_ns_seconds", lambda m, k, dtype: times[dtype])
    assert muon_mod.cpu_ortho_dtype.__wrapped__(64, 64) == want


def test_dtype_is_bf16_off_the_cpu_and_per_shape_on_it(monkeypatch):
    monkeypatch.setattr(muon_mod, "cpu_ortho_dtype",
                        lambda m, k: torch.bfloat16 if m * k > 10_000 else torch.float32)
    assert ortho_dtype(torch.device("cuda"), (64, 64)) == torch.bfloat16
    assert ortho_dtype(torch.device("cpu"), (3, 64, 64)) == torch.float32
    assert ortho_dtype(torch.device("cpu"), (256, 64)) == torch.bfloat16


def test_step_uses_the_detected_dtype_per_shape(monkeypatch):
    seen = []
    real = muon_mod.zeropower_batched

    def spy(grads, coeffs, steps, eps, dtype):
        seen.append((tuple(grads.shape[1:]), dtype))
        return real(grads, coeffs, steps, eps, dtype)

    monkeypatch.setattr(muon_mod, "zeropower_batched", spy)
    monkeypatch.setattr(muon_mod, "cpu_ortho_dtype",
                        lambda m, k: torch.bfloat16 if m > k else torch.float32)
    Muon(_params(), lr=1e-2).step()
    # one call per distinct shape, each in its own shape's dtype
    assert sorted(seen, key=str) == sorted(
        [(s, torch.bfloat16 if s[0] > s[1] else torch.float32) for s in set(SHAPES)], key=str)


def test_probe_times_each_shape_once(monkeypatch):
    calls = []

    def timed(m, k, dtype):
        calls.append((m, k))
        return 1.0

    monkeypatch.setattr(muon_mod, "_ns_seconds", timed)
    muon_mod.cpu_ortho_dtype.cache_clear()
    try:
        for shape in [(64, 32), (64, 32), (32, 64)]:
            muon_mod.cpu_ortho_dtype(*shape)
        assert calls == [(64, 32), (64, 32), (32, 64), (32, 64)]  # bf16 and fp32, per shape
    finally:
        muon_mod.cpu_ortho_dtype.cache_clear()  # the real probe's verdicts, not these


def test_state_dict_round_trips_with_torchs(monkeypatch):
    _detect(monkeypatch, torch.float32)
    params = _params()
    ours = Muon(params, lr=1e-2, adjust_lr_fn="match_rms_adamw")
    ours.step()
    state = ours.state_dict()
    assert all(set(s) == {"momentum_buffer"} for s in state["state"].values())
    # into torch's Muon and back: the same keys, the same buffers
    theirs = torch.optim.Muon(_clone(params), lr=1e-2, adjust_lr_fn="match_rms_adamw")
    theirs.load_state_dict(state)
    again = Muon(_clone(params), lr=1e-2, adjust_lr_fn="match_rms_adamw")
    again.load_state_dict(theirs.state_dict())
    for key, s in state["state"].items():
        torch.testing.assert_close(again.state_dict()["state"][key]["momentum_buffer"],
                                   s["momentum_buffer"], rtol=0, atol=0)
    assert again.state_dict()["param_groups"] == state["param_groups"]


def test_resumed_step_equals_uninterrupted(monkeypatch):
    _detect(monkeypatch, torch.float32)
    straight = _params()
    opt = Muon(straight, lr=1e-2)
    opt.step()
    resumed = _clone(straight)
    opt2 = Muon(resumed, lr=1e-2)
    # a deep copy, as from a checkpoint file: load_state_dict keeps the tensors it is
    # given, and a buffer shared with `opt` would take both optimizers' momentum updates
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    opt.step()
    opt2.step()
    for s, r in zip(straight, resumed, strict=True):
        torch.testing.assert_close(r, s, rtol=0, atol=0)


def test_forced_dtype_overrides_detection_and_is_not_saved(monkeypatch):
    _detect(monkeypatch, torch.float32)
    theirs, ours = _params(), None
    ours = _clone(theirs)
    torch.optim.Muon(theirs, lr=1e-2).step()
    forced = Muon(ours, lr=1e-2, dtype=torch.bfloat16)
    forced.step()  # bf16 although detection says fp32: torch's update
    for t, o in zip(theirs, ours, strict=True):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-5)
    assert "dtype" not in forced.state_dict()["param_groups"][0]


def test_a_resume_keeps_the_saved_verdicts_whatever_a_new_probe_says(monkeypatch):
    _detect(monkeypatch, torch.bfloat16)
    straight = _params()
    opt = Muon(straight, lr=1e-2)
    opt.step()
    state = opt.state_dict()
    assert state["ortho_dtypes"] == {f"{m}x{k}": "bfloat16" for m, k in set(SHAPES)}
    _detect(monkeypatch, torch.float32)  # the resumed process's probe would say fp32
    resumed = _clone(straight)
    opt2 = Muon(resumed, lr=1e-2)
    opt2.load_state_dict(copy.deepcopy(state))  # as from a file: buffers of its own
    opt.step()
    opt2.step()
    for s, r in zip(straight, resumed, strict=True):  # both in bf16: the same update
        torch.testing.assert_close(r, s, rtol=0, atol=0)
    assert opt2.state_dict()["ortho_dtypes"] == state["ortho_dtypes"]


def test_torchs_muon_loads_our_state_dict():
    _params_ = _params()
    ours = Muon(_params_, lr=1e-2)
    ours.step()
    theirs = torch.optim.Muon(_clone(_params_), lr=1e-2)
    theirs.load_state_dict(ours.state_dict())  # the extra key ignored
    assert "ortho_dtypes" not in theirs.state_dict()
