"""The spectra engine against NumPy and today's SVD path, on planted spectra (fp64)."""

import numpy as np
import pytest
import torch

import budgets
from budgets.rank.spectra import METHODS, product_spectrum, spectrum


def planted(batch: int, m: int, n: int, s: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Matrices [batch, m, n] with singular values s (len <= min(m, n)), random singular
    vectors."""
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(batch, m, len(s), generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(batch, n, len(s), generator=g, dtype=torch.float64)).Q
    return U @ torch.diag_embed(s.expand(batch, -1)) @ V.mT


SHAPES = [(40, 40), (64, 16), (16, 64), (1, 30), (30, 1)]


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("m, n", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_planted_spectrum_is_found(method, m, n):
    r = min(m, n)
    s = torch.logspace(0, -3, r, dtype=torch.float64)
    A = planted(3, m, n, s)
    got = spectrum(A.float(), method=method).double()
    assert got.shape == (3, r)
    torch.testing.assert_close(got, s.expand(3, -1), atol=2e-6, rtol=0)


@pytest.mark.parametrize("center", [False, True], ids=["raw", "centered"])
def test_auto_matches_numpy_svd(center):
    A = torch.rand(4, 50, 30)
    ref = A.double().numpy()
    if center:
        ref = ref - ref.mean(axis=-2, keepdims=True)
    want = torch.from_numpy(np.linalg.svd(ref, compute_uv=False))
    got = spectrum(A, center=center).double()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fp64_input_keeps_full_precision():
    s = torch.logspace(0, -12, 20, dtype=torch.float64)
    got = spectrum(planted(1, 20, 20, s))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[0], s, atol=1e-14, rtol=1e-6)


def test_metrics_equal_the_svd_path_on_softmax_matrices():
    """rank_eps identical and eranks within 1e-4 relative of the fp32 SVD route."""
    T = 96
    S = torch.randn(2, 4, T, T) * 3
    P = torch.softmax(S.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), -1)
    for center in (False, True):
        old = budgets.spectrum_metrics(spectrum(P, center, method="svd"), (T, T), 0.1)
        new = budgets.spectrum_metrics(spectrum(P, center, method="gram"), (T, T), 0.1)
        assert torch.equal(old["rank_eps"], new["rank_eps"])
        torch.testing.assert_close(new["erank"], old["erank"], rtol=1e-4, atol=0)


def test_product_spectrum_equals_dense():
    g = torch.Generator().manual_seed(1)
    L = torch.randn(2, 3, 70, 5, generator=g, dtype=torch.float64)
    R = torch.randn(2, 3, 40, 5, generator=g, dtype=torch.float64)
    dense = torch.linalg.svdvals(L @ R.mT)[..., :5]
    torch.testing.assert_close(product_spectrum(L, R, scale=2.0), 2.0 * dense)


def test_unknown_method_and_mismatched_factors_are_named():
    with pytest.raises(ValueError, match="unknown spectrum method 'qr'"):
        spectrum(torch.ones(3, 3), method="qr")
    with pytest.raises(ValueError, match=r"must share their last dim"):
        product_spectrum(torch.ones(4, 2), torch.ones(4, 3))


def test_empty_matrix_has_an_empty_spectrum():
    assert spectrum(torch.ones(2, 0, 5)).shape == (2, 0)


@pytest.mark.parametrize("shape", [(8, 8), (256, 256), (300, 128), (1024, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
def test_route_follows_the_dtype(shape):
    assert budgets.rank.spectra.choose_method(torch.empty(*shape)) == "gram"
    assert budgets.rank.spectra.choose_method(torch.empty(*shape, dtype=torch.float64)) == "svd"
