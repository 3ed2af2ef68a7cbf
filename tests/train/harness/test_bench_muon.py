"""python -m benches.train.harness.bench_muon --curve: the loss curves of the variant
trained with torch's Muon and with each of ours, against the seed-to-seed yardstick (not a
timed test)."""

import re

import pytest

from benches.train.harness.bench_muon import curve_gaps, main
from tests.train.conftest import tiny_experiment

MUON = {"optimizer": "muon", "lr": 1e-2, "max_steps": 8}


def test_curve_gaps_measure_the_step_and_the_mean_gap():
    base = [1.0, 0.5, 0.25, 0.125] * 20
    assert curve_gaps(base, base) == {"step": 0.0, "mean": 0.0, "final": pytest.approx(
        sum(base[-50:]) / 50), "final_ref": pytest.approx(sum(base[-50:]) / 50)}
    shifted = curve_gaps([v + 0.1 for v in base], base)
    assert shifted["step"] == pytest.approx(0.1) and shifted["mean"] == pytest.approx(0.1)
    # one outlier step: the step gap sees it whole, the 50-step mean a fiftieth of it
    spike = curve_gaps([v + (1.0 if i == 40 else 0.0) for i, v in enumerate(base)], base)
    assert spike["step"] == pytest.approx(1.0) and spike["mean"] == pytest.approx(0.02)


def test_ours_follows_torchs_curve_closer_than_another_seed(tiny_yaml, capsys):
    config = str(tiny_yaml(tiny_experiment(train=MUON)))
    with pytest.raises(SystemExit) as done:
        main(["--curve", "--config", config, "--variant", "mha"])
    out = capsys.readouterr().out
    gap = {name: float(g) for name, g in
           re.findall(r"^  (.+?)\s+largest step gap ([\d.]+)", out, flags=re.M)}
    assert set(gap) == {"ours, bf16", "ours, fp32", "ours, detected", "torch Muon, seed +1"}
    assert gap["ours, bf16"] < 1e-3 < gap["torch Muon, seed +1"]  # bf16: torch's update
    assert gap["ours, fp32"] < gap["torch Muon, seed +1"]
    assert done.value.code == 0 and "seed-to-seed gap" in out


def test_a_variant_without_muon_is_refused(tiny_yaml):
    config = str(tiny_yaml(tiny_experiment()))  # AdamW: the default
    with pytest.raises(SystemExit, match="does not train with Muon"):
        main(["--curve", "--config", config, "--variant", "mha"])
