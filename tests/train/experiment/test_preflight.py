"""Sizes bounded before work starts (train/experiment/preflight.py): the memory estimate and its
error, the bounded cost of the preflight itself, the warnings for settings that defeat
their purpose, the floor of a matched MLP; and `blocks` surviving a preset that cannot be
built at the sizes asked for."""

import json
import time

import pytest
import torch

import train.experiment.preflight as pf
from tests.train.conftest import merged, tiny_experiment
from train.cli import main
from train.config import parse_experiment
from train.experiment.preflight import (
    PREFLIGHT_TOKENS,
    MemoryEstimate,
    bounded_config,
    check_memory,
    preflight,
    saved_bytes,
    size_warnings,
    static_estimate,
    write_notes,
)
from train.lm.decoder import build_model

TINY = tiny_experiment(
    data={"vocab_size": 16, "batch_size": 4}, model={"n_layers": 2},
    variants={"ssm": {"block": "ssm", "d_state": 4}})
TINY["train"], TINY["monitor"] = {"max_steps": 10, "warmup_steps": 2}, {"probe_size": 4}
GiB = 2**30


def tiny(**sections):
    return parse_experiment(merged(TINY, **sections))


# ---------------------------------------------------------------- the memory estimate

def test_seq_len_of_millions_is_an_error_that_shows_the_estimate():
    exp = tiny(data={"seq_len": 4_000_000})
    with pytest.raises(ValueError) as err:
        preflight(exp, available={"cpu": 16 * GiB})
    message = str(err.value)
    assert message.startswith("variants.mha: needs about ")
    assert "but 16.0 GiB is available" in message
    for term in ("weights", "gradients", "optimizer state", "monitor probe", "data",
                 "activations at data.batch_size 4 x data.seq_len 4000000"):
        assert term in message


def test_seq_len_100000_fails_before_any_model_is_built(monkeypatch):
    exp = tiny(data={"seq_len": 100_000, "train_size": 20_000})
    monkeypatch.setattr(pf, "build_model", lambda config: pytest.fail("built a model"))
    with pytest.raises(ValueError, match=r"data 29\.\d GiB.*lower data\.seq_len"):
        preflight(exp, available={"cpu": 16 * GiB})


def test_preflight_cost_is_bounded_whatever_the_seq_len():
    """The old preflight ran every model on [2, seq_len] tokens: quadratic attention at
    seq_len 100,000 never came back. Now it runs on at most PREFLIGHT_TOKENS."""
    exp = tiny(data={"seq_len": 100_000})
    start = time.perf_counter()
    assert preflight(exp, available={"cpu": 1024 * GiB}) == []
    assert time.perf_counter() - start < 60
    assert build_model(bounded_config(exp, "mha")).max_len == PREFLIGHT_TOKENS


def test_the_cli_refuses_before_touching_the_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pf, "available_memory", lambda kind: 8 * GiB)
    config = tmp_path / "big.yaml"
    config.write_text(json.dumps(TINY))  # JSON is YAML
    runs = tmp_path / "runs"
    assert main(["train", str(config), "data.seq_len=4000000", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("rankzoo: error: variants.mha: needs about") == 1
    assert "Traceback" not in err and not runs.exists()


def test_estimate_terms_follow_the_formula():
    exp = tiny()
    e = static_estimate(exp, "mha", "mha").with_activations(1000.0, 2.0)
    P = e.params
    assert build_model(exp.variant_config("mha")).param_count() == P
    assert (e.weights, e.gradients, e.optimizer) == (4 * P, 4 * P, 8 * P)  # AdamW: 2 states
    assert e.activations == 4 * (1000 * 16 + 2 * 16 * 16)
    assert e.data == 16 * (32 + 8) * 16
    assert e.probe == 3 * 4 * 4 * 2 * 16 * 16  # 3 copies x fp32 x probe x heads x T x T
    lion = tiny(train={"optimizer": "lion", "precision": "bf16-true"})
    e = static_estimate(lion, "mha", "mha").with_activations(1000.0)
    assert (e.weights, e.optimizer, e.activations) == (2 * P, 2 * P, 4 * 1000 * 16 // 2)


def test_measured_activations_match_a_full_length_forward():
    """The activation term, measured on at most PREFLIGHT_TOKENS, against autograd's saved
    tensors of a real forward at batch x seq_len: never below, at most 20% above (the
    fixed costs of a short sequence are counted per token), a reference kernel's T x T
    scores included."""
    exp = tiny(data={"seq_len": 384, "batch_size": 3, "num_kv_pairs": 4},
               variants={"ref": {"block": "softmax", "backend": "reference"}})
    for variant in ("mha", "ssm", "ref"):
        a, c = pf.activation_bytes(build_model(bounded_config(exp, variant)), variant, 384,
                                   "cpu")
        estimate = static_estimate(exp, variant, variant).with_activations(a, c).activations
        real = saved_bytes(build_model(exp.variant_config(variant)),
                           torch.zeros(3, 384, dtype=torch.long))
        assert real <= estimate <= 1.2 * real, (variant, estimate, real)


def test_check_memory_passes_what_fits_and_skips_the_unknown():
    e = MemoryEstimate("v", 10, 40, 40, 80, 100, 1000, 50, 4, 16, processes=2)
    assert e.on_device("cpu") == 2 * (40 + 40 + 80 + 100 + 50) + 2 * 1000
    assert e.on_device("cuda") == 40 + 40 + 80 + 100 + 50  # data stays on the host
    check_memory(e, None, "cpu")  # unknown: nothing to check against
    check_memory(e, 2620, "cpu")
    with pytest.raises(ValueError, match="x 2 processes"):
        check_memory(e, 2619, "cpu")


# ---------------------------------------------------------------- warnings

def test_settings_that_defeat_their_purpose_are_warned_about():
    exp = tiny(train={"warmup_steps": 1000, "max_steps": 3},
               data={"batch_size": 100_000, "train_size": 20_000, "val_size": 3},
               monitor={"probe_size": 500})
    assert size_warnings(exp) == [
        "train.warmup_steps (1000) >= train.max_steps (3): the learning rate never leaves "
        "warmup",
        "data.batch_size (100000) > data.train_size (20000): every batch is the whole "
        "training set of 20000 examples",
        "monitor.probe_size (500) > data.val_size (3): the probe batch holds the 3 "
        "validation examples there are"]
    assert size_warnings(tiny()) == []


def test_warnings_go_to_stderr_and_the_notes(tmp_path, capsys):
    from train.experiment.stages import preflight as run_preflight

    notes = run_preflight(tiny(train={"warmup_steps": 10, "max_steps": 10}))
    assert capsys.readouterr().err == ("rankzoo: warning: train.warmup_steps (10) >= "
                                       "train.max_steps (10): the learning rate never "
                                       "leaves warmup\n")
    write_notes(tmp_path, notes)
    write_notes(tmp_path, [])
    assert (tmp_path / "notes.txt").read_text() == f"warning: {notes[0]}\n"


# ---------------------------------------------------------------- the matched MLP's floor

def test_matching_below_the_mlp_floor_names_the_nearest_feasible_setting():
    """The reference MQA at d_mlp=49: MHA's extra K/V would leave it d_mlp=1 (the issue's
    silently removed MLP); the error names the reference width that lifts it to 16."""
    raw = {"name": "m", "data": {"vocab_size": 16, "seq_len": 8, "num_kv_pairs": 2},
           "model": {"d_model": 64, "n_layers": 2, "d_mlp": 49},
           "block_defaults": {"n_heads": 4}, "match": {"params": True},
           "variants": {"mqa": {"block": "softmax", "n_kv_heads": 1},
                        "mha": {"block": "softmax"}}}
    with pytest.raises(ValueError, match=r"variant 'mha' .*at least d_mlp=16 \(the floor, "
                                         r"0\.25 x d_model\).*would give it d_mlp=1; nearest "
                                         r"feasible setting: model\.d_mlp=64"):
        parse_experiment(raw)
    raw["model"]["d_mlp"] = 64
    assert parse_experiment(raw).d_mlp == {"mqa": 64, "mha": 16}


# ---------------------------------------------------------------- blocks

def test_blocks_survives_a_preset_that_cannot_be_built(capsys):
    assert main(["blocks", "--d-model", "64", "--n-heads", "64", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    bad = {b["variant"]: b["error"] for b in doc["blocks"] if b.get("error")}
    assert bad["moe (top-1 of 64)"] == "RoPE needs an even head_dim, got 1"
    good = [b for b in doc["blocks"] if not b.get("error")]
    assert {b["block"] for b in good} >= {"linear", "mla", "ssm"}
    assert all(b["params"] > 0 for b in good)
    assert main(["blocks", "--d-model", "64", "--n-heads", "64"]) == 0
    out = capsys.readouterr().out
    assert "moe (top-1 of 64)" in out and "RoPE needs an even head_dim" in out
    assert "ssm (Mamba-2, N=16)" in out
