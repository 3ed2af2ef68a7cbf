from pathlib import Path

import pytest

from tests.train.conftest import MQA, tiny_experiment
from train.config import apply_override, load_experiment

ROOT = Path(__file__).resolve().parents[3]
BASE = tiny_experiment(  # the sizes, train and monitor sections left at their defaults
    name="t", seed=1, data={"train_size": None, "val_size": None, "batch_size": None},
    variants={"mqa": MQA}, train=None, monitor=None)


def test_quick_config_loads():
    exp = load_experiment(ROOT / "configs" / "quick.yaml")
    assert exp.name == "quick"
    assert {v.block_kwargs.get("n_kv_heads") for v in exp.variants.values()} == {None, 2, 1}


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_names_itself_after_its_file(path):
    exp = load_experiment(path)
    assert exp.name == path.stem and exp.variants


def test_defaults_merge_and_overrides(tiny_yaml):
    exp = load_experiment(tiny_yaml(BASE),
                          ["train.max_steps=7", "variants.mqa.n_kv_heads=2", "seed=5",
                           "monitor.eps=0.01", "train.precision=bf16-mixed"])
    assert exp.train.max_steps == 7 and exp.seed == 5 and exp.monitor.eps == 0.01
    assert exp.train.precision == "bf16-mixed"
    assert exp.variants["mqa"].block_kwargs == {"n_heads": 2, "n_kv_heads": 2}
    assert exp.variants["mha"].block_kwargs == {"n_heads": 2}
    config = exp.variant_config("mqa")
    assert config["block"] == {"name": "softmax", "n_heads": 2, "n_kv_heads": 2}
    assert load_experiment(tiny_yaml(exp.to_dict())) == exp  # round trip


@pytest.mark.parametrize("override, match", [
    ("data.vocab_sise=64", r"'data\.vocab_sise'.*did you mean 'data\.vocab_size'"),
    ("trian.max_steps=3", r"'trian'.*did you mean 'train'"),
    ("variants.mqa.n_kv_head=1", r"'variants\.mqa\.n_kv_head'.*did you mean "
                                 r"'variants\.mqa\.n_kv_heads'"),
    ("block_defaults.n_haeds=1", r"'block_defaults\.n_haeds'.*did you mean"),
])
def test_unknown_keys_suggest(tiny_yaml, override, match):
    with pytest.raises(ValueError, match=match):
        load_experiment(tiny_yaml(BASE), [override])


@pytest.mark.parametrize("override, match", [
    ("train.max_steps", "bad override 'train.max_steps': expected key=value"),
    ("=3", "bad override"),
    ("a..b=3", "bad override"),
    ("seed.x=3", r"seed is 1, not a mapping"),
    ("train.max_steps=[1", "not valid YAML"),
])
def test_bad_overrides(tiny_yaml, override, match):
    with pytest.raises(ValueError, match=match):
        load_experiment(tiny_yaml(BASE), [override])


@pytest.mark.parametrize("override, match", [
    ("train.max_steps=ten", r"train\.max_steps must be int, got 'ten'"),
    ("train.max_steps=0", r"train\.max_steps must be > 0, got 0"),
    ("variants.mqa.n_kv_heads=3", r"variants\.mqa: .*n_kv_heads \(3\)"),
    ("variants.mqa.block=nope", r"variants\.mqa\.block: unknown block key 'nope'"),
    ("variants.mqa.d_model=8", r"variants\.mqa: set model\.d_model"),
    ("data.num_kv_pairs=9", r"num_kv_pairs \(9\) too large for seq_len \(16\)"),
    ("data.task=copy",
     r"data\.task must be one of \['mqar', 'markov', 'modadd', 'text', 'tokens'\]"),
    ("name=a/b", "name must be"),
    ("variants={}", "variants must be a non-empty mapping"),
])
def test_bad_values_are_named(tiny_yaml, override, match):
    with pytest.raises(ValueError, match=match):
        load_experiment(tiny_yaml(BASE), [override])


def test_errors_name_the_file(tiny_yaml):
    path = tiny_yaml(BASE)
    with pytest.raises(ValueError, match=str(path)):
        load_experiment(path, ["model.d_model=-1"])


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_experiment(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        load_experiment(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_experiment(empty)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [x\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_experiment(broken)


def test_apply_override_creates_missing_sections():
    raw = {}
    apply_override(raw, "train.lr=1e-3")
    assert raw == {"train": {"lr": 0.001}}


def _per_variant_train_raw(train) -> dict:
    raw = tiny_experiment(name="t", seed=None, monitor=None,
                          data={"seq_len": 32, "num_kv_pairs": 4, "train_size": 64},
                          variants={"ssm": {"block": "ssm", "d_state": 4, "train": train}})
    raw["train"] = {"optimizer": "muon", "lr": 1e-2}
    return raw


def test_a_variant_sets_its_own_optimizer_and_lr():
    from train.config import parse_experiment

    exp = parse_experiment(_per_variant_train_raw({"optimizer": "adamw", "lr": 3e-3}))
    assert exp.variant_config("ssm")["train"]["optimizer"] == "adamw"
    assert exp.variant_config("ssm")["train"]["lr"] == 3e-3
    assert exp.variant_config("mha")["train"]["optimizer"] == "muon"
    assert parse_experiment(exp.to_dict()) == exp  # the resolved config keeps it


@pytest.mark.parametrize("train, match", [
    ({"max_steps": 3}, r"variants.ssm.train: \['max_steps'\] cannot differ between variants"),
    ({"lr": -1}, r"variants.ssm.train: train.lr must be > 0, got -1"),
    (5, r"variants.ssm.train must be a mapping"),
], ids=["shared-key", "bad-value", "not-a-mapping"])
def test_bad_variant_train_is_named(train, match):
    from train.config import parse_experiment

    with pytest.raises(ValueError, match=match):
        parse_experiment(_per_variant_train_raw(train))
