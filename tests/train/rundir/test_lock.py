"""One writer per run directory (train/rundir/lock.py): a second writer is refused with
one line naming the holder, a lock left by a killed process never blocks, and readers
say that a directory is being written without taking its lock."""

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.train.conftest import tiny_experiment, write_run
from train.cli import main
from train.rundir.lock import (
    RunLocked,
    acquire,
    hold_run_dir,
    in_progress_note,
    lock_path,
    release,
    writer,
)


class Holder:
    """A forked child process that takes a run directory's lock and keeps it."""

    def __init__(self, exp_dir: Path):
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: lock, say so, wait to be killed
            try:
                acquire(exp_dir)
                os.write(write, b"held")
                time.sleep(120)
            finally:
                os._exit(0)
        os.close(write)
        assert os.read(read, 4) == b"held"
        os.close(read)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


@pytest.fixture
def holder():
    """holder(exp_dir): a child process holding exp_dir's lock, killed (SIGKILL) at the
    end of the test or by the test."""
    held = []

    def start(exp_dir: Path) -> Holder:
        held.append(Holder(exp_dir))
        return held[-1]

    yield start
    for h in held:
        h.kill()


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path, holder):
    exp_dir = tmp_path / "runs" / "tiny"
    proc = holder(exp_dir)
    with pytest.raises(RunLocked) as err:
        acquire(exp_dir)
    message = str(err.value)
    assert f"pid {proc.pid} on {socket.gethostname()} since " in message
    assert str(exp_dir) in message and "\n" not in message


def test_a_lock_left_by_sigkill_does_not_block(tmp_path, holder):
    exp_dir = tmp_path / "runs" / "tiny"
    proc = holder(exp_dir)
    assert writer(exp_dir)["pid"] == proc.pid
    proc.kill()
    assert lock_path(exp_dir).is_file()  # stale: the file stays, the flock is gone
    assert writer(exp_dir) is None
    fd, path = acquire(exp_dir)
    try:
        assert writer(exp_dir)["pid"] == os.getpid()
    finally:
        release(fd, path)
    assert not path.exists()


def test_the_lock_is_released_and_taken_again(tmp_path):
    exp_dir = tmp_path / "tiny"
    with hold_run_dir(exp_dir) as path:
        assert path == tmp_path / "tiny.lock" and path.is_file()
    assert not path.exists()
    with hold_run_dir(exp_dir):
        pass


@pytest.mark.parametrize("mode", [[], ["--overwrite"], ["--resume"]])
def test_train_on_a_locked_directory_exits_2_with_one_line(tmp_path, tiny_yaml, holder,
                                                           capsys, mode):
    config, runs = tiny_yaml(), tmp_path / "runs"
    write_run(runs, tiny_experiment())  # an existing run for --overwrite and --resume
    proc = holder(runs / "tiny")
    before = {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", str(config), "--runs-dir", str(runs), *mode]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rankzoo: error: run directory ")
    assert f"pid {proc.pid} on {socket.gethostname()}" in err[0]
    after = {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()}
    assert after == before  # nothing created, deleted or rewritten


def test_report_reads_a_directory_in_progress_and_says_so(tmp_path, holder, capsys):
    runs = tmp_path / "runs"
    write_run(runs, tiny_experiment())
    proc = holder(runs / "tiny")
    for target in (runs / "tiny", runs / "tiny" / "mha"):
        assert main(["report", str(target)]) == 0  # it never waits for, nor takes, the lock
        err = capsys.readouterr().err
        assert f"is being written by pid {proc.pid}" in err and "not final" in err
    assert writer(runs / "tiny")["pid"] == proc.pid


def test_no_note_for_a_directory_nobody_writes(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, tiny_experiment())
    assert in_progress_note(runs / "tiny") is None
