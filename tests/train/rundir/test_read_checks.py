"""What `report` refuses on read, in one line naming the file: rank records whose steps
go backwards or repeat, per-head lists of different lengths; and what it takes: a
report.json whose variants list no layers."""

import json

import pytest

from tests.train.cli.test_fuzz import run_cli
from tests.train.conftest import tiny_experiment, write_run


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "runs", tiny_experiment(), steps=(3, 6))


@pytest.mark.parametrize("order", [[1, 0], [0, 0]])
def test_rank_records_must_go_forward(run, tmp_path, order):
    ranks = run / "mha" / "ranks.jsonl"
    lines = ranks.read_text().splitlines()
    ranks.write_text("".join(lines[i] + "\n" for i in order))
    (run / "mha" / "report.json").unlink()  # the report is rebuilt from ranks.jsonl
    code, _, err = run_cli(["report", run], tmp_path)
    assert code == 2 and "Traceback" not in err
    assert f"{ranks}:2: step {json.loads(lines[order[1]])['step']} after step" in err


@pytest.mark.parametrize("key", ["first_token_mass", "diagonal_mass", "centered_erank",
                                 "class"])
def test_a_short_per_head_list_is_named(run, tmp_path, key):
    path = run / "mha" / "report.json"
    doc = json.loads(path.read_text())
    heads = doc["variants"][0]["layers"][0]["heads"]
    heads[key] = heads[key][:1]
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(["report", run], tmp_path)
    assert code == 2 and "zip()" not in err and "Traceback" not in err
    assert f"{path}: variants[0].layers[0].heads: per-head lists of different lengths " \
           f"({key} has 1" in err


@pytest.mark.parametrize("fmt", ["table", "md", "json"])
def test_a_report_without_layers_is_shown(run, tmp_path, fmt):
    path = run / "mha" / "report.json"
    doc = json.loads(path.read_text())
    doc["variants"][0]["layers"] = []
    doc["variants"][0]["metrics"]["val/accuracy/kv2"] = 0.5  # the recall view reads it
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(["report", run, "--format", fmt], tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert "mha" in out
