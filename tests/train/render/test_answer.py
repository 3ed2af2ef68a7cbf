"""The short answer a report opens with: one row per variant, at most three advice items,
the ones that change a model first."""

from __future__ import annotations

from budgets.verdicts import VerdictThresholds
from train.render.answer import answer_markdown, budget_line, outcome, top_advice

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
