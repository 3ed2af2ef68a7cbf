"""Every file rankzoo reads goes through a schema: a structurally wrong, undecodable or
malformed file is `rankzoo: error: <file>[:line]: <what>` with exit code 2, never a
KeyError from deep inside a renderer. Each crash of the reliability issue is a test here.

The run directories are written directly (a probe of an untrained model in place of a
trained one): what is tested is reading them back, and that takes no training.
"""

import json

import pytest

from budgets.schema import Int, ListOf, Maybe, Number, Record, check, read_json, read_text
from tests.train.conftest import MQA, tiny_experiment
from tests.train.conftest import write_run as write_run_dir
from train.cli import main
from train.config import load_experiment
from train.hf import adapter_dir, model_type_of
from train.rundir.files import read_yaml

TINY = tiny_experiment(
    data={"vocab_size": 16, "seq_len": 8, "batch_size": 4}, model={"n_layers": 2},
    variants={"mqa": MQA}, monitor=None)
TINY["train"] = {"max_steps": 10, "warmup_steps": 2}


def write_run(root, raw=TINY):
    """A finished-looking run (conftest.write_run): ranks.jsonl at steps 5 and 10."""
    return write_run_dir(root, raw, steps=(5, 10))


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "runs")


def error_of(capsys, *argv) -> str:
    """The one stderr line of a command that must fail with exit code 2."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("rankzoo: error: ") == 1 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("rankzoo: error: ")]
    return line.removeprefix("rankzoo: error: ")


# ---------------------------------------------------------------- the crashes

def test_report_json_without_variants(run, capsys):
    path = run / "mha" / "report.json"
    path.write_text(json.dumps({"schema": "rankzoo.report", "version": 1}))
    assert error_of(capsys, "report", run / "mha") == f"{path}: missing key 'variants'"


def test_report_json_with_an_empty_variant(run, capsys):
    path = run / "mqa" / "report.json"
    path.write_text(json.dumps({"schema": "rankzoo.report", "version": 1, "variants": [{}]}))
    assert error_of(capsys, "report", run) == f"{path}: variants[0]: missing key 'variant'"


def test_report_json_deep_field_is_named(run, capsys):
    path = run / "mha" / "report.json"
    doc = json.loads(path.read_text())
    doc["variants"][0]["layers"][1]["axes"][0]["declared"] = "eight"
    path.write_text(json.dumps(doc))
    assert error_of(capsys, "report", run) == (
        f"{path}: variants[0].layers[1].axes[0].declared: expected an int, got 'eight'")


def test_ranks_line_with_layers_not_a_list(run, capsys):
    (run / "mha" / "report.json").unlink()  # the report is rebuilt from ranks.jsonl
    ranks = run / "mha" / "ranks.jsonl"
    ranks.write_text('{"step": 5, "layers": "oops"}\n')
    assert error_of(capsys, "report", run / "mha") == (
        f"{ranks}:1: corrupt rank record (missing key 'seq_len')")
    ranks.write_text('{"step": 5, "seq_len": 8, "eps": 0.1, "layers": "oops"}\n')
    assert error_of(capsys, "report", run / "mha") == (
        f"{ranks}:1: corrupt rank record (layers: expected a list, got 'oops')")


def test_ranks_record_infinite_rank_is_named(run, capsys):
    (run / "mha" / "report.json").unlink()
    ranks = run / "mha" / "ranks.jsonl"
    lines = ranks.read_text().splitlines()
    record = json.loads(lines[1])
    record["layers"][0]["quantities"]["past_future"]["rank_eps"][0] = float("inf")
    ranks.write_text(lines[0] + "\n" + json.dumps(record) + "\n")
    assert error_of(capsys, "report", run / "mha") == (
        f"{ranks}:2: corrupt rank record (layers[0].quantities.past_future.rank_eps[0]: "
        "expected a finite number, got inf)")


@pytest.mark.parametrize("name", ["report.json", "ranks.jsonl", "config.yaml"])
def test_binary_run_files_are_named(run, capsys, name):
    path = run / "mha" / name
    path.write_bytes(b"{\n\xf3\x00\x01binary")
    if name != "report.json":  # ranks.jsonl and config.yaml are read without a report.json
        (run / "mha" / "report.json").unlink()
    assert error_of(capsys, "report", run / "mha") == (
        f"{path}:2: not UTF-8 text (byte 0xf3; a binary or corrupt file?)")


def test_binary_experiment_config_is_named(tmp_path, capsys):
    path = tmp_path / "base.yaml"
    path.write_bytes(b"name: x\n\xf3\xff")
    assert error_of(capsys, "train", path, "--dry-run") == (
        f"{path}:2: not UTF-8 text (byte 0xf3; a binary or corrupt file?)")


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "base.yaml"
    path.write_text("name: tiny\n  seed: 1\n")
    err = error_of(capsys, "train", path, "--dry-run")
    assert err.startswith(f"{path}:2: not valid YAML (mapping values are not allowed here")
    assert "<unicode string>" not in err


def test_override_errors_name_the_override(capsys, tiny_yaml):
    path = tiny_yaml(TINY, file="base.yaml")
    err = error_of(capsys, "train", path, "train.max_steps=abc", "--dry-run")
    assert err == (f"override 'train.max_steps=abc' (applied to {path}): train.max_steps "
                   "must be int, got 'abc'")
    # the second override is the culprit, not the first nor the file
    err = error_of(capsys, "train", path, "train.lr=0.01", "model.d_model=-2", "--dry-run")
    assert err.startswith("override 'model.d_model=-2' (applied to")
    err = error_of(capsys, "train", path, "train.lr=[1", "--dry-run")
    assert err.startswith("bad override 'train.lr=[1': value is not valid YAML")
    assert "<unicode string>" not in err


def test_the_file_is_blamed_for_its_own_error(tiny_yaml):
    path = tiny_yaml(TINY, file="base.yaml", seed=-1)
    with pytest.raises(ValueError) as err:
        load_experiment(path, ["train.max_steps=5"])
    assert str(err.value).startswith(f"{path}: seed must be a non-negative int")


def test_an_override_that_fixes_the_file_is_not_blamed(tiny_yaml):
    path = tiny_yaml(TINY, file="base.yaml", seed=-1)
    assert load_experiment(path, ["seed=3"]).seed == 3


def test_experiment_yaml_of_the_wrong_shape(run, capsys):
    path = run / "experiment.yaml"
    path.write_text("variants: [mha, mqa]\n")
    assert error_of(capsys, "report", run) == (
        f"{path}: variants: expected an object, got ['mha', 'mqa']")
    path.write_text("- a list\n")
    assert error_of(capsys, "report", run) == f"{path}: expected an object, got ['a list']"


def test_config_yaml_of_the_wrong_shape(run, capsys):
    (run / "mha" / "report.json").unlink()
    path = run / "mha" / "config.yaml"
    path.write_text("variant: [1]\n")
    assert error_of(capsys, "report", run / "mha") == (
        f"{path}: variant: expected a string, got [1]")


def test_a_file_that_cannot_be_read(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path}: cannot be read"):
        read_text(tmp_path)  # a directory


def test_corrupt_run_is_left_as_it_was(run, capsys):
    (run / "mha" / "report.json").write_text("{")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert error_of(capsys, "report", run).startswith(f"{run / 'mha' / 'report.json'}:1: "
                                                      "not a JSON document")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------- Hugging Face configs

def test_hf_config_json_is_checked(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama",
                                                      "num_attention_heads": 0}))
    with pytest.raises(ValueError, match=r"config\.json: num_attention_heads: expected an "
                                         r"int >= 1, got 0"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": 7}))
    with pytest.raises(ValueError, match="model_type: expected a string, got 7"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ValueError, match=r"config\.json:1: not a JSON document"):
        model_type_of(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 2}))
    assert model_type_of(tmp_path) == "gpt2"


def test_adapter_config_json_is_checked(tmp_path):
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({"peft_type": "LORA", "r": 0}))
    with pytest.raises(ValueError, match=rf"adapter={tmp_path}: the adapter does not load "
                                         rf"\({path}: r: expected an int >= 1, got 0\)"):
        adapter_dir(tmp_path)
    path.write_bytes(b"\x89PNG")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        adapter_dir(tmp_path)
    path.write_text(json.dumps({"peft_type": "LORA", "r": 4, "rank_pattern": {"q": 2}}))
    assert adapter_dir(tmp_path) == tmp_path


# ---------------------------------------------------------------- the schema itself

def test_schema_paths_and_messages():
    spec = Record({"a": ListOf(Record({"b": Int(0)}), min_len=1)}, {"c": Maybe(Number())})
    assert check({"a": [{"b": 1}], "c": None, "extra": "kept"}, spec) == {
        "a": [{"b": 1}], "c": None, "extra": "kept"}
    cases = [({}, "missing key 'a'"), ({"a": []}, "a: expected at least 1 entries, got 0"),
             ({"a": [{"b": True}]}, "a[0].b: expected an int, got True"),
             ({"a": [{"b": 1.0}]}, "a[0].b: expected an int, got 1.0"),
             ({"a": [{"b": -1}]}, "a[0].b: expected an int >= 0, got -1"),
             ({"a": [{"b": 1}], "c": float("nan")}, "c: expected a finite number, got nan"),
             ({"a": [{"b": 1}], "c": "1"}, "c: expected a number, got '1'"),
             ([], "expected an object, got []")]
    for doc, message in cases:
        with pytest.raises(ValueError) as err:
            check(doc, spec, "f.json")
        assert str(err.value) == f"f.json: {message}"
    closed = Record({"x": int}, closed=True)
    with pytest.raises(ValueError, match="unknown key 'y'; known: \\['x'\\]"):
        check({"x": 1, "y": 2}, closed)


def test_read_text_and_json_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json: file not found"):
        read_text(tmp_path / "nope.json")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(ValueError, match=r"deep\.json(:1)?: not a JSON document"):
        read_json(deep)
    lines = tmp_path / "lines.json"
    lines.write_text('{\n  "a": 1,\n  "b": \n}')
    with pytest.raises(ValueError, match=r"lines\.json:4: not a JSON document"):
        read_json(lines)


def test_read_yaml_keeps_its_contract(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("")
    assert read_yaml(path) is None
    path.write_text("a: 1\n")
    assert read_yaml(path) == {"a": 1}
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"x\.yaml: expected an object, got \[1, 2\]"):
        read_yaml(path)


def test_an_undecided_erank_is_read_and_drawn(run, tmp_path, capsys):
    """The matrix-free probe leaves an erank null where it could not decide it: the
    schema lets it through, and the figures skip it."""
    ranks = run / "mha" / "ranks.jsonl"
    records = [json.loads(line) for line in ranks.read_text().splitlines()]
    for record in records:
        record["layers"][0]["quantities"]["mixing_centered"]["erank"][0] = None
    ranks.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(run), "--plot", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "rank_over_training.png").is_file()
