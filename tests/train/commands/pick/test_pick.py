"""`rankzoo pick`: each family's knob sized to a budget, checked against the closed forms
worked out by hand at three budgets; budgets nothing meets, explained in one line; the
Pareto front; `--emit` writing an experiment that `rankzoo train --dry-run` accepts,
matched in parameters, never over an existing file; `--runs` evidence joined to the
candidate it measured, and runs at other sizes left out with a note; bad input in one line.

The sizes: d_model 64, 4 heads (head dim K = 16), 2 layers, 256 tokens, bf16 (2 bytes).
"""

import json

import pytest
import yaml

from tests.train.conftest import write_run
from train.cli import main
from train.commands.pick import pick_document
from train.commands.pick.constraints import Constraints, size
from train.commands.pick.emit import emitted_experiment
from train.commands.pick.front import dominates
from train.config import load_experiment
from train.experiment.plan import plan_document
from train.sizing.families import Shape
from train.sizing.units import parse_bytes, parse_count

D, H, L, T = 64, 4, 2, 256
KiB = 1024


def sized(shape: Shape, budget: int, **limits):
    return size(shape, Constraints(D, H, L, T, budget, **limits))


# ---------------------------------------------------------------- sizing by hand

# softmax: 2 (K, V) x T x G x K elements a layer, x 2 layers x 2 bytes = 32 KiB x G; G | 4
@pytest.mark.parametrize("budget, G, bound", [(40 * KiB, 1, ["cache"]),
                                              (100 * KiB, 2, ["cache"]),
                                              (1024 * KiB, 4, ["range"])])
def test_softmax_kv_heads(budget, G, bound):
    s = sized(Shape("softmax"), budget)
    assert s.fits and s.value == G and list(s.limited_by) == bound
    assert s.cost.cache_bytes == 32 * KiB * G


# sliding window, MQA: 2 x W x 1 x K x 2 layers x 2 bytes = 128 W bytes, W <= T
@pytest.mark.parametrize("budget, W", [(1 * KiB, 8), (8 * KiB + 100, 64), (1024 * KiB, T)])
def test_sliding_window_mqa(budget, W):
    s = sized(Shape("sliding_window", (("n_kv_heads", 1),), "MQA"), budget)
    assert s.fits and s.value == W and s.cost.cache_bytes == 128 * W
    assert s.cost.budget.mixing == min(W - 1, T // 2)


# linear elu+1: H x F x (V + 1) = 68 F elements a layer -> 272 F bytes, F = K
@pytest.mark.parametrize("budget, K", [(1 * KiB, 3), (8 * KiB, 30), (64 * KiB, 240)])
def test_linear_elu(budget, K):
    s = sized(Shape("linear", (("feature_map", "elu+1"),)), budget)
    assert s.fits and s.value == K and s.cost.cache_bytes == 272 * K


# linear Taylor: F = 1 + K + K(K+1)/2 features -> 272 F bytes
@pytest.mark.parametrize("budget, K, F", [(1 * KiB, 1, 3), (8 * KiB, 6, 28), (64 * KiB, 20, 231)])
def test_linear_taylor(budget, K, F):
    s = sized(Shape("linear", (("feature_map", "taylor"),), "Taylor"), budget)
    assert s.fits and s.value == K and s.cost.config.f_dim == F
    assert s.cost.cache_bytes == 272 * F


# Mamba-2: P = 2 D / H = 32, conv_dim = 128 + 2 N, d_conv 4:
# H P N + 3 conv_dim = 134 N + 384 elements a layer -> 4 (134 N + 384) bytes
@pytest.mark.parametrize("budget, N", [(4 * KiB, 4), (8 * KiB, 12), (64 * KiB, 119)])
def test_ssm_state(budget, N):
    s = sized(Shape("ssm"), budget)
    assert s.fits and s.value == N and s.cost.cache_bytes == 4 * (134 * N + 384)


# MLA: T x (R + dr) a layer with dr = 8 -> 1024 (R + 8) bytes; R <= d_model
@pytest.mark.parametrize("budget, R", [(16 * KiB, 8), (40 * KiB, 32), (1024 * KiB, D)])
def test_mla_latent(budget, R):
    s = sized(Shape("mla"), budget)
    assert s.fits and s.value == R and s.cost.cache_bytes == 1024 * (R + 8)


# MoE: the cache is the one shared K/V head's (32 KiB) whatever k; FLOPs per token a layer
# 2 D (2 k K + 2 K) + 4 k K (T + 1) / 2 + 2 D E = 12320 k + 4608 -> 24640 k + 9216
@pytest.mark.parametrize("flops, k", [(40_000, 1), (60_000, 2), (None, H)])
def test_moe_top_k(flops, k):
    s = sized(Shape("moe"), 32 * KiB, flops_budget=flops)
    assert s.fits and s.value == k and s.cost.cache_bytes == 32 * KiB
    assert s.cost.prefill_flops == 24640 * k + 9216
    assert list(s.limited_by) == (["FLOPs"] if flops else ["range"])


def test_params_budget_binds():
    # softmax blocks: q and o 2 D^2 plus k and v 2 D G K a layer = 16384 + 4096 G in all
    s = sized(Shape("softmax"), 1024 * KiB, params_budget=25_000)
    assert s.value == 2 and s.cost.block_params == 24576 and list(s.limited_by) == ["params"]


def test_decode_step_is_the_last_tokens_cost():
    # full attention: the seq_len-th token sees T keys, the average one (T + 1) / 2
    s = sized(Shape("softmax"), 1024 * KiB)
    K, G = 16, 4
    proj = 2 * D * (2 * H * K + 2 * G * K)
    assert s.cost.decode_flops == pytest.approx(L * (proj + 4 * H * K * T), abs=L * T)
    assert s.cost.prefill_flops < s.cost.decode_flops


# ---------------------------------------------------------------- infeasible budgets

def test_a_window_of_one_key_is_no_candidate():
    # W = 1 carries nothing across (its past->future cap is 0): the smallest is W = 2
    s = sized(Shape("sliding_window", (("n_kv_heads", 1),), "MQA"), 200)
    assert not s.fits and s.value == 2 and list(s.limited_by) == ["cache"]


def test_nothing_fits_names_the_smallest_cache(capsys):
    assert main(["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "2", "--seq-len",
                 "256", "--cache-budget", "100"]) == 2
    err = capsys.readouterr().err
    assert err == ("rankzoo: error: nothing fits 100 B of cache per sequence at 256 tokens: "
                   "the smallest cache is sliding_window (MQA) W=2, G=1 at 256 B\n")


def test_families_over_budget_are_listed_with_their_smallest():
    doc = pick_document(Constraints(D, H, L, T, 8 * KiB))
    over = {r["label"]: r for r in doc["infeasible"]}
    assert over["softmax (MQA)"]["smallest"]["cache_bytes"] == 32 * KiB
    assert over["mla"]["smallest"] == {**over["mla"]["smallest"], "value": 1,
                                       "cache_bytes": 1024 * 9}
    assert "9 KiB of cache > 8 KiB" in over["mla"]["reason"]
    assert {r["family"] for r in doc["candidates"]} == {"sliding_window", "linear", "ssm",
                                                         "delta"}


def test_params_and_flops_that_nothing_meets():
    with pytest.raises(ValueError, match=r"^nothing fits 64 KiB of cache per sequence at 256 "
                                         r"tokens, 100 block parameters, 1k FLOPs/token: .*"
                                         r"the fewest parameters linear \(Taylor\) K=1"):
        pick_document(Constraints(D, H, L, T, 64 * KiB, params_budget=100, flops_budget=1000))


# ---------------------------------------------------------------- the document and the front

def test_document_grouped_by_family_ordered_by_cache():
    doc = pick_document(Constraints(D, H, L, T, 8 * KiB))
    families = [r["family"] for r in doc["candidates"]]
    assert families == sorted(families, key=families.index)  # each family together
    firsts = [min(r["cache_bytes"] for r in doc["candidates"] if r["family"] == f)
              for f in dict.fromkeys(families)]
    assert firsts == sorted(firsts)
    for r in doc["candidates"]:
        assert r["cache_bytes"] <= 8 * KiB
        p = r["params"]
        # matched: within 5% of the MHA layers with a 4 x d_model MLP
        assert abs(p["layers_matched"] - L * doc["reference"]["layer_params"]) \
            <= 0.05 * L * doc["reference"]["layer_params"]
    by_label = {r["label"]: r for r in doc["candidates"]}
    assert by_label["sliding_window (MQA)"]["front"]  # the most carried rank
    assert by_label["linear (Taylor)"]["front"]  # the smallest cache
    assert not by_label["sliding_window (MHA)"]["front"]  # the MQA window: same cache, more
    # a window's stack reaches layers x (W - 1) tokens: not the whole sequence
    assert by_label["sliding_window (MQA)"]["reach_tokens"] == 2 * 63
    assert not by_label["sliding_window (MQA)"]["holds_associations"]


def test_measured_accuracy_enters_the_front():
    def row(cache, carried, acc=None):
        evidence = [] if acc is None else [{"exact": True, "accuracy": acc}]
        return {"cache_bytes": cache, "carried": carried, "evidence": evidence}

    assert dominates(row(1, 10), row(2, 5))
    assert not dominates(row(1, 10, acc=0.3), row(2, 5, acc=0.9))  # measured better
    assert not dominates(row(1, 10), row(2, 5, acc=0.9))  # a guess does not beat a measure
    assert dominates(row(1, 10, acc=0.9), row(2, 5))


def test_table_and_json(capsys):
    args = ["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "2", "--seq-len", "256",
            "--cache-budget", "8KiB"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "families that do not fit" in out and "K = feature_dim" in out and "W=64, G=1" in out
    assert main([*args, "--format", "json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout: one JSON document
    assert doc["constraints"]["cache_budget_bytes"] == 8192 and doc["candidates"]


# ---------------------------------------------------------------- --emit

EMIT = ["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "2", "--seq-len", "256",
        "--cache-budget", "8KiB", "--associations", "8"]


def test_emit_is_accepted_by_train_dry_run(tmp_path, capsys):
    path = tmp_path / "pick.yaml"
    assert main([*EMIT, "--emit", str(path), "--shortlist", "all"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {path}" in err
    raw = yaml.safe_load(path.read_text())
    assert raw["data"]["task"] == "mqar" and raw["data"]["num_kv_pairs"] == 8
    assert raw["data"]["seq_len"] == 256 and raw["match"]["params"] is True
    # every fitting shape once: 3 windows, 2 feature maps, Mamba-2, GDN and KDA
    assert len(raw["variants"]) == 8
    assert raw["variants"]["delta_kda_k21"]["gate"] == "channel"
    assert raw["variants"]["sliding_window_mqa_w64"] == {"block": "sliding_window",
                                                        "n_kv_heads": 1, "window": 64}
    assert main(["train", str(path), "--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [v["variant"] for v in plan["variants"]] == list(raw["variants"])
    assert all(abs(v["rel_diff"]) <= 0.05 for v in plan["variants"])
    # the plan's cache is the pick's, in elements: 8 KiB of bf16 is 4096
    assert all(v["cache_elements"] <= 4096 for v in plan["variants"])


def test_emit_front_only_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "front.yaml"
    assert main([*EMIT, "--emit", str(path)]) == 0
    front = yaml.safe_load(path.read_text())["variants"]
    doc_front = [r for r in pick_document(Constraints(D, H, L, T, 8 * KiB, associations=8))
                 ["candidates"] if r["front"]]
    assert len(front) == len(doc_front) < 6
    path.write_text("mine\n")
    capsys.readouterr()
    assert main([*EMIT, "--emit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "exists; pass --force" in err and err.count("\n") == 1
    assert path.read_text() == "mine\n"
    assert main([*EMIT, "--emit", str(path), "--force"]) == 0
    assert load_experiment(path).name == "front"
    assert len(plan_document(load_experiment(path))["variants"]) == len(front)


def test_emit_needs_room_for_the_associations():
    doc = pick_document(Constraints(D, H, L, 32, 8 * KiB, associations=16))
    with pytest.raises(ValueError, match=r"MQAR needs 4 x associations <= seq_len, so at most 8"):
        emitted_experiment(doc, "x")


# ---------------------------------------------------------------- --runs

def run_raw(name: str, variants: dict, d_model: int = D, seq_len: int = T) -> dict:
    return {"name": name, "seed": 0,
            "data": {"task": "mqar", "vocab_size": 32, "seq_len": seq_len, "num_kv_pairs": 4,
                     "train_size": 8, "val_size": 8, "batch_size": 4},
            "model": {"d_model": d_model, "n_layers": L},
            "block_defaults": {"n_heads": H}, "variants": variants,
            "monitor": {"probe_size": 2, "probe_len": 32, "histograms": False}}


def test_runs_join_their_candidates(tmp_path, capsys):
    runs = write_run(tmp_path, run_raw("r", {
        "w64": {"block": "sliding_window", "n_kv_heads": 1, "window": 64},  # MQA, exact
        "w8": {"block": "sliding_window", "window": 8},  # MHA, another W
        "relu": {"block": "linear", "feature_map": "relu"},  # no candidate has relu
    }))
    other = write_run(tmp_path, run_raw("wide", {"w64": {
        "block": "sliding_window", "n_kv_heads": 1, "window": 64}}, d_model=32))
    doc = pick_document(Constraints(D, H, L, T, 8 * KiB), runs=[runs, other])
    by_label = {r["label"]: r for r in doc["candidates"]}
    mqa = by_label["sliding_window (MQA)"]["evidence"]
    assert [(e["variant"], e["exact"], e["knob_value"]) for e in mqa] == [("w64", True, 64)]
    assert mqa[0]["accuracy"] == 0.5 and mqa[0]["realized"]["mixing"] is not None
    mha = by_label["sliding_window (MHA)"]["evidence"]
    assert [(e["variant"], e["exact"], e["knob_value"]) for e in mha] == [("w8", False, 8)]
    assert not any(r["evidence"] for r in doc["candidates"] if r["family"] != "sliding_window")
    notes = "\n".join(doc["notes"])
    assert "relu" in notes and "none of the candidates' settings" in notes
    assert "trained at d_model=32, not the target's d_model=64" in notes
    # in the table: the measured accuracy, and @W=8 where it was measured at another W
    args = ["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "2", "--seq-len",
            "256", "--cache-budget", "8KiB", "--runs", str(runs), str(other)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "0.500 @W=8" in captured.out and "accuracy" in captured.out
    assert "rankzoo: note:" in captured.err and "d_model=32" in captured.err


def test_a_run_given_twice_counts_once(tmp_path):
    runs = write_run(tmp_path, run_raw("r", {
        "w64": {"block": "sliding_window", "n_kv_heads": 1, "window": 64}}))
    doc = pick_document(Constraints(D, H, L, T, 8 * KiB),
                        runs=[runs, runs, runs / "w64", tmp_path / "." / "r"])
    evidence = {r["label"]: r for r in doc["candidates"]}["sliding_window (MQA)"]["evidence"]
    assert [e["variant"] for e in evidence] == ["w64"]
    assert sum("given more than once in --runs; counted once" in n for n in doc["notes"]) == 3


def test_runs_at_another_length_are_ignored(tmp_path):
    runs = write_run(tmp_path, run_raw("short", {
        "w64": {"block": "sliding_window", "n_kv_heads": 1, "window": 64}}, seq_len=128))
    doc = pick_document(Constraints(D, H, L, T, 8 * KiB), runs=[runs])
    assert not any(r["evidence"] for r in doc["candidates"])
    assert any("seq_len=128, not the target's seq_len=256" in n for n in doc["notes"])


def test_missing_runs_dir_is_one_line(tmp_path, capsys):
    assert main([*EMIT, "--runs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: --runs ") and err.count("\n") == 1


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("extra, message", [
    (["--cache-budget", "-1"], "--cache-budget -1: expected a positive size"),
    (["--cache-budget", "64k"], "say 64KiB (1024-based) or 64KB (1000-based)"),
    (["--cache-budget", "8KiB", "--cache-dtype", "fp12"], "--cache-dtype fp12: unknown dtype"),
    (["--cache-budget", "8KiB", "--params-budget", "-5"], "--params-budget -5: expected a "
                                                          "positive count"),
    (["--cache-budget", "8KiB", "--flops-budget", "lots"], "--flops-budget lots: expected"),
    (["--cache-budget", "8KiB", "--force"], "--force only applies with --emit"),
])
def test_bad_input_is_one_line(capsys, extra, message):
    assert main(["pick", "--d-model", "64", "--n-heads", "4", "--n-layers", "2",
                 "--seq-len", "256", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: ") and message in err and err.count("\n") == 1


def test_heads_must_divide_width(capsys):
    assert main(["pick", "--d-model", "66", "--n-heads", "4", "--n-layers", "2",
                 "--seq-len", "256", "--cache-budget", "8KiB"]) == 2
    err = capsys.readouterr().err
    assert "--n-heads 4 must divide --d-model 66" in err and err.count("\n") == 1


def test_units():
    assert parse_bytes("256KiB") == 262144 and parse_bytes("1MiB") == 2 ** 20
    assert parse_bytes("262144") == 262144 and parse_bytes("1.5 KiB") == 1536
    assert parse_bytes("64KB") == 64000
    assert parse_count("300M", "--params-budget") == 300_000_000
    assert parse_count("1.5B", "--params-budget") == 1_500_000_000
    assert parse_count("2GFLOPs", "--flops-budget") == 2_000_000_000
    assert parse_count("4e9", "--flops-budget") == 4_000_000_000


def test_shapes_that_cannot_be_built_are_listed_with_the_reason():
    # 64 heads of width 1: RoPE needs an even head dim, so no softmax, window or MoE builds
    doc = pick_document(Constraints(64, 64, 2, 256, 64 * KiB))
    reasons = {r["label"]: r["reason"] for r in doc["infeasible"]}
    assert "RoPE needs an even head_dim, got 1" in reasons["softmax"]
    assert "RoPE needs an even head_dim, got 1" in reasons["sliding_window (MQA)"]
    assert {r["family"] for r in doc["candidates"]} - {"hybrid"} == {"linear", "ssm", "mla",
                                                                     "delta"}
    # hybrids only with the global layers that build here: MLA, never softmax
    globals_ = {r["layers"][1]["block"] for r in doc["candidates"] if r["family"] == "hybrid"}
    assert globals_ == {"mla"}
    assert all(r["params"]["d_mlp_matched"] is None for r in doc["candidates"])  # no MHA
