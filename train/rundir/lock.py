"""One writer per run directory: an OS lock held for a whole `rankzoo train`.

    with hold_run_dir(exp_dir):        # RunLocked (one line naming the holder) if taken
        ...                            # create, overwrite, resume, train, report

The lock is the file beside the directory, runs/<experiment>.lock (beside it, not in it:
--overwrite deletes the directory, and a lock inside would go with it), locked with
flock. The kernel releases a flock when its process ends, however it ends, so a run
killed with SIGKILL leaves at most a stale file that the next run simply locks again;
nothing has to tell a stale lock from a live one. The file says who holds it (pid, host,
process start, since when): the message a second writer gets, and what `rankzoo report`,
`pick --runs` and `compress` read to say that a directory is being written. Readers never
take the lock: they only read the file and check that the process it names still runs
(train/rundir/status.py held).

Only global rank zero takes it: the other ranks of a distributed run write nothing.
flock is local to a host; on a network filesystem two hosts may not see each other's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .status import held, process_start

LOCK_SUFFIX = ".lock"


class RunLocked(RuntimeError):
    """The run directory is held by another live process."""


def lock_path(exp_dir: Path) -> Path:
    """runs/<experiment>.lock for runs/<experiment>."""
    exp_dir = Path(exp_dir)
    return exp_dir.with_name(exp_dir.name + LOCK_SUFFIX)


@contextlib.contextmanager
def hold_run_dir(exp_dir: Path) -> Iterator[Path]:
    """Hold the run directory's lock for the block; yields the lock file's path. A
    --runs-dir made only to hold the lock is removed again if nothing was put in it."""
    parent = Path(exp_dir).parent
    made = not parent.exists()
    fd, path = acquire(Path(exp_dir))
    try:
        yield path
    finally:
        release(fd, path)
        if made:
            with contextlib.suppress(OSError):  # not empty: the run wrote into it
                parent.rmdir()


def acquire(exp_dir: Path) -> tuple[int, Path]:
    """Lock exp_dir for this process: (the lock file's descriptor, its path), or
    RunLocked naming the holder."""
    path = lock_path(exp_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(locked_message(exp_dir, read_holder(path))) from None
        # a holder that ended between our open and our flock removed the file: ours is
        # then a lock on a name no one else can see, so lock the current file instead
        if same_file(fd, path):
            write_holder(fd)
            return fd, path
        os.close(fd)
    raise RunLocked(f"run directory {exp_dir}: its lock file {path} keeps being replaced; "
                    "another process is starting and ending runs on it")


def release(fd: int, path: Path) -> None:
    """Remove the lock file (while still holding it, so no one locks a removed file),
    then let go."""
    try:
        if same_file(fd, path):
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def write_holder(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "process_start": process_start(os.getpid()),
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)


def read_holder(path: Path) -> dict[str, Any] | None:
    """What the lock file says of its holder; None when it is absent, empty or being
    written."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def locked_message(exp_dir: Path, holder: dict[str, Any] | None) -> str:
    who = ("another process (it has not yet said which)" if holder is None else
           f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}")
    return (f"run directory {exp_dir} is being written by {who} (lock {lock_path(exp_dir)}); "
            "one run at a time: wait for it to end or stop it, then --resume")


def writer(exp_dir: Path) -> dict[str, Any] | None:
    """The live process writing exp_dir (its lock file's record), or None when no run
    holds it: no lock file, or one left by a process that is gone. Takes no lock."""
    holder = read_holder(lock_path(exp_dir))
    if holder is None or not held(holder):
        return None
    return holder


def in_progress_note(run_dir: Path) -> str | None:
    """The line a reader adds for a run directory (or a variant of one) still being
    written: its figures are those on disk at this moment."""
    run_dir = Path(run_dir)
    for exp_dir in (run_dir, run_dir.parent):
        holder = writer(exp_dir)
        if holder is not None:
            return (f"{exp_dir} is being written by pid {holder.get('pid')} on "
                    f"{holder.get('host')} (since {holder.get('since')}): what is shown is "
                    "what it held on disk when read, not final")
    return None
