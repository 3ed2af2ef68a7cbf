"""Hybrid advice checked by training: `report --emit-check` writes the hybrid that swaps
the advised layers beside the original, its `check:` key records the layers, and the
report on the finished run reads it back as verified or refuted."""

from __future__ import annotations

import json

import pytest

from tests.train.conftest import tiny_experiment, write_run
from train.cli import main
from train.commands.check import attach_checks, emit_check, recorded_checks
from train.config import load_experiment
from train.render.advice import advice_markdown
from train.rundir.read import load_run

TWO_LAYERS = {"n_layers": 2}


def advise_hybrid(report: dict, layers=(1,), kept=(0,), state: int = 2) -> dict:
    """The report with the advice a partly flat variant gets: a cheaper_block item per
    swapped layer and the hybrid."""
    report["advice"] += [{"kind": "cheaper_block", "variant": "mha", "layer": i,
                          "state": state, "text": "a fixed state"} for i in layers]
    report["advice"].append({"kind": "hybrid", "variant": "mha", "layers": list(layers),
                             "kept": list(kept), "state": state, "text": "a hybrid"})
    return report


def layer_names(config: dict) -> list[tuple[str, dict]]:
    return [(ly["name"], {k: v for k, v in ly.items() if k != "name"})
            for ly in config["layers"]]


@pytest.mark.parametrize("original, kept", [
    ({"block": "softmax"}, ("softmax", {"n_heads": 2})),
    ({"layers": [{"block": "softmax"}, {"block": "sliding_window", "window": 4}]},
     ("sliding_window", {"n_heads": 2, "window": 4})),
], ids=["uniform", "layer-pattern"])
def test_emit_check_writes_the_hybrid_beside_the_original(tmp_path, capsys, original, kept):
    run = write_run(tmp_path, tiny_experiment(model=TWO_LAYERS, variants={"mha": original}))
    report = advise_hybrid(load_run(run), layers=(0,), kept=(1,))
    path = tmp_path / "check.yaml"
    emit_check(report, run, path)
    exp = load_experiment(path)
    assert list(exp.variants) == ["mha", "mha.l0_linear_f2", "mha.l0_ssm_n2", "mha.l0_delta_k2"]
    ssm = exp.variant_config("mha.l0_ssm_n2")
    assert layer_names(ssm) == [("ssm", {"d_state": 2, "n_heads": 2}), kept]
    linear = layer_names(exp.variant_config("mha.l0_linear_f2"))
    assert linear[0][0] == "linear" and linear[0][1]["feature_dim"] == 2 and linear[1] == kept
    record = {"of": "mha", "advice": "hybrid", "state": 2, "layers": [0]}
    assert exp.variants["mha.l0_ssm_n2"].check == record and ssm["check"] == record
    assert exp.to_dict()["variants"] == load_experiment(path).to_dict()["variants"]
    text = path.read_text()
    assert "checks the hybrid advice of mha" in text and "layer 0 realizes" in text
    assert "Declared cache per sequence at T = 16 in bfloat16: mha " in text
    assert "&id" not in text and "*id" not in text
    capsys.readouterr()
    assert main(["train", str(path), "--dry-run"]) == 0


def test_the_declared_caches_in_the_header_are_the_blocks_own(tmp_path):
    run = write_run(tmp_path, tiny_experiment(model=TWO_LAYERS))
    path = tmp_path / "check.yaml"
    emit_check(advise_hybrid(load_run(run)), run, path)
    line = next(ln for ln in path.read_text().splitlines() if "Declared cache" in ln)
    caches = dict(part.rsplit(" ", 2)[:2] for part in line.split(": ", 1)[1].split("; "))
    # MHA at T = 16, d_model 16: 2 x T x 16 elements per layer, 2 B each
    assert int(caches["mha"]) == 2 * 2 * 16 * 16 * 2
    assert int(caches["mha.l1_ssm_n2"]) < int(caches["mha"])


def check_run(tmp_path, candidate_metrics=None):
    """A finished check run: mha and its hybrid with layer 1 an SSM with N = 2; write_run
    gives both the same metrics unless `candidate_metrics` changes the hybrid's."""
    hybrid = {"layers": [{"block": "softmax"}, {"block": "ssm", "d_state": 2}],
              "check": {"of": "mha", "advice": "hybrid", "state": 2, "layers": [1]}}
    run = write_run(tmp_path, tiny_experiment(
        name="check", model=TWO_LAYERS,
        variants={"mha": {"block": "softmax"}, "mha.l1_ssm_n2": hybrid}))
    if candidate_metrics:
        path = run / "mha.l1_ssm_n2" / "report.json"
        doc = json.loads(path.read_text())
        doc["variants"][0]["metrics"].update(candidate_metrics)
        path.write_text(json.dumps(doc))
    return run


def test_a_hybrid_check_run_reads_back_as_verified(tmp_path):
    run = check_run(tmp_path)
    assert recorded_checks(run) == {"mha.l1_ssm_n2": {
        "of": "mha", "block": "ssm", "state": 2, "advice": "hybrid", "layers": [1]}}
    report = load_run(run)
    [item] = attach_checks(report, recorded_checks(run))
    assert (item["candidate"], item["advice"], item["layers"], item["verdict"]) == (
        "mha.l1_ssm_n2", "hybrid", [1], "verified")
    cache = item["cache_bytes"]
    assert cache["original"] == 2 * 2 * (2 * 16 * 16) and cache["candidate"] < cache["original"]
    assert "the hybrid advice (layer 1 at a fixed state of 2: an SSM with N = 2" in item["text"]
    assert f"{cache['original']} B -> {cache['candidate']} B" in item["text"]
    assert "the hybrid advice" in advice_markdown(report)


def test_a_hybrid_check_run_that_loses_accuracy_is_refuted(tmp_path, capsys):
    run = check_run(tmp_path, {"val/accuracy": 0.4})  # 0.1 below mha's 0.5
    assert main(["report", str(run), "--format", "json"]) == 0
    [item] = json.loads(capsys.readouterr().out)["advice_checks"]
    assert item["verdict"] == "refuted"
    assert not item["metrics"]["val/accuracy"]["within"]


HYBRID_CHECK = {"of": "mha", "advice": "hybrid", "state": 2, "layers": [1]}
SSM_LAYER = [{"block": "softmax"}, {"block": "ssm", "d_state": 2}]


@pytest.mark.parametrize("variant, message", [
    ({"layers": SSM_LAYER, "check": {**HYBRID_CHECK, "layers": [2]}},
     "variants.cheap.check.layers [2]: some but not all of the 2 layers (0 to 1)"),
    ({"layers": SSM_LAYER, "check": {k: v for k, v in HYBRID_CHECK.items() if k != "layers"}},
     "variants.cheap.check: missing layers"),
    ({"layers": SSM_LAYER, "check": {**HYBRID_CHECK, "layers": [1, 0]}},
     "variants.cheap.check.layers must be a non-empty ascending list of layer indices"),
    ({"layers": SSM_LAYER, "check": {**HYBRID_CHECK, "layers": [0]}},
     "variants.cheap.check.layers [0] hold softmax: the swapped layers hold one block that "
     "checks it (linear, ssm, delta)"),
    ({"layers": [{"block": "ssm", "d_state": 2}] * 2, "check": {**HYBRID_CHECK,
                                                                "layers": [0, 1]}},
     "variants.cheap.check.layers [0, 1]: some but not all"),
    ({"block": "ssm", "d_state": 2, "check": HYBRID_CHECK},
     "variants.cheap.check: a hybrid check is a layer pattern"),
    ({"block": "ssm", "d_state": 2, "check": {**HYBRID_CHECK, "advice": "cheaper_block"}},
     "variants.cheap.check.layers: only a check of hybrid advice swaps some layers"),
])
def test_a_bad_hybrid_check_key_is_a_located_config_error(tiny_yaml, capsys, variant,
                                                          message):
    path = tiny_yaml(model=TWO_LAYERS, variants={"cheap": variant})
    with pytest.raises(ValueError) as e:
        load_experiment(path)
    assert message in str(e.value) and str(e.value).startswith(f"{path}: ")
    assert main(["train", str(path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err
