"""Faults at write points, then --resume, against the run never interrupted.

Fast: a full disk while a checkpoint is written (the write primitive made to fail, as a
full filesystem fails it) is one line and exit 2, keeps the last good checkpoint, and a
resume once space is back ends as the uninterrupted run; so does an interrupt while a
report is written. Slow (-m slow): the whole fault table of
benches/train/experiment/bench_faults.py, every kill point under SIGKILL and SIGINT, and
DDP on 2 CPU processes."""

import errno
import json
import os
import signal

import pytest
import torch

import train.rundir.files as files
from benches.train.experiment.bench_faults import (
    POINTS,
    SIGNALS,
    TINY,
    differences,
    documents,
    fault_table,
    table,
)
from train.cli import main
from train.render.table import to_markdown
from train.rundir.status import read_status


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    config = tmp / "faults.yaml"
    config.write_text(json.dumps(TINY))
    assert main(["train", str(config), "--runs-dir", str(tmp / "runs")]) == 0
    return config, documents(tmp / "runs" / TINY["name"])


def failing_commit(monkeypatch, name: str, error: BaseException, nth: int = 1):
    """Make the nth commit of a file called `name` raise `error` (its temporary file is
    whole, the rename not done)."""
    commit, seen = files.commit, []

    def fail(tmp, path):
        if path.name == name:
            seen.append(path)
            if len(seen) == nth:
                raise error
        commit(tmp, path)

    monkeypatch.setattr(files, "commit", fail)


def test_a_full_disk_at_a_checkpoint_is_one_line_and_resume_recovers(
        tmp_path, monkeypatch, capsys, reference):
    config, want = reference
    runs, vdir = tmp_path / "runs", tmp_path / "runs" / TINY["name"] / "mha"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    failing_commit(monkeypatch, "last.ckpt", full, nth=2)  # the final one, at step 6
    assert main(["train", str(config), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == [errors[0]] and "Traceback" not in err
    assert errors[0].startswith(f"rankzoo: error: cannot write {vdir}/checkpoints/last.ckpt: "
                                "No space left on device (ENOSPC); ")
    assert errors[0].endswith("; --resume continues from the last checkpoint")
    kept = torch.load(vdir / "checkpoints" / "last.ckpt", weights_only=False)
    assert kept["global_step"] == 3  # the last good checkpoint, whole
    assert read_status(vdir)["state"] == "stopped"
    assert not list(vdir.rglob(".*.tmp"))

    monkeypatch.undo()  # space is back
    assert main(["train", str(config), "--runs-dir", str(runs), "--resume"]) == 0
    assert differences(documents(runs / TINY["name"]), want) == []


def test_an_interrupt_while_the_report_is_written_resumes_to_the_same_report(
        tmp_path, monkeypatch, reference):
    config, want = reference
    runs = tmp_path / "runs"
    failing_commit(monkeypatch, "report.json", KeyboardInterrupt())
    assert main(["train", str(config), "--runs-dir", str(runs)]) == 130
    vdir = runs / TINY["name"] / "mha"
    assert not (vdir / "report.json").exists() and not list(vdir.rglob(".*.tmp"))
    monkeypatch.undo()
    assert main(["train", str(config), "--runs-dir", str(runs), "--resume"]) == 0
    assert differences(documents(runs / TINY["name"]), want) == []


def test_differences_sees_a_lost_step_and_a_changed_loss(reference):
    _, want = reference
    run = want["runs"]["mha"]
    changed = {**want, "runs": {"mha": {**run, "steps": run["steps"][:-1],
                                        "val/loss": run["val/loss"] + 1e-5}}}
    found = differences(changed, want)
    assert len(found) == 2 and any("/steps" in d for d in found)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_every_kill_point_resumes_to_the_uninterrupted_run(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("the DDP rows need torch.distributed with gloo")
    rows = fault_table(POINTS, SIGNALS, ddp=True, root=tmp_path)
    print(to_markdown(table(rows)))
    assert len(rows) == len(POINTS) * len(SIGNALS) + len(SIGNALS)
    assert [r for r in rows if not r["equal"]] == []
