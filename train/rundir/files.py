"""The run directory's small files: YAML configs and JSON summaries, read and written.

One place for their format (YAML keys in the order written, JSON indented, a trailing
newline), so every stage writes them alike; and for their shape on read: each file the
harness reads back goes through a schema (budgets/schema.py), so a truncated, binary or
hand-edited file is an error naming the file, the line where known, and the field.

Every file of a run is written whole or not at all (`atomic_path`): into a temporary file
beside it, flushed to disk (fsync), then renamed over the old one, so a kill or a full
disk mid-write leaves the previous version, never half a file. A write that fails (no
space, no permission, a read-only filesystem) is a `WriteFailed`: one line naming the
file and the reason. ranks.jsonl grows a line at a time (`append_line`): rewriting the
whole file per record would cost its size at every measurement, so a line is appended,
flushed, and on a failure cut off again, leaving the file as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from budgets.schema import ANY, Int, MapOf, Maybe, Number, Record, check, read_text

from ..config.yaml_parse import parse_yaml
from .layout import CONFIG_FILE, EXPERIMENT_FILE

# What the readers of a run directory take from its YAML files (train/rundir/read.py,
# train/experiment/stages.py, train/experiment/finetune.py, train/experiment/sweep.py);
# everything else is compared or parsed by the experiment parser, which names its own errors.
SECTION = Maybe(dict)
EXPERIMENT_YAML = Record({}, {"variants": Maybe(MapOf(ANY)),
                              **dict.fromkeys(("data", "model", "train", "monitor", "match",
                                               "sweep", "finetune"), SECTION)})
FINETUNE_RECORD = Record({"r": Int(1), "alpha": Number()},
                         {"trainable_params": Maybe(Int(0)), "zero_shot": MapOf(Number(
                             finite=False))})
VARIANT_YAML = Record({}, {"experiment": str, "variant": str, "params": Int(0),
                           "finetune": FINETUNE_RECORD,
                           **dict.fromkeys(("data", "model", "block", "train", "monitor",
                                            "match"), SECTION)})
# by file name: the run directory's files have fixed names (train/rundir/layout.py)
RUN_YAML = {EXPERIMENT_FILE: EXPERIMENT_YAML, CONFIG_FILE: VARIANT_YAML}
MAPPING = Maybe(dict)


def read_yaml(path: Path, spec: Any = None) -> Any:
    """A YAML file written by write_yaml (or by hand); None when it is empty. Checked
    against `spec`, by default the schema of its run-directory name (experiment.yaml,
    config.yaml), else: a mapping."""
    path = Path(path)
    data = parse_yaml(read_text(path), str(path))
    spec = spec if spec is not None else RUN_YAML.get(path.name, MAPPING)
    return None if data is None else check(data, spec, str(path))


def write_yaml(path: Path, data: dict) -> None:
    write_text(path, yaml.safe_dump(data, sort_keys=False))


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------- writing whole or not at all

# what only a write meets: a full disk, a quota, a read-only filesystem
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
TMP_PREFIX, TMP_SUFFIX = ".", ".tmp"  # .<name>.<pid>.tmp: a temporary file beside its target


class WriteFailed(OSError):
    """A run file that could not be written; its message names the file and the reason,
    and the file keeps what it held before."""

    def __init__(self, line: str, code: int | None = None, filename: str | None = None):
        super().__init__(line)
        self.line, self.errno, self.filename = line, code, filename

    def __str__(self) -> str:  # the line itself, not OSError's "[Errno n] ..."
        return self.line

    def __reduce__(self):  # whole across processes (--jobs): OSError's own drops errno
        return type(self), (self.line, self.errno, self.filename)


def write_failed(path: Path, error: OSError) -> WriteFailed:
    """The one-line error for `error` raised while writing `path`; on a full disk it says
    how much space is left."""
    if isinstance(error, WriteFailed):
        return error
    code = errno.errorcode.get(error.errno or 0)
    reason = error.strerror or str(error) or type(error).__name__
    line = f"cannot write {path}: {reason}" + (f" ({code})" if code else "")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):  # how much is left, to judge by
        free = free_bytes(path)
        line += "" if free is None else f"; {free:,} bytes free there"
        line += "; free some space and run it again"
    return WriteFailed(line, error.errno, str(path))


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def temporary(path: Path) -> Path:
    """The temporary file a write of `path` goes through: hidden, beside it, per process."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}{TMP_SUFFIX}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write `path`'s new contents to (by any writer: torch.save,
    savefig); on leaving the block it is flushed to disk and renamed over `path`. On any
    error it is removed and `path` is left as it was; an OSError becomes a WriteFailed."""
    path = Path(path)
    tmp = temporary(path)
    try:
        yield tmp
        commit(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def commit(tmp: Path, path: Path) -> None:
    """Flush `tmp` to disk and rename it over `path`, then flush the directory entry."""
    fsync(tmp)
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # not every filesystem opens directories
        fsync(path.parent)


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all; returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp, tmp.open("w") as f:
        f.write(text)
    return path


def append_line(path: Path, line: str) -> None:
    """Append one line (a trailing newline added) in a single write, flushed to disk; a
    failed write is cut off again, so the file holds whole lines only."""
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        raise write_failed(path, e) from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: the disk filled up mid-line
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise write_failed(path, e) from None
    finally:
        os.close(fd)


def remove_temporaries(root: Path) -> list[Path]:
    """Delete the temporary files that writes killed mid-way left under `root`; only the
    holder of the run directory's lock may call it (train/rundir/lock.py)."""
    found = [p for p in Path(root).rglob(f"{TMP_PREFIX}*{TMP_SUFFIX}") if p.is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return found
