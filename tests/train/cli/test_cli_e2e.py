"""End to end through the CLI, in-process: train a tiny experiment, report on it, resume it."""

import json

import pytest
import yaml

from tests.train.conftest import MQA, tiny_experiment
from train.cli import main

TINY = tiny_experiment(
    data={"train_size": 64, "val_size": 16}, model={"n_layers": 2}, variants={"mqa": MQA},
    train={"max_steps": 10, "warmup_steps": 2, "val_every_n_steps": 5,
           "checkpoint_every_n_steps": 5},
    monitor={"every_n_steps": 5, "probe_size": 4, "histograms": None})


def steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    runs = tmp / "runs"
    rc = main(["train", str(config), "--runs-dir", str(runs)])
    assert rc == 0
    return config, runs, runs / "tiny"


def test_run_directory_layout(trained):
    _, _, exp = trained
    assert (exp / "report.md").is_file() and (exp / "experiment.yaml").is_file()
    assert "mha" in (exp / "report.md").read_text()
    for variant in ("mha", "mqa"):
        v = exp / variant
        assert list(v.glob("events.out.tfevents.*")), "TensorBoard event files"
        assert (v / "checkpoints" / "last.ckpt").is_file()
        assert steps(v / "ranks.jsonl") == [5, 10]
        first, record = map(json.loads, (v / "ranks.jsonl").read_text().splitlines())
        assert record["seq_len"] == 16 and len(record["layers"]) == 2
        # the final measurement keeps its spectra, for the report's plots; only that one
        assert "spectra" not in first["layers"][0] and record["layers"][0]["spectra"]
        report = json.loads((v / "report.json").read_text())
        assert [s["variant"] for s in report["variants"]] == [variant]
        assert "val/accuracy" in report["variants"][0]["metrics"]
        config = yaml.safe_load((v / "config.yaml").read_text())
        assert config["variant"] == variant and config["backend_used"] == ["sdpa"]
        assert config["params"] > 0


def test_tensorboard_has_rank_scalars_and_histograms(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trained[2] / "mqa"), size_guidance={"histograms": 0}).Reload()
    tags = acc.Tags()
    tag = "rank/L0/mixing_centered/erank/h0"
    assert tag in tags["scalars"] and "val/accuracy" in tags["scalars"]
    assert [e.step for e in acc.Scalars(tag)] == [5, 10]  # logged once per measurement
    assert "spectrum/L1/qk" in tags["histograms"]


def test_report_table_json_md(trained, capsys):
    _, _, exp = trained
    before = sorted(p.name for p in exp.rglob("*"))
    assert main(["report", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "mha" in out and "mqa" in out and "inference" in out
    assert main(["report", str(exp), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # one JSON document, nothing else
    assert doc["schema"] == "rankzoo.report" and doc["experiment"] == "tiny"
    assert [v["variant"] for v in doc["variants"]] == ["mha", "mqa"]
    assert main(["report", str(exp / "mqa"), "--format", "json"]) == 0
    assert [v["variant"] for v in json.loads(capsys.readouterr().out)["variants"]] == ["mqa"]
    assert main(["report", str(exp), "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("# Rank-budget report: tiny")
    assert sorted(p.name for p in exp.rglob("*")) == before  # report never writes


def test_report_rebuilds_from_ranks(trained, tmp_path, capsys):
    import shutil

    v = tmp_path / "mha"
    shutil.copytree(trained[2] / "mha", v)
    (v / "report.json").unlink()
    assert main(["report", str(v), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["variants"][0]["step"] == 10


def test_existing_run_dir_is_refused(trained, capsys):
    config, runs, exp = trained
    mtime = (exp / "report.md").stat().st_mtime
    assert main(["train", str(config), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: run directory") and str(exp) in err
    assert "--overwrite" in err and "Traceback" not in err
    assert (exp / "report.md").stat().st_mtime == mtime


def test_resume_continues_without_duplicate_steps(trained, capsys):
    import torch

    config, runs, exp = trained
    rc = main(["train", str(config), "train.max_steps=12", "--runs-dir", str(runs), "--resume",
               "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)  # progress and notes went to stderr
    assert [v["step"] for v in doc["variants"]] == [12, 12]
    for variant in ("mha", "mqa"):
        assert steps(exp / variant / "ranks.jsonl") == [5, 10, 12]  # the end is measured too
        ckpt = torch.load(exp / variant / "checkpoints" / "last.ckpt", weights_only=False)
        assert ckpt["global_step"] == 12  # last.ckpt holds the final weights
    # resuming a finished run changes nothing
    assert main(["train", str(config), "train.max_steps=12", "--runs-dir", str(runs),
                 "--resume"]) == 0
    assert steps(exp / "mqa" / "ranks.jsonl") == [5, 10, 12]


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == f"rankzoo: error: experiment config not found: {tmp_path / 'missing.yaml'}\n"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["train", str(config), "model.d_modle=8"]) == 2
    assert "did you mean 'model.d_model'" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert f"no results in {tmp_path}" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_unservable_backend_fails_before_the_run_dir(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(TINY))
    rc = main(["train", str(config), "variants.mqa.backend=flash_attn",
               "--runs-dir", str(tmp_path / "runs")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: variants.mqa: ") and "flash_attn" in err
    assert not (tmp_path / "runs").exists()
