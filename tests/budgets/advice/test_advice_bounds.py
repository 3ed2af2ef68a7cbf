"""Advice that holds: bounds from the max over every sample and head, stated with their
conditions and re-checked; fixed states only for flat ranks; KV bytes; no advice for runs
that did not finish or did not learn."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from budgets import VerdictThresholds, annotate, build_report, probe_model
from budgets.advice.verdicts import is_flat
from tests.budgets.advice.conftest import (
    B,
    T,
    kinds,
    lengths,
    mqar_status,
    report_of,
    the,
    violations,
)


@pytest.mark.parametrize("shortest, at_t, flat", [
    (3, 4, True), (3, 4.01, False), (0, 1, True),  # + 1 for small ranks
    (20, 22, True), (20, 22.01, False),            # + 10% for large ones
])
def test_flat_means_at_most_one_or_ten_percent_more_at_t(shortest, at_t, flat):
    assert is_flat(shortest, at_t, VerdictThresholds()) is flat


def test_a_flat_low_rank_layer_gets_a_fixed_state_with_its_conditions(probed):
    layer = probed(pf_mean=(2, 3), pf_max=(3, 5),
                   past_future_lengths=lengths((3, 4), (4, 4), (3, 5)))
    report = report_of(layer)
    item = the(report, "cheaper_block")
    observed = [m for e in layer["past_future_lengths"] for m in e["rank_eps_max"]]
    # T = 8 is not judged: its past->future block is 4 x 4, too small to hold a state of 5
    assert item["state"] == math.ceil(max(observed)) and item["lengths"] == [16, 32]
    assert item["conditions"] == {"eps": 0.1, "batch_size": B, "seq_len": T, "checked": True,
                                  "max_observed": max(layer["quantities"]["past_future"][
                                      "rank_eps_max"])}
    assert f"a fixed state of {item['state']}" in item["text"] and "SSM" in item["text"]
    assert violations(report) == []


def test_the_bound_is_the_sample_max_not_the_batch_mean(probed):
    # the layer 10: a mean of <= 9 per head, one sample reaching 14
    report = report_of(probed(pf_mean=(3, 3), pf_max=(3, 6),
                              past_future_lengths=lengths((5, 5), (6, 6))))
    assert the(report, "cheaper_block")["state"] == 6


def test_a_rank_that_grows_with_t_gets_no_fixed_state(probed):
    report = report_of(probed(pf_max=(3, 3), past_future_lengths=lengths((1, 1), (2, 2),
                                                                        (3, 3))))
    assert "cheaper_block" not in kinds(report)
    text = the(report, "grows_with_t")["text"]
    assert "grows with T" in text and "1 at T = 8 -> 3 at T = 32" in text


def test_lengths_whose_half_caps_the_state_are_not_judged(probed):
    # 4 at T = 8 is all a 4 x 4 past->future block holds: growth to 8 says nothing
    report = report_of(probed(pf_max=(8, 8), past_future_lengths=lengths((4, 4), (8, 8),
                                                                        (8, 8))))
    assert not {"cheaper_block", "grows_with_t"} & set(kinds(report))
    (note,) = [a for a in report["advice"] if a["kind"] == "note"]
    assert "T/2 above that rank" in note["text"]


def fixed_state_layer(layer):
    """The layer as a recurrent block reports it: one fixed state instead of K/V caches."""
    q = layer["quantities"]
    q["inference.state"] = q.pop("inference.k")
    del q["inference.v"]
    return layer


def test_growth_within_a_fixed_state_is_a_finding_not_a_missing_state(probed):
    layer = fixed_state_layer(probed(pf_max=(3, 3), past_future_lengths=lengths(
        (1, 1), (2, 2), (3, 3))))
    report = report_of(layer)
    assert not {"cheaper_block", "grows_with_t"} & set(kinds(report))
    (finding,) = report["findings"]
    assert "within the block's own fixed state" in finding["text"]
    assert "no fixed state serves" not in " ".join(a["text"] for a in report["advice"])


@pytest.mark.parametrize("change", ["lower_bound_row", "lower_bound_length", "one_length",
                                    "no_lengths", "above_half_the_cap"])
def test_no_fixed_state_without_a_decided_flat_low_rank(probed, change):
    layer = probed()
    if change == "lower_bound_row":  # matrix-free: a head's rank only known from below
        layer["quantities"]["past_future"]["rank_eps_bound"] = [0.0, 1.0]
    elif change == "lower_bound_length":
        layer["past_future_lengths"][0]["lower_bound"] = True
    elif change == "one_length":  # T < 32: nothing to compare with
        layer["past_future_lengths"] = layer["past_future_lengths"][-1:]
    elif change == "no_lengths":
        del layer["past_future_lengths"]
    else:
        layer["quantities"]["past_future"]["rank_eps_max"] = [3.0, 9.0]  # 9 > 16 / 2
    assert "cheaper_block" not in kinds(report_of(layer))


def test_the_checks_catch_wrong_bounds(probed, fake_layer):
    layer = probed(kv=kv_heads(k=(3, 2), v=(4, 1), k_pre_rope=(1, 2)))
    layer["adapters"] = [{"module": "wq", "adapter": "default", "declared": 8,
                          "metrics": {"rank_eps": 3.0}}]
    report = report_of(layer)
    assert violations(report) == [] and {"cheaper_block", "kv_cache", "lora_rank"} <= set(
        kinds(report))
    the(report, "cheaper_block")["state"] -= 1
    the(report, "kv_cache")["options"]["k_pre_rope"]["rank_k"][1] -= 1
    the(report, "lora_rank")["suggested"] -= 1
    bad = violations(report)
    assert len(bad) == 3, bad
    assert any("cheaper_block state 4 < rank 5" in b for b in bad)
    assert any("k_pre_rope rank 1 of KV head 1 < 2" in b for b in bad)
    assert any("lora_rank r = 2 < adapter rank 3" in b for b in bad)


def test_an_older_probe_gets_no_bound_advice_and_one_note(fake_variants):
    report = build_report(fake_variants())  # no rank_eps_max anywhere
    assert not {"cheaper_block", "kv_cache", "kv_cache_summary"} & set(kinds(report))
    (note,) = [a for a in report["advice"] if a["kind"] == "note"]
    assert "softmax, other" in note["text"] and "per-sample maxima" in note["text"]


# ---------------------------------------------------------------- run status

STATUSES = {
    "stopped": ({"state": "stopped", "step": 300, "max_steps": 600, "learned": None,
                 "reason": "interrupted"}, "stopped at step 300 of 600"),
    "diverged": ({"state": "diverged", "step": 120, "max_steps": 600, "learned": None,
                  "reason": "loss was nan"}, "diverged at step 120 of 600"),
    "chance": ({"state": "finished", "step": 600, "max_steps": 600, "learned": False,
                "reason": "val/accuracy 0.02 within 0.05 of chance 0.016"},
               "did not learn the task (val/accuracy 0.02"),
}


@pytest.mark.parametrize("case", sorted(STATUSES))
def test_no_advice_for_a_run_that_stopped_diverged_or_did_not_learn(probed, case):
    status, said = STATUSES[case]
    report = report_of(probed(kv=kv_heads(k=(3, 2), v=(4, 1))), status=status)
    assert report["variants"][0]["status"] == status
    (item,) = report["advice"]
    assert item["kind"] == "no_advice" and item["variant"] == "v" and said in item["text"]


@pytest.mark.parametrize("learned", [True, None])
def test_a_finished_run_that_learned_or_may_have_gets_advice(probed, learned):
    status = {"state": "finished", "step": 600, "max_steps": 600, "learned": learned}
    report = report_of(probed(), status=status)
    assert "no_advice" not in kinds(report) and "cheaper_block" in kinds(report)


@pytest.mark.parametrize("accuracy, cuts", [(0.5, False), (0.97, True)],
                         ids=["learned-not-solved", "solved"])
def test_cuts_are_advised_only_when_the_task_is_solved(probed, accuracy, cuts):
    # chance 0.25: solved from 0.25 + 0.9 x 0.75 = 0.925
    layer = probed(kv=kv_heads(k=(1, 1), v=(1, 1)))
    report = report_of(layer, status=mqar_status(), metrics={"val/accuracy": accuracy})
    cut_kinds = {"cheaper_block", "kv_cache", "kv_cache_summary"}
    assert bool(cut_kinds & set(kinds(report))) is cuts
    under_used = [f for f in report["findings"] if f.get("topic") == "under_used"]
    assert len(under_used) == (0 if cuts else 1)
    if not cuts:
        assert "not solved (val/accuracy 0.5, solved from 0.925)" in under_used[0]["text"]
        assert "past->future rank <= 5" in under_used[0]["text"]


def test_a_markov_run_is_solved_near_its_entropy_floor(probed):
    status = {**mqar_status(), "baseline": {"task": "markov", "entropy_floor": 1.0,
                                            "unigram_loss": 3.0}}  # solved from 1.2
    unsolved = report_of(probed(), status=status, metrics={"val/loss": 1.5})
    solved = report_of(probed(), status=status, metrics={"val/loss": 1.1})
    assert "cheaper_block" not in kinds(unsolved) and "cheaper_block" in kinds(solved)


# ---------------------------------------------------------------- KV cache bytes

def kv_heads(k, v, k_pre_rope=None, K=8, **extra):
    def ranks(maxima):
        return {"rank_eps": [x - 0.5 for x in maxima], "rank_eps_max": [float(x) for x in maxima],
                "erank": [1.0] * len(maxima)}

    kv = {"n_kv_heads": len(k), "head_dim": K, "rope": k_pre_rope is not None,
          "k": ranks(k), "v": ranks(v), **extra}
    if k_pre_rope is not None:
        kv["k_pre_rope"] = ranks(k_pre_rope)
    return kv


def test_kv_bytes_by_hand(probed):
    report = report_of(probed(kv=kv_heads(k=(3, 2), v=(4, 1), k_pre_rope=(1, 2),
                                          v_head_dim=8)))
    item = the(report, "kv_cache")
    # G = 2 KV heads, K = V = 8, bf16 = 2 B, T = 32
    full = (8 + 8) * 2 * 2  # 64 B per token
    post = {"per_token": (3 + 4) * 2 + (2 + 1) * 2,  # 20 B
            "basis": (8 * 3 + 8 * 4) * 2 + (8 * 2 + 8 * 1) * 2}  # 160 B per sequence
    pre = {"per_token": (1 + 4) * 2 + (2 + 1) * 2,  # 16 B
           "basis": (8 * 1 + 8 * 4) * 2 + (8 * 2 + 8 * 1) * 2}  # 128 B
    assert (item["dtype"], item["bytes_per_element"], item["full_bytes_per_token"]) == (
        "bfloat16", 2, full)
    for key, hand in (("k", post), ("k_pre_rope", pre)):
        opt = item["options"][key]
        assert (opt["bytes_per_token"], opt["basis_bytes"]) == (hand["per_token"],
                                                               hand["basis"])
        at_t = hand["per_token"] + hand["basis"] / T  # 25 and 20 B per token at T
        assert opt["cache_bytes_per_token"] == pytest.approx(at_t)
        assert opt["ratio"] == pytest.approx(full / at_t)  # 2.56x and 3.2x
    assert item["options"]["k"]["per_head_bytes_per_token"] == [(3 + 4) * 2, (2 + 1) * 2]
    text = item["text"]
    assert "keys before RoPE" in text and "keys after RoPE" in text and "3.20x" in text
    assert "to be checked with `rankzoo compress`" in text and "4 samples" in text
    assert item["conditions"]["max_observed"] == 4.0  # the largest rank bounded
    summary = the(report, "kv_cache_summary")
    assert summary["full_bytes_per_token"] == full and "rankzoo compress" in summary["text"]
    # the cost model is stated: a probe without pooled ranks advises a basis per sequence
    for it in (item, summary):
        assert it["cost_model"] == "per_sequence_basis"
        assert "a basis fitted per sequence, paid once per sequence" in it["text"]


def test_pooled_ranks_advise_one_shared_basis_counted_as_a_weight(probed):
    kv = kv_heads(k=(3, 2), v=(4, 1), k_pre_rope=(1, 2), v_head_dim=8)
    for name, pooled in (("k", (5, 4)), ("v", (6, 2)), ("k_pre_rope", (2, 3))):
        kv[name]["rank_eps_pooled"] = [float(x) for x in pooled]  # above the per-sample max
    report = report_of(probed(kv=kv))
    item = the(report, "kv_cache")
    full = (8 + 8) * 2 * 2
    codes = {"k": (5 + 6 + 4 + 2) * 2, "k_pre_rope": (2 + 6 + 3 + 2) * 2}
    assert item["cost_model"] == "shared_basis" and "once per model" in item["text"]
    assert item["observed"]["v"] == [6.0, 2.0]  # the pooled figures, not the maxima
    for key, per_token in codes.items():
        opt = item["options"][key]
        assert opt["rank_field"] == "rank_eps_pooled"
        assert opt["bytes_per_token"] == opt["cache_bytes_per_token"] == per_token
        assert opt["ratio"] == pytest.approx(full / per_token)  # no bases per token
        assert opt["basis_bytes"] == 8 * per_token  # K = V = 8 per code: once per model
    summary = the(report, "kv_cache_summary")
    assert summary["cost_model"] == "shared_basis"
    assert "`rankzoo compress RUN_DIR/v --ratios" in summary["text"]  # a run's variant
    assert violations(report) == []
    item["options"]["k"]["rank_v"][0] = 5  # below the pooled 6: the check names it
    assert any("v rank 5 of KV head 0 < 6" in bad for bad in violations(report))
    # a Hugging Face model's advice names the command on that model and its text
    hf = report_of(probed(kv=kv), source={"hf": "models/smol", "text": "calib.txt"})
    assert hf["variants"][0]["probed_from"] == {"hf": "models/smol", "text": "calib.txt"}
    assert ("`rankzoo compress --hf models/smol --text calib.txt --eval-text EVAL --ratios"
            in the(hf, "kv_cache_summary")["text"])


def test_kv_bytes_follow_the_dtype_and_the_value_width(probed):
    layer = probed(kv=kv_heads(k=(3, 2), v=(4, 1)))
    layer["quantities"]["inference.v"]["shape"] = [T, 2 * 4]  # joined [T, G*V]: V = 4
    report = report_of(layer)
    bf16 = the(report, "kv_cache")
    assert bf16["v_head_dim"] == 4 and bf16["full_bytes_per_token"] == (8 + 4) * 2 * 2
    assert list(bf16["options"]) == ["k"] and "keys after RoPE" not in bf16["text"]
    annotate(report, VerdictThresholds(cache_dtype="float32"))
    fp32 = the(report, "kv_cache")
    assert fp32["full_bytes_per_token"] == 2 * bf16["full_bytes_per_token"]
    assert fp32["options"]["k"]["ratio"] == pytest.approx(bf16["options"]["k"]["ratio"])


def test_kv_summary_sums_the_layers_and_low_ratios_are_not_advised(probed):
    cheap = probed(0, kv=kv_heads(k=(1, 1), v=(1, 1)))
    full_rank = probed(1, kv=kv_heads(k=(8, 8), v=(8, 8)))  # bases cost more than they save
    report = report_of(cheap, full_rank)
    assert [a["layer"] for a in report["advice"] if a["kind"] == "kv_cache"] == [0]
    summary = the(report, "kv_cache_summary")
    assert summary["layers"] == 2 and report["findings"] == []
    per_layer = (8 + 8) * 2 * 2
    assert summary["full_bytes_per_token"] == 2 * per_layer
    assert summary["options"]["k"]["bytes_per_token"] == (1 + 1) * 2 * 2 + (8 + 8) * 2 * 2


# ---------------------------------------------------------------- on a real probe

class RopeAttention(nn.Module):
    """A causal softmax block with RoPE, the probe contract and key_value_heads, on
    near-uniform attention (small weights), so its past->future rank stays low."""

    kind = "rope"

    def __init__(self, d=16, h=2, k=8):
        super().__init__()
        self.h, self.k = h, k
        self.qkv = nn.Linear(d, 3 * h * k, bias=False)
        self.wo = nn.Linear(h * k, d, bias=False)

    def _rope(self, x):  # [B, H, T, K]
        T = x.shape[-2]
        angle = torch.arange(T)[:, None] / 10 ** (torch.arange(self.k // 2) / (self.k // 2))
        cos, sin = angle.cos(), angle.sin()
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def _heads(self, x):
        q, k, v = (y.unflatten(-1, (self.h, self.k)).transpose(1, 2)
                   for y in self.qkv(x).chunk(3, -1))
        return q, k, v

    def mixing_matrices(self, x):
        q, k, _ = self._heads(x)
        s = self._rope(q) @ self._rope(k).transpose(-1, -2) / self.k ** 0.5
        T = x.shape[1]
        return s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf).softmax(-1)

    def forward(self, x, cache=None):
        y = self.mixing_matrices(x) @ self._heads(x)[2]  # [B, H, T, K]
        if cache is not None:
            cache["x"] = x
        return self.wo(y.transpose(1, 2).flatten(-2))

    def key_value_heads(self, x):
        _, k, v = self._heads(x)
        return {"k": self._rope(k), "v": v, "k_pre_rope": k}

    def init_cache(self, batch, max_len):
        return {}

    def inference_state(self, cache):
        kv = self.key_value_heads(cache["x"])
        return {n: kv[n].transpose(1, 2).flatten(-2) for n in ("k", "v")}  # [B, T, H*K]

    def weight_matrices(self):
        return {"out": self.wo.weight}  # [D, H*K]

    def budget(self, seq_len):
        from budgets import RankBudget
        return RankBudget(block=self.kind, seq_len=seq_len, n_heads=self.h,
                          mixing=seq_len // 2, logits=self.k, value_path=self.h * self.k,
                          inference=min(seq_len, self.h * self.k))


def test_a_real_probe_gives_advice_that_holds():
    torch.manual_seed(0)
    model = nn.Sequential(RopeAttention(), RopeAttention())
    x = torch.randn(3, 64, 16)  # [B, T, D]
    probe = probe_model(model, x)
    if "rank_eps_max" not in probe["layers"][0]["quantities"]["past_future"]:
        pytest.skip("the probe does not record rank_eps_max yet")
    report = build_report({"rope": {"probe": probe, "step": 1, "params": 1}})
    assert violations(report) == []
    bounds = [a for a in report["advice"] if "conditions" in a]
    assert all(a["conditions"]["checked"] for a in bounds)
    assert all(a["conditions"]["seq_len"] == 64 for a in bounds)
    layer = report["variants"][0]["layers"][0]
    out = next(a for a in layer["axes"] if a["axis"] == "out")
    assert (out["part"], out["declared"]) == ("pretrain", 16)  # min(D, H*K)
    if "kv_heads" in layer:  # keys before RoPE are what the advice compares too
        item = next(a for a in [*report["advice"], *report["findings"]]
                    if a["kind"] in ("kv_cache_summary", "finding") and "options" in a)
        assert set(item["options"]) == {"k", "k_pre_rope"}


def test_a_cache_no_low_rank_form_shrinks_is_a_finding_not_advice(probed):
    full_rank = probed(0, kv=kv_heads(k=(8, 8), v=(8, 8)))  # bases cost more than they save
    report = report_of(full_rank)
    assert not {"kv_cache", "kv_cache_summary"} & set(kinds(report))
    (finding,) = report["findings"]
    assert finding["topic"] == "no_saving" and finding["options"]["k"]["ratio"] < 1
    assert f"no low-rank KV saving at T = {T}" in finding["text"]
