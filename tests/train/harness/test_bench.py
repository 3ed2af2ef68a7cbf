"""Smoke test of `python -m benches.train.harness.bench_monitor monitor` (not a timed test)."""

import re

from benches.train.harness.bench_monitor import main
from tests.train.conftest import MQA, tiny_experiment

RAW = tiny_experiment(  # warmup, checkpoints and histograms left at their defaults
    name="b", data={"train_size": 64, "val_size": 16}, variants={"mqa": MQA},
    train={"max_steps": 4, "warmup_steps": None, "val_every_n_steps": 2,
           "checkpoint_every_n_steps": None},
    monitor={"every_n_steps": 2, "probe_size": 4, "histograms": None})


def test_monitor_bench_prints_the_overhead_and_writes_nothing_here(tmp_path, monkeypatch,
                                                                    capsys, tiny_yaml):
    tiny_yaml(RAW)
    monkeypatch.chdir(tmp_path)
    assert main(["monitor", "--config", "exp.yaml", "--variant", "mqa", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "without monitor" in out and "with monitor" in out
    assert re.search(r"overhead \(fit difference\): [+-]\d+\.\d%", out)
    assert re.search(r"overhead \(time in monitor\): \d+\.\d%", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]  # no runs/


def test_monitor_bench_unknown_variant_is_an_error(capsys, tiny_yaml):
    assert main(["monitor", "--config", str(tiny_yaml(RAW)), "--variant", "gqa"]) == 2
    assert "'gqa' is not in" in capsys.readouterr().err
