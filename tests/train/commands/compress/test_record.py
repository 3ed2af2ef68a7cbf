"""`rankzoo compress RUN_DIR/<variant> --record`: the document kept in the variant's
directory, and `rankzoo report` showing it beside the KV advice.

The run is written by hand (tests/train/conftest.py write_run, plus a checkpoint): nothing
is trained.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import budgets
from tests.train.conftest import tiny_experiment, write_run
from train.cli import main
from train.lm.decoder import build_model
from train.rundir.lock import hold_run_dir
from train.rundir.read import run_config

FAST = ("--ratios", "2", "--alloc", "uniform", "--calib-size", "4")


@pytest.fixture
def run(tmp_path):
    """runs/tiny/mha/ as training leaves it: a checkpoint to compress, and a report.json
    probed from those weights, of a run that learned its task (so it gets KV advice)."""
    exp_dir = write_run(tmp_path, tiny_experiment())
    vdir = exp_dir / "mha"
    torch.manual_seed(0)
    model = build_model(run_config(vdir))
    (vdir / "checkpoints").mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "global_step": 10}, vdir / "checkpoints" / "last.ckpt")
    probe = budgets.probe_model(model, torch.randint(0, 32, (2, 16)), eps=0.1)
    entry = {"probe": probe, "step": 10, "params": model.param_count(),
             "metrics": {"val/accuracy": 0.9, "val/loss": 1.0}}
    report = budgets.build_report({"mha": entry}, experiment="tiny")
    (vdir / "report.json").write_text(budgets.to_json(report) + "\n")
    return exp_dir


def compress(capsys, *args):
    code = main(["compress", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_record_writes_once_and_force_replaces(run, capsys):
    record = run / "mha" / "compress.json"
    code, out, err = compress(capsys, run / "mha", *FAST, "--record", "--format", "json")
    assert code == 0, err
    assert json.loads(record.read_text()) == json.loads(out)  # the document printed
    assert f"wrote {record}" in err
    before = (record.read_bytes(), record.stat().st_ino)
    code, out, err = compress(capsys, run / "mha", *FAST, "--record")
    assert code == 2 and out == "" and err.count("\n") == 1  # refused before measuring
    assert str(record) in err and "--force" in err
    assert (record.read_bytes(), record.stat().st_ino) == before
    code, out, err = compress(capsys, run / "mha", *FAST, "--record", "--force",
                              "--format", "json")
    assert code == 0, err
    assert record.stat().st_ino != before[1]  # replaced whole (a rename), not edited
    assert json.loads(record.read_text()) == json.loads(out)
    assert not [p for p in (run / "mha").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args, message", [
    (("--hf", "model", "--text", "a.txt", "--eval-text", "b.txt", "--record"),
     "--record writes into a run's variant directory; --hf model has none"),
    (("RUN/mha", "--force"), "--force only applies with --record"),
])
def test_record_flags_refuse_bad_combinations(run, capsys, args, message):
    args = [str(run / "mha") if a == "RUN/mha" else a for a in args]
    code, out, err = compress(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
    assert not (run / "mha" / "compress.json").exists()


def test_record_refuses_a_run_being_trained(run, capsys):
    with hold_run_dir(run):  # as `rankzoo train` holds it
        code, out, err = compress(capsys, run / "mha", *FAST, "--record")
    assert code == 2 and out == "" and "is being written by pid" in err
    assert not (run / "mha" / "compress.json").exists()


def kv_measured(report: dict, variant: str = "mha") -> list[dict]:
    items = [*report["advice"], *report.get("findings", [])]
    return [a["measured"] for a in items if a.get("variant") == variant and "measured" in a]


def test_report_attaches_the_record_and_a_given_file_wins(run, capsys, tmp_path):
    code, out, err = compress(capsys, run / "mha", *FAST, "--record", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert main(["report", str(run), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    measured = kv_measured(json.loads(out))
    assert measured, "the KV advice of mha carries the recorded measurement"
    record = str(run / "mha" / "compress.json")
    for m in measured:
        assert m["source"] == record and m["verdict"] == doc["verdict"]["verdict"]
        assert m["delta_loss"] == doc["verdict"]["advised_delta_loss"]
    assert "rankzoo compress --record" in err and record in err
    # --compressed FILE for the same variant takes precedence over the record
    given = tmp_path / "given.json"
    doc["verdict"]["advised_delta_loss"] = 9.0
    given.write_text(json.dumps(doc))
    assert main(["report", str(run), "--format", "json", "--compressed", str(given)]) == 0
    out, err = capsys.readouterr()
    assert {(m["source"], m["delta_loss"]) for m in kv_measured(json.loads(out))} == {
        (str(given), 9.0)}
    assert "--record" not in err


def test_report_says_when_the_record_is_older_than_the_weights(run, capsys):
    assert compress(capsys, run / "mha", *FAST, "--record")[0] == 0
    record, ckpt = run / "mha" / "compress.json", run / "mha" / "checkpoints" / "last.ckpt"
    later = record.stat().st_mtime + 60
    os.utime(ckpt, (later, later))  # a resumed run wrote new weights since
    assert main(["report", str(run), "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert f"{record} measured the weights before {ckpt}" in err and "--force" in err


def test_report_notes_a_record_that_does_not_read(run, capsys):
    (run / "mha" / "compress.json").write_text("{cut")
    assert main(["report", str(run), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "compress.json: not JSON" in err and "left out" in err
    assert not kv_measured(json.loads(out))
