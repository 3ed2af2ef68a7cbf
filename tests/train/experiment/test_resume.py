"""--resume continues the same experiment: finished variants are kept as they are, more
steps or new variants are welcome, and any other change of config is refused before the
run directory is touched."""

import copy

import pytest
from rich.console import Console

from tests.train.conftest import tiny_experiment
from train.config import parse_experiment
from train.experiment.stages import train_experiment

QUIET = Console(quiet=True)
RAW = tiny_experiment(
    name="rs", data={"vocab_size": 16, "train_size": 64, "val_size": 16, "batch_size": 16},
    train={"max_steps": 4, "warmup_steps": 0, "val_every_n_steps": 4,
           "checkpoint_every_n_steps": 4, "log_every_n_steps": None},
    monitor={"every_n_steps": 4})


def experiment(**changes):
    raw = copy.deepcopy(RAW)
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = raw
        for p in parents:
            node = node[p]
        node[key] = value
    return parse_experiment(raw)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    train_experiment(experiment(), runs, console=QUIET)
    return runs


def snapshot(exp_dir):
    return {p: p.read_bytes() for p in exp_dir.rglob("*") if p.is_file()}


def test_resuming_a_finished_run_keeps_it_as_it_is(run_dir):
    before = snapshot(run_dir / "rs")
    report = train_experiment(experiment(), run_dir, resume=True, console=QUIET)
    assert report["variants"][0]["step"] == 4
    assert "train/loss" in report["variants"][0]["metrics"]
    after = {p: b for p, b in snapshot(run_dir / "rs").items() if p.name != "report.md"}
    assert after == {p: b for p, b in before.items() if p.name != "report.md"}


@pytest.mark.parametrize("changes, named", [
    ({"train__lr": 0.5}, "train.lr: 0.003 -> 0.5"),
    ({"data__num_kv_pairs": 3}, "data.num_kv_pairs: 2 -> 3"),
    ({"model__d_model": 32}, "model.d_model: 16 -> 32"),
    ({"variants": {"mha": {"block": "softmax", "n_kv_heads": 1}}}, "variants.mha.n_kv_heads"),
], ids=["lr", "task", "width", "variant-changed"])
def test_a_changed_config_is_refused_before_anything_is_written(run_dir, changes, named):
    before = snapshot(run_dir / "rs")
    with pytest.raises(ValueError, match="trained under another config") as e:
        train_experiment(experiment(**changes), run_dir, resume=True, console=QUIET)
    assert named in str(e.value)
    assert snapshot(run_dir / "rs") == before


def test_more_steps_and_new_variants_resume(tmp_path):
    train_experiment(experiment(), tmp_path, console=QUIET)
    more = experiment(train__max_steps=8,
                      variants={"mha": {"block": "softmax"}, "ssm": {"block": "ssm"}})
    report = train_experiment(more, tmp_path, resume=True, console=QUIET)
    assert {v["variant"]: v["step"] for v in report["variants"]} == {"mha": 8, "ssm": 8}
