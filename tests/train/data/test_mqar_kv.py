"""MQAR validation accuracy per number of key-value pairs (data.val_kv_pairs)."""

import copy

import lightning as L
import pytest
import torch

from tests.train.conftest import tiny_experiment
from train.config import load_experiment, parse_experiment
from train.data import IGNORE, MQARSpec, make_mqar, make_mqar_val, make_splits
from train.harness.module import LMModule

RAW = tiny_experiment(  # the train and monitor sections left at their defaults
    name="t", seed=1, train=None, monitor=None,
    data={"seq_len": 32, "num_kv_pairs": 4, "val_kv_pairs": [2, 4, 8], "train_size": 64,
          "val_size": 30})


def test_validation_split_mixes_the_numbers_of_pairs_interleaved():
    spec = MQARSpec(32, 32, 4, val_kv_pairs=(2, 4, 8))
    tokens, labels = make_mqar_val(spec, 10, seed=5)
    assert tokens.shape == labels.shape == (10, 32)
    assert (labels != IGNORE).sum(dim=1).tolist() == [2, 4, 8, 2, 4, 8, 2, 4, 8, 2]
    assert torch.equal(make_mqar_val(spec, 10, seed=5)[0], tokens)  # seeded
    # the training split keeps num_kv_pairs; with no val_kv_pairs nothing changes
    (train_tokens, train_labels), _ = make_splits(spec, 6, 6, seed=0)
    assert ((train_labels != IGNORE).sum(dim=1) == 4).all()
    plain = MQARSpec(32, 32, 4)
    assert torch.equal(make_mqar_val(plain, 7, seed=3)[1], make_mqar(plain, 7, seed=3)[1])


def test_validation_logs_accuracy_per_number_of_pairs():
    exp = parse_experiment(copy.deepcopy(RAW))
    module = LMModule(exp.variant_config("mha"))
    logged = {}
    module.log = lambda name, value, **kwargs: logged.setdefault(name, (value, kwargs))
    tokens, labels = make_mqar_val(exp.data.spec(), 9, seed=0)
    with torch.no_grad():
        module.validation_step((tokens, labels), 0)
        logits = module(tokens)
    assert {"val/accuracy", "val/accuracy/kv2", "val/accuracy/kv4", "val/accuracy/kv8"} \
        <= set(logged)
    rows = (labels != IGNORE).sum(dim=1) == 8
    mask = labels[rows] != IGNORE
    expected = ((logits[rows].argmax(-1) == labels[rows]) & mask).sum() / mask.sum()
    value, kwargs = logged["val/accuracy/kv8"]
    torch.testing.assert_close(value, expected.float())
    assert kwargs["batch_size"] == 3 * 8  # weighted by the query positions


def test_per_pair_accuracy_through_a_trainer(tmp_path):
    exp = parse_experiment(copy.deepcopy(RAW))
    module = LMModule(exp.variant_config("mha"))
    _, val = make_splits(exp.data.spec(), 1, exp.data.val_size, seed=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*val), batch_size=8)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), accelerator="cpu")
    (metrics,) = trainer.validate(module, loader, verbose=False)
    for n in (2, 4, 8):
        assert 0 <= metrics[f"val/accuracy/kv{n}"] <= 1


def test_default_logs_the_training_number_only():
    raw = copy.deepcopy(RAW)
    del raw["data"]["val_kv_pairs"]
    exp = parse_experiment(raw)
    assert "val_kv_pairs" not in exp.data.to_dict()
    module = LMModule(exp.variant_config("mha"))
    logged = {}
    module.log = lambda name, value, **kwargs: logged.setdefault(name, value)
    with torch.no_grad():
        module.validation_step(make_mqar_val(exp.data.spec(), 4, seed=0), 0)
    assert set(logged) == {"val/loss", "val/accuracy", "val/accuracy/kv4"}


@pytest.mark.parametrize("value, match", [
    ([2, 9], r"val_kv_pairs value 9 too large for seq_len \(32\).*\[2, 9\]"),
    ([2, 16], r"val_kv_pairs value 16 too large for seq_len"),
    ([4, 4], r"val_kv_pairs has repeated values: \[4, 4\]"),
    ([], "val_kv_pairs must be a non-empty list of positive ints"),
    ([0, 2], r"val_kv_pairs must be a non-empty list of positive ints, got \[0, 2\]"),
    (4, "data.val_kv_pairs must be list or null, got 4"),
])
def test_bad_val_kv_pairs_are_named(tiny_yaml, value, match):
    raw = copy.deepcopy(RAW)
    raw["data"]["val_kv_pairs"] = value
    path = tiny_yaml(raw)
    with pytest.raises(ValueError, match=match):
        load_experiment(path)


def test_val_kv_pairs_must_fit_the_vocabulary_and_val_size():
    with pytest.raises(ValueError, match=r"val_kv_pairs value 8 too large for vocab_size \(16\)"):
        MQARSpec(16, 64, 4, val_kv_pairs=(4, 8))
    raw = copy.deepcopy(RAW)
    raw["data"]["val_size"] = 2
    with pytest.raises(ValueError, match=r"val_size \(2\) must be >= .*\[2, 4, 8\]"):
        parse_experiment(raw)


def test_val_kv_pairs_belongs_to_mqar_only():
    raw = copy.deepcopy(RAW)
    raw["data"] = {"task": "markov", "seq_len": 16, "val_kv_pairs": [2]}
    with pytest.raises(ValueError, match="data.val_kv_pairs"):
        parse_experiment(raw)


def test_training_split_mixes_train_kv_pairs():
    spec = MQARSpec(32, 32, 4, val_kv_pairs=(2, 8), train_kv_pairs=(2, 4, 8))
    (tokens, labels), (_, val_labels) = make_splits(spec, 9, 4, seed=0)
    assert (labels != IGNORE).sum(dim=1).tolist() == [2, 4, 8] * 3
    assert (val_labels != IGNORE).sum(dim=1).tolist() == [2, 8, 2, 8]
    # the resolved config carries it and loads back to the same experiment
    raw = copy.deepcopy(RAW)
    raw["data"]["train_kv_pairs"] = [2, 8]
    exp = parse_experiment(raw)
    assert exp.data.mqar_spec().fit_kv_pairs == (2, 8)
    assert parse_experiment(exp.to_dict()).data == exp.data


@pytest.mark.parametrize("value, match", [
    ([2, 9], r"train_kv_pairs value 9 too large for seq_len \(32\).*\[2, 9\]"),
    ([3, 3], r"train_kv_pairs has repeated values: \[3, 3\]"),
])
def test_bad_train_kv_pairs_are_named(value, match):
    raw = copy.deepcopy(RAW)
    raw["data"]["train_kv_pairs"] = value
    with pytest.raises(ValueError, match=match):
        parse_experiment(raw)
