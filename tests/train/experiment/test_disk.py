"""Before the first step: the disk a run will write against the free space
(train/experiment/disk.py), and the fine-tune stage's memory joining the memory estimate
(train/experiment/preflight.py)."""

import pytest

import train.experiment.disk as disk
from tests.train.conftest import merged, tiny_experiment
from train.cli import main
from train.config import parse_experiment
from train.experiment.disk import checkpoint_bytes, disk_need, disk_preflight
from train.experiment.preflight import (
    activation_bytes,
    bounded_config,
    finetune_estimate,
    preflight,
    static_estimate,
)
from train.lm.decoder import build_model

FINETUNE = {"ranks": [1, 2], "targets": ["q_proj", "v_proj"],
            "data": {**tiny_experiment()["data"], "permute_seed": 1},
            "train": {"max_steps": 4, "lr": 0.02, "warmup_steps": 0}}


def test_the_need_counts_every_run_and_one_checkpoint_in_flight():
    plain = parse_experiment(tiny_experiment())
    need, largest = disk_need(plain)
    with_ft = parse_experiment(tiny_experiment(finetune=FINETUNE))
    need_ft, _ = disk_need(with_ft)
    # a checkpoint holds at least the fp32 weights and AdamW's two states
    assert largest >= 3 * 4 * build_model(plain.variant_config("mha")).param_count()
    assert need >= 2 * largest  # the run's checkpoint, and the new one beside it
    assert need_ft >= need + 2 * largest  # two fine-tunes, a checkpoint each


def test_more_than_is_free_is_refused_naming_both(tmp_path):
    exp = parse_experiment(tiny_experiment())
    need, _ = disk_need(exp)
    with pytest.raises(ValueError, match=r"needs about .* of disk .* is free there; free "
                                         r"some space"):
        disk_preflight(exp, tmp_path / "tiny", free=need - 1)
    assert disk_preflight(exp, tmp_path / "tiny", free=3 * need) == []
    [warning] = disk_preflight(exp, tmp_path / "tiny", free=need + 1)
    assert "less than twice the need" in warning


def test_what_a_resumed_or_overwritten_directory_holds_counts(tmp_path):
    exp = parse_experiment(tiny_experiment())
    need, largest = disk_need(exp)
    exp_dir = tmp_path / "tiny"
    exp_dir.mkdir()
    (exp_dir / "blob").write_bytes(b"\0" * need)
    # on a resume the files there are rewritten in place: one checkpoint in flight is new
    [warning] = disk_preflight(exp, exp_dir, resume=True, free=largest + 1)
    assert "less than twice" in warning
    assert disk_preflight(exp, exp_dir, overwrite=True, free=need // 2) != []  # warns only
    with pytest.raises(ValueError):
        disk_preflight(exp, exp_dir, free=need // 2)


def test_train_refuses_before_writing_anything(tmp_path, tiny_yaml, monkeypatch, capsys):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 1000)
    runs = tmp_path / "runs"
    assert main(["train", str(tiny_yaml()), "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rankzoo: error: the run in ") and "1000 B is free" in err[-1]
    assert not runs.exists()  # neither the run directory nor its lock, nor --runs-dir


# ---------------------------------------------------------------- fine-tune memory

def test_the_finetune_estimate_counts_the_adapters_alone_as_trainable():
    exp = parse_experiment(tiny_experiment(model={"d_model": 32}, finetune=FINETUNE))
    model = build_model(bounded_config(exp, "mha"))
    params = model.param_count()
    estimate = finetune_estimate(exp, "mha", "mha", model)
    adapters = 2 * 2 * (32 + 32)  # r = 2 on q_proj and v_proj, each 32 -> 32: A and B
    assert estimate.params == params + adapters
    assert estimate.weights == 4 * (params + adapters)
    assert estimate.gradients == 4 * adapters and estimate.optimizer == 2 * 4 * adapters
    assert estimate.stage == "finetune"


def test_a_finetune_that_does_not_fit_is_named_before_any_work():
    big = {**FINETUNE, "data": {**FINETUNE["data"], "train_size": 20_000,
                                "batch_size": 512}}
    plain = parse_experiment(tiny_experiment())
    model = build_model(bounded_config(plain, "mha"))
    a, c = activation_bytes(model, "mha", plain.data.seq_len, "cpu")
    base_need = static_estimate(plain, "mha", "mha").with_activations(a, c).on_device("cpu")
    room = {"cpu": 2 * base_need}
    assert preflight(plain, available=room) == []  # the pretraining alone fits
    exp = parse_experiment(merged(tiny_experiment(), finetune=big))
    with pytest.raises(ValueError, match=r"^the fine-tune of mha: needs about .* lower "
                                         r"finetune.data.seq_len, finetune.data.batch_size"):
        preflight(exp, available=room)


def test_checkpoint_bytes_follow_the_precision():
    exp = parse_experiment(tiny_experiment())
    half = parse_experiment(tiny_experiment(train={"precision": "bf16-true"}))
    params = build_model(exp.variant_config("mha")).param_count()
    assert checkpoint_bytes(exp, "mha") - checkpoint_bytes(half, "mha") == 3 * 2 * params
