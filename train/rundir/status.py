"""A run's state, recorded in its directory: <run>/status.json.

    {"state": "running", "step": 200, "pid": 4242, "host": "box", "started": ..., ...}

The fit writes it (train/harness/fit.py): `running` when it starts and at each checkpoint (step:
the checkpoint's, the step a resume continues from), then `finished` at its last step,
`diverged` at the step whose loss or update was not finite, or `stopped` at the step an
error or an interrupt ended it (with the reason). Each write goes to a temporary file
that is flushed and renamed in place (train/rundir/files.py), so a reader never sees half
a file.

A process killed outright (SIGKILL, power loss) leaves `running` behind; read_status
tells that apart from a live run by the pid and host it records and reports it as
`interrupted`. Nothing here imports Lightning: `rankzoo report` reads it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import write_text
from .layout import VariantFiles

STATES = ("running", "finished", "stopped", "diverged")
INTERRUPTED = "interrupted"  # read_status's name for a `running` that no process holds


def write_status(run_dir: Path, state: str, step: int, **extra: Any) -> Path:
    """Record `state` at `step` (and anything in `extra`) atomically; returns the path."""
    if state not in STATES:
        raise ValueError(f"status: state must be one of {list(STATES)}, got {state!r}")
    path = VariantFiles(run_dir).status
    record = {"state": state, "step": int(step), "pid": os.getpid(),
              "host": socket.gethostname(), "process_start": process_start(os.getpid()),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    return write_text(path, json.dumps(record, indent=2) + "\n")


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The recorded status (None when there is none); `running` becomes `interrupted`
    when the process that wrote it is gone. A malformed file is a ValueError naming it."""
    path = VariantFiles(run_dir).status
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


# ---------------------------------------------------------------- the report's run status

REPORT_STATES = ("finished", "stopped", "diverged")  # a report entry's status["state"]


@dataclass(frozen=True)
class LearnedMargins:
    """When a run counts as having learned something: its validation figure must beat the
    task's baseline (the data specs' `baseline`, train/data/mqar.py and train/data/markov.py)
    by a fraction of the distance from that baseline to a perfect model, so the margin
    scales with the task.

    MQAR: val/accuracy > plateau + mqar_fraction x (1 - plateau). The plateau, 1/n, is a
    value copied from the context without its key; a model that guesses the i-th query's
    value as the i-th pair's (the power-law gaps keep keys roughly in order) reaches 0.16
    at n = 8 (plateau 0.125) and 0.29 at n = 4 (0.25) at vocab 128, length 64 (measured on
    2000 examples): a partial trick, not recall, which 0.1 of the distance (0.2125 at
    n = 8, 0.325 at n = 4) stays above.
    Markov: val/loss < unigram - markov_fraction x (unigram - floor): the model must close
    a tenth of the gap between ignoring the context and the true chain (about 0.04 nats
    at vocab 64, rank 8), several times the validation loss's sampling noise (~0.006 nats
    over 512 x 64 tokens)."""

    mqar_fraction: float = 0.1
    markov_fraction: float = 0.1

    def __post_init__(self):
        for name in ("mqar_fraction", "markov_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"LearnedMargins.{name} must be in [0, 1), got {value!r}")


LEARNED_MARGINS = LearnedMargins()


def learned_threshold(baseline: dict | None,
                      margins: LearnedMargins = LEARNED_MARGINS) -> tuple[str, str, float] | None:
    """(metric, "above" | "below", value) a run must pass to count as having learned, or
    None when its task has no baseline."""
    if not baseline:
        return None
    chance, unigram, floor = (baseline.get(k) for k in ("chance_accuracy", "unigram_loss",
                                                        "entropy_floor"))
    if baseline.get("task") == "mqar" and chance is not None:
        return "val/accuracy", "above", chance + margins.mqar_fraction * (1.0 - chance)
    if baseline.get("task") == "markov" and unigram is not None and floor is not None:
        return "val/loss", "below", unigram - margins.markov_fraction * (unigram - floor)
    return None


def judge_learned(metrics: dict[str, float], baseline: dict | None,
                  margins: LearnedMargins = LEARNED_MARGINS) -> tuple[bool | None, str]:
    """(learned, why): False when the validation figure does not beat the task's baseline
    by the margin (LearnedMargins), None when there is no baseline or no figure."""
    rule = learned_threshold(baseline, margins)
    if rule is None:
        task = (baseline or {}).get("task", "unknown")
        return None, f"no baseline for the {task} task: whether it learned is not judged"
    metric, side, threshold = rule
    value = metrics.get(metric)
    if value is None or not math.isfinite(value):
        return None, f"no finite {metric} recorded: whether it learned is not judged"
    if side == "above":
        chance = baseline["chance_accuracy"]
        if value > threshold:
            return True, (f"{metric} {value:.4g} is above the guessing plateau {chance:.4g} "
                          f"by more than the margin (> {threshold:.4g})")
        return False, (f"{metric} {value:.4g} is not above the guessing plateau "
                       f"{chance:.4g} by the margin (the plateau: a value of the context "
                       f"guessed without its key; learning needs > {threshold:.4g})")
    unigram, floor = baseline["unigram_loss"], baseline["entropy_floor"]
    if value < threshold:
        return True, (f"{metric} {value:.4g} is below the unigram loss {unigram:.4g} by more "
                      f"than the margin (< {threshold:.4g}; entropy floor {floor:.4g})")
    return False, (f"{metric} {value:.4g} is not below the unigram loss "
                   f"{unigram:.4g} by the margin (learning needs < {threshold:.4g}; the "
                   f"entropy floor is {floor:.4g})")


def run_status(state: str, step: int, max_steps: int | None, metrics: dict[str, float],
               baseline: dict | None, reason: str | None = None,
               margins: LearnedMargins = LEARNED_MARGINS) -> dict[str, Any]:
    """The status a report entry carries (docs/SCHEMAS.md): {"state",
    "step", "max_steps", "learned", "reason", "baseline"}, and "learned_reason" (the
    judgment's sentence, whatever the state) and "rule" (the threshold, stated). "reason"
    says where it stopped and why (`reason`, status.json's) for a run that did not
    finish, else why it did or did not learn."""
    if state not in REPORT_STATES:
        raise ValueError(f"run status: state must be one of {list(REPORT_STATES)}, "
                         f"got {state!r}")
    learned, why = judge_learned(metrics, baseline, margins)
    if state == "finished":
        said = why
    else:
        said = reason or ("its loss or an update went non-finite" if state == "diverged"
                          else "it ended before max_steps")
    rule = learned_threshold(baseline, margins)
    return {"state": state, "step": int(step), "max_steps": max_steps, "learned": learned,
            "reason": said, "learned_reason": why, "baseline": baseline,
            "rule": None if rule is None else f"learned: {rule[0]} {rule[1]} {rule[2]:.4g}"}


def status_line(status: dict[str, Any]) -> str:
    """A report status for people: `finished at step 600 of 600; did not learn: ...`."""
    of = "" if status.get("max_steps") is None else f" of {status['max_steps']}"
    head = f"{status['state']} at step {status['step']}{of}"
    if status["state"] != "finished":
        return f"{head} ({status['reason']})" if status.get("reason") else head
    judged = status.get("learned_reason") or status.get("reason")
    if not judged:
        return head
    return f"{head}; " + ("did not learn: " if status.get("learned") is False else "") + judged
