"""The exact eigensolvers on the machine's cores: a batch spread over worker threads, each
LAPACK call on one thread.

    lam = eigvalsh(G)      # G [..., n, n] symmetric -> [..., n] ascending (torch.linalg.eigvalsh)
    s = spread(torch.linalg.svdvals, A)   # any per-matrix function over A [..., m, n]
    plan = eig_plan()      # EigPlan(workers, cores, one_s, spread_s), timed once per process
    with one_thread(): ...

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

The worker count is chosen as Muon chooses its Newton-Schulz dtype (train/harness/muon.py):
a short timed probe, once per process, of one worker against all cores; all only where
they take under SPREAD_MAX_SHARE of one worker's time, so that load noise does not flip
the choice from one process to the next.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

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

    def describe(self) -> str:
        """'2 workers x 1 thread (timed: 1 worker 0.041 s, 2 workers 0.022 s)'."""
        name = f"{self.workers} worker{'s' if self.workers > 1 else ''} x 1 thread"
        if self.one_s is None:
            return f"{name} ({self.cores} core)"
        return (f"{name} (timed: 1 worker {self.one_s:.3f} s, {self.cores} workers "
                f"{self.spread_s:.3f} s)")

    def to_dict(self) -> dict:
        return {"workers": self.workers, "cores": self.cores, "one_s": self.one_s,
                "spread_s": self.spread_s, "text": self.describe()}


_forced: list[int] = []  # set by forced_workers, for benchmarks and tests


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
    """fn over A [N, ...] cut into pieces, on `workers` threads (call inside one_thread)."""
    if workers == 1 or A.shape[0] < 2:
        return fn(A)
    pieces = A.split(math.ceil(A.shape[0] / (workers * CHUNKS_PER_WORKER)))
    return torch.cat(list(_pool(workers).map(_on_one_thread(fn), pieces)))


def _seconds(G: torch.Tensor, workers: int) -> float:
    best = float("inf")
    with one_thread():
        _run(torch.linalg.eigvalsh, G, workers)  # warm-up: the workers start
        for _ in range(PROBE_REPEATS):  # the minimum: the least disturbed by other load
            start = time.perf_counter()
            _run(torch.linalg.eigvalsh, G, workers)
            best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def _plan(n_cores: int) -> EigPlan:
    if n_cores == 1:
        return EigPlan(1, 1, None, None)
    n = min(PROBE_PER_CORE * n_cores, PROBE_MOST)
    X = torch.randn(n, PROBE_SIDE, PROBE_SIDE, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    G = X @ X.mT  # [n, side, side]
    one, spread_s = _seconds(G, 1), _seconds(G, n_cores)
    return EigPlan(n_cores if spread_s < SPREAD_MAX_SHARE * one else 1, n_cores, one, spread_s)


def eig_plan() -> EigPlan:
    """This machine's EigPlan: timed on the first call (~0.2 s on 2 cores), then kept for
    the process (per core count)."""
    return _plan(cores())


def spread(fn: Callable[[torch.Tensor], torch.Tensor], A: torch.Tensor) -> torch.Tensor:
    """fn (a per-matrix batched function, e.g. torch.linalg.eigvalsh) of A [..., m, n], its
    batch spread over eig_plan()'s workers on a CPU; on another device one call. Returns
    fn's result with A's batch dims."""
    if A.device.type != "cpu":
        return fn(A)
    flat = A.reshape(-1, *A.shape[-2:])  # [N, m, n]
    big = flat.shape[0] > 1 and min(A.shape[-2:]) >= SPREAD_FROM
    workers = (_forced[-1] if _forced else eig_plan().workers) if big else 1
    with one_thread():
        out = _run(fn, flat, workers)
    return out.reshape(*A.shape[:-2], *out.shape[1:])


def eigvalsh(G: torch.Tensor) -> torch.Tensor:
    """Eigenvalues [..., n], ascending, of symmetric G [..., n, n] (its lower triangle),
    as torch.linalg.eigvalsh gives them, the batch spread over the cores."""
    return spread(torch.linalg.eigvalsh, G)


def eigensolver_text(device) -> str:
    """How the spectra of tensors on `device` are decomposed, for a report's machine line:
    the CPU's EigPlan (timed here if no batch needed it yet), or one batched call."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"one batched call on {device.type}"
    return eig_plan().describe()
