"""A hybrid variant end to end: trained beside a uniform one, its layers reported per kind,
TensorBoard's tags naming each layer's kind, the uniform variant's files as before."""

import json

import pytest
import yaml

from tests.train.conftest import tiny_experiment
from train.cli import main

HYBRID = {"pattern": ["local", "global"],
          "blocks": {"local": {"block": "sliding_window", "window": 4},
                     "global": {"block": "softmax"}}}
TINY = tiny_experiment(
    data={"train_size": 64, "val_size": 16}, model={"n_layers": 2},
    variants={"mha": {"block": "softmax"}, "lg": HYBRID},
    train={"max_steps": 6, "warmup_steps": 1, "val_every_n_steps": 3,
           "checkpoint_every_n_steps": 3},
    monitor={"every_n_steps": 3, "probe_size": 4})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["train", str(config), "--runs-dir", str(tmp / "runs")]) == 0
    return tmp / "runs" / "tiny"


def test_the_hybrid_run_records_its_pattern_and_kinds(trained):
    config = yaml.safe_load((trained / "lg" / "config.yaml").read_text())
    assert config["pattern"] == ["local", "global"] and "block" not in config
    assert [s["name"] for s in config["layers"]] == ["sliding_window", "softmax"]
    variant = json.loads((trained / "lg" / "report.json").read_text())["variants"][0]
    assert [ly["block"] for ly in variant["layers"]] == ["sliding_window", "softmax"]
    kinds = {k["kind"]: k for k in variant["kinds"]}
    assert set(kinds) == {"local", "global"}
    assert kinds["local"]["rows"]["past_future"]["declared"] == 3  # W - 1
    assert kinds["global"]["rows"]["past_future"]["declared"] == 8  # T / 2
    assert kinds["local"]["zoo_block"] == "sliding_window"


def test_a_uniform_variant_has_no_pattern_or_kinds(trained):
    config = yaml.safe_load((trained / "mha" / "config.yaml").read_text())
    assert "pattern" not in config and config["block"]["name"] == "softmax"
    variant = json.loads((trained / "mha" / "report.json").read_text())["variants"][0]
    assert "kinds" not in variant and "pattern" not in variant


def test_the_report_shows_the_hybrid_per_kind(trained, capsys):
    assert main(["report", str(trained)]) == 0
    out = capsys.readouterr().out
    assert "lg: per kind of layer" in out and "mha: per kind" not in out
    assert main(["report", str(trained), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    lg = next(v for v in doc["variants"] if v["variant"] == "lg")
    assert [k["kind"] for k in lg["kinds"]] == ["local", "global"]


def test_tensorboard_tags_name_each_layers_kind(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(trained / "lg")).Reload().Tags()["scalars"]
    assert any(t.startswith("rank/L0.local/") for t in tags)
    assert any(t.startswith("rank/L1.global/") for t in tags)
    uniform = EventAccumulator(str(trained / "mha")).Reload().Tags()["scalars"]
    assert any(t.startswith("rank/L0/") for t in uniform)


def test_compress_refuses_a_hybrid_in_one_line(trained, capsys):
    assert main(["compress", str(trained / "lg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rankzoo: error: ") and "a layer pattern (local, global)" in err[-1]
