"""The short answer a report opens with: one row per variant, at most three advice items,
the ones that change a model first."""

from __future__ import annotations

from budgets.advice.verdicts import VerdictThresholds
from train.render.answer import answer_markdown, budget_line, headline, outcome, top_advice

TH = VerdictThresholds()


def row(axis, part, declared, realized):
    return {"axis": axis, "part": part, "quantity": axis, "declared": declared,
            "realized_mean": realized}


def variant(status=None, metrics=None):
    layer = {"layer": 0, "axes": [row("mixing", "pretrain", 16, 3.5),
                                  row("logits", "pretrain", 8, 8.0),
                                  row("inference", "inference", 32, None)]}
    return {"variant": "v", "step": 10, "metrics": metrics or {}, "status": status,
            "layers": [layer, {**layer, "layer": 1}]}


def test_the_budget_line_sums_realized_and_declared_per_part():
    # pretrain: (3.5 + 8) x 2 layers of (16 + 8) x 2; an undecided inference row counts 0
    assert budget_line(variant()) == "pretrain 23/48 · adapter - · inference 0/64"


def test_outcome_tells_solved_from_learned():
    mqar = {"state": "finished", "step": 600, "max_steps": 600, "learned": True,
            "baseline": {"chance_accuracy": 0.2}}  # solved from 0.92
    assert outcome(variant(mqar, {"val/accuracy": 0.95}), TH) == "finished, solved"
    assert outcome(variant(mqar, {"val/accuracy": 0.6}), TH) == "finished, learned"
    stopped = {**mqar, "state": "stopped", "step": 300}
    assert outcome(variant(stopped, {"val/accuracy": 0.6}), TH) == "stopped at 300/600"


def test_top_advice_puts_what_changes_a_model_first_and_keeps_three():
    kinds = ["note", "collapsed", "kv_cache", "cheaper_block", "grows_with_t", "lora_rank"]
    report = {"advice": [{"kind": k, "text": k} for k in kinds]}
    assert [a["kind"] for a in top_advice(report)] == ["cheaper_block", "lora_rank",
                                                       "grows_with_t"]


def test_markdown_answer_counts_what_only_the_details_hold():
    report = {"experiment": "x", "variants": [variant()],
              "advice": [{"kind": "note", "text": f"n{i}"} for i in range(5)],
              "findings": [{"kind": "finding", "text": "f"}]}
    md = answer_markdown(report)
    assert md.startswith("## Summary") and md.count("\n- n") == 3
    assert "(2 more advice items, 1 finding: below.)" in md


def test_a_kv_item_reads_as_one_line_with_its_bytes_basis_and_measured_loss():
    opts = {"k_pre_rope": {"cost_model": "shared_basis", "ratio": 1.6, "basis_bytes": 640,
                           "cache_bytes_per_token": 40.0},
            "k": {"cost_model": "shared_basis", "ratio": 1.2, "basis_bytes": 800,
                  "cache_bytes_per_token": 53.3}}
    item = {"kind": "kv_cache_summary", "variant": "mqa", "rope": True, "options": opts,
            "full_bytes_per_token": 64, "text": "a long text " * 20,
            "measured": {"delta_loss": 0.0012, "ratio": 1.6, "verdict": "verified",
                         "tolerance": 0.02}}
    line = headline(item)
    assert line.startswith("mqa: a low-rank KV cache, 40 B/token for 64 (1.60x; keys "
                           "before RoPE + values, one basis shared by every sequence, "
                           "640 B once per model)")
    assert line.endswith("measured +0.0012 nats per token at 1.60x: verified")
    assert "a long text" not in line  # the full text stays in the details
    md = answer_markdown({"experiment": "x", "variants": [variant()], "advice": [item]})
    assert f"- {line}" in md
    note = {"kind": "note", "text": "a note"}
    assert headline(note) == "a note"  # other kinds read as their text
