"""Smoke test of `python -m train.harness.bench_monitor monitor` (not a timed test)."""

import re

import yaml

from train.harness.bench_monitor import main

RAW = {
    "name": "b", "seed": 0,
    "data": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "train_size": 64,
             "val_size": 16, "batch_size": 8},
    "model": {"d_model": 16, "n_layers": 1},
    "block_defaults": {"n_heads": 2},
    "variants": {"mha": {"block": "softmax"}, "mqa": {"block": "softmax", "n_kv_heads": 1}},
    "train": {"max_steps": 4, "val_every_n_steps": 2, "log_every_n_steps": 1},
    "monitor": {"every_n_steps": 2, "probe_size": 4},
}


def test_monitor_bench_prints_the_overhead_and_writes_nothing_here(tmp_path, monkeypatch,
                                                                    capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(RAW))
    monkeypatch.chdir(tmp_path)
    assert main(["monitor", "--config", "exp.yaml", "--variant", "mqa", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "without monitor" in out and "with monitor" in out
    assert re.search(r"overhead \(fit difference\): [+-]\d+\.\d%", out)
    assert re.search(r"overhead \(time in monitor\): \d+\.\d%", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]  # no runs/


def test_monitor_bench_unknown_variant_is_an_error(tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(RAW))
    assert main(["monitor", "--config", str(tmp_path / "exp.yaml"), "--variant", "gqa"]) == 2
    assert "'gqa' is not in" in capsys.readouterr().err
