"""Run files are written whole or not at all (train/rundir/files.py): a write that fails
with a full disk, no permission or a read-only filesystem is one line naming the file
and the reason, and leaves what the file held before. The failures are simulated by
making the write primitives raise, as the filesystem would."""

import errno
import json
import os

import pytest

import train.rundir.files as files
from train.rundir.files import (
    WriteFailed,
    append_line,
    atomic_path,
    remove_temporaries,
    write_json,
    write_text,
)

FAULTS = [(errno.ENOSPC, "No space left on device (ENOSPC)"),
          (errno.EACCES, "Permission denied (EACCES)"),
          (errno.EROFS, "Read-only file system (EROFS)")]


def failing(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code, reason", FAULTS)
def test_a_failed_replace_keeps_the_old_file_and_names_it(tmp_path, monkeypatch, code, reason):
    path = tmp_path / "report.json"
    write_json(path, {"old": 1})
    monkeypatch.setattr(files.os, "fsync", failing(code))
    with pytest.raises(WriteFailed) as err:
        write_json(path, {"new": 2})
    message = str(err.value)
    assert message.startswith(f"cannot write {path}: {reason}") and "\n" not in message
    assert err.value.errno == code
    assert json.loads(path.read_text()) == {"old": 1}
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_a_full_disk_says_how_much_is_free(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "replace", failing(errno.ENOSPC))
    with pytest.raises(WriteFailed, match=r"bytes free there; free some space and run it "
                                          r"again$"):
        write_text(tmp_path / "notes.txt", "x")


def test_a_writer_cut_short_leaves_the_old_file(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"old checkpoint")
    with pytest.raises(KeyboardInterrupt), atomic_path(path) as tmp:
        tmp.write_bytes(b"half a new")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old checkpoint" and list(tmp_path.iterdir()) == [path]


def test_append_cut_short_by_a_full_disk_is_rolled_back(tmp_path, monkeypatch):
    path = tmp_path / "ranks.jsonl"
    append_line(path, json.dumps({"step": 3}))
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills up mid-line
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "write", half_then_full)
    with pytest.raises(WriteFailed, match="ranks.jsonl: No space left on device"):
        append_line(path, json.dumps({"step": 6, "layers": [1, 2, 3]}))
    monkeypatch.undo()
    assert path.read_text() == '{"step": 3}\n'
    append_line(path, json.dumps({"step": 6}))
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [3, 6]


def test_temporaries_left_by_a_kill_are_removed(tmp_path):
    (tmp_path / "mha" / "checkpoints").mkdir(parents=True)
    stale = tmp_path / "mha" / "checkpoints" / ".last.ckpt.4242.tmp"
    stale.write_bytes(b"half")
    kept = tmp_path / "mha" / "report.json"
    kept.write_text("{}")
    assert remove_temporaries(tmp_path) == [stale]
    assert not stale.exists() and kept.exists()
