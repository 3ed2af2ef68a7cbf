"""python -m benches.train.harness.bench_loop: a variant run alone as it runs beside the
others, the plain loop it is timed against, its table and its errors (not a timed test:
the timing itself starts processes; tests/train/harness/test_throughput.py checks that the
loop's losses are the harness's)."""

import json
import pathlib
import sys

import pytest

from benches.train.harness.bench_loop import (
    Timing,
    alone_overrides,
    imported_train,
    main,
    plain_loop,
    rows,
)
from tests.train.conftest import MQA, tiny_experiment
from train.config import load_experiment

RAW = tiny_experiment(name="b", variants={"mqa": MQA, "moe": {"block": "moe", "top_k": 1}},
                      match={"params": True})


@pytest.fixture
def config(tiny_yaml):
    return str(tiny_yaml(RAW))


def test_a_variant_alone_keeps_the_width_matching_gave_it_beside_the_others(config):
    exp = load_experiment(config)
    widths = {v: exp.variant_config(v)["model"]["d_mlp"] for v in exp.variants}
    assert len(set(widths.values())) > 1  # matching moved some widths off mha's
    for variant, width in widths.items():
        overrides = alone_overrides(exp, config, variant, steps=4, device="cpu")
        alone = load_experiment(config, overrides)
        assert list(alone.variants) == [variant] and f"model.d_mlp={width}" in overrides
        got, want = alone.variant_config(variant), exp.variant_config(variant)
        assert got["model"] == want["model"] and got["train"]["max_steps"] == 4
        assert {k: v for k, v in got["train"].items() if k != "max_steps"} == \
            {k: v for k, v in want["train"].items() if k != "max_steps"}


def test_the_plain_loop_trains_the_steps_asked_without_lightning(config):
    exp = load_experiment(config, alone_overrides(load_experiment(config), config, "moe",
                                                  steps=3, device="cpu"))
    r = plain_loop(exp, "moe")  # MoE: its balancing loss enters the backward, as in the harness
    assert len(r["losses"]) == 3 and r["loss"] == r["losses"][-1]
    assert r["tokens"] == 3 * RAW["data"]["batch_size"] * RAW["data"]["seq_len"]
    assert r["lightning"] == ("lightning" in sys.modules)  # this process: whatever ran before


def test_the_rows_take_each_process_at_its_fastest_repeat_against_the_same_loop():
    loop = [Timing(20.0, 16.0, 1000, 0.5, cpu=12.0), Timing(10.0, 8.0, 1000, 0.4, cpu=14.0)]
    harness = {"harness": [Timing(12.0, 9.0, 1000, 0.3, cpu=13.0),
                           Timing(30.0, 17.0, 1000, 0.3, cpu=15.0)],
               "harness @ /old": [Timing(20.0, 9.0, 1000, 0.3), Timing(25.0, 9.0, 1000, 0.3)]}
    (now, split), (old, _) = rows("mha", loop, harness)
    # the loop's fastest is its second repeat (10 s), the harness's its first (12 s)
    assert now == ("mha", "12.0", "10.0", "1.20x", f"{13 / 12:.2f}x", "83", "100")
    assert split == ("mha", "9.0", "8.0", "3.0", "2.0", "0.3", "0.4")
    assert old[0] == "mha (@ /old)" and old[3] == "2.00x"


@pytest.mark.parametrize(("argv", "message"), [
    (["--variant", "gqa"], "--variant 'gqa' is not in"),
    (["--steps", "0"], "--steps and --repeats must be >= 1, got 0"),
    (["--harness-tree", "/nonexistent"], "--harness-tree /nonexistent: no train/ package"),
])
def test_bad_arguments_are_one_line_errors(config, capsys, argv, message):
    assert main(["--config", config, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_loop_process_prints_its_result_as_json(config, capsys):
    overrides = alone_overrides(load_experiment(config), config, "mha", steps=2, device="cpu")
    assert main(["--plain-loop", "mha", "--config", config,
                 "--overrides", json.dumps(overrides)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["losses"]) == 2 and r["train_seconds"] > 0


def test_another_tree_s_harness_imports_that_tree_s_train(tmp_path, monkeypatch):
    """`python -m` puts the working directory ahead of PYTHONPATH: started from this
    repository, an older tree's harness would import this tree's train/ instead."""
    tree = tmp_path / "old"
    (tree / "train").mkdir(parents=True)
    (tree / "train" / "__init__.py").write_text("")
    monkeypatch.chdir(pathlib.Path(__file__).parents[3])  # the repository, train/ beside
    assert imported_train(str(tree)) == (tree / "train" / "__init__.py").resolve()
