"""`rankzoo compress`: caches projected to low rank, measured against the loss.

Zoo models are built here (and a finished run's directory written by hand, with a
checkpoint), Hugging Face models are tiny random ones saved into tmp directories: nothing
is trained or downloaded.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import budgets
import zoo
from tests.train.conftest import tiny_experiment
from train.cli import main
from train.commands.compress import CompressOptions, compress_run
from train.commands.compress.bases.calibrate import calibrate, disjoint_rows, zoo_data
from train.commands.compress.bases.lowrank import full_ranks, projectors
from train.commands.compress.run import load_variant
from train.commands.compress.saved.save import save_compressed
from train.commands.compress.target.zoo_projections import PROJECTIONS
from train.commands.compress.target.zoo_surgery import ZooTarget
from train.config import parse_experiment
from train.data import make_splits
from train.lm.decoder import DecoderLM, build_model
from train.rundir.files import write_yaml
from train.rundir.read import load_run
from zoo.facts import CACHE_KINDS
from zoo.registry import register, unregister

VOCAB = 16
FAMILIES = {
    "mha": ("softmax", {"n_heads": 2}),
    "gqa-norope": ("softmax", {"n_heads": 4, "n_kv_heads": 2, "rope": False}),
    "window": ("sliding_window", {"n_heads": 2, "window": 4}),
    "mla": ("mla", {"n_heads": 2, "kv_lora_rank": 8}),
    "moe": ("moe", {"n_heads": 2, "top_k": 1}),
    "linear": ("linear", {"n_heads": 2, "feature_map": "taylor", "feature_dim": 2}),
    "ssm": ("ssm", {"n_heads": 2, "d_state": 4}),
    "gdn": ("delta", {"n_heads": 2, "key_dim": 4}),
    "kda": ("delta", {"n_heads": 2, "key_dim": 4, "gate": "channel"}),
}


def tiny(block: str, seed: int = 0, **kwargs) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(VOCAB, 16, 2, block, kwargs, max_len=32).eval()


def tokens(n: int = 6, T: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def projected_logits(target: ZooTarget, ranks: dict, calib: torch.Tensor,
                     x: torch.Tensor, bases: str = "energy") -> torch.Tensor:
    cal = calibrate(target, calib, 4, bases)
    P = {key: projectors(cal.bases[key], ranks[key], cal.encoders[key]) for key in ranks}
    with torch.no_grad(), target.projected(P):
        return target.model(x)


# ---------------------------------------------------------------- exactness

@pytest.mark.parametrize("bases", ["energy", "output"])
@pytest.mark.parametrize("name", [*FAMILIES, "mha-post-rope", "window-post-rope", "moe-post-rope"])
def test_full_rank_equals_the_original(name, bases):
    block, kwargs = FAMILIES[name.removesuffix("-post-rope")]
    model = tiny(block, **kwargs)
    keys = "post-rope" if name.endswith("post-rope") else "auto"
    target = ZooTarget(model, keys)
    x, y = tokens(seed=2), tokens(seed=3)
    with torch.no_grad():
        before = model(x)
    after = projected_logits(target, full_ranks(target.slots), tokens(), x, bases)
    assert (after - before).abs().max() < 1e-4
    with torch.no_grad():
        assert torch.equal(model(x), before)  # the surgery was undone
    one = {s.key: [1] * s.heads for s in target.slots}
    assert (projected_logits(target, one, tokens(), x, bases) - before).abs().max() > 1e-6
    cal = calibrate(target, tokens(), 4, bases)
    weighted = bases == "output" and block != "moe"  # its routed experts: energy bases
    assert set(cal.used.values()) == {"output" if weighted else "energy"}
    P = {s.key: projectors(cal.bases[s.key], [s.width] * s.heads, cal.encoders[s.key])
         for s in target.slots}
    with target.projected(P):
        loss = target.evaluate(x, y, 4)["loss"]
    assert loss == pytest.approx(target.evaluate(x, y, 4)["loss"], abs=2e-6)


def plant_rank(linear: torch.nn.Linear, heads: int, r: int, seed: int) -> None:
    """Make each head's rows of W a rank-r matrix: its outputs span r directions."""
    g = torch.Generator().manual_seed(seed)
    K = linear.out_features // heads
    with torch.no_grad():
        for h in range(heads):
            a = torch.randn(K, r, generator=g)
            b = torch.randn(r, linear.in_features, generator=g) / linear.in_features ** 0.5
            linear.weight[h * K:(h + 1) * K] = a @ b


def planted_softmax(r: int) -> DecoderLM:
    model = tiny("softmax", n_heads=2, n_kv_heads=2, head_dim=8)
    for i, block in enumerate(model.blocks):
        plant_rank(block.k_proj, 2, r, seed=10 + i)
        plant_rank(block.v_proj, 2, r, seed=20 + i)
    return model


def test_a_planted_rank_r_cache_loses_nothing_at_r_and_something_below():
    r = 3
    model = planted_softmax(r)
    target = ZooTarget(model)  # keys before RoPE
    x = tokens(seed=5)
    with torch.no_grad():
        before = model(x)
    at = {s.key: [r] * s.heads for s in target.slots}
    below = {s.key: [r - 1] * s.heads for s in target.slots}
    assert (projected_logits(target, at, tokens(), x) - before).abs().max() < 1e-4
    assert (projected_logits(target, below, tokens(), x) - before).abs().max() > 1e-3


def test_mla_latent_of_planted_rank():
    r = 3
    model = tiny("mla", n_heads=2, kv_lora_rank=8)
    for i, block in enumerate(model.blocks):
        with torch.no_grad():  # the latent rows of kv_down: rank r (the norm keeps the span)
            g = torch.Generator().manual_seed(i)
            block.kv_down.weight[:8] = torch.randn(8, r, generator=g) @ torch.randn(
                r, 16, generator=g)
    target = ZooTarget(model)
    x = tokens(seed=5)
    with torch.no_grad():
        before = model(x)
    at = {s.key: [r] for s in target.slots}
    assert (projected_logits(target, at, tokens(), x) - before).abs().max() < 1e-4
    below = {s.key: [r - 1] for s in target.slots}
    assert (projected_logits(target, below, tokens(), x) - before).abs().max() > 1e-3


def test_rope_keys_are_projected_before_the_rotation():
    """Keys of rank r before RoPE: projected there, nothing is lost at r; the rotated keys
    have a higher rank, so a basis of r directions after RoPE loses something."""
    r = 3
    model = planted_softmax(r)
    x = tokens(seed=5)
    with torch.no_grad():
        before = model(x)
    pre, post = ZooTarget(model, "pre-rope"), ZooTarget(model, "post-rope")
    at = {s.key: [r] * s.heads for s in pre.slots}
    pre_logits = projected_logits(pre, at, tokens(), x)
    post_logits = projected_logits(post, at, tokens(), x)
    assert (pre_logits - before).abs().max() < 1e-4
    assert (post_logits - before).abs().max() > 1e-3
    assert (post_logits - pre_logits).abs().max() > 1e-3
    # at r = head_dim the rotation meets the keys it would have met
    full = {s.key: [8] * s.heads for s in pre.slots}
    assert (projected_logits(pre, full, tokens(), x) - before).abs().max() < 1e-4


def test_keys_that_do_not_apply_are_one_line_errors():
    with pytest.raises(ValueError, match="keys=pre-rope: the softmax block .*has no RoPE"):
        ZooTarget(tiny("softmax", n_heads=2, rope=False), "pre-rope")
    with pytest.raises(ValueError, match="keys=post-rope: only attention with a KV cache"):
        ZooTarget(tiny("linear", n_heads=2), "post-rope")


def test_every_cache_kind_has_its_projection():
    assert set(PROJECTIONS) == set(CACHE_KINDS)


@pytest.mark.parametrize("name", ["window", "mla", "ssm", "gdn"])
def test_a_new_block_of_a_known_cache_kind_needs_no_edit_in_compress(name):
    """A user's block (a family's math under facts of its own) is projected by the kind
    of cache it declares: full rank keeps its logits, rank 1 changes them."""
    block, kwargs = FAMILIES[name]
    parent = zoo.block_class(block)
    facts = dataclasses.replace(parent.facts, mirrors=(), checks=())
    register("toy")(type("Toy", (parent,), {"facts": facts}))
    try:
        model = tiny("toy", **kwargs)
        target = ZooTarget(model)
        assert target.block_kind == "toy" and target.cache_kind == parent.facts.cache
        x = tokens(seed=2)
        with torch.no_grad():
            before = model(x)
        full = projected_logits(target, full_ranks(target.slots), tokens(), x, "output")
        assert (full - before).abs().max() < 1e-4
        one = {s.key: [1] * s.heads for s in target.slots}
        assert (projected_logits(target, one, tokens(), x) - before).abs().max() > 1e-6
    finally:
        unregister("toy")


# ---------------------------------------------------------------- a finished run

RAW = tiny_experiment(
    name="cz", data={"task": "mqar", "vocab_size": VOCAB * 2, "train_size": 64, "val_size": 24},
    model={"n_layers": 2},
    variants={"mla": {"block": "mla", "kv_lora_rank": 8},
              "linear": {"block": "linear", "feature_map": "taylor", "feature_dim": 2},
              "gdn": {"block": "delta", "key_dim": 4}})
RAW["train"], RAW["monitor"] = {"max_steps": 7, "warmup_steps": 1}, {"probe_size": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """runs/cz/<variant>/ as training leaves it: config.yaml, checkpoints/last.ckpt, and a
    report.json and ranks.jsonl probed from those very weights."""
    exp = parse_experiment(RAW)
    exp_dir = tmp_path_factory.mktemp("runs") / exp.name
    exp_dir.mkdir()
    write_yaml(exp_dir / "experiment.yaml", exp.to_dict())
    _, (val, _) = make_splits(exp.data.spec(), 64, 24, 0)
    for i, name in enumerate(exp.variants):
        vdir = exp_dir / name
        (vdir / "checkpoints").mkdir(parents=True)
        config = exp.variant_config(name)
        torch.manual_seed(i)
        model = build_model(config)
        torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                    "global_step": 7}, vdir / "checkpoints" / "last.ckpt")
        probe = budgets.probe_model(model, val[:4], eps=0.1)
        (vdir / "ranks.jsonl").write_text(json.dumps({"step": 7, **probe}) + "\n")
        entry = {"probe": probe, "step": 7, "params": model.param_count(),
                 "metrics": {"val/accuracy": 0.9, "val/loss": 1.0}}  # finished, learned
        report = budgets.build_report({name: entry}, experiment=exp.name)
        (vdir / "report.json").write_text(budgets.to_json(report) + "\n")
        write_yaml(vdir / "config.yaml", {**config, "params": model.param_count()})
    return exp_dir


def _cli(capsys, *args):
    code = main(["compress", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibration_is_training_data_and_evaluation_is_validation_data(run):
    _, config, step = load_variant(run / "mha")
    assert step == 7
    (train_x, _), (val_x, val_y) = make_splits(parse_experiment(RAW).data.spec(), 64, 24, 0)
    notes = []
    calib, eval_x, eval_y = zoo_data(config, CompressOptions(calib_size=10), notes)
    assert torch.equal(calib, train_x[:10])
    assert len(disjoint_rows(calib, eval_x)) == len(eval_x)  # no evaluated sequence calibrated
    assert torch.equal(eval_x, val_x[disjoint_rows(calib, val_x)])
    calib, eval_x, _ = zoo_data(config, CompressOptions(calib_size=10, overlap=True), notes)
    assert torch.equal(calib, val_x[:10]) and torch.equal(eval_x, val_x)  # asked for
    assert any("overlap asked" in n for n in notes)


def test_disjoint_rows_drops_repeats():
    calib = torch.tensor([[1, 2], [3, 4]])
    assert disjoint_rows(calib, torch.tensor([[3, 4], [5, 6], [1, 2]])).tolist() == [1]


def test_json_table_and_the_reports_predicted_ratio(run, capsys):
    code, out, err = _cli(capsys, run / "mha", "--ratios", "1.5,2,4", "--eps", "0.1",
                          "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "rankzoo.compress" and doc["family"] == "kv"
    assert doc["keys"] == "pre-rope" and doc["length"] == 16  # the report's probe T
    rows = doc["rows"]
    assert rows[0]["allocation"] == "full" and rows[0]["delta_loss"] == 0
    assert [r["allocation"] for r in rows[1:]] == [
        "advised", *["uniform", "sensitivity", "mixed"] * 3, "eps"]
    for r in rows[2:-1]:
        assert r["ratio"] >= r["target"] - 1e-9 and "accuracy" in r
    # the advised row is the report's own KV advice, at its own ratio
    report = load_run(run / "mha")
    summary = next(a for a in [*report["advice"], *report["findings"]]
                   if a["kind"] in ("kv_cache_summary", "finding") and "options" in a)
    predicted = summary["options"]["k_pre_rope"]["ratio"]
    assert doc["prediction"]["ratio"] == pytest.approx(predicted)
    # one cost model: the report advises the shared basis compress measures
    assert summary["cost_model"] == doc["prediction"]["cost_model"] == "shared_basis"
    assert rows[1]["ratio"] == pytest.approx(predicted)
    # compress's own cost model: the shared bases are weights, the codes alone per token
    assert doc["cost_model"]["name"] == rows[1]["cost_model"] == "shared_basis"
    codes = sum(r for layer in rows[1]["ranks"].values() for heads in layer for r in heads)
    assert rows[1]["bytes_per_token"] == codes * doc["bytes_per_element"]
    assert rows[1]["ratio"] == pytest.approx(rows[0]["bytes_per_token"] / (codes * 2))
    width = rows[0]["ranks"]["k"][0][0]  # K = V here: the full row keeps every width
    assert rows[1]["basis_bytes"] == 2 * sum(  # K x r per head, once per model
        r * width for layer in rows[1]["ranks"].values() for heads in layer for r in heads)
    assert rows[1]["ratio"] > rows[1]["ratio_per_sequence"]
    assert doc["bases"]["used"] == {"k": "output", "v": "output"}
    assert all(r["bases"] == {"k": "output", "v": "output"} for r in rows[1:])
    # advice names the command that checks it; a cache that saves too little is a finding
    advised = max(o["ratio"] for o in summary["options"].values()) >= 1.25
    assert ("rankzoo compress RUN_DIR/mha --ratios" in summary["text"]) is advised
    assert (summary["kind"] == "kv_cache_summary") is advised
    v = doc["verdict"]
    assert v["verdict"] in ("verified", "refuted") and v["tolerance"] == 0.02
    assert v["advised_delta_loss"] == pytest.approx(rows[1]["delta_loss"])
    within = [r["ratio"] for r in rows[1:] if r["delta_loss"] <= 0.02]
    assert v["largest_ratio_within"] == (max(within) if within else None)


def test_verdict_refuted_names_the_largest_ratio_within(run):
    doc = compress_run(run / "mha", CompressOptions(ratios=(1.5, 4), tolerance=0.0))
    v = doc["verdict"]
    advised = doc["rows"][1]
    if advised["delta_loss"] > 0:
        assert v["verdict"] == "refuted" and "refuted" in v["text"]
        assert ("largest measured ratio within it" in v["text"]
                or "no measured setting" in v["text"])


def test_state_families_get_a_row_and_say_what_they_save(run, capsys):
    # the delta rule's conv state stays in full: at K = 4 its state is at most 1.43x smaller
    for name, family, ratio in (("mla", "mla", "1.5"), ("linear", "linear", "1.5"),
                                ("gdn", "delta", "1.25")):
        code, out, err = _cli(capsys, run / name, "--ratios", ratio, "--format", "json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["family"] == family and doc["keys"] is None
        assert doc["prediction"] is not None and "implied" in doc["verdict"]["text"] \
            or doc["verdict"]["verdict"] is None
        assert doc["rows"][0]["bytes_per_token"] > doc["rows"][-1]["bytes_per_token"]


def test_markdown_plot_and_save(run, capsys, tmp_path):
    code, out, err = _cli(capsys, run / "mha", "--ratios", "1.5,2", "--format", "md",
                          "--plot", tmp_path / "plot", "--save", tmp_path / "small",
                          "--tolerance", "10")
    assert code == 0, err
    assert out.startswith("# compress mha") and "**Verdict**" in out and "| setting |" in out
    assert (tmp_path / "plot" / "compress.png").stat().st_size > 1000
    saved = tmp_path / "small"
    assert {p.name for p in saved.iterdir()} == {"checkpoints", "config.yaml", "bases.pt",
                                                "compress.json"}
    info = json.loads((saved / "compress.json").read_text())
    # the saved model is the compressed one: its loss is the row's
    model, config, _ = load_variant(saved)
    _, eval_x, eval_y = zoo_data(config, CompressOptions(), [])
    loss = ZooTarget(model).evaluate(eval_x, eval_y, 8)["loss"]
    assert loss == pytest.approx(info["row"]["loss"], abs=1e-5)
    assert info["saved"]["setting"] != "the advised ranks" or info["row"]["ratio"] > 1
    bases = torch.load(saved / "bases.pt")
    assert set(bases) == {"slots", "ranks", "bases", "encoders"}
    # nothing written is lost without being asked: a second --save into it is refused
    before = sorted(p.name for p in saved.rglob("*"))
    code, out, err = _cli(capsys, run / "mha", "--ratios", "2", "--save", saved)
    assert code == 2 and err.count("\n") == 1 and "--save" in err and "not empty" in err
    assert sorted(p.name for p in saved.rglob("*")) == before


@pytest.mark.parametrize("args, message", [
    (("--ratios", "1,2"), "--ratios 1,2: each ratio must be > 1"),
    (("--bases", "fisher"), "fisher: one of output, energy"),
    (("--ratios", "0.5"), "each ratio must be > 1"),
    (("--ratios", "two"), "--ratios two: expected numbers"),
    (("--eps", "0,0.5"), "--eps 0,0.5: each eps must lie in (0, 1)"),
    (("--eps", "1.5"), "each eps must lie in (0, 1)"),
    (("--alloc", "best"), "--alloc best: expected a list of uniform, greedy"),
    (("--cache-dtype", "fp7"), "--cache-dtype fp7: unknown dtype"),
    (("--text", "x.txt"), "--text x.txt only applies with --hf PATH"),
    (("--tolerance", "inf", "--format", "json"), "--tolerance inf: expected a finite number"),
    (("--ratios", "2,inf"), "each ratio must be > 1 and finite"),
])
def test_bad_input_is_one_line(run, capsys, args, message):
    code, out, err = _cli(capsys, run / "mha", *args)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("rankzoo: error: ") and message in err


def test_run_dir_errors_are_one_line(run, capsys, tmp_path):
    code, _, err = _cli(capsys, run)
    assert code == 2 and "name one variant directory" in err and "mha" in err
    code, _, err = _cli(capsys, tmp_path / "nowhere")
    assert code == 2 and "not found" in err and err.count("\n") == 1
    code, _, err = _cli(capsys, run / "linear", "--keys", "pre-rope")
    assert code == 2 and "--keys pre-rope: only attention with a KV cache" in err
    code, _, err = _cli(capsys, run / "linear", "--save", tmp_path / "s")
    assert code == 2 and "not through a weight" in err and not (tmp_path / "s").exists()
    code, _, err = _cli(capsys)
    assert code == 2 and "exactly one of RUN_DIR or --hf" in err


def test_save_refuses_a_setting_that_makes_the_cache_no_smaller(tmp_path):
    """The only settings within the tolerance keep a cache larger than the full one (the
    advised ranks at 0.86x): nothing is written, a note says why, and the CLI exits 1."""
    doc = {"verdict": {"largest_ratio_within": 0.86, "largest_within": "the advised ranks"},
           "rows": [{"allocation": "full", "ratio": 1.0},
                    {"allocation": "advised", "ratio": 0.86}]}
    notes = []
    written = []
    save_compressed(doc, None, None, {}, CompressOptions(save=str(tmp_path / "s")), notes,
                    written.append)
    assert doc["saved"] is None and not written and not (tmp_path / "s").exists()
    assert "no smaller than the full one (at best 0.86x, the advised ranks)" in notes[0]
