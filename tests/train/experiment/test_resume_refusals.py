"""What `train --resume` refuses before it writes anything (experiment.yaml included), and
what `--overwrite` and an early failure leave: a max_steps below a step some run reached,
a variant directory copied in from another config, a changed fine-tune, a symlinked run
directory, no empty --runs-dir."""

import shutil

import pytest
import yaml

from tests.train.cli.test_fuzz import run_cli, snapshot
from tests.train.conftest import MQA, tiny_experiment
from train.cli import main
from train.config import parse_experiment

DATA = {"train_size": 32, "val_size": 8, "batch_size": 8}
RAW = tiny_experiment(variants={"mqa": MQA})
FT = tiny_experiment(name="ft", train={"max_steps": 3, "checkpoint_every_n_steps": 3},
                     finetune={"ranks": [1], "targets": ["v_proj"],
                               "data": {**tiny_experiment()["data"], "permute_seed": 1},
                               "train": {"max_steps": 3}})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run of RAW (6 steps) and one of FT (3 steps and a LoRA fine-tune)."""
    root = tmp_path_factory.mktemp("trained")
    for raw in (RAW, FT):
        config = root / f"{raw['name']}.yaml"
        config.write_text(yaml.safe_dump(raw))
        assert main(["train", str(config), "--runs-dir", str(root / "runs")]) == 0
    return root


def copy_of(trained, tmp_path, name: str):
    shutil.copytree(trained / "runs" / name, tmp_path / "runs" / name)
    config = tmp_path / f"{name}.yaml"
    shutil.copy(trained / f"{name}.yaml", config)
    return config, tmp_path / "runs" / name


def refused(tmp_path, argv, run) -> str:
    before = snapshot(run)
    code, _, err = run_cli(argv, tmp_path)
    assert code == 2 and err.count("rankzoo: error:") == 1 and "Traceback" not in err, err
    assert snapshot(run) == before  # experiment.yaml and every run as they were
    return err


def test_a_max_steps_below_a_step_reached_is_refused(trained, tmp_path):
    config, run = copy_of(trained, tmp_path, "tiny")
    err = refused(tmp_path, ["train", config, "--resume", "train.max_steps=4",
                             "--runs-dir", tmp_path / "runs"], run)
    assert "train.max_steps 4 is below step 6, which" in err and "mha" in err


def test_a_variant_directory_of_another_config_is_refused(trained, tmp_path):
    config, run = copy_of(trained, tmp_path, "tiny")
    other = parse_experiment(tiny_experiment(model={"d_model": 32}, variants={"mqa": MQA}))
    conf = yaml.safe_load((run / "mqa" / "config.yaml").read_text())
    conf["model"] = other.variant_config("mqa")["model"]  # as if copied from that run
    (run / "mqa" / "config.yaml").write_text(yaml.safe_dump(conf))
    err = refused(tmp_path, ["train", config, "--resume", "--runs-dir", tmp_path / "runs"],
                  run)
    assert f"{run / 'mqa'} holds a run of another config (model.d_model: 32 -> 16" in err


def test_a_changed_fine_tune_is_refused_before_experiment_yaml_is_written(trained, tmp_path):
    config, run = copy_of(trained, tmp_path, "ft")
    err = refused(tmp_path, ["train", config, "--resume", "finetune.data.permute_seed=7",
                             "--runs-dir", tmp_path / "runs"], run)
    assert "mha.lora-r1 holds a run of another config (data.permute_seed: 1 -> 7)" in err


def test_more_steps_still_resume(trained, tmp_path):
    config, run = copy_of(trained, tmp_path, "tiny")
    code, _, err = run_cli(["train", config, "--resume", "train.max_steps=8",
                            "--runs-dir", tmp_path / "runs"], tmp_path)
    assert code == 0, err


def test_overwrite_refuses_a_symlinked_run_directory(trained, tmp_path):
    config, run = copy_of(trained, tmp_path, "tiny")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "tiny").symlink_to(run, target_is_directory=True)
    err = refused(tmp_path, ["train", config, "--overwrite", "--runs-dir",
                             tmp_path / "links"], run)
    assert f"{tmp_path / 'links' / 'tiny'} is a symbolic link; not deleting it" in err
    assert (tmp_path / "links" / "tiny").is_symlink()


def test_an_early_failure_leaves_no_empty_runs_dir(tmp_path, tiny_yaml, monkeypatch):
    import train.experiment.stages as stages

    def fail(*args, **kwargs):
        raise ValueError("a failure before the first step")

    monkeypatch.setattr(stages, "train_all", fail)
    runs = tmp_path / "new" / "runs"
    code, _, err = run_cli(["train", tiny_yaml(), "--runs-dir", runs], tmp_path)
    assert code == 2 and "a failure before the first step" in err
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    code, _, _ = run_cli(["train", tiny_yaml(), "--runs-dir", tmp_path / "kept"], tmp_path)
    assert code == 2 and (tmp_path / "kept").is_dir()  # it was there before: kept
