"""SSD's math, written once (budgets/mixing/ssd.py): the mixing matrix against a per-token
recurrence of the scan in fp64, the factors against the matrix's past->future block, the
stable segment sum where running sums cancel, and the caps against the matrix's rank."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from budgets.mixing.ssd import segsum, ssd_caps, ssd_factors, ssd_mixing


@dataclass(frozen=True)
class Scan:
    """One scan's shape: heads H, groups G, state N, head dim P, decay per state entry."""

    heads: int
    groups: int
    state: int
    head_dim: int
    per_entry: bool  # A [H, N] (Mamba-1's selective scan) rather than A [H] (Mamba-2)


SCANS = {
    "mamba2 A[H], one group": Scan(4, 1, 8, 3, False),
    "mamba2 A[H], two groups": Scan(4, 2, 8, 3, False),
    "mamba1 A[H,N], P=1": Scan(6, 1, 5, 1, True),
}


def inputs(scan: Scan, T: int, dtype=torch.float64, seed: int = 0, dt_scale: float = 1.0):
    """x [B, T, H, P], dt [B, T, H] (positive), A [H] or [H, N] (negative), B, C [B, T, G, N]."""
    g = torch.Generator().manual_seed(seed)
    H, G, N, P = scan.heads, scan.groups, scan.state, scan.head_dim

    def draw(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    dt = F.softplus(draw(2, T, H)) * dt_scale
    A = -torch.exp(draw(H, N) if scan.per_entry else draw(H))
    x, B, C = draw(2, T, H, P), draw(2, T, G, N), draw(2, T, G, N)
    return tuple(t.to(dtype) for t in (x, dt, A, B, C))


def recurrence(x, dt, A, B, C) -> torch.Tensor:
    """y [B, T, H, P] one token at a time: state_t = exp(A dt_t) state_{t-1} + dt_t B_t x_t^T,
    y_t = C_t . state_t, in fp64; nothing shared with budgets/mixing/ssd.py."""
    b, T, H, P = x.shape
    rep = H // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, 2), C.repeat_interleave(rep, 2)  # [B, T, H, N]
    rate = A if A.dim() == 2 else A[:, None]  # [H, N or 1]
    state = torch.zeros(b, H, B.shape[-1], P, dtype=torch.float64)  # [B, H, N, P]
    ys = []
    for t in range(T):
        decay = torch.exp(rate * dt[:, t, :, None])[..., None]  # [B, H, N or 1, 1]
        write = dt[:, t, :, None, None] * Bh[:, t, :, :, None] * x[:, t, :, None, :]
        state = decay * state + write  # [B, H, N, P]
        ys.append((Ch[:, t, :, :, None] * state).sum(-2))  # [B, H, P]
    return torch.stack(ys, dim=1)  # [B, T, H, P]


def apply(M: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y [B, T, H, P] = M x per head and channel, M [B, H, T, T]."""
    return (M @ x.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize("scan", SCANS.values(), ids=SCANS.keys())
@pytest.mark.parametrize("T", [1, 2, 17], ids=lambda T: f"T={T}")
def test_the_matrix_rebuilds_the_recurrence(scan, T):
    x, dt, A, B, C = inputs(scan, T)
    M = ssd_mixing(dt, A, B, C)  # [B, H, T, T]
    assert M.shape == (2, scan.heads, T, T) and M.dtype == torch.float64
    assert torch.equal(M.triu(1), torch.zeros_like(M))  # causal: nothing from the future
    torch.testing.assert_close(apply(M, x), recurrence(x, dt, A, B, C), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("scan", SCANS.values(), ids=SCANS.keys())
@pytest.mark.parametrize("T", [2, 16, 17], ids=lambda T: f"T={T}")
def test_the_factors_give_the_past_future_block(scan, T):
    x, dt, A, B, C = inputs(scan, T, seed=1)
    M = ssd_mixing(dt, A, B, C)
    f = ssd_factors(dt, A, B, C)
    h = T // 2
    assert f.L.shape == (2, scan.heads, T - h, scan.state) and f.L.dtype == torch.float32
    assert f.R.shape == (2, scan.heads, h, scan.state) and f.seq_len == T
    torch.testing.assert_close((f.L.double() @ f.R.double().mT), M[..., h:, :h], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("per_entry", [False, True], ids=["A[H]", "A[H,N]"])
def test_fp32_keeps_its_accuracy_where_the_running_decay_is_large(per_entry):
    """Strong decay over many tokens: the running sum of A dt reaches -300 to -1e3, where an fp32
    ulp is 6e-5, so cumsum_t - cumsum_s would put ~1e-4 relative error on every decay
    (measured: 9e-5); summed over its own segment each decay keeps ~2e-6, in the matrix and
    in the factors. B = C = 1 and N = 1, so that M[t, s] is the decay times dt_s alone."""
    scan = Scan(heads=4, groups=1, state=1, head_dim=1, per_entry=per_entry)
    _, dt, A, B, C = inputs(scan, 256, seed=2, dt_scale=4.0)
    B, C = torch.ones_like(B), torch.ones_like(C)
    fp32 = [t.float() for t in (dt, A, B, C)]
    running = (dt[..., None] * A.reshape(4, -1)).sum(1)  # A dt summed over T, [B, H, N]
    assert float(running.max()) < -300 and float(running.min()) < -1000
    pairs = [(ssd_mixing(*fp32), ssd_mixing(dt, A, B, C))]
    f32, f64 = ssd_factors(*fp32), ssd_factors(dt, A, B, C)
    pairs += [(f32.L, f64.L.double()), (f32.R, f64.R.double())]  # fp64 math, fp32 out
    for got, exact in pairs:
        live = exact > exact.amax() * 1e-8  # decays fp32 holds with its full precision
        assert float(((got.double() - exact).abs() / exact)[live].max()) < 1e-5


def test_segsum_sums_each_segment_and_masks_the_future():
    a = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    want = torch.tensor([[0, -1, -1, -1], [2, 0, -1, -1], [6, 4, 0, -1], [14, 12, 8, 0]],
                        dtype=torch.float64)
    want = want.masked_fill(want == -1, float("-inf"))
    assert torch.equal(segsum(a), want)


@pytest.mark.parametrize(("T", "state", "cap"), [(32, 8, 8), (10, 8, 5)],
                         ids=["N below T/2", "T/2 below N"])
def test_the_mixing_cap_is_the_past_future_rank(T, state, cap):
    """The declared cap min(N, T/2) bounds the block's rank, and random inputs reach it."""
    scan = Scan(heads=3, groups=1, state=state, head_dim=2, per_entry=False)
    _, dt, A, B, C = inputs(scan, T, seed=3)
    h = T // 2
    ranks = torch.linalg.matrix_rank(ssd_mixing(dt, A, B, C)[..., h:, :h])  # [B, H]
    caps = ssd_caps("ssm", T, d_model=16, heads=3, head_dim=2, state=state, params=100)
    assert caps.mixing == cap and int(ranks.max()) == cap


def test_the_caps():
    caps = ssd_caps("ssm", 64, d_model=16, heads=4, head_dim=8, state=16, params=1000)
    assert (caps.n_heads, caps.mixing, caps.logits, caps.value_path, caps.inference) == (
        4, 16, 16, 16, 8)  # value path min(D, H P); inference min(N, P) per head
    assert caps.cache_elements == 4 * 8 * 16  # H P N
    assert caps.flops_per_token == 2 * 1000 + 6 * 4 * 8 * 16
    zoo_like = ssd_caps("ssm", 64, 16, 4, 8, 16, 1000, conv_cache=70, projection_flops=5)
    assert zoo_like.cache_elements == 4 * 8 * 16 + 70
    assert zoo_like.flops_per_token == 5 + 6 * 4 * 8 * 16
    assert ssd_caps("mamba", 64, 16, 32, 1, 16, 10).inference == 1  # Mamba-1: P = 1


@pytest.mark.parametrize(("bad", "message"), [
    ("dt", r"dt must be \[B, T, H\], got shape \(2, 5\)"),
    ("A", r"A must be \[H\] or \[H, N\] with H = 4, got shape \(3,\)"),
    ("B", r"B must be .* got shape \(2, 5, 3, 8\)"),
    ("A per entry", r"A \[H, N\] must have N = 8 \(B's state\), got shape \(4, 7\)"),
], ids=["dt without heads", "A of the wrong heads", "groups not dividing heads",
        "A of the wrong state"])
def test_a_bad_shape_is_named(bad, message):
    _, dt, A, B, C = inputs(SCANS["mamba2 A[H], one group"], 5)
    if bad == "dt":
        dt = dt[..., 0]
    elif bad == "A":
        A = A[:3]
    elif bad == "B":
        B = B.expand(-1, -1, 3, -1)
    else:
        A = -torch.ones(4, 7, dtype=torch.float64)
    for fn in (ssd_mixing, ssd_factors):
        with pytest.raises(ValueError, match=message):
            fn(dt, A, B, C)
