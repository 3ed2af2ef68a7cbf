"""Train an experiment's runs (its variants, or its sweep's grid points) on worker processes
of the CPU, side by side: `rankzoo train --jobs N|auto`.

    jobs = choose_jobs(exp, "auto")     # Jobs(processes, threads, asked), notes
    entries = train_parallel(exp, exp_dir, resume, console, jobs, train_variant)

A training step of the zoo's small models gains little from a second thread (1 vs 2
threads on 2 cores: mha 15.7 vs 12.0 ms, gdn 32.5 vs 23.1), so runs on processes of one
thread each beat one process on all of them: the main job's twelve variants about 1.5x on
2 cores, more on a box of many. Every run trains through the same function as in turn
(train/experiment/stages.py train_variant or train_sweep_run, then train/harness/fit.py
fit_run), from its own seed, so its report is the one a sequential run at the same thread
count writes; only its seconds and tokens/s differ, measured in its worker on its threads
beside the others. The fine-tune stage stays in turn, after all of them (it loads them).

Workers are spawned, never forked: a fork of a process whose torch already started OpenMP
threads can hang in them. They print to stderr, never to a terminal (no live progress
bar: one line per validation, naming the run). Distributed runs and accelerators train in
turn (one process drives the devices).

Stopping: ^C reaches every worker from the terminal (one process group). SIGTERM and
SIGHUP reach the parent alone when a scheduler or `kill` sends them: the parent's
Terminated (train/harness/stop.py) sets an event each worker watches, and the worker stops
its run as ^C would (the run records itself as interrupted); sent to a worker directly,
they stop its run the same way. A worker whose parent is gone (killed with SIGKILL, which
nothing can catch) sees it within WATCH_SECONDS, stops its run and exits: none trains on
as an orphan.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from ..config import Experiment
from ..harness.devices import accelerator_kind
from ..harness.fit import is_global_zero, quiet_lightning
from ..harness.stop import STOP_SIGNALS, Terminated
from .preflight import available_memory, memory_estimates, processes

__all__ = ["Jobs", "auto_jobs", "check_jobs", "choose_jobs", "train_parallel"]

# --jobs auto trains side by side only runs of at least this many steps: a worker's start
# (spawn, then importing torch and Lightning) takes 2.3-4.3 s measured on 2 cores, about
# what 200 steps of the quickest variant of configs/quick.yaml take (mha: 15.7 ms a step).
MIN_STEPS = 200
# A worker's own memory beside its run's estimate: the interpreter, torch and Lightning,
# 456-474 MB of resident memory measured after a run of configs/quick.yaml (torch 2.13 CPU).
WORKER_BYTES = 500 * 2**20
# How often a worker looks at its parent and at the stop event: an orphan stops its run
# within this, a few seconds at most with the run's own unwinding (a checkpoint being
# written finishes first).
WATCH_SECONDS = 0.5

# A run's task in a worker: (experiment, run name, run directory's parent, resume, console,
# labelled) -> its report entry, None for a sweep's diverged grid point.
TrainOne = Callable[..., dict | None]


@dataclass(frozen=True)
class Jobs:
    """How an experiment's runs train: on `processes` workers of `threads` threads each
    (1 process: in turn, in this one), as `--jobs asked` resolved; `notes` say why an
    explicit count was not followed."""

    processes: int
    threads: int
    asked: int | str
    notes: tuple[str, ...] = ()

    def header(self, exp: Experiment) -> str:
        runs = f"{len(exp.variants)} {'sweep runs' if exp.sweep else 'variants'}"
        return (f"training {runs} on {self.processes} processes x {self.threads} "
                f"thread{'s' * (self.threads != 1)} (--jobs {self.asked})")


# ---------------------------------------------------------------- how many

def check_jobs(jobs: object) -> int | str:
    """`jobs` as given when it is a positive int or "auto"; else a ValueError naming it."""
    if jobs == "auto" or (isinstance(jobs, int) and not isinstance(jobs, bool) and jobs >= 1):
        return jobs
    raise ValueError(f"jobs must be a positive int or 'auto', got {jobs!r}")


def auto_jobs(runs: int, steps: int, kind: str, cores: int, available: int | None,
              per_worker: int) -> int:
    """--jobs auto: how many workers, from the number of runs, the steps each takes, the
    accelerator kind, the cores (torch's threads) and the memory `available` (None:
    unknown) against what one worker needs (`per_worker` bytes). One, in turn, unless on
    the CPU with two runs or more, each long enough to pay for a worker's start
    (MIN_STEPS); then one per core, never more than the runs nor than fit side by side."""
    if kind != "cpu" or runs < 2 or steps < MIN_STEPS:
        return 1
    fit = runs if available is None else available // max(1, per_worker)
    return max(1, min(runs, cores, fit))


def in_turn_reason(exp: Experiment) -> str | None:
    """Why `exp`'s runs must train one at a time whatever --jobs says (None: they need
    not): one process drives an accelerator, or a distributed run's ranks."""
    t = exp.train
    kind = accelerator_kind(t.accelerator)
    if kind != "cpu":
        return f"train.accelerator={t.accelerator!r} runs on {kind}"
    if not is_global_zero() or processes(exp) > 1 or t.num_nodes > 1 or t.strategy != "auto":
        return (f"a distributed run (train.devices={t.devices!r}, train.num_nodes="
                f"{t.num_nodes}, train.strategy={t.strategy!r})")
    return None


def worker_bytes(exp: Experiment) -> int:
    """The memory one worker needs: the largest run's estimate (its activations measured,
    train/experiment/preflight.py) and the worker's own (WORKER_BYTES)."""
    return WORKER_BYTES + max(estimate.on_device("cpu") for estimate in memory_estimates(exp)
                              if not estimate.stage)  # the fine-tune stage trains in turn


def choose_jobs(exp: Experiment, jobs: int | str, cores: int | None = None) -> Jobs:
    """--jobs resolved for `exp` on this machine: an explicit count is followed (up to
    the number of runs) unless the runs must train in turn (in_turn_reason); "auto" by
    auto_jobs. `cores`: torch's threads here (which honor OMP_NUM_THREADS) when None."""
    asked = check_jobs(jobs)
    cores = cores or torch.get_num_threads()
    runs, why = len(exp.variants), in_turn_reason(exp)
    if why is not None:
        notes = (f"--jobs {asked}: {why}; its runs train one at a time",) \
            if asked != "auto" and asked > 1 else ()
        return Jobs(1, cores, asked, notes)
    if asked == "auto":
        steps = exp.train.max_steps  # every run's: a variant may not change it
        count = auto_jobs(runs, steps, "cpu", cores, None, 0)
        if count > 1:  # the memory is measured only where it can lower the count
            count = auto_jobs(runs, steps, "cpu", cores, available_memory("cpu"),
                              worker_bytes(exp))
    else:
        count = min(asked, runs)
    return Jobs(count, max(1, cores // count), asked)


# ---------------------------------------------------------------- the pool

def train_parallel(exp: Experiment, exp_dir: Path, resume: bool, console: Console,
                   jobs: Jobs, train_one: TrainOne) -> dict[str, dict]:
    """Train every run of `exp` with `train_one` on jobs.processes workers; their report
    entries by name, in the experiment's order (a sweep's diverged grid points left out).
    The first run that fails stops the start of the rest; the runs under way finish (their
    directories stay valid for --resume) and then its error is raised here. ^C reaches
    the workers too (one process group): each run records itself as interrupted, and the
    KeyboardInterrupt is raised here once every worker has exited. SIGTERM and SIGHUP
    (Terminated) stop the workers' runs in the same way, through the stop event."""
    console.print(jobs.header(exp))
    context = multiprocessing.get_context("spawn")
    stop = context.Event()  # set: every worker stops its run as ^C would
    pool = ProcessPoolExecutor(max_workers=jobs.processes, mp_context=context,
                               initializer=start_worker,
                               initargs=(jobs.threads, os.getpid(), stop))
    try:
        results = run_all(
            lambda run: pool.submit(work, train_one, exp, run, exp_dir, resume),
            jobs.processes, list(exp.variants), console)
    except BaseException:  # SIGTERM or SIGHUP here (or ^C sent to this process alone)
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the runs under way record and end
    return {run: results[run] for run in exp.variants if results.get(run) is not None}


def run_all(submit: Callable[[str], Future], width: int, runs: list[str],
            console: Console) -> dict[str, dict | None]:
    """Each run's result by name, `submit`ted in order, at most `width` at a time: a run
    is submitted only when a worker is free for it, since the pool marks whatever waits
    in its queue as running, and a running future cannot be cancelled. After a failure
    nothing more is submitted; the first failure is raised once the rest are done."""
    results: dict[str, dict | None] = {}
    running: dict[Future, str] = {}
    waiting = iter(runs)
    started, failed = 0, None
    while True:
        while failed is None and len(running) < width and (run := next(waiting, None)):
            running[submit(run)] = run
            started += 1
        if not running:
            break
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=lambda f: runs.index(running[f])):
            run = running.pop(future)
            try:
                results[run] = future.result()  # a KeyboardInterrupt goes up as it is
            except Exception as e:
                console.print(failure_line(run, e, len(runs) - started, len(running)))
                failed = failed or e
    if failed is not None:
        raise failed
    return results


def failure_line(run: str, error: Exception, left: int, running: int) -> str:
    """What the parent says when a run failed: its error comes last, raised."""
    why = type(error).__name__
    if isinstance(error, BrokenProcessPool):
        why += ": a worker process ended abruptly (killed, or out of memory)"
    return (f"[red]{run}: failed[/] ({why})"
            + (f"; not starting the {left} run{'s' * (left != 1)} left" if left else "")
            + (f"; waiting for the {running} under way" if running else ""))


# ---------------------------------------------------------------- in a worker

class Worker:
    """A worker process's own state: its parent, the run under way (None while idle), and
    whether a stop was taken (one per run: a second signal must not cut its status write
    short)."""

    parent: int = 0
    run: str | None = None
    stopping: bool = False
    why: str | None = None  # set before the worker signals itself: what asked it to stop

    @classmethod
    def orphaned(cls) -> bool:
        """Reparented: the parent is gone (never in a process start_worker did not set up,
        where work() runs in the caller's own process)."""
        return cls.parent != 0 and os.getppid() != cls.parent


def start_worker(threads: int, parent: int, stop) -> None:
    """A worker's setup: its share of the cores, Lightning quiet, ^C ignored while idle
    (one arriving between runs would kill it, and the pool with the others), SIGTERM and
    SIGHUP taken as stops (on_stop_signal), and a thread watching the parent and the
    stop event."""
    torch.set_num_threads(threads)
    quiet_lightning()
    Worker.parent = parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in STOP_SIGNALS:
        signal.signal(s, on_stop_signal)
    threading.Thread(target=watch, args=(stop,), name="rankzoo-watch", daemon=True).start()


def on_stop_signal(signum: int, frame) -> None:
    """SIGTERM or SIGHUP in a worker: the run under way stops as ^C stops it (Terminated,
    raised once); idle, an orphan exits, and a worker whose parent lives waits for the
    pool to end it (exiting now would break the pool, which then kills the other workers
    wherever their runs are)."""
    if Worker.run is None:
        if Worker.orphaned():
            os._exit(128 + signum)
        return
    if Worker.stopping:
        return
    Worker.stopping = True
    raise Terminated(signum, Worker.why)


def watch(stop) -> None:
    """A worker's watch, every WATCH_SECONDS: when the parent asks (the stop event) or is
    gone, the worker signals itself, once, so its main thread stops the run where it is
    (a thread cannot raise in another; a signal handler runs in the main thread)."""
    signalled = False
    while True:
        asked = stop.wait(WATCH_SECONDS)
        orphan = Worker.orphaned()
        if orphan and Worker.run is None:
            os._exit(128 + signal.SIGTERM)
        if (asked or orphan) and not signalled and Worker.run is not None:
            Worker.why = (f"its parent process {Worker.parent} is gone" if orphan
                          else "the parent process was stopped")
            signalled = True
            os.kill(os.getpid(), signal.SIGTERM)


def on_interrupt(signum: int, frame) -> None:
    """^C in a worker's run: KeyboardInterrupt, once (a stop signal after it is ignored)."""
    if not Worker.stopping:
        Worker.stopping = True
        raise KeyboardInterrupt


def work(train_one: TrainOne, exp: Experiment, run: str, exp_dir: Path,
         resume: bool) -> dict | None:
    """One run in a worker: its report entry. ^C, SIGTERM and SIGHUP interrupt it as ^C
    would in turn (the fit records the run as interrupted); an error that would not
    pickle back to the parent goes as a RuntimeError naming it. An orphan exits once its
    run has recorded how it ended: there is no one to answer."""
    # never a terminal: no live bar, one line per validation; lines unwrapped, since
    # the run's name makes them longer and a wrapped tail would land among other runs'
    console = Console(stderr=True, force_terminal=False, soft_wrap=True)
    Worker.run, Worker.stopping, Worker.why = run, False, None
    signal.signal(signal.SIGINT, on_interrupt)
    try:
        return train_one(exp, run, exp_dir, resume, console, labelled=True)
    except BaseException as e:
        if not picklable(e):
            raise RuntimeError(f"{run}: {type(e).__name__}: {e}") from e
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        Worker.run = None
        if Worker.orphaned():
            os._exit(128 + signal.SIGTERM)


def picklable(e: BaseException) -> bool:
    """Whether `e` makes it back to the parent: the pool breaks (and terminates every
    worker) on a result it cannot unpickle."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        return False
    return True
