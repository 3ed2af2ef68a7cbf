"""The report's advice against an outcome: KV advice with the loss change `rankzoo
compress` measured at its ranks, and a cheaper-block suggestion trained beside its variant
by the experiment `report --emit-check` writes."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from budgets.advice.hybrid import state_blocks
from tests.train.conftest import tiny_experiment, write_run
from train.cli import main
from train.commands.check import (
    attach_checks,
    attach_measured,
    check_kv,
    emit_check,
    read_compressed,
    recorded_checks,
)
from train.commands.check.outcome import ACCURACY_TOLERANCE, LOSS_TOLERANCE
from train.commands.compress import CompressOptions
from train.config import load_experiment, parse_experiment
from train.config.parse import advice_checks
from train.experiment.stages import train_experiment
from train.render.advice import advice_markdown, advice_text
from train.rundir.read import load_run

QUIET = Console(quiet=True)


def kv_item(kind: str, variant: str = "mha") -> dict:
    return {"kind": kind, "variant": variant, "layer": 0, "options": {}, "text": "a cache"}


def compress_doc(variant: str, verdict: str | None, delta: float = 0.01) -> dict:
    v = {"verdict": verdict, "tolerance": 0.02, "largest_ratio_within": None}
    if verdict is not None:
        v |= {"advised_ratio": 1.6, "advised_delta_loss": delta}
    return {"schema": "rankzoo.compress", "source": {"variant": variant}, "verdict": v}


# ---------------------------------------------------------------- measured KV advice

def test_measured_loss_goes_beside_each_kv_item_of_its_variant(tmp_path):
    report = load_run(write_run(tmp_path, tiny_experiment(variants={"mqa": {
        "block": "softmax", "n_kv_heads": 1}})))
    report["advice"] = [kv_item("kv_cache"), kv_item("kv_cache_summary"),
                        kv_item("kv_cache_summary", "mqa"), {"kind": "note", "text": "n"}]
    report["findings"] = [{**kv_item("finding"), "topic": "no_saving"},
                          {**kv_item("finding"), "topic": "under_used"}]
    notes = attach_measured(report, [compress_doc("mha", "refuted", 0.3),
                                     compress_doc("gone", "verified"),
                                     compress_doc("mqa", None)])
    mha = [a for a in report["advice"] if a.get("variant") == "mha"]
    assert all(a["measured"]["verdict"] == "refuted" for a in mha)
    assert all(a["measured"]["delta_loss"] == 0.3 for a in mha)
    assert "measured" not in report["advice"][2] and "measured" not in report["advice"][3]
    assert "+0.3000 nats per token at its ratio of 1.60x: refuted" in advice_text(mha[0])
    assert "refuted" in advice_markdown(report)
    assert report["findings"][0]["measured"]["verdict"] == "refuted"
    assert "measured" not in report["findings"][1]
    assert any("'gone' is not in this report" in n for n in notes)
    assert any("measured no advised ranks" in n for n in notes)


def test_read_compressed_refuses_what_is_not_a_compress_document(tmp_path):
    bad, other = tmp_path / "bad.json", tmp_path / "other.json"
    bad.write_text("{not json")
    other.write_text(json.dumps({"schema": "rankzoo.report"}))
    with pytest.raises(ValueError, match="bad.json: not JSON"):
        read_compressed([bad])
    with pytest.raises(ValueError, match="other.json: not a rankzoo.compress document"):
        read_compressed([other])
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_compressed([tmp_path / "missing.json"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny experiment trained for its 6 steps (checkpoints, report.json)."""
    root = tmp_path_factory.mktemp("runs")
    train_experiment(parse_experiment(tiny_experiment()), root, console=QUIET)
    return root / "tiny"


def test_check_measures_the_advised_ranks_and_writes_nothing(trained):
    report = load_run(trained)
    report["advice"].append(kv_item("kv_cache_summary"))
    before = {p: p.stat().st_mtime_ns for p in trained.rglob("*") if p.is_file()}
    said = []
    check_kv(trained, report, CompressOptions(ratios=(2.0,), allocations=("uniform",),
                                              calib_size=4), say=said.append)
    m = report["advice"][-1]["measured"]
    assert m["verdict"] == ("verified" if m["delta_loss"] <= m["tolerance"] else "refuted")
    assert m["ratio"] > 0 and "rankzoo compress" in said[0]  # the cost is said first
    assert {p: p.stat().st_mtime_ns for p in trained.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------- cheaper-block check

def cheaper_block(state: int, layer: int = 0) -> dict:
    return {"kind": "cheaper_block", "variant": "mha", "layer": layer, "state": state,
            "text": "a fixed state"}


def test_emit_check_writes_a_matched_experiment_and_keeps_what_exists(trained, tmp_path):
    report = load_run(trained)
    report["advice"].append(cheaper_block(3))
    path = tmp_path / "check.yaml"
    raw = emit_check(report, trained, path)
    exp = load_experiment(path)
    assert list(exp.variants) == ["mha", "mha.linear_f3", "mha.ssm_n3", "mha.delta_k3"]
    assert exp.variant_config("mha.ssm_n3")["block"]["d_state"] == 3
    assert exp.variant_config("mha.delta_k3")["block"]["key_dim"] == 3
    assert exp.variant_config("mha.linear_f3")["block"]["feature_dim"] == 3
    assert exp.match.params and exp.data.seq_len == 16 and raw["name"] == "check"
    # the record is a key, kept from the file to each run's config and back to YAML
    record = {"of": "mha", "advice": "cheaper_block", "state": 3}
    for name in ("mha.ssm_n3", "mha.linear_f3"):
        assert exp.variants[name].check == record
        assert exp.variant_config(name)["check"] == record
        assert exp.to_dict()["variants"][name]["check"] == record
    assert not exp.variants["mha"].check and "check" not in exp.variant_config("mha")
    assert parse_experiment(exp.to_dict()).variants["mha.ssm_n3"].check == record
    text = path.read_text()
    assert "layer 0 realizes" in text and f"rankzoo train {path}" in text
    assert "&id" not in text and "*id" not in text  # each record written out, no aliases
    with pytest.raises(FileExistsError, match="pass --force"):
        emit_check(report, trained, path)
    assert path.read_text() == text
    report["advice"] = []
    with pytest.raises(ValueError, match="no variant has cheaper-block advice"):
        emit_check(report, trained, tmp_path / "none.yaml")
    with pytest.raises(ValueError, match="mha has no cheaper-block advice"):
        emit_check(report, trained / "mha", tmp_path / "none.yaml")
    assert not (tmp_path / "none.yaml").exists()


def test_emitted_check_trains_and_its_report_gives_the_verdict(trained, tmp_path, capsys):
    """End to end: the advice emits its experiment, `rankzoo train` trains it and ends with
    the verdicts, and the report of its run says whether each suggested block matched the
    original."""
    report = load_run(trained)
    report["advice"].append(cheaper_block(2))
    path = tmp_path / "check.yaml"
    emit_check(report, trained, path)
    capsys.readouterr()
    assert main(["train", str(path), "--runs-dir", str(tmp_path / "runs"),
                 "--format", "json"]) == 0
    ended = json.loads(capsys.readouterr().out)["advice_checks"]
    checked = load_run(tmp_path / "runs" / "check")
    items = attach_checks(checked, recorded_checks(tmp_path / "runs" / "check"))
    assert [(c["candidate"], c["block"], c["state"]) for c in items] == [
        ("mha.linear_f2", "linear", 2), ("mha.ssm_n2", "ssm", 2), ("mha.delta_k2", "delta", 2)]
    metrics = {v["variant"]: v["metrics"] for v in checked["variants"]}
    for c in items:  # the verdict, recomputed from the runs' own metrics
        a, b = metrics["mha"], metrics[c["candidate"]]
        ok = (a["val/accuracy"] - b["val/accuracy"] <= ACCURACY_TOLERANCE
              and b["val/loss"] - a["val/loss"] <= LOSS_TOLERANCE)
        assert c["verdict"] == ("verified" if ok else "refuted")
        assert c["verdict"] in c["text"]
    assert "## Advice checked by training" in advice_markdown(checked)
    assert ended == items  # the end of `rankzoo train` says the same as `report`


CHECK = {"of": "mha", "advice": "cheaper_block", "state": 2}


def test_report_matches_a_check_by_its_key_whatever_its_name(tmp_path, capsys):
    """The `check:` key is the record: a variant named anything is matched to the variant
    it names, and a name that looks like a check without the key is no check."""
    run = write_run(tmp_path, tiny_experiment(variants={
        "cheap": {"block": "ssm", "d_state": 2, "check": CHECK},
        "check.mha.ssm_n2": {"block": "ssm", "d_state": 2}}))
    assert main(["report", str(run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [item] = doc["advice_checks"]
    assert (item["variant"], item["candidate"], item["state"]) == ("mha", "cheap", 2)
    assert item["metrics"]["val/loss"]["difference"] == 0.0  # write_run's equal metrics
    assert item["verdict"] == "verified"
    assert recorded_checks(run / "cheap") == {}  # one variant alone has no original


def test_a_sweeps_check_is_matched_at_the_same_grid_point(tmp_path):
    run = write_run(tmp_path, tiny_experiment(
        variants={"cheap": {"block": "ssm", "d_state": 2, "check": CHECK}},
        sweep={"lr": [0.001, 0.003]}), sweep=True)
    assert recorded_checks(run) == {
        f"cheap_lr{lr}": {"of": f"mha_lr{lr}", "block": "ssm", "state": 2,
                          "advice": "cheaper_block"}
        for lr in ("0.001", "0.003")}


@pytest.mark.parametrize("check, message", [
    ({**CHECK, "stat": 2}, "unknown variant check key 'variants.cheap.check.stat'; did you "
                           "mean 'variants.cheap.check.state'?"),
    ({**CHECK, "of": "gone"}, "variants.cheap.check.of: 'gone' is not a variant of the "
                              "experiment; one of ['mha']"),
    ({**CHECK, "of": "cheap"}, "variants.cheap.check.of: 'cheap' is this variant itself"),
    ({**CHECK, "state": 0}, "variants.cheap.check.state must be a positive int, got 0"),
    ({**CHECK, "advice": "kv_cache"}, "variants.cheap.check.advice must be one of "
                                      "['cheaper_block', 'hybrid'], got 'kv_cache'"),
    ({"of": "mha"}, "variants.cheap.check: missing advice, state"),
    ("mha", "variants.cheap.check must be a mapping"),
])
def test_a_bad_check_key_is_a_located_config_error(tiny_yaml, capsys, check, message):
    path = tiny_yaml(variants={"cheap": {"block": "ssm", "d_state": 2, "check": check}})
    with pytest.raises(ValueError) as e:
        load_experiment(path)
    assert message in str(e.value) and str(e.value).startswith(f"{path}: ")
    assert main(["train", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_only_a_fixed_state_block_checks_cheaper_block_advice(tiny_yaml):
    path = tiny_yaml(variants={"mqa": {"block": "softmax", "n_kv_heads": 1, "check": CHECK}})
    with pytest.raises(ValueError, match=r"a softmax block cannot check cheaper_block advice "
                                         r"\(the blocks that do: linear, ssm, delta\)"):
        load_experiment(path)


def test_the_advice_names_every_block_that_can_check_it():
    """The advice's wording (budgets, which does not import the zoo) names each block that
    --emit-check trains for it, so that a new fixed-state family is not trained unnamed."""
    named = state_blocks(7)
    checks = advice_checks("cheaper_block")
    assert {block for block, _ in checks} == {"linear", "ssm", "delta"}
    for block, check in checks:
        assert check.text.format(n=7) in named, block


def test_report_check_flags_refuse_bad_combinations(tmp_path, capsys):
    run = write_run(tmp_path, tiny_experiment())
    with pytest.raises(SystemExit) as e:
        main(["report", str(run), "--force"])
    assert e.value.code == 2
    assert "--force only applies with --emit-check" in capsys.readouterr().err
    assert main(["report", str(run), "--emit-check", str(tmp_path / "c.yaml")]) == 2
    assert "no variant has cheaper-block advice" in capsys.readouterr().err
    assert not (tmp_path / "c.yaml").exists()
