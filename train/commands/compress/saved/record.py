"""`rankzoo compress RUN_DIR/<variant> --record`: the compress document kept in the
variant's directory, where `rankzoo report RUN_DIR` finds it.

    check_record(vdir, force)             # before any work: an existing record, a busy run
    path = write_record(vdir, doc, force)  # after measuring: vdir/compress.json

The record is the document `--format json` prints (docs/SCHEMAS.md, rankzoo.compress). It
is written whole or not at all (train/rundir/files.py) while holding the run directory's
lock (train/rundir/lock.py), so it never lands in a directory `rankzoo train` is writing;
an existing record is replaced only when forced. Both are checked before the minutes of
measuring and again under the lock, since another process may have written meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from ....rundir.files import write_json
from ....rundir.layout import EXPERIMENT_FILE
from ....rundir.lock import RunLocked, hold_run_dir, lock_path, read_holder, writer

RECORD_FILE = "compress.json"


def record_path(vdir) -> Path:
    return Path(vdir) / RECORD_FILE


def locked_dir(vdir) -> Path:
    """The directory whose lock guards vdir: its experiment's, as `rankzoo train` takes it,
    or vdir itself when it stands alone."""
    vdir = Path(vdir)
    return vdir.parent if (vdir.parent / EXPERIMENT_FILE).is_file() else vdir


def check_record(vdir, force: bool = False) -> None:
    """Refuse, before any work, a record that would replace one unasked or write into a
    run directory being trained."""
    refuse_existing(record_path(vdir), force)
    holder = writer(locked_dir(vdir))
    if holder is not None:
        raise RunLocked(busy(locked_dir(vdir), holder))


def write_record(vdir, doc: dict, force: bool = False) -> Path:
    """Write `doc` to vdir/compress.json under the run directory's lock; returns the path."""
    path = record_path(vdir)
    try:
        with hold_run_dir(locked_dir(vdir)):
            refuse_existing(path, force)
            return write_json(path, doc)
    except RunLocked:
        raise RunLocked(busy(locked_dir(vdir), read_holder(lock_path(locked_dir(vdir))))) \
            from None


def refuse_existing(path: Path, force: bool) -> None:
    if path.is_dir():
        raise IsADirectoryError(f"--record: {path} is a directory; nothing was written")
    if path.exists() and not force:
        raise FileExistsError(f"--record: {path} exists (a compress document recorded "
                              f"before); pass --force to replace it (nothing was written)")


def busy(exp_dir: Path, holder: dict | None) -> str:
    who = "another process" if holder is None else \
        f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
    return (f"--record: {exp_dir} is being written by {who} (lock {lock_path(exp_dir)}); "
            "record when it ends (nothing was written)")
