"""`rankzoo compress --heal`: LoRA healing of a compressed setting, its projections in place.

The Hugging Face model is a tiny Llama trained in the fixture (conftest.py), so that an
over-compressed cache costs it loss; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

from train.cli import main
from train.commands.compress import CompressOptions, load_compressed
from train.commands.compress.bases.calibrate import calibrate, hf_data
from train.commands.compress.bases.lowrank import projectors
from train.commands.compress.heal import (
    HEAL_LOSSES,
    Adapter,
    ModelData,
    heal,
    heal_row,
    schedule,
)
from train.commands.compress.measure import measure
from train.commands.compress.options import HEAL_OBJECTIVES
from train.commands.compress.target.hf_surgery import HFTarget
from train.commands.compress.target.surgery import Surgery
from train.hf import load_model

pytest.importorskip("transformers", reason="compress --hf needs transformers")

SEQ = 32


def _cli(capsys, *args):
    code = main(["compress", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def measured(trained_llama, word_texts):
    """(target, calibration, evaluation ids, doc rows measured at 2x and 8x, ranks by row)
    of the trained Llama."""
    model, _ = load_model(trained_llama)
    target = HFTarget(model)
    calib_text, eval_text = (p.read_bytes() for p in word_texts)
    calib, evals = hf_data(calib_text, eval_text, None, 64, SEQ, 4, 4, False, "c", "e", [])
    cal = calibrate(target, calib, 2, "output")
    options = CompressOptions(ratios=(2, 8), tolerance=10, heal=4096)
    rows, chosen, _ = measure(target, cal, lambda: target.evaluate(evals, batch_size=4),
                              options, SEQ, None, [])
    heal_x = calib.repeat(4, 1)  # [16, SEQ]
    return target, cal, evals, {"rows": rows, "tolerance": 10, "source": {}}, chosen, heal_x


def _data(target, evals, heal_x) -> ModelData:
    return ModelData(lambda: (heal_x, None), lambda: target.evaluate(evals, batch_size=4),
                     evals, 4)


def test_healing_wins_back_loss_and_leaves_every_weight_as_it_was(measured):
    """At 8x the trained model loses loss; 4096 healing tokens of distillation win back
    a good part of it, every base weight is bit-identical afterwards and no hook stays."""
    target, cal, evals, doc, chosen, heal_x = measured
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    flags = [p.requires_grad for p in target.model.parameters()]
    hooks = [len(m._forward_hooks) for m in target.model.modules()]
    notes: list[str] = []
    healed = heal(doc, target, cal, chosen, CompressOptions(ratios=(2, 8), heal=4096),
                  _data(target, evals, heal_x), notes)
    curve = doc["heal"]["curve"]
    start, end = curve[0]["delta_loss"], curve[-1]["delta_loss"]
    assert doc["rows"][healed.row]["target"] == 8 and start > 0.05
    assert end < 0.8 * start, curve
    assert [p["step"] for p in curve] == schedule(doc["heal"]["steps"])
    assert curve[0]["loss"] == pytest.approx(doc["rows"][healed.row]["loss"], abs=1e-6)
    after = target.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [len(m._forward_hooks) for m in target.model.modules()] == hooks
    assert [p.requires_grad for p in target.model.parameters()] == flags
    # 8 projections: W_Q, W_K, W_V, W_O of 2 layers, each a rank-8 pair A [8, in], B [out, 8]
    # (hidden 32; W_K and W_V give 2 KV heads of 8)
    assert doc["heal"]["adapters"]["projections"] == 8
    assert doc["heal"]["adapters"]["params"] == 2 * 8 * ((32 + 32) * 2 + (32 + 16) * 2)


def test_the_healed_keys_and_values_stay_in_the_bases_span(measured):
    """Merged into the projected weights, the adapters keep P W = W on every head's rows
    of W_K and W_V: the healed model is served by the same rank-r cache."""
    target, cal, evals, doc, chosen, heal_x = measured
    healed = heal(doc, target, cal, chosen, CompressOptions(ratios=(2, 8), heal=1024),
                  _data(target, evals, heal_x), [])
    P = {k: projectors(cal.bases[k], healed.ranks[k], cal.encoders[k]) for k in healed.ranks}
    moved = sum(a.B.detach().abs().sum().item() for a in healed.adapters)
    assert moved > 0  # the adapters learned something
    surgery = Surgery()
    try:
        target.apply(surgery, P)
        healed.merge(surgery)
        for i, layer in enumerate(target.layers):
            for rows, kind in ((layer.k, "k"), (layer.v, "v")):
                w = rows.weight().double()  # [G*K, D]
                G, K, _ = P[(i, kind)].shape
                again = (P[(i, kind)] @ w.view(G, K, -1)).reshape(w.shape)
                assert torch.allclose(again, w, atol=1e-5), (i, kind)
    finally:
        surgery.restore()


def test_adapter_rows_are_projected_per_head():
    """Adapter.up(): the rows of projected heads become P_g B_g, the others stay B."""
    lin = torch.nn.Linear(4, 6)
    P = torch.zeros(1, 2, 2, dtype=torch.float64)
    P[0, 0, 0] = 1.0  # keep the first channel of the one head
    a = Adapter(lin, [(torch.tensor([2, 3]), P)], r=2)
    with torch.no_grad():
        a.B.copy_(torch.arange(12.0).view(6, 2))
    up = a.up()
    assert torch.equal(up[[0, 1, 4, 5]], a.B[[0, 1, 4, 5]])
    assert torch.equal(up[2], a.B[2]) and torch.equal(up[3], torch.zeros(2))


def test_the_setting_healed_is_the_best_at_its_ratio():
    rows = [{"allocation": "full", "target": None, "loss": 1.0},
            {"allocation": "uniform", "target": 2.0, "loss": 1.3},
            {"allocation": "greedy", "target": 2.0, "loss": 1.2},
            {"allocation": "uniform", "target": 4.0, "loss": 1.9},
            {"allocation": "greedy", "target": 4.0, "loss": 2.0}]
    assert heal_row({"rows": rows}, 2.0) == 2
    assert heal_row({"rows": rows}, None) == 3  # the largest ratio by default
    with pytest.raises(ValueError, match="heal_at=3: no setting was measured at that ratio"):
        heal_row({"rows": rows}, 3.0)


def test_schedule_and_objectives():
    assert schedule(100) == [0, 6, 12, 25, 50, 100]
    assert schedule(1) == [0, 1]
    assert set(HEAL_LOSSES) == set(HEAL_OBJECTIVES)


def test_heal_and_save_serve_the_healed_model(trained_llama, word_texts, tmp_path, capsys):
    """--heal with --save: the healed setting is saved, its loss the healed one, its cache
    holding the row's bytes; the table, the figure and --format json carry the curve."""
    calib, evals = word_texts
    out, plots = tmp_path / "s", tmp_path / "plots"
    code, stdout, err = _cli(capsys, "--hf", trained_llama, "--text", calib, "--eval-text",
                             evals, "--seq-len", SEQ, "--ratios", "2,8", "--heal", "2k",
                             "--heal-loss", "lm", "--save", out, "--plot", plots,
                             "--format", "json", "--cache-dtype", "fp32")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["heal"]["objective"] == "lm" and doc["heal"]["tokens"] >= 2000
    assert (plots / "heal.png").stat().st_size > 1000
    assert "healed" in err and "as the row counts" in err
    saved = load_compressed(out)
    model_loss = HFTarget(saved.model).evaluate(
        hf_data(calib.read_bytes(), evals.read_bytes(), None, 64, SEQ, 4, 4, False, "c",
                "e", [])[1], batch_size=4)["loss"]
    assert model_loss == pytest.approx(doc["heal"]["curve"][-1]["loss"], abs=1e-4)
    assert doc["saved"]["cache"]["held_bytes"] == doc["saved"]["cache"]["reported_bytes"]
    code, table, err = _cli(capsys, "--hf", trained_llama, "--text", calib, "--eval-text",
                            evals, "--seq-len", SEQ, "--ratios", "8", "--heal", "256")
    assert code == 0 and "heal uniform for 8x" in table and "recovered" in table


@pytest.mark.parametrize("args, message", [
    (("--heal-at", "2"), "--heal-at only applies with --heal TOKENS"),
    (("--heal", "1k", "--heal-at", "3"), "--heal-at 3: not among --ratios 2,8"),
    (("--heal", "lots"), "--heal lots: expected a count"),
    (("--heal", "1k", "--heal-loss", "mse"), "--heal-loss mse: one of distill, lm"),
])
def test_bad_heal_flags_are_one_line(trained_llama, word_texts, capsys, args, message):
    calib, evals = word_texts
    code, out, err = _cli(capsys, "--hf", trained_llama, "--text", calib, "--eval-text",
                          evals, "--ratios", "2,8", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_a_state_cache_is_refused_before_any_work(tmp_path):
    """Healing adapts KV caches' projections: a linear-attention run is refused at once."""
    from train.commands.compress.heal import check_heal

    class Linear:
        family = "linear"
        caches_kv = False

    with pytest.raises(ValueError, match="heal=10: healing adapts the attention projections"):
        check_heal(Linear(), CompressOptions(heal=10))


def test_a_zoo_variant_heals_and_saves_the_healed_weights(zoo_run, tmp_path):
    """A run heals on its training split: the saved checkpoint's validation loss is the
    healed one, its cache holds the row's bytes, and the run's own weights are untouched."""
    from train.commands.compress import compress_run
    from train.commands.compress.bases.calibrate import zoo_data
    from train.commands.compress.run import load_variant
    from train.commands.compress.target.zoo_surgery import ZooTarget

    out = tmp_path / "s"
    doc = compress_run(zoo_run / "mha", CompressOptions(ratios=(4,), heal=512, tolerance=10,
                                                       cache_dtype="fp32", save=str(out)))
    h = doc["heal"]
    assert h["setting"].endswith("4x") and h["steps"] == 4 and h["sequences"] == 32
    assert doc["saved"]["cache"]["held_bytes"] == doc["saved"]["cache"]["reported_bytes"]
    saved, config, _ = load_variant(out)
    _, eval_x, eval_y = zoo_data(config, CompressOptions(), [])
    loss = ZooTarget(saved).evaluate(eval_x, eval_y, 8)["loss"]
    assert loss == pytest.approx(h["curve"][-1]["loss"], abs=1e-5)
    original, _, _ = load_variant(zoo_run / "mha")
    assert ZooTarget(original).evaluate(eval_x, eval_y, 8)["loss"] == pytest.approx(
        doc["rows"][0]["loss"], abs=1e-6)
