"""A run's state, recorded in its directory: <run>/status.json.

    {"state": "running", "step": 200, "pid": 4242, "host": "box", "started": ..., ...}

The fit writes it (train/fit.py): `running` when it starts and at each checkpoint (step:
the checkpoint's, the step a resume continues from), then `finished` at its last step,
`diverged` at the step whose loss or update was not finite, or `stopped` at the step an
error or an interrupt ended it (with the reason). Each write goes to a temporary file
that os.replace puts in place, so a reader never sees half a file.

A process killed outright (SIGKILL, power loss) leaves `running` behind; read_status
tells that apart from a live run by the pid and host it records and reports it as
`interrupted`. Nothing here imports Lightning: `rankzoo report` reads it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
STATES = ("running", "finished", "stopped", "diverged")
INTERRUPTED = "interrupted"  # read_status's name for a `running` that no process holds


def write_status(run_dir: Path, state: str, step: int, **extra: Any) -> Path:
    """Record `state` at `step` (and anything in `extra`) atomically; returns the path."""
    if state not in STATES:
        raise ValueError(f"status: state must be one of {list(STATES)}, got {state!r}")
    path = Path(run_dir) / STATUS_FILE
    record = {"state": state, "step": int(step), "pid": os.getpid(),
              "host": socket.gethostname(), "process_start": process_start(os.getpid()),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The recorded status (None when there is none); `running` becomes `interrupted`
    when the process that wrote it is gone. A malformed file is a ValueError naming it."""
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a status file ({e})") from None
    if not (isinstance(record, dict) and record.get("state") in STATES
            and isinstance(record.get("step"), int) and record["step"] >= 0):
        raise ValueError(f"{path}: not a status file (expected an object with a state in "
                         f"{list(STATES)} and a step >= 0)")
    if record["state"] == "running" and not held(record):
        return {**record, "state": INTERRUPTED}
    return record


def held(record: dict[str, Any]) -> bool:
    """Whether the process that wrote a `running` record still runs. On another host it
    cannot be told from here, and counts as running."""
    if record.get("host") != socket.gethostname():
        return True
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = process_start(pid)
    if started is None:
        return pid_alive(pid) and record.get("process_start") is None
    return record.get("process_start") in (None, started)  # else: the pid was reused


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def process_start(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (Linux /proc), to tell a pid
    reused by another process from the one that wrote the status; None where there is no
    /proc, or no such process, or it is a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    if not fields or fields[0] == "Z":
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3


def describe_status(record: dict[str, Any]) -> str:
    """One line for people: `finished at step 600`, `interrupted after the checkpoint
    at step 200 (pid 4242 on box is gone; --resume continues it)`."""
    state, step = record["state"], record["step"]
    where = f"pid {record.get('pid')} on {record.get('host')}"
    if state == INTERRUPTED:
        return (f"interrupted after the checkpoint at step {step} ({where} is gone; "
                "--resume continues it)" if step else
                f"interrupted before its first checkpoint ({where} is gone)")
    if state == "running":
        return f"running ({where}), last checkpoint at step {step}"
    reason = record.get("reason")
    return f"{state} at step {step}" + (f" ({reason})" if reason else "")


def status_notes(run_dirs: list[Path]) -> list[str]:
    """One line for each run whose status is not `finished` (none for a run without a
    status file, written before there were any): what `rankzoo report` notes under it."""
    notes = []
    for run_dir in run_dirs:
        try:
            record = read_status(run_dir)
        except ValueError as e:
            notes.append(str(e))
            continue
        if record is not None and record["state"] != "finished":
            notes.append(f"{Path(run_dir).name}: {describe_status(record)}")
    return notes
