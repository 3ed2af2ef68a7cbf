"""Stopping a run on the signals schedulers send, the way ^C stops it.

    with stopping_on_signals():          # rankzoo train: SIGTERM and SIGHUP raise Terminated
        train_experiment(exp)            # each run under way records itself as interrupted
    # the CLI exits 128 + the signal's number: 143 for SIGTERM, 129 for SIGHUP

SIGTERM is what `kill`, `timeout`, `docker stop`, systemd and SLURM's `scancel` send;
SIGHUP what a closed terminal or SSH session sends. Left to their default action they end
the process at once: a run's status stays `running`, and worker processes training
variants side by side (train/experiment/parallel.py) would train on as orphans. Raised as
an exception in the main thread instead, they unwind as ^C's KeyboardInterrupt does
(train/harness/fit.py records the run as stopped, "interrupted (SIGTERM)"), and the
pool tells its workers to stop too. Nothing here imports Lightning.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# the signals a scheduler, a terminal or an operator sends to stop a command
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class Terminated(BaseException):
    """A stop a signal asked for. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` on the way up takes it for a run's failure. `why` says more where
    the signal is not the whole story (a worker whose parent process is gone)."""

    def __init__(self, signum: int, why: str | None = None):
        super().__init__(signum, why)  # args as given: it pickles back from a worker
        self.signum, self.why = int(signum), why

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's code for a command a signal ended: 128 + its number."""
        return 128 + self.signum

    def __str__(self) -> str:
        return self.signal_name + (f": {self.why}" if self.why else "")


def raise_once(stopping: list[int]):
    """A signal handler raising Terminated on the first signal it sees and ignoring the
    rest: a second SIGTERM while the first unwinds must not cut the status write short.
    `stopping` records the signals taken (shared with whoever else stops the process)."""
    def handler(signum: int, frame) -> None:
        if stopping:
            return
        stopping.append(signum)
        raise Terminated(signum)
    return handler


@contextlib.contextmanager
def stopping_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[list[int]]:
    """Inside, the first of `signals` raises Terminated in the main thread; yields the
    list of signals taken. The handlers before are restored on the way out. Off the main
    thread (where no handler can be set) nothing changes."""
    stopping: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return
    before = {s: signal.signal(s, raise_once(stopping)) for s in signals}
    try:
        yield stopping
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
