"""Sweeps: the grid expands into runs, the best lr is chosen on validation over seeds, a
diverging lr is recorded rather than ending the sweep."""

import json

import pytest

from tests.train.conftest import tiny_experiment
from train.cli import main
from train.config import parse_experiment
from train.experiment.sweep import best_runs, summarize
from train.render.sweep import sweep_markdown, sweep_table


def raw_experiment(**sweep):
    return tiny_experiment(
        name="sw", seed=3,
        data={"task": "mqar", "vocab_size": 16, "train_size": 64, "val_size": 16,
              "batch_size": 16},
        variants={"ssm": {"block": "ssm", "d_state": 4}},
        train={"max_steps": 8, "val_every_n_steps": 4, "checkpoint_every_n_steps": 4,
               "warmup_steps": 0, "lr": 0.002, "log_every_n_steps": None},
        monitor={"every_n_steps": 4, "histograms": None}, sweep=sweep)


def test_grid_expands_every_variant_by_every_point():
    exp = parse_experiment(raw_experiment(optimizer=["adamw", "muon"], lr=[1e-3, 3e-3],
                                          seed=[0, 1]))
    assert len(exp.variants) == 2 * 2 * 2 * 2
    config = exp.variant_config("ssm_muon_lr0.003_s1")
    assert (config["train"]["optimizer"], config["train"]["lr"], config["seed"]) == ("muon",
                                                                                   3e-3, 1)
    assert config["sweep"] == {"variant": "ssm", "optimizer": "muon", "lr": 3e-3, "seed": 1}
    assert config["block"] == {"name": "ssm", "n_heads": 2, "d_state": 4}


def test_unswept_axes_keep_the_train_section_and_the_seed():
    exp = parse_experiment(raw_experiment(lr=[1e-3, 1e-2]))
    assert list(exp.variants) == ["mha_lr0.001", "mha_lr0.01", "ssm_lr0.001", "ssm_lr0.01"]
    config = exp.variant_config("mha_lr0.01")
    assert (config["train"]["optimizer"], config["train"]["lr"], config["seed"]) == ("adamw",
                                                                                   1e-2, 3)


def test_resolved_sweep_loads_back_equal():
    exp = parse_experiment(raw_experiment(optimizer=["lion"], lr=[1e-3, 3e-3], seed=[0, 2],
                                          select="val/accuracy"))
    assert exp.to_dict()["variants"] == {"mha": {"block": "softmax", "n_heads": 2},
                                         "ssm": {"block": "ssm", "n_heads": 2, "d_state": 4}}
    assert parse_experiment(exp.to_dict()) == exp


def test_matched_widths_follow_each_run():
    raw = raw_experiment(lr=[1e-3, 3e-3])
    raw["match"] = {"params": True}
    exp = parse_experiment(raw)
    assert exp.d_mlp["ssm_lr0.001"] == exp.d_mlp["ssm_lr0.003"] != exp.d_mlp["mha_lr0.001"]


@pytest.mark.parametrize("sweep, message", [
    ({"lr": [-1.0]}, "sweep.lr values must be numbers > 0, got -1.0"),
    ({"lr": ["fast"]}, "sweep.lr values must be numbers > 0, got 'fast'"),
    ({"optimizer": ["sgd"]}, "sweep.optimizer values must be in"),
    ({"seed": [0, 0]}, "without repeats, got [0, 0]"),
    ({"seed": []}, "non-empty list"),
    ({"seed": [1.5]}, "sweep.seed values must be non-negative ints, got 1.5"),
    ({"lr": 0.1}, "sweep.lr must be list or null, got 0.1"),
    ({"lr": [0.1], "select": "val/ppl"}, "sweep.select must be one of"),
    ({"select": "val/loss"}, "at least one of"),
    ({"lrs": [0.1]}, "did you mean 'sweep.lr'"),
    ({"lr": [0.0012345671, 0.0012345674]}, "two grid points share a run name"),
], ids=["negative-lr", "string-lr", "unknown-optimizer", "repeated-seed", "empty-list",
        "float-seed", "scalar-not-list", "bad-select", "no-axis", "unknown-key", "lr-clash"])
def test_bad_sweep_values_are_named(sweep, message):
    with pytest.raises(ValueError) as e:
        parse_experiment(raw_experiment(**sweep))
    assert message in str(e.value)


def fake_run(name, score, select="val/loss", mixing=3.0):
    """A report variant section with just what the summary reads."""
    return {"variant": name, "metrics": {select: score, "val/accuracy": 0.5},
            "layers": [{"axes": [{"axis": "mixing", "realized_mean": mixing},
                                 {"axis": "value_path", "realized_mean": 2 * mixing}],
                        "mixing_centered_erank": mixing + 1}]}


def test_best_lr_is_the_best_mean_over_seeds_and_a_failed_seed_disqualifies():
    exp = parse_experiment(raw_experiment(lr=[1e-3, 3e-3, 1e-2], seed=[0, 1]))
    scores = {  # 0.001 holds the single best run, 0.003 the best mean; 0.01 lost a seed
        "mha_lr0.001_s0": 1.0, "mha_lr0.001_s1": 3.0,
        "mha_lr0.003_s0": 1.5, "mha_lr0.003_s1": 1.6,
        "mha_lr0.01_s0": 0.1,
        "ssm_lr0.001_s0": 2.0, "ssm_lr0.001_s1": 2.0,
        "ssm_lr0.003_s0": 2.5, "ssm_lr0.003_s1": 2.5,
        "ssm_lr0.01_s0": 0.5, "ssm_lr0.01_s1": 0.7,
    }
    report = {"variants": [fake_run(n, s, mixing=i) for i, (n, s) in enumerate(scores.items())]}
    groups = {g["variant"]: g for g in summarize(exp, report)["groups"]}
    assert groups["mha"]["best_lr"] == 3e-3
    assert groups["mha"]["runs"] == ["mha_lr0.003_s0", "mha_lr0.003_s1"]
    assert groups["mha"]["realized"]["mixing"] == pytest.approx((2 + 3) / 2)
    assert groups["mha"]["metrics"]["val/loss"] == pytest.approx(1.55)
    assert [e["mean"] for e in groups["mha"]["lrs"]][2] is None
    assert groups["ssm"]["best_lr"] == 1e-2
    assert "0.003 1.55*" in sweep_markdown(summarize(exp, report))


def test_best_runs_take_the_best_optimizer_then_the_best_seed():
    exp = parse_experiment(raw_experiment(optimizer=["adamw", "muon"], lr=[1e-3], seed=[0, 1]))
    scores = {"mha_adamw_lr0.001_s0": 2.0, "mha_adamw_lr0.001_s1": 2.2,
              "mha_muon_lr0.001_s0": 1.4, "mha_muon_lr0.001_s1": 1.2,  # muon: best mean
              "ssm_adamw_lr0.001_s0": 0.9, "ssm_adamw_lr0.001_s1": 1.5,
              "ssm_muon_lr0.001_s0": 1.1}  # ssm muon lost a seed: out
    report = {"variants": [fake_run(n, s) for n, s in scores.items()]}
    assert best_runs(summarize(exp, report)) == {"mha": "mha_muon_lr0.001_s1",
                                                 "ssm": "ssm_adamw_lr0.001_s0"}


def test_accuracy_is_maximized():
    exp = parse_experiment(raw_experiment(lr=[1e-3, 3e-3], select="val/accuracy"))
    report = {"variants": [fake_run("mha_lr0.001", 0.9, "val/accuracy"),
                           fake_run("mha_lr0.003", 0.4, "val/accuracy")]}
    summary = summarize(exp, report)
    assert summary["groups"][0]["best_lr"] == 1e-3
    assert summary["groups"][1]["best_lr"] is None  # ssm left no result at all
    sweep_table(summary)  # renders with a group that has no winner


def test_a_sweep_trains_each_point_and_survives_a_diverging_lr(tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    raw = raw_experiment(lr=[1e-3, 1e4], seed=[0, 1])
    del raw["variants"]["ssm"]
    config.write_text(json.dumps(raw))  # JSON is YAML
    rc = main(["train", str(config), "--runs-dir", str(tmp_path / "runs"), "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert [v["variant"] for v in doc["variants"]] == ["mha_lr0.001_s0", "mha_lr0.001_s1"]
    (group,) = doc["sweep"]["groups"]
    assert group["best_lr"] == 1e-3 and group["lrs"][1]["mean"] is None
    run_dir = tmp_path / "runs" / "sw"
    assert json.loads((run_dir / "sweep.json").read_text()) == doc["sweep"]
    assert (run_dir / "mha_lr10000_s1" / "diverged.txt").is_file()
    assert "## Sweep" in (run_dir / "report.md").read_text()

    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["sweep"]["groups"][0]["best_lr"] == 1e-3
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_dry_run_shows_each_variant_once_and_the_grid(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default runs dir, ./runs, must stay untouched
    config = tmp_path / "sweep.yaml"
    config.write_text(json.dumps(raw_experiment(optimizer=["adamw", "muon"], lr=[1e-3, 3e-3])))
    assert main(["train", str(config), "--dry-run", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [row["variant"] for row in doc["variants"]] == ["mha", "ssm"]
    assert doc["sweep"]["runs"] == 8 and doc["sweep"]["lr"] == [1e-3, 3e-3]
    assert main(["train", str(config), "--dry-run"]) == 0
    assert "sweep: 8 runs" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_report_leaves_out_an_interrupted_run_and_names_divergence(tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    raw = raw_experiment(lr=[1e4])
    del raw["variants"]["ssm"]
    config.write_text(json.dumps(raw))
    runs = tmp_path / "runs"
    assert main(["train", str(config), "--runs-dir", str(runs)]) == 1  # every run diverged
    assert "every run of the sweep diverged" in capsys.readouterr().err
    assert main(["report", str(runs / "sw")]) == 2
    assert "1 run diverged (e.g. " in capsys.readouterr().err

    raw["sweep"] = {"lr": [1e-3]}
    config.write_text(json.dumps(raw))
    assert main(["train", str(config), "--runs-dir", str(runs), "--overwrite"]) == 0
    interrupted = runs / "sw" / "mha_lr0.003"  # started, killed before any measurement
    interrupted.mkdir()
    (interrupted / "config.yaml").write_text("variant: mha_lr0.003\n")
    capsys.readouterr()
    assert main(["report", str(runs / "sw"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [v["variant"] for v in json.loads(out)["variants"]] == ["mha_lr0.001"]
    assert f"note: {interrupted} has no results yet" in err
