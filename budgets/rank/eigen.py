"""The exact eigensolvers on the machine's cores: a batch spread over worker threads, each
LAPACK call on one thread, by the faster of torch's LAPACK and numpy's.

    lam = eigvalsh(G)      # G [..., n, n] symmetric -> [..., n] ascending
    s = spread(fn, A)      # any per-matrix function over A [..., m, n], on the workers;
                           # fn may call solve(G), the chosen eigensolver in its own thread
    plan = eig_plan()      # EigPlan(workers, cores, one_s, spread_s, solver, ...), timed once
    with one_thread(): ...
    with measuring(device) as n: ...   # a whole measurement: all cores, or one on busy ones

Why workers, not LAPACK's OpenMP team. The tridiagonalization behind eigvalsh synchronizes
its team O(n) times, and on a loaded machine each synchronization waits for a time slice:
on 2 shared cores two 576 x 576 eigvalsh took 10.8 s on two threads and 0.058 s on one. A
worker thread on one LAPACK thread waits for no one: under load the workers share the
cores, at worst as slow as one thread, never 100x slower; on a quiet machine they use every
core.

No oversubscription: the workers run only inside one_thread(), each task sets torch's and
MKL's counts to one in its own thread (MKL's count is per thread: a fresh worker would
otherwise run LAPACK on every core), and the calling thread waits while they work. Each
matrix is decomposed by the same one-thread LAPACK call as in a serial batch, so the
values are bit-identical to the serial ones.

Two LAPACKs. torch's wheels carry MKL, numpy's carry OpenBLAS; for an eigvalsh of
1024 x 1024 in fp64 on one thread of an AMD EPYC, OpenBLAS took 0.052 s and MKL 0.074 s
(512 x 512: 0.0085 s vs 0.0115 s), and on an Intel CPU the order may well turn. numpy's
LAPACK is a candidate only where its BLAS can be held to one thread (threadpoolctl finds it:
OpenBLAS, MKL or BLIS), so that no worker starts a team of its own; it is held there for
the whole of a spread() call of matrices from SOLVER_FROM up, not longer, and solve()
outside such a call takes torch's.

Both choices are made as Muon chooses its Newton-Schulz dtype (train/harness/muon.py): a
short timed probe, once per process. The workers first, on torch's LAPACK: all cores only
where they take under SPREAD_MAX_SHARE of one worker's time. Then the solver, on those
workers: numpy's only where it takes under SOLVER_MAX_SHARE of torch's time. Both margins
keep load noise from flipping a choice from one process to the next. The two LAPACKs round
differently (eigenvalues ~1e-15 * lambda_1 apart), far below every figure's tolerance
(docs/METRICS.md, "How the spectra are computed").
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

# numpy's LAPACK only where it takes under this share of torch's on the probe,
SOLVER_MAX_SHARE = 0.8
# and only for matrices from this side up: below, calls into OpenBLAS from two workers did
# not overlap (384 x 384: 4.2 ms a matrix on 1 worker and on 2, torch's 5.6 and 2.9 ms),
# from 512 up they did (512: 8.8 / 4.6 ms, torch's 11.7 / 6.1; 1024: 54 / 28, torch's 77 / 39)
SOLVER_FROM = 512
SOLVER_PROBE_SIDE = 768  # the solvers' probe: 2 matrices per worker, ~20-35 ms each on one
SOLVER_PROBE_PER_WORKER = 2
# All cores only where they take under this share of one worker's time on the probe.
SPREAD_MAX_SHARE = 0.75
# Matrices with a side below this stay in one serial call: a 64 x 64 eigvalsh takes
# ~0.2 ms, about what handing it to a worker costs.
SPREAD_FROM = 128
PROBE_SIDE = 384  # the probe's matrices, ~5 ms each on one thread: long enough to time
PROBE_PER_CORE = 4  # matrices per core in the probe (at most PROBE_MOST in all)
PROBE_MOST = 64
PROBE_REPEATS = 2  # timed calls per count after a warm-up; the fastest counts
CHUNKS_PER_WORKER = 4  # a batch is cut into this many pieces per worker: balance under load

_outer: list[int] = []  # the thread counts one_thread() replaced, outermost first


@contextlib.contextmanager
def one_thread():
    """torch (and MKL) on one thread within the block: eigensolvers, and the workers of
    spread(), never run an OpenMP team (module docstring)."""
    before = torch.get_num_threads()
    _outer.append(before)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        _outer.pop()
        torch.set_num_threads(before)


def cores() -> int:
    """The threads torch computes on outside one_thread() (its intra-op count: the
    physical cores unless OMP_NUM_THREADS or torch.set_num_threads said otherwise)."""
    return _outer[0] if _outer else torch.get_num_threads()


@dataclass(frozen=True)
class EigPlan:
    """How a batch of eigenproblems runs on this machine, and the probe that chose it."""

    workers: int  # worker threads, each on one LAPACK thread
    cores: int
    one_s: float | None  # the probe on one worker (None: not probed, one core)
    spread_s: float | None  # on `cores` workers
    solver: str = "torch"  # a key of SOLVERS: the LAPACK of matrices from SOLVER_FROM up
    solver_s: tuple[tuple[str, float], ...] = ()  # the solvers' probe on `workers` workers

    def describe(self) -> str:
        """'2 workers x 1 thread (timed: 1 worker 0.041 s, 2 workers 0.022 s); numpy's
        LAPACK from 512 x 512 (timed: torch 0.052 s, numpy 0.040 s)'."""
        name = f"{self.workers} worker{'s' if self.workers > 1 else ''} x 1 thread"
        out = (f"{name} ({self.cores} core)" if self.one_s is None else
               f"{name} (timed: 1 worker {self.one_s:.3f} s, {self.cores} workers "
               f"{self.spread_s:.3f} s)")
        return f"{out}; {self.solver_text()}"

    def solver_text(self) -> str:
        """"numpy's LAPACK from 512 x 512 (timed: torch 0.052 s, numpy 0.040 s)"."""
        timed = ", ".join(f"{k} {v:.3f} s" for k, v in self.solver_s)
        return (f"{self.solver}'s LAPACK from {SOLVER_FROM} x {SOLVER_FROM}"
                + (f" (timed: {timed})" if timed else ""))

    def to_dict(self) -> dict:
        return {"workers": self.workers, "cores": self.cores, "one_s": self.one_s,
                "spread_s": self.spread_s, "solver": self.solver,
                "solver_s": dict(self.solver_s), "text": self.describe()}


_forced: list[int] = []  # set by forced_workers, for benchmarks and tests
_forced_solver: list[str] = []  # set by forced_solver


@contextlib.contextmanager
def forced_workers(n: int):
    """Within the block, batches run on `n` workers whatever the probe chose."""
    if int(n) < 1:
        raise ValueError(f"workers must be at least 1, got {n!r}")
    _forced.append(int(n))
    try:
        yield
    finally:
        _forced.pop()


# ---------------------------------------------------------------- the two LAPACKs

def _numpy_eigvalsh(G: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.linalg.eigvalsh(G.numpy()))  # the same lower triangle


SOLVERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch": torch.linalg.eigvalsh, "numpy": _numpy_eigvalsh}

# the BLAS libraries threadpoolctl controls, as it names them (numpy's build names them
# within its own: 'scipy-openblas')
_CONTROLLED = ("openblas", "mkl", "blis")


def numpy_blas() -> str | None:
    """The BLAS numpy was built against, as threadpoolctl names it ('openblas', 'mkl',
    'blis'), or None for one it cannot control (Accelerate, an unknown build)."""
    try:
        name = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"].lower()
    except Exception:  # an older numpy, or a build that does not say
        return None
    return next((kind for kind in _CONTROLLED if kind in name), None)


@functools.cache
def _blas():
    """threadpoolctl's controller of the loaded BLAS libraries where numpy's is among them,
    else None: numpy's LAPACK is then not a candidate (it might start a team per worker)."""
    kind = numpy_blas()
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    blas = ThreadpoolController().select(user_api="blas")
    return blas if kind and any(c.internal_api == kind for c in blas.lib_controllers) else None


def solvers() -> list[str]:
    """The eigensolvers this process may use: torch's always, numpy's where its BLAS can be
    held to one thread."""
    return ["torch", *(["numpy"] if _blas() is not None else [])]


@contextlib.contextmanager
def forced_solver(name: str):
    """Within the block, `name`'s LAPACK decomposes whatever the probe chose."""
    if name not in solvers():
        raise ValueError(f"eigensolver {name!r} is not available here; available: "
                         f"{', '.join(solvers())}")
    _forced_solver.append(name)
    try:
        yield
    finally:
        _forced_solver.pop()


_holding: list[bool] = []  # while non-empty, numpy's BLAS is on one thread (_held)


@contextlib.contextmanager
def _held(solver: str):
    """numpy's BLAS on one thread for the block (threadpoolctl: one C call each way)."""
    if solver != "numpy":
        yield
        return
    with _blas().limit(limits=1):
        _holding.append(True)
        try:
            yield
        finally:
            _holding.pop()


# ---------------------------------------------------------------- the workers

@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rankzoo-eig")


def _on_one_thread(fn: Callable[[torch.Tensor], torch.Tensor]):
    def task(A: torch.Tensor) -> torch.Tensor:
        # MKL's count is per thread: a new worker starts at all cores whatever the caller
        # set (measured: 2 of 2), so each task sets its own (the caller's is 1 already)
        torch.set_num_threads(1)
        return fn(A)
    return task


def _run(fn: Callable, A: torch.Tensor, workers: int) -> torch.Tensor:
    """fn over A [N, ...] cut into pieces, on `workers` threads (call inside one_thread).
    At most CHUNKS_PER_WORKER pieces per worker, of sizes differing by at most one: 9
    heads on 2 workers go as 2 + 1 x 7, and the slower worker does 5 of them, not 6."""
    if workers == 1 or A.shape[0] < 2:
        return fn(A)
    pieces = A.tensor_split(min(A.shape[0], workers * CHUNKS_PER_WORKER))
    return torch.cat(list(_pool(workers).map(_on_one_thread(fn), pieces)))


def _seconds(G: torch.Tensor, workers: int, solver: str = "torch") -> float:
    best = float("inf")
    with one_thread(), _held(solver):
        _run(SOLVERS[solver], G, workers)  # warm-up: the workers start
        for _ in range(PROBE_REPEATS):  # the minimum: the least disturbed by other load
            start = time.perf_counter()
            _run(SOLVERS[solver], G, workers)
            best = min(best, time.perf_counter() - start)
    return best


def _probe_grams(n: int, side: int) -> torch.Tensor:
    X = torch.randn(n, side, side, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    return X @ X.mT  # [n, side, side]


@functools.cache
def _plan(n_cores: int) -> EigPlan:
    workers, one, spread_s = 1, None, None
    if n_cores > 1:  # the workers, on torch's LAPACK (at every size)
        G = _probe_grams(min(PROBE_PER_CORE * n_cores, PROBE_MOST), PROBE_SIDE)
        one, spread_s = _seconds(G, 1), _seconds(G, n_cores)
        workers = n_cores if spread_s < SPREAD_MAX_SHARE * one else 1
    solver, timed = "torch", ()
    if len(solvers()) > 1:  # then the LAPACK of the large matrices, on those workers
        G = _probe_grams(SOLVER_PROBE_PER_WORKER * workers, SOLVER_PROBE_SIDE)
        timed = tuple((name, _seconds(G, workers, name)) for name in solvers())
        if dict(timed)["numpy"] < SOLVER_MAX_SHARE * dict(timed)["torch"]:
            solver = "numpy"
    return EigPlan(workers, n_cores, one, spread_s, solver, timed)


def eig_plan() -> EigPlan:
    """This machine's EigPlan: timed on the first call (~0.4 s on 2 cores), then kept for
    the process (per core count)."""
    return _plan(cores())


def _solver() -> str:
    return _forced_solver[-1] if _forced_solver else eig_plan().solver


def spread_workers(A: torch.Tensor) -> int:
    """The workers a batch of matrices like A's [..., m, n] is spread over: eig_plan()'s
    (or forced_workers') on a CPU from SPREAD_FROM up, else 1 (and no probe started)."""
    if A.device.type != "cpu" or min(A.shape[-2:]) < SPREAD_FROM:
        return 1
    return _forced[-1] if _forced else eig_plan().workers


def spread(fn: Callable[[torch.Tensor], torch.Tensor], A: torch.Tensor) -> torch.Tensor:
    """fn (a per-matrix batched function: solve, or a whole pipeline that calls it) of A
    [..., m, n], its batch spread over eig_plan()'s workers on a CPU, the chosen LAPACK
    held to one thread; on another device one call. Returns fn's result with A's batch
    dims."""
    if A.device.type != "cpu":
        return fn(A)
    flat = A.reshape(-1, *A.shape[-2:])  # [N, m, n]
    side = min(A.shape[-2:])  # of the Gram matrix, or of A itself when A is one
    workers = spread_workers(A) if flat.shape[0] > 1 else 1
    # small matrices alone never start the probe: their LAPACK is torch's (solve)
    held = _held(_solver()) if side >= SOLVER_FROM else contextlib.nullcontext()
    with one_thread(), held:
        out = _run(fn, flat, workers)
    return out.reshape(*A.shape[:-2], *out.shape[1:])


def solve(G: torch.Tensor) -> torch.Tensor:
    """Eigenvalues [..., n], ascending, of symmetric G [..., n, n] (its lower triangle) by
    the chosen LAPACK, in the calling thread: for functions that spread() runs (there the
    LAPACK is held to one thread). On another device, torch's batched call."""
    if G.device.type != "cpu" or G.shape[-1] < SOLVER_FROM:
        return torch.linalg.eigvalsh(G)
    solver = _solver()
    if solver == "numpy" and not _holding:  # outside spread's hold: never a BLAS team
        solver = "torch"
    return SOLVERS[solver](G)


def eigvalsh(G: torch.Tensor) -> torch.Tensor:
    """Eigenvalues [..., n], ascending, of symmetric G [..., n, n] (its lower triangle),
    the batch spread over the cores."""
    return spread(solve, G)


def eigensolver_text(device) -> str:
    """How the spectra of tensors on `device` are decomposed, for a report's machine line:
    the CPU's EigPlan (timed here if no batch needed it yet), or one batched call."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"one batched call on {device.type}"
    return eig_plan().describe()


def measuring_threads(device) -> int:
    """torch's thread count for a whole measurement on `device` (a report's forward,
    capture and figures, not only its spectra): all cores where the probe found them free
    (EigPlan.workers > 1), one where it found them busy. An OpenMP team on busy cores
    waits at every barrier for a time slice: `report --hf` at 1 x 256 beside two busy
    processes took 41-47 s on 2 threads and 9-10 s on one (quiet: the same on both)."""
    if torch.device(device).type != "cpu" or cores() == 1:
        return cores()
    return cores() if eig_plan().workers > 1 else 1


@contextlib.contextmanager
def measuring(device):
    """Within the block, torch computes on measuring_threads(device) threads; the count
    before comes back after. Yields that count."""
    before, n = torch.get_num_threads(), measuring_threads(device)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
