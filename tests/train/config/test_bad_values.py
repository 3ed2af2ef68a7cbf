"""Values a config may not hold, refused when it is loaded (so `--dry-run` sees them),
each error naming the key: non-finite numbers, seeds past what the generators take, names
too long for a directory, sizes past what can be built, keys written twice."""

import math

import pytest
import yaml

from tests.train.cli.test_fuzz import run_cli
from tests.train.conftest import tiny_experiment
from train.cli import main
from train.config import load_experiment, parse_experiment
from train.config.yaml_parse import parse_yaml
from train.data.markov import MarkovSpec, markov_transitions, stationary_distribution


@pytest.mark.parametrize("override,named", [
    ("data.power_a=.inf", "data.power_a must be a finite number, got inf"),
    ("train.lr=.inf", "train.lr must be a finite number"),
    ("seed=4294967296", "seed must be a non-negative int up to 4294967295"),
    ("data.permute_seed=100000000000000000000", "data.permute_seed must be a non-negative int"),
    ("data.permute_seed=1e20", "data.permute_seed must be int or null"),
    ("sweep.seed=[4294967296]", "sweep.seed values must be a non-negative int up to"),
    ("sweep.lr=[.inf]", "sweep.lr values must be finite"),
    ("name=" + "a" * 256, "name is 256 characters long; a directory name takes at most 255"),
    ("variants." + "v" * 300 + ".block=softmax", "is 300 characters long"),
    ("model.n_layers=100000", "model.n_layers must be <= 1024, got 100000"),
    ("model.d_model=1000000000000", "model.d_model must be <= 1048576"),
    (f"data.vocab_size={2 ** 63}", "data.vocab_size must be <= 16777216"),  # past an int64
    ("model.mlp_ratio=1e30", "model's MLP width must be <="),
])
def test_a_bad_value_is_refused_by_the_dry_run(tmp_path, override, named):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment()))
    code, _, err = run_cli(["train", config, override, "--dry-run"], tmp_path)
    assert code == 2, err
    assert "Traceback" not in err and err.count("rankzoo: error:") == 1
    assert named in err, err


def test_a_long_fine_tune_name_is_refused_before_training():
    raw = tiny_experiment(variants={"v" * 250: {"block": "softmax"}}, finetune={
        "ranks": [4], "data": tiny_experiment()["data"]})
    with pytest.raises(ValueError, match=r"fine-tune directory name .* 258 characters"):
        parse_experiment(raw)


def test_a_key_written_twice_is_named_with_its_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: tiny\nvariants:\n  mha: {block: softmax}\n"
                    "  mha: {block: softmax, n_kv_heads: 1}\n")
    with pytest.raises(ValueError, match=r"dup.yaml:4: .*duplicate key 'mha'"):
        load_experiment(path)


def test_a_yaml_merge_may_still_override_a_key():
    assert parse_yaml("a: &base {x: 1}\nb:\n  <<: *base\n  x: 2\n", "merge.yaml") == \
        {"a": {"x": 1}, "b": {"x": 2}}


@pytest.mark.parametrize("temperature", [0.03, 0.01, 0.001, 1e-6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_markov_baseline_is_finite_at_low_temperature(temperature, seed):
    """Near-deterministic chains underflow to zeros and may split into classes: the
    stationary distribution is still one (pi P = pi, entries >= 0, sum 1), and the floor
    and unigram loss are finite, 0 <= floor <= unigram."""
    spec = MarkovSpec(16, 16, 2, temperature)
    P = markov_transitions(spec, seed)
    pi = stationary_distribution(P)
    assert (pi >= 0).all() and math.isclose(float(pi.sum()), 1.0, rel_tol=1e-12)
    assert float((pi @ P - pi).abs().max()) < 1e-9
    base = spec.baseline(seed)
    floor, unigram = base["entropy_floor"], base["unigram_loss"]
    assert math.isfinite(floor) and math.isfinite(unigram)
    assert 0 <= floor <= unigram + 1e-12


def test_the_stationary_distribution_of_a_chain_that_splits():
    """Closed classes entered from the uniform start, each weighed by the chance of falling
    into it: {0} and the cycle {1, 2} (1/3 and 2/3, 1 and 2 alternating with equal
    weight); then {0} and {2}, with 1 leaking into 0 (2/3 and 1/3)."""
    import torch
    P = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]], dtype=torch.float64)
    pi = stationary_distribution(P)
    assert torch.allclose(pi, torch.tensor([1 / 3, 1 / 3, 1 / 3], dtype=torch.float64))
    P = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 0, 1.0]], dtype=torch.float64)
    assert torch.allclose(stationary_distribution(P),
                          torch.tensor([2 / 3, 0, 1 / 3], dtype=torch.float64), atol=1e-12)


def test_a_markov_run_at_low_temperature_reports(tmp_path, tiny_yaml):
    config = tiny_yaml(tiny_experiment("markov", data={"temperature": 0.01}, seed=1))
    assert main(["train", str(config), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert (tmp_path / "runs" / "tiny" / "mha" / "report.json").is_file()
