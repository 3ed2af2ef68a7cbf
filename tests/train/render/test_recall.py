"""The recall-vs-capacity view, on constructed reports whose answer is known."""

import pytest

from train.render.recall import recall_figure, recall_markdown, recall_table, recall_view, spearman


def variant(name: str, carried: list[float], accuracy: dict[int, float], cache: int = 100,
            learned=True, cap: int = 16) -> dict:
    layers = [{"layer": i, "block": "softmax",
               "axes": [{"axis": "mixing", "quantity": "past_future", "declared": cap,
                         "realized_max": r - 1, "realized_max_sample": r}]}
              for i, r in enumerate(carried)]
    metrics = {"val/accuracy": 0.5, **{f"val/accuracy/kv{n}": a for n, a in accuracy.items()}}
    return {"variant": name, "metrics": metrics, "layers": layers,
            "budget": {"model": {"cache_elements": cache}}, "status": {"learned": learned}}


def report(*variants) -> dict:
    return {"variants": list(variants)}


def test_no_per_count_accuracy_no_view():
    v = variant("a", [3.0], {})
    assert recall_view(report(v)) is None


def test_rows_take_the_largest_layer_and_sample_and_count_bytes():
    view = recall_view(report(variant("a", [3.0, 7.2], {2: 0.9, 8: 0.4}, cache=1000)))
    (row,) = view["rows"]
    assert row["carried"] == 8  # ceil of the largest layer's largest sample
    assert row["cap"] == 16 and row["cache_bytes"] == 2000  # bf16
    assert view["counts"] == [2, 8] and list(row["accuracy"]) == [2, 8]


def test_sentence_splits_by_carried_rank_at_the_largest_count():
    view = recall_view(report(variant("big", [9.0], {2: 1.0, 8: 0.9}),
                              variant("big2", [12.0], {2: 1.0, 8: 0.7}),
                              variant("small", [3.0], {2: 0.9, 8: 0.2})))
    s = view["sentence"]
    assert "At 8 key-value pairs" in s
    assert "recall 0.80 on average (big 9, big2 12)" in s  # (0.9 + 0.7) / 2
    assert "recall 0.20 on average (small 3)" in s
    assert "Spearman's rho of carried rank and accuracy is 0.50" in s  # ranks (1,2,3) vs (3,1,2)


def test_sentence_when_capacity_does_not_separate():
    view = recall_view(report(variant("a", [9.0], {4: 0.9}), variant("b", [5.0], {4: 0.8})))
    assert "Every variant carries at least 4" in view["sentence"]
    assert "Spearman" not in view["sentence"]  # two points: no correlation stated


@pytest.mark.parametrize("xs, ys, want", [([1, 2, 3, 4], [2, 4, 6, 9], 1.0),
                                          ([1, 2, 3, 4], [9, 6, 4, 2], -1.0),
                                          ([1, 1, 2, 3], [1, 2, 3, 4], 0.9486833)],
                         ids=["monotone", "reversed", "ties"])
def test_spearman_by_hand(xs, ys, want):
    assert spearman(xs, ys) == pytest.approx(want, abs=1e-6)


def test_spearman_undefined_cases():
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_table_markdown_and_figure():
    view = recall_view(report(variant("a", [9.0], {2: 1.0, 8: 0.9}, learned=None),
                              variant("b", [3.0], {2: 0.9, 8: 0.2}, learned=False)))
    md = recall_markdown(view)
    assert "## Recall vs capacity" in md and "| a | softmax | 9 / 16 |" in md
    assert md.rstrip().endswith(view["sentence"])
    assert recall_table(view).row_count == 2
    w, h = recall_figure(view).get_size_inches() * 110
    assert w <= 1200 and h <= 600


def test_variants_that_did_not_learn_are_left_out_and_named():
    view = recall_view(report(variant("big", [9.0], {8: 0.9}),
                              variant("stuck", [12.0], {8: 0.1}, learned=False),
                              variant("small", [3.0], {8: 0.3})))
    s = view["sentence"]
    assert "recall 0.90 on average (big 9)" in s and "stuck 12" not in s
    assert s.endswith("Left out, as they did not learn the task: stuck.")
