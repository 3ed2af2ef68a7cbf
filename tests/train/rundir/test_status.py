"""status.json: each run's state (running, finished, stopped at step k, diverged at step
k), written atomically; a `running` that no process holds reads as interrupted, and
`rankzoo report` says so."""

import json
import os
import socket
import subprocess
import sys

import pytest
from rich.console import Console

import train.harness.module as module_py
import train.rundir.status as status_py
from tests.train.conftest import tiny_markov
from train.cli import main
from train.config import parse_experiment
from train.experiment.stages import train_experiment
from train.harness.module import NonFiniteLoss
from train.rundir.layout import STATUS_FILE
from train.rundir.read import load_run
from train.rundir.status import describe_status, read_status, write_status

TINY = tiny_markov("st", checkpoint_every=2)
QUIET = Console(quiet=True)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_write_replaces_the_file_whole(tmp_path):
    write_status(tmp_path, "running", 0)
    write_status(tmp_path, "running", 200)
    assert [p.name for p in tmp_path.iterdir()] == [STATUS_FILE]  # no temporary left
    record = read_status(tmp_path)
    assert (record["state"], record["step"], record["pid"]) == ("running", 200, os.getpid())
    assert describe_status(record).startswith("running (pid ")


def test_running_without_its_process_is_interrupted(tmp_path):
    write_status(tmp_path, "running", 200)
    record = json.loads((tmp_path / STATUS_FILE).read_text())
    (tmp_path / STATUS_FILE).write_text(json.dumps({**record, "pid": dead_pid()}))
    gone = read_status(tmp_path)
    assert (gone["state"], gone["step"]) == ("interrupted", 200)
    assert describe_status(gone).startswith("interrupted after the checkpoint at step 200 (pid ")


def test_a_reused_pid_is_not_the_run(tmp_path, monkeypatch):
    write_status(tmp_path, "running", 10)
    if read_status(tmp_path)["process_start"] is None:
        pytest.skip("no /proc: process start times are not recorded here")
    monkeypatch.setattr(status_py, "process_start", lambda pid: -1)  # another process now
    assert read_status(tmp_path)["state"] == "interrupted"


def test_another_hosts_run_is_taken_as_running(tmp_path):
    write_status(tmp_path, "running", 10)
    record = json.loads((tmp_path / STATUS_FILE).read_text())
    other = {**record, "host": socket.gethostname() + "-elsewhere", "pid": dead_pid()}
    (tmp_path / STATUS_FILE).write_text(json.dumps(other))
    assert read_status(tmp_path)["state"] == "running"


@pytest.mark.parametrize("text", ["{", '{"state": "done", "step": 1}', '{"state": "running"}',
                                  '{"state": "stopped", "step": -1}', "[]"])
def test_a_malformed_status_is_named(tmp_path, text):
    (tmp_path / STATUS_FILE).write_text(text)
    with pytest.raises(ValueError, match=f"{tmp_path / STATUS_FILE}: not a status file"):
        read_status(tmp_path)


def test_an_unknown_state_is_not_written(tmp_path):
    with pytest.raises(ValueError, match="state must be one of .*, got 'done'"):
        write_status(tmp_path, "done", 1)


def test_a_run_records_running_then_finished(tmp_path, monkeypatch):
    seen = []
    write = status_py.write_status

    def spy(run_dir, state, step, **extra):
        seen.append((state, step))
        return write(run_dir, state, step, **extra)

    monkeypatch.setattr("train.harness.fit.write_status", spy)
    train_experiment(parse_experiment(TINY), tmp_path, console=QUIET)
    assert seen == [("running", 0), ("running", 2), ("running", 4), ("running", 6),
                    ("finished", 6)]
    assert read_status(tmp_path / "st" / "mha")["state"] == "finished"
    notes = []
    load_run(tmp_path / "st", notes=notes)
    assert notes == []  # a finished run needs no note


def test_a_diverged_run_records_its_step(tmp_path, monkeypatch):
    check = module_py.LMModule._check_finite

    def nan_at_3(self, loss):
        if self.global_step == 3:
            raise NonFiniteLoss(f"training loss is nan at step {self.global_step}")
        check(self, loss)

    monkeypatch.setattr(module_py.LMModule, "_check_finite", nan_at_3)
    with pytest.raises(NonFiniteLoss):
        train_experiment(parse_experiment(TINY), tmp_path, console=QUIET)
    record = read_status(tmp_path / "st" / "mha")
    assert (record["state"], record["step"]) == ("diverged", 3)
    assert record["reason"].startswith("NonFiniteLoss: training loss is nan at step 3")


def test_report_notes_a_run_that_did_not_finish(tmp_path):
    train_experiment(parse_experiment(TINY), tmp_path, console=QUIET)
    vdir = tmp_path / "st" / "mha"
    write_status(vdir, "running", 4)
    record = json.loads((vdir / STATUS_FILE).read_text())
    (vdir / STATUS_FILE).write_text(json.dumps({**record, "pid": dead_pid()}))
    for run_dir in (tmp_path / "st", vdir):
        notes = []
        load_run(run_dir, notes=notes)
        assert len(notes) == 1 and notes[0].startswith(
            "mha: interrupted after the checkpoint at step 4 (pid "), notes


def test_a_resume_from_an_unreadable_checkpoint_is_one_error(tmp_path, capsys, tiny_yaml):
    config = tiny_yaml(TINY, file="st.yaml")
    assert main(["train", str(config), "--runs-dir", str(tmp_path)]) == 0
    ckpt = tmp_path / "st" / "mha" / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # what a non-atomic write cut short left
    (tmp_path / "st" / "mha" / "report.json").unlink()
    capsys.readouterr()
    assert main(["train", str(config), "--runs-dir", str(tmp_path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"rankzoo: error: cannot resume from {ckpt}: not a readable checkpoint" in err
    assert "--overwrite redoes the run" in err
