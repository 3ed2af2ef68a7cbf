"""The eigensolvers on the cores (budgets/rank/eigen.py) and the centered pair of spectra
(spectra.centered_pair): the same values as one serial call, one LAPACK thread in every
worker, the centered Gram as exact as the fp64 SVD."""

import contextlib
import threading

import numpy as np
import pytest
import torch

from budgets.rank import eigen
from budgets.rank.eigen import EigPlan, eig_plan, eigvalsh, forced_workers, one_thread, spread
from budgets.rank.metrics import singular_value_pair, singular_values, spectrum_metrics
from budgets.rank.spectra import centered_pair, spectrum


def grams(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    X = torch.randn(batch, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return X @ X.mT


def test_spread_values_are_bit_identical_to_one_serial_call():
    G = grams(7, eigen.SPREAD_FROM)
    with one_thread():
        want = torch.linalg.eigvalsh(G)
    for workers in (1, 2, 3):
        with forced_workers(workers):
            assert torch.equal(eigvalsh(G), want)
    with forced_workers(2):  # leading dims kept
        assert torch.equal(eigvalsh(G.view(7, 1, *G.shape[-2:])), want.view(7, 1, -1))


def test_workers_run_one_thread_and_leave_the_callers_count():
    """No OpenMP team beside another: every worker computes on one thread, and the
    caller's thread count comes back after the call."""
    seen = []

    def record(A: torch.Tensor) -> torch.Tensor:
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return A.sum((-2, -1))

    before = torch.get_num_threads()
    with forced_workers(2):
        out = spread(record, torch.ones(16, eigen.SPREAD_FROM, eigen.SPREAD_FROM))
    assert torch.get_num_threads() == before
    assert out.shape == (16,)
    assert {n for _, n in seen} == {1}
    assert any(name.startswith("rankzoo-eig") for name, _ in seen)


def test_small_or_single_matrices_stay_in_one_call():
    calls = []

    def count(A):
        calls.append(A.shape[0])
        return A.sum(-1)

    with forced_workers(4):
        spread(count, torch.ones(32, 8, 8))  # below SPREAD_FROM
        spread(count, torch.ones(1, 200, 200))
    assert calls == [32, 1]


def test_plan_is_timed_once_and_described(monkeypatch):
    eigen._plan.cache_clear()
    timed = []

    def seconds(G, w, solver="torch"):
        timed.append((w, solver))
        return {(1, "torch"): 1.0}.get((w, solver), 0.6)

    monkeypatch.setattr(eigen, "_seconds", seconds)
    monkeypatch.setattr(eigen, "solvers", lambda: ["torch"])
    try:
        plan = eigen._plan(4)
        assert plan == EigPlan(4, 4, 1.0, 0.6) and timed == [(1, "torch"), (4, "torch")]
        assert eigen._plan(4) is plan and len(timed) == 2  # cached
        assert "4 workers x 1 thread" in plan.describe() and "1 worker 1.000 s" in plan.describe()
        # under SPREAD_MAX_SHARE only: 0.8 of one worker's time keeps one worker
        monkeypatch.setattr(eigen, "_seconds", lambda G, w, solver="torch": {1: 1.0}.get(w, 0.8))
        assert eigen._plan(3).workers == 1
        assert eigen._plan(1) == EigPlan(1, 1, None, None)
    finally:
        eigen._plan.cache_clear()


@pytest.mark.parametrize("numpy_s, solver", [(0.7, "numpy"), (0.85, "torch")],
                         ids=["numpy-under-share", "numpy-over-share"])
def test_plan_takes_numpy_only_under_its_share_of_torchs_time(monkeypatch, numpy_s, solver):
    """The large matrices' LAPACK is timed on the workers the plan chose; numpy's wins
    only under SOLVER_MAX_SHARE of torch's time, so noise does not flip it."""
    eigen._plan.cache_clear()
    seen = []

    def seconds(G, w, name="torch"):
        seen.append((tuple(G.shape), w, name))
        return {"torch": 1.0, "numpy": numpy_s}[name] if G.shape[-1] == eigen.SOLVER_PROBE_SIDE \
            else {1: 1.0}.get(w, 0.5)

    monkeypatch.setattr(eigen, "_seconds", seconds)
    monkeypatch.setattr(eigen, "solvers", lambda: ["torch", "numpy"])
    try:
        plan = eigen._plan(2)
        assert plan.workers == 2 and plan.solver == solver
        assert dict(plan.solver_s) == {"torch": 1.0, "numpy": numpy_s}
        side = eigen.SOLVER_PROBE_SIDE
        assert [s for s in seen if s[0][-1] == side] == [
            ((2 * eigen.SOLVER_PROBE_PER_WORKER, side, side), 2, n) for n in ("torch", "numpy")]
        assert f"{solver}'s LAPACK from {eigen.SOLVER_FROM}" in plan.describe()
    finally:
        eigen._plan.cache_clear()


needs_numpy_solver = pytest.mark.skipif(
    "numpy" not in eigen.solvers(),
    reason=f"numpy's BLAS ({eigen.numpy_blas()}) is not one threadpoolctl holds to one thread")


@needs_numpy_solver
def test_numpy_solver_spread_is_bit_identical_and_agrees_with_torch():
    """numpy's LAPACK: each matrix as one serial numpy call gives it, on any number of
    workers; torch's within LAPACK rounding (1e-12 of the largest eigenvalue)."""
    from threadpoolctl import threadpool_limits

    G = grams(5, eigen.SOLVER_FROM)
    with threadpool_limits(limits=1, user_api="blas"):  # a BLAS team rounds otherwise
        want = torch.from_numpy(np.linalg.eigvalsh(G.numpy()))
    with eigen.forced_solver("numpy"):
        for workers in (1, 2):
            with forced_workers(workers):
                assert torch.equal(eigvalsh(G), want)
    torch.testing.assert_close(want, torch.linalg.eigvalsh(G), rtol=0,
                               atol=1e-12 * float(want.max()))


@needs_numpy_solver
def test_numpy_solver_runs_its_blas_on_one_thread_and_restores_it():
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before, seen = blas_threads(), []

    def record(A):
        seen.extend(blas_threads())
        return eigen.solve(A @ A.mT)

    with eigen.forced_solver("numpy"), forced_workers(2):
        spread(record, torch.randn(4, eigen.SOLVER_FROM, eigen.SOLVER_FROM, dtype=torch.float64))
        # outside a spread numpy's LAPACK is not held to one thread: torch's decomposes
        G = grams(1, eigen.SOLVER_FROM)
        assert torch.equal(eigen.solve(G), torch.linalg.eigvalsh(G))
    assert seen and set(seen) == {1}
    assert blas_threads() == before


def test_small_matrices_take_torchs_lapack_whatever_the_plan():
    """Below SOLVER_FROM, numpy's calls from two workers did not overlap: torch's LAPACK."""
    G = grams(3, eigen.SOLVER_FROM - 1)
    with contextlib.ExitStack() as stack:
        if "numpy" in eigen.solvers():
            stack.enter_context(eigen.forced_solver("numpy"))
        with one_thread():
            assert torch.equal(eigen.solve(G), torch.linalg.eigvalsh(G))


def test_forced_solver_refuses_an_unknown_one():
    with pytest.raises(ValueError, match="eigensolver 'scipy' is not available here"), \
            eigen.forced_solver("scipy"):
        pass


def test_plan_counts_the_cores_outside_one_thread():
    outside = eigen.cores()
    with one_thread():
        assert torch.get_num_threads() == 1 and eigen.cores() == outside
    assert eig_plan().cores == outside


def test_forced_workers_refuses_zero():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"), forced_workers(0):
        pass


def causal_softmax(B: int, H: int, T: int, scale: float = 3.0) -> torch.Tensor:
    S = torch.randn(B, H, T, T, generator=torch.Generator().manual_seed(1)) * scale
    return torch.softmax(S.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")), -1)


@pytest.mark.parametrize("m, n", [(48, 48), (60, 20), (20, 60)])
def test_centered_pair_raw_is_spectrum_and_centered_is_exact(m, n):
    """The raw values bit-identical to spectrum(A); the centered ones, from the raw Gram,
    at least as close to the fp64 SVD of the fp64-centered matrix as centering in fp32."""
    A = torch.rand(3, m, n, generator=torch.Generator().manual_seed(2)) ** 4
    s, s_c = centered_pair(A)
    assert torch.equal(s, spectrum(A))
    Ad = A.double()
    exact = torch.linalg.svdvals(Ad - Ad.mean(-2, keepdim=True))
    err_new = (s_c.double() - exact).abs().max()
    err_old = (spectrum(A, center=True).double() - exact).abs().max()
    assert err_new <= max(err_old, 1e-7 * float(exact[..., 0].max()))
    torch.testing.assert_close(s_c.double(), exact, atol=1e-6, rtol=0)


def test_mixing_pair_metrics_agree_with_two_spectra():
    """What the probe reports of a softmax mixing matrix: raw metrics equal, centered
    ones within the tolerance docs/METRICS.md states (1e-5 relative, counts equal here)."""
    P = causal_softmax(2, 3, 128)
    s, s_c = singular_value_pair(P)
    old_c = singular_values(P, center=True)
    assert torch.equal(s, singular_values(P))
    a, b = spectrum_metrics(s_c, (128, 128)), spectrum_metrics(old_c, (128, 128))
    for name in ("rank_eps", "numerical_rank"):
        assert torch.equal(a[name], b[name])
    for name in ("erank", "stable_rank", "participation_ratio", "sigma_1", "sigma_ratio"):
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=0)


def test_centered_pair_of_fp64_takes_the_svd():
    A = torch.rand(2, 10, 6, dtype=torch.float64)
    s, s_c = centered_pair(A)
    assert s.dtype == torch.float64
    assert torch.equal(s_c, spectrum(A, center=True))


@pytest.mark.parametrize("n", [129, 300, 512], ids=lambda n: f"n{n}")
def test_lower_gram_is_the_gram_of_a_triangular_matrix(n):
    """A causal mixing matrix's Gram by its halves: A A^T to fp64 rounding, for odd
    halves and leading dims too; any other matrix gets the plain product."""
    from budgets.rank import spectra

    P = causal_softmax(2, 2, n).double()
    want = P @ P.mT
    G = spectra._gram(P)
    torch.testing.assert_close(G, want, rtol=0, atol=1e-14 * float(want.abs().max()))
    Q = P.clone()
    Q[..., 0, -1] = 1e-30  # one entry above the diagonal: not triangular
    assert torch.equal(spectra._gram(Q), Q @ Q.mT)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_spectra_on_cuda_are_one_batch_and_match_the_cpu_workers():
    """On a GPU a layer's mixing matrices go to the device's eigensolver as one batch; the
    metrics match the CPU workers' to 1e-6 relative (counts equal), and the time of one
    30-layer report's worth of 1024 x 1024 pairs is printed for the GPU check's log."""
    import time

    P = causal_softmax(1, 9, 1024)
    s, s_c = singular_value_pair(P)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        g, g_c = singular_value_pair(P.cuda())
    torch.cuda.synchronize()
    print(f"\ncentered pair of 9 x 1024 x 1024 on {torch.cuda.get_device_name()}: "
          f"{(time.perf_counter() - start) / 3:.3f} s a layer")
    for cpu, gpu in ((s, g), (s_c, g_c)):
        a, b = spectrum_metrics(cpu, (1024, 1024)), spectrum_metrics(gpu.cpu(), (1024, 1024))
        for name in ("rank_eps", "numerical_rank"):
            assert torch.equal(a[name], b[name])
        for name in ("erank", "stable_rank", "participation_ratio", "sigma_1"):
            torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=0)


def test_small_batches_never_start_the_probe(monkeypatch):
    """A training run's monitor measures 32 x 32 matrices: no probe (~0.4 s) for them."""
    eigen._plan.cache_clear()
    monkeypatch.setattr(eigen, "_plan", lambda n: pytest.fail("the probe ran"))
    G = grams(4, 64)
    assert torch.equal(eigvalsh(G), torch.linalg.eigvalsh(G))
    assert spread(lambda A: A.sum((-2, -1)), torch.ones(1, 200, 200)).shape == (1,)  # one


def test_fewer_matrices_than_workers_take_two_passes_with_the_same_values(monkeypatch):
    """One head on 2 workers: its Gram products, then its raw and centered eigenproblems
    as two tasks (1.6x faster measured); the values bit-identical to one pass."""
    from budgets.rank import spectra

    P = causal_softmax(1, 1, eigen.SPREAD_FROM + 8)
    with forced_workers(1):
        want = spread(spectra._pair_here, P).float()  # [1, 1, 2, T], as centered_pair gives
    calls = []
    real = spectra.spread
    monkeypatch.setattr(spectra, "spread", lambda fn, A: calls.append(fn) or real(fn, A))
    with forced_workers(2):
        s, s_c = centered_pair(P)
    assert calls == [spectra._pair_grams, spectra._values]
    assert torch.equal(s, want[..., 0, :]) and torch.equal(s_c, want[..., 1, :])
    calls.clear()
    with forced_workers(2):
        centered_pair(causal_softmax(1, 2, eigen.SPREAD_FROM + 8))  # as many as workers
    assert calls == [spectra._pair_here]


@pytest.mark.parametrize("workers, want", [(2, 2), (1, 1)], ids=["cores-free", "cores-busy"])
def test_a_measurement_takes_all_cores_only_where_the_probe_found_them_free(
        monkeypatch, workers, want):
    """torch's own team collapses on busy cores as LAPACK's did: where the probe kept one
    eigensolver worker, the whole measurement runs on one thread."""
    monkeypatch.setattr(eigen, "cores", lambda: 2)
    monkeypatch.setattr(eigen, "eig_plan", lambda: EigPlan(workers, 2, 1.0, 0.9))
    assert eigen.measuring_threads("cpu") == want
    before = torch.get_num_threads()
    with eigen.measuring("cpu") as n:
        assert n == want and torch.get_num_threads() == want
    assert torch.get_num_threads() == before


def test_a_measurement_on_one_core_or_a_gpu_starts_no_probe(monkeypatch):
    monkeypatch.setattr(eigen, "eig_plan", lambda: pytest.fail("the probe ran"))
    monkeypatch.setattr(eigen, "cores", lambda: 1)
    assert eigen.measuring_threads("cpu") == 1
    monkeypatch.setattr(eigen, "cores", lambda: 8)
    assert eigen.measuring_threads("cuda") == 8
