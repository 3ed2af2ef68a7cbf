"""`rankzoo pick` hybrids: a global layer every N, the cheap layers between them sized by
hand to what the global layers leave; their rows (the largest cap over the layers, costs
summed), the layer-by-layer front, which are kept, the flags and their errors; `--emit`
writing them as layer patterns that `rankzoo train --dry-run` plans with the same cache;
`--runs` joining a layer-pattern run to its hybrid.

The sizes: d_model 64, 4 heads (head dim K = 16), 4 layers, 256 tokens, bf16 (2 bytes).
Per layer: softmax at the global G = 2 (the GQA preset) caches 2 x 256 x 2 x 16 = 16384
elements (32 KiB); MLA at its default latent R = 32 with dr = 8 caches 256 x 40 = 10240
(20 KiB); an MQA window of W keys 2 x W x 16 = 32 W elements (64 W bytes).
"""

import json

import pytest
import yaml

from tests.train.conftest import write_run
from train.cli import main
from train.commands.pick import Hybrids, pick_document
from train.commands.pick.constraints import Constraints
from train.commands.pick.front import dominates
from train.commands.pick.hybrids import size_hybrids
from train.config import load_experiment

D, H, L, T = 64, 4, 4, 256
KiB = 1024
C64 = Constraints(D, H, L, T, 64 * KiB, associations=8)
ARGS = ["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "4", "--seq-len", "256",
        "--cache-budget", "64KiB", "--associations", "8"]


# ---------------------------------------------------------------- sizing by hand

def test_cheap_layers_get_what_the_global_layers_leave():
    found = {(h.every, h.glob.block, h.cheap.label): h for h in size_hybrids(C64, Hybrids())}
    # 1 in 4 global: softmax's 32 KiB leaves 32 KiB to 3 MQA windows, 192 W bytes: W = 170
    sm = found[(4, "softmax", "sliding_window (MQA)")]
    assert sm.fits and sm.cheap.value == 170 and sm.n_global == 1 and sm.n_cheap == 3
    assert sm.totals.cache_bytes == 32 * KiB + 192 * 170
    assert sm.pattern == "sliding_window W=170, G=1 x3 + softmax G=2"
    # MLA's 20 KiB leaves 44 KiB: W = 234
    mla = found[(4, "mla", "sliding_window (MQA)")]
    assert mla.fits and mla.cheap.value == 234
    assert mla.totals.cache_bytes == 20 * KiB + 192 * 234
    # 1 in 2: two softmax layers are the whole 64 KiB, so nothing is left for the windows
    assert not found[(2, "softmax", "sliding_window (MQA)")].fits
    assert found[(2, "softmax", "sliding_window (MQA)")].over == ("cache",)
    # the unit: the cheap layers, then the global one
    assert [b for b, _ in sm.unit()] == ["sliding_window"] * 3 + ["softmax"]


def test_only_cheap_families_fill_the_gaps():
    blocks = {h.cheap.shape.block for h in size_hybrids(C64, Hybrids())}
    assert blocks == {"sliding_window", "linear", "ssm", "delta"}


def test_params_and_flops_budgets_bind_the_cheap_layers_too():
    free = {(h.every, h.glob.block, h.cheap.label): h for h in size_hybrids(C64, Hybrids())}
    limit = free[(4, "softmax", "ssm (Mamba-2)")].totals.block_params - 1
    tight = {(h.every, h.glob.block, h.cheap.label): h for h in size_hybrids(
        Constraints(D, H, L, T, 64 * KiB, params_budget=limit), Hybrids())}
    h = tight[(4, "softmax", "ssm (Mamba-2)")]
    assert h.fits and h.cheap.limited_by == ("params",)
    assert h.totals.block_params <= limit
    assert h.cheap.value < free[(4, "softmax", "ssm (Mamba-2)")].cheap.value


# ---------------------------------------------------------------- rows and the front

def test_hybrid_rows_carry_the_largest_cap_and_the_sums():
    doc = pick_document(C64, hybrids=Hybrids(keep="all"))
    rows = {r["pattern"]: r for r in doc["candidates"] if r["family"] == "hybrid"}
    row = rows["sliding_window W=170, G=1 x3 + softmax G=2"]
    cheap, glob = row["layers"]
    assert (cheap["count"], glob["count"]) == (3, 1)
    assert row["carried"] == T // 2 == glob["caps"]["mixing"]  # the global layer's p->f
    assert cheap["caps"]["mixing"] == 128  # min(W - 1, T / 2)
    # MHA windows: 3 x 256 W bytes in 32 KiB, W = 42, each carrying W - 1
    mha = rows["sliding_window W=42, G=4 x3 + softmax G=2"]["layers"][0]
    assert mha["caps"]["mixing"] == 41 and mha["cache_bytes"] == 3 * 256 * 42
    assert row["reach_tokens"] == T - 1 and row["holds_associations"]
    assert row["cache_bytes"] == cheap["cache_bytes"] + glob["cache_bytes"] == 65408
    assert row["params"]["blocks"] == cheap["block_params"] + glob["block_params"]
    assert row["flops"]["prefill_per_token"] == (cheap["flops"]["prefill_per_token"]
                                                 + glob["flops"]["prefill_per_token"])
    assert row["unit"] == {"every": 4, "ratio": "3:1", "cheap_layers": 3, "global_layers": 1}
    assert row["knob"]["value"] == 170 and row["limited_by"] == ["cache"]
    # after the uniform candidates, the fewest global layers first
    families = [r["family"] for r in doc["candidates"]]
    assert families.index("hybrid") == len(families) - len(rows)
    everys = [r["unit"]["every"] for r in doc["candidates"] if r["family"] == "hybrid"]
    assert everys == sorted(everys, reverse=True)


def test_the_front_compares_layer_by_layer():
    def uniform(cache, carried):
        return {"cache_bytes": cache, "carried": carried, "evidence": []}

    def hybrid(cache, cheap, n_cheap, n_global=1):
        return {"cache_bytes": cache, "carried": 128, "evidence": [], "layers": [
            {"count": n_cheap, "caps": {"mixing": cheap}},
            {"count": n_global, "caps": {"mixing": 128}}]}

    # a hybrid's global layer does not make up for cheap layers that carry less
    assert not dominates(hybrid(10, 5, 3), uniform(20, 20))
    assert not dominates(uniform(20, 20), hybrid(10, 5, 3))
    # cheap layers that carry as much, and a global one that carries more: it dominates
    assert dominates(hybrid(10, 20, 3), uniform(20, 20))
    # more global layers against wider cheap ones: neither outdoes the other
    assert not dominates(hybrid(10, 50, 3), hybrid(10, 20, 2, 2))
    assert not dominates(hybrid(10, 20, 2, 2), hybrid(10, 50, 3))
    assert dominates(hybrid(9, 50, 3), hybrid(10, 40, 3))


def test_best_keeps_the_hybrids_no_other_hybrid_outdoes():
    every = pick_document(C64, hybrids=Hybrids(keep="all"))
    best = pick_document(C64)
    all_h = [r for r in every["candidates"] if r["family"] == "hybrid"]
    kept = [r for r in best["candidates"] if r["family"] == "hybrid"]
    assert 0 < len(kept) < len(all_h) == every["hybrids"]["fit"] == best["hybrids"]["fit"]
    assert best["hybrids"]["shown"] == len(kept)
    kept_patterns = {r["pattern"] for r in kept}
    for row in all_h:  # each dropped one is outdone by another hybrid, each kept one by none
        outdone = any(dominates(o, row) for o in all_h if o is not row)
        assert outdone == (row["pattern"] not in kept_patterns)
    # dropping them changes no row's front
    fronts = {r["label"]: r["front"] for r in every["candidates"]}
    assert all(r["front"] == fronts[r["label"]] for r in best["candidates"])


def test_uniform_rows_are_the_same_with_and_without_hybrids():
    with_h = pick_document(Constraints(D, H, L, T, 8 * KiB))
    without = pick_document(Constraints(D, H, L, T, 8 * KiB), hybrids=Hybrids(keep="none"))
    assert without["candidates"] == with_h["candidates"]  # no hybrid fits 8 KiB here
    assert not any(r["family"] == "hybrid" for r in without["infeasible"])
    assert without["hybrids"] == {"keep": "none"}
    over = [r for r in with_h["infeasible"] if r["family"] == "hybrid"]
    assert {r["label"] for r in over} == {"hybrid 3:1, 1:1 with softmax (GQA G=2)",
                                          "hybrid 3:1, 1:1 with mla"}
    assert "its 1 global layer alone: 32 KiB of cache" in over[0]["reason"]


def test_global_kv_heads_and_units_are_flags(capsys):
    assert main([*ARGS, "--global-kv-heads", "1", "--global-every", "4", "--hybrids", "all",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r for r in doc["candidates"] if r["family"] == "hybrid"]
    assert rows and {r["unit"]["every"] for r in rows} == {4}
    softmax = [r for r in rows if r["layers"][1]["block"] == "softmax"]
    assert softmax and all(r["pattern"].endswith("+ softmax G=1") for r in softmax)
    assert doc["hybrids"]["global_kv_heads"] == 1 and doc["hybrids"]["every"] == [4]


@pytest.mark.parametrize("extra, message", [
    (["--global-every", "3"], "--global-every 3 does not divide --n-layers 4"),
    (["--global-every", "1"], "--global-every 1: a unit needs a cheap layer before its global"),
    (["--global-kv-heads", "3"], "--global-kv-heads 3 must divide --n-heads 4"),
    (["--hybrids", "none", "--global-every", "2"], "--global-every only applies with hybrids"),
])
def test_bad_hybrid_flags_are_one_line(capsys, extra, message):
    assert main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: ") and message in err and err.count("\n") == 1


def test_table_shows_the_pattern(capsys):
    assert main([*ARGS, "--hybrids", "all"]) == 0
    out = capsys.readouterr().out
    assert "hybrid 3:1" in out and "hybrid 1:1" in out
    assert "sliding_window W=170, G=1 x3 +" in out  # the pattern may wrap after the +


# ---------------------------------------------------------------- --emit and --runs

def test_emitted_hybrids_are_layer_patterns_train_plans(tmp_path, capsys):
    path = tmp_path / "hyb.yaml"
    assert main([*ARGS, "--global-every", "4", "--emit", str(path), "--shortlist", "all",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    raw = yaml.safe_load(path.read_text())
    name = "sliding_window_mqa_w170_x3_softmax_g2"
    assert raw["variants"][name] == {
        "pattern": ["sliding_window"] * 3 + ["softmax"],
        "blocks": {"sliding_window": {"block": "sliding_window", "n_kv_heads": 1,
                                      "window": 170},
                   "softmax": {"block": "softmax", "n_kv_heads": 2}}}
    assert "--global-every 4" in path.read_text()  # the header's pick command
    exp = load_experiment(path)
    assert exp.variants[name].unit and len(exp.variants) == len(doc["candidates"])
    assert main(["train", str(path), "--dry-run", "--format", "json"]) == 0
    plan = {v["variant"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    rows = {r["pattern"]: r for r in doc["candidates"] if r["family"] == "hybrid"}
    row = rows["sliding_window W=170, G=1 x3 + softmax G=2"]
    # the plan, from the model train builds, agrees with pick on the cache and the cap
    assert plan[name]["block"] == "hybrid"
    assert plan[name]["cache_elements"] == row["cache_elements"]
    assert plan[name]["budget_per_layer"]["mixing"] == row["carried"]
    assert plan[name]["pattern"] == "sliding_window x3, softmax"
    assert all(abs(v["rel_diff"]) <= 0.05 for v in plan.values())


def test_delta_rule_hybrids_are_emitted_as_they_were_picked(tmp_path, capsys):
    """Qwen3-Next's pattern (GDN x3 + attention) and Kimi Linear's (KDA x3 + MLA) train as
    pick costed them."""
    path = tmp_path / "delta.yaml"
    assert main([*ARGS, "--global-every", "4", "--hybrids", "all", "--emit", str(path),
                 "--shortlist", "all", "--format", "json"]) == 0
    rows = {r["label"]: r for r in json.loads(capsys.readouterr().out)["candidates"]}
    raw = yaml.safe_load(path.read_text())
    assert main(["train", str(path), "--dry-run", "--format", "json"]) == 0
    plan = {v["variant"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    for label, gate, glob in (("delta (GDN) x3 + softmax (GQA G=2)", "scalar", "softmax"),
                              ("delta (KDA) x3 + mla", "channel", "mla")):
        row = rows[label]
        [name] = [n for n, v in raw["variants"].items() if "pattern" in v
                  and v["blocks"][v["pattern"][0]].get("gate") == gate
                  and v["blocks"][v["pattern"][-1]]["block"] == glob]
        assert plan[name]["cache_elements"] == row["cache_elements"]
        assert plan[name]["budget_per_layer"]["mixing"] == row["carried"]
        assert row["layers"][0]["caps"]["mixing"] == row["knob"]["value"]  # K carries K


def test_a_layer_pattern_run_joins_its_hybrid(tmp_path):
    raw = {"name": "h", "seed": 0,
           "data": {"task": "mqar", "vocab_size": 32, "seq_len": T, "num_kv_pairs": 4,
                    "train_size": 8, "val_size": 8, "batch_size": 4},
           "model": {"d_model": D, "n_layers": L}, "block_defaults": {"n_heads": H},
           "variants": {
               "exact": {"pattern": ["w", "w", "w", "g"], "blocks": {
                   "w": {"block": "sliding_window", "n_kv_heads": 1, "window": 170},
                   "g": {"block": "softmax", "n_kv_heads": 2}}},
               "narrow": {"pattern": ["w", "w", "w", "g"], "blocks": {
                   "w": {"block": "sliding_window", "n_kv_heads": 1, "window": 16},
                   "g": {"block": "softmax", "n_kv_heads": 2}}},
               "mixed": {"layers": [{"block": "ssm"}, {"block": "softmax"}]}},
           "monitor": {"probe_size": 2, "probe_len": 32, "histograms": False}}
    runs = write_run(tmp_path, raw)
    doc = pick_document(C64, runs=[runs], hybrids=Hybrids(keep="all"))
    rows = {r["pattern"]: r for r in doc["candidates"] if r["family"] == "hybrid"}
    evidence = rows["sliding_window W=170, G=1 x3 + softmax G=2"]["evidence"]
    assert [(e["variant"], e["exact"], e["knob_value"]) for e in evidence] == [
        ("exact", True, 170), ("narrow", False, 16)]
    assert evidence[0]["accuracy"] == 0.5
    # the ssm / softmax alternation trained no candidate's setting (d_state 16 is no size
    # pick gave it): a note, no evidence
    assert any("mixed" in n and "hybrid of ssm, softmax" in n for n in doc["notes"])
    assert sum(len(r["evidence"]) for r in doc["candidates"]) == 2
