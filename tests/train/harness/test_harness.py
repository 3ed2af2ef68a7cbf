"""The harness in depth: dry run, parameter matching, Markov and text data, optimizers,
and the non-finite-loss stop."""

import itertools
import json
import sys

import pytest
import torch
import yaml

import zoo
from tests.train.conftest import MQA, merged, tiny_experiment
from train.cli import main
from train.config import load_experiment, parse_experiment
from train.data import (
    IGNORE,
    MarkovSpec,
    TextSpec,
    make_markov,
    markov_transitions,
    text_splits,
)
from train.harness.module import LMModule, NonFiniteLoss
from train.harness.optim import Combined, build_optimizer, muon_params
from train.sizing.match import count_params, matched_widths

BASE = tiny_experiment(name="h", variants={"mqa": MQA}, train={"checkpoint_every_n_steps": 2})


def with_(**sections):
    return merged(BASE, **sections)


# ---------------------------------------------------------------- dry run

def test_dry_run_prints_the_matched_table_and_touches_nothing(tmp_path, capsys, tiny_yaml):
    config, runs = tiny_yaml(BASE, match={"params": True}), tmp_path / "runs"
    assert main(["train", str(config), "--dry-run", "--runs-dir", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "mha" in table and "mqa" in table and "d_mlp" in table and "value_path" in table
    assert main(["train", str(config), "--dry-run", "--format", "json",
                 "--runs-dir", str(runs)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not runs.exists()
    mha, mqa = doc["variants"]
    assert mha["rel_diff"] == 0 and abs(mqa["rel_diff"]) <= 0.05
    assert mqa["d_mlp"] > mha["d_mlp"] == 64  # MQA's smaller K/V is paid back in the MLP
    assert mqa["budget_per_layer"]["inference"] < mha["budget_per_layer"]["inference"]
    assert set(mha["budget_per_layer"]) == {"mixing", "logits", "value_path", "inference",
                                            "total"}
    assert mha["cache_elements"] > mqa["cache_elements"] > 0 and mha["flops_per_token"] > 0


# ---------------------------------------------------------------- matching

def test_every_block_pair_in_the_zoo_matches_within_tolerance():
    sizes = {"vocab_size": 32, "d_model": 64, "n_layers": 2, "mlp_ratio": 4.0, "d_mlp": None,
             "seq_len": 32, "norm": "rmsnorm", "tie_embeddings": False}
    for a, b in itertools.permutations(zoo.names(), 2):
        variants = {"ref": (a, {"n_heads": 4}), "other": (b, {"n_heads": 4})}
        widths = matched_widths(sizes, variants, 0.05)
        counts = [count_params(32, 64, 2, blk, kw, widths[n], 32, "rmsnorm", False)
                  for n, (blk, kw) in variants.items()]
        assert abs(counts[1] - counts[0]) <= 0.05 * counts[0], (a, b, widths, counts)


def test_matched_width_is_recorded_and_reloads(tiny_yaml):
    exp = parse_experiment(with_(match={"params": True, "tolerance": 0.02}))
    assert exp.variant_config("mha")["model"]["d_mlp"] == 64
    assert exp.variant_config("mqa")["model"]["d_mlp"] > 64
    assert load_experiment(tiny_yaml(exp.to_dict())) == exp


def test_impossible_match_names_the_variant_and_counts():
    # the reference (MQA, a tiny MLP) is smaller than MHA's attention alone
    raw = with_(match={"params": True}, model={"d_model": 64, "mlp_ratio": 0.05})
    raw["variants"] = {"mqa": {"block": "softmax", "n_kv_heads": 1}, "mha": {"block": "softmax"}}
    with pytest.raises(ValueError, match=r"variant 'mha' cannot be matched to [\d,]+ param.*"
                                         r"without its MLP it already has"):
        parse_experiment(raw)
    with pytest.raises(ValueError, match=r"'match\.tolerence'.*did you mean 'match\.tolerance'"):
        parse_experiment(with_(match={"tolerence": 0.1}))


# ---------------------------------------------------------------- data

def test_markov_transitions_have_the_planted_rank_and_labels_are_next_tokens():
    spec = MarkovSpec(vocab_size=32, seq_len=12, rank=3)
    P = markov_transitions(spec, seed=0)
    torch.testing.assert_close(P.sum(-1), torch.ones(32, dtype=P.dtype))
    logits = P.log() - P.log().mean(-1, keepdim=True)  # the softmax's shift removed
    assert torch.linalg.matrix_rank(logits).item() == 3
    tokens, labels = make_markov(spec, 5, seed=1)
    assert tokens.shape == labels.shape == (5, 12)
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    assert torch.equal(make_markov(spec, 5, seed=1)[0], tokens)


def test_markov_config_records_the_intrinsic_rank_and_rejects_other_tasks_keys():
    data = {"task": "markov", "vocab_size": 16, "seq_len": 16, "rank": 4}
    exp = parse_experiment(with_(data=data) | {"data": data})
    config = exp.variant_config("mha")
    assert config["data_intrinsic_rank"] == 4 and config["data"]["rank"] == 4
    with pytest.raises(ValueError, match=r"unknown markov data key 'data\.num_kv_pairs'"):
        parse_experiment(with_() | {"data": {**data, "num_kv_pairs": 2}})
    with pytest.raises(ValueError, match=r"markov rank \(20\) must be <= vocab_size \(16\)"):
        parse_experiment(with_() | {"data": {**data, "rank": 20}})


def test_text_from_globbed_files_splits_train_and_validation(tmp_path):
    (tmp_path / "a.py").write_bytes(b"print('a')\n" * 50)
    (tmp_path / "b.py").write_bytes(b"x = 1\n" * 50)
    (tmp_path / "skip.txt").write_bytes(b"\xff" * 1000)
    spec = TextSpec((str(tmp_path / "*.py"),), seq_len=8, val_fraction=0.2)
    (tokens, labels), (vt, vl) = text_splits(spec, 10, 4, seed=0)
    assert tokens.shape == (10, 8) and vt.shape == (4, 8)
    assert torch.equal(tokens[:, 1:], labels[:, :-1]) and (labels != IGNORE).all()
    assert tokens.max() < 128  # the .txt file of 0xff bytes was not read
    dir_spec = TextSpec((str(tmp_path),), seq_len=8, pattern="*.py")
    assert text_splits(dir_spec, 3, 3, seed=0)[0][0].max() < 128


def test_text_stdlib_is_read_capped():
    spec = TextSpec(("stdlib",), seq_len=32, max_bytes=20_000)
    (tokens, _), (val, _) = text_splits(spec, 16, 4, seed=0)
    assert tokens.shape == (16, 32) and val.shape == (4, 32)
    exp = parse_experiment(with_() | {"data": {"task": "text", "paths": ["stdlib"],
                                               "max_bytes": 20_000, "seq_len": 16}})
    assert exp.data.vocab_size == 256 and exp.variant_config("mha")["data"]["vocab_size"] == 256


def test_text_errors_name_the_path(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="nope"):
        text_splits(TextSpec((str(tmp_path / "nope"),), 8), 2, 2, 0)
    with pytest.raises(ValueError, match="empty.*names no files"):
        text_splits(TextSpec((str(tmp_path / "empty"),), 8), 2, 2, 0)
    with pytest.raises(ValueError, match="blank.txt.*every file is empty"):
        text_splits(TextSpec((str(tmp_path / "blank.txt"),), 8), 2, 2, 0)
    with pytest.raises(ValueError, match=r"unknown text data key 'data\.vocab_size'"):
        parse_experiment(with_() | {"data": {"task": "text", "paths": ["x"], "vocab_size": 9}})


# ---------------------------------------------------------------- optimizers

def tiny_module(optimizer: str, lr: float) -> LMModule:
    raw = with_(train={"optimizer": optimizer, "lr": lr, "weight_decay": 0.0})
    raw["model"] = {"d_model": 32, "n_layers": 2}
    return LMModule(parse_experiment(raw).variant_config("mha"))


@pytest.mark.parametrize("name, lr", [("adamw", 3e-3), ("muon", 3e-3), ("lion", 1e-3)])
def test_each_optimizer_reduces_the_loss(name, lr):
    torch.manual_seed(0)
    module = tiny_module(name, lr)
    optimizer = build_optimizer(module.model, module.config["train"])
    tokens = torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0))
    batch = (tokens, tokens.roll(-1, dims=1))

    def closure():
        optimizer.zero_grad()
        loss = module._loss(batch)[0]
        loss.backward()
        return loss

    first = closure().item()
    for _ in range(8):
        optimizer.step(closure)
    # the drop over seeds 0-29 (model and batch), AVX-512 and AVX2 alike: AdamW 0.36-0.40,
    # Muon 0.29-0.32, Lion 0.117-0.131 (seed 0: 0.38, 0.30, 0.127)
    assert module._loss(batch)[0].item() < first - 0.1


def test_muon_gets_only_hidden_matrices():
    module = tiny_module("muon", 1e-3)
    optimizer = build_optimizer(module.model, module.config["train"])
    assert isinstance(optimizer, Combined)
    muon, adamw = optimizer.optimizers
    assert isinstance(muon, torch.optim.Muon)
    hidden = {id(p) for g in muon.param_groups for p in g["params"]}
    assert hidden == {id(p) for p in muon_params(module.model)} and hidden
    assert all(p.dim() == 2 for g in muon.param_groups for p in g["params"])
    model = module.model
    assert id(model.embed.weight) not in hidden and id(model.head.weight) not in hidden
    rest = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert rest | hidden == {id(p) for p in model.parameters()} and not rest & hidden


def test_the_schedule_reaches_both_optimizers_after_a_resume():
    """A resume loads the state dict: torch then gives each inner optimizer new group
    dicts, which the lr schedule (stepping Combined's groups) must still reach."""
    module = tiny_module("muon", 1e-3)
    optimizer = build_optimizer(module.model, module.config["train"])
    optimizer.load_state_dict(optimizer.state_dict())
    for i, group in enumerate(optimizer.param_groups):
        group["lr"] = 0.5 + i
    inner = [g for o in optimizer.optimizers for g in o.param_groups]
    assert [g["lr"] for g in inner] == [0.5 + i for i in range(len(inner))]


def test_lion_missing_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "lion_pytorch", None)  # import fails
    module = tiny_module("lion", 1e-4)
    with pytest.raises(ValueError, match="pip install lion-pytorch"):
        build_optimizer(module.model, module.config["train"])


# ---------------------------------------------------------------- Lightning runs

def test_muon_on_markov_trains_through_lightning(tmp_path):
    from train.experiment.stages import train_experiment

    raw = with_(train={"optimizer": "muon", "max_steps": 4})
    raw["data"] = tiny_experiment("markov")["data"]
    raw["variants"] = {"mha": {"block": "softmax"}}
    train_experiment(parse_experiment(raw), runs_dir=tmp_path)
    config = yaml.safe_load((tmp_path / "h" / "mha" / "config.yaml").read_text())
    assert config["data_intrinsic_rank"] == 2 and config["train"]["optimizer"] == "muon"
    ckpt = torch.load(tmp_path / "h" / "mha" / "checkpoints" / "last.ckpt", weights_only=False)
    assert len(ckpt["optimizer_states"][0]["optimizers"]) == 2


def test_non_finite_loss_stops_naming_variant_and_step_and_keeps_last_good_checkpoint(
        tmp_path, monkeypatch):
    from train.experiment.stages import train_experiment

    real = LMModule._loss

    def poisoned(self, batch):
        loss, logits = real(self, batch)
        return (loss * float("nan") if self.training and self.global_step >= 3 else loss), logits

    monkeypatch.setattr(LMModule, "_loss", poisoned)
    with pytest.raises(NonFiniteLoss, match=r"variant 'mha'.* nan at step 3.*last good "
                                            r"checkpoint"):
        train_experiment(parse_experiment(with_()), runs_dir=tmp_path)
    ckpt = torch.load(tmp_path / "h" / "mha" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


def test_bad_text_path_fails_before_the_run_directory_is_made(tmp_path, capsys, tiny_yaml):
    raw = with_() | {"data": {"task": "text", "paths": [str(tmp_path / "gone")], "seq_len": 8}}
    runs = tmp_path / "runs"
    assert main(["train", str(tiny_yaml(raw)), "--runs-dir", str(runs)]) == 2
    assert "gone' does not exist" in capsys.readouterr().err and not runs.exists()
