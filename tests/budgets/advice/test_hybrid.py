"""The hybrid advice: a run where some layers but not all are served by a fixed state is
advised to swap exactly those, with the cache it saves; never on a run that did not learn
or did not solve its task; never when every layer is served."""

from __future__ import annotations

from tests.budgets.advice.conftest import (
    kinds,
    lengths,
    mqar_status,
    report_of,
    the,
    violations,
)

CACHE = 512  # each layer's declared cache, elements per sequence at T (2 x T x G x K)
OUT = 12  # each layer's W_O width: a fixed state of N holds N x 12 elements


def with_cache(layer, cache=CACHE, out=OUT):
    """The layer with a declared cache and a W_O row of width `out` (None: no row)."""
    layer["budget"]["cache_elements"] = cache
    if out is not None:
        w = {**layer["quantities"]["value"], "shape": [16, out]}
        layer["quantities"]["out"] = w
    return layer


def growing(probed, i=0):
    """A layer whose past->future rank grows with T: 1 -> 3 over T = 8, 16, 32."""
    return with_cache(probed(i, pf_max=(3, 3),
                             past_future_lengths=lengths((1, 1), (2, 2), (3, 3))))


def flat(probed, i=1, out=OUT):
    """A layer flat at rank 4 from T = 16 on (T = 8 is not judged: 4 is all it holds)."""
    return with_cache(probed(i, pf_max=(4, 4),
                             past_future_lengths=lengths((3, 4), (4, 4), (4, 4))), out=out)


def test_a_flat_layer_beside_a_growing_one_gets_one_hybrid_naming_it(probed):
    report = report_of(growing(probed), flat(probed))
    assert kinds(report).count("hybrid") == 1
    assert the(report, "cheaper_block")["layer"] == 1
    assert "grows_with_t" in kinds(report)
    item = the(report, "hybrid")
    assert (item["layers"], item["kept"], item["state"]) == ([1], [0], 4)
    # by hand, at bfloat16: full 2 x 512 x 2 B; layer 1's 1024 B become 4 x 12 elements
    assert item["cache_saved"] == {
        "dtype": "bfloat16", "bytes_per_element": 2, "seq_len": 32, "full_bytes": 2048,
        "swapped_bytes": 1024, "state_elements": [48], "state_bytes": 96,
        "hybrid_bytes": 1120, "saved_bytes": 928, "ratio": 2048 / 1120}
    assert item["conditions"]["checked"] and item["conditions"]["max_observed"] == 4
    text = item["text"]
    assert "layer 1 realizes past->future rank <= 4" in text and "layer 0 does not" in text
    assert "keeping fake in layer 0" in text
    assert "hybrid 1120 B, 928 B saved (1.83x)" in text
    assert violations(report) == []


def test_every_layer_flat_keeps_the_whole_model_advice_and_no_hybrid(probed):
    report = report_of(flat(probed, 0), flat(probed, 1))
    assert kinds(report).count("cheaper_block") == 2 and "hybrid" not in kinds(report)


def test_no_flat_layer_gives_no_hybrid(probed):
    report = report_of(growing(probed, 0), growing(probed, 1))
    assert not {"cheaper_block", "hybrid"} & set(kinds(report))


def test_no_hybrid_for_a_run_that_did_not_learn(probed):
    status = {"state": "finished", "step": 600, "max_steps": 600, "learned": False,
              "reason": "val/accuracy 0.02 within 0.05 of chance 0.016"}
    report = report_of(growing(probed), flat(probed), status=status)
    assert kinds(report) == ["no_advice"] and not report["findings"]


def test_a_run_that_learned_but_did_not_solve_gets_its_hybrid_held_back(probed):
    report = report_of(growing(probed), flat(probed), status=mqar_status(),
                       metrics={"val/accuracy": 0.5})
    assert not {"cheaper_block", "hybrid"} & set(kinds(report))
    (under,) = [f for f in report["findings"] if f.get("topic") == "under_used"]
    assert "a hybrid with layer 1 at a fixed state of 4" in under["text"]
    solved = report_of(growing(probed), flat(probed), status=mqar_status(),
                       metrics={"val/accuracy": 0.97})
    assert "hybrid" in kinds(solved)


def test_the_hybrid_check_catches_a_wrong_state_or_every_layer(probed):
    report = report_of(growing(probed), flat(probed))
    item = the(report, "hybrid")
    item["state"] = 3
    assert any("layer 1: cheaper_block state 3 < rank 4" in b for b in violations(report))
    item["state"], item["layers"] = 4, [0, 1]
    assert any("swaps every layer" in b for b in violations(report))
    item["layers"] = [1, 5]
    assert any("layer 5 is not a layer of the variant" in b for b in violations(report))


def test_without_declared_caches_the_saving_is_not_stated(probed):
    layers = [growing(probed), flat(probed)]
    for layer in layers:
        layer["budget"]["cache_elements"] = 0
    item = the(report_of(*layers), "hybrid")
    assert item["cache_saved"] is None and "the saving is not stated" in item["text"]


def test_without_an_output_row_the_state_falls_back_to_the_value_path(probed):
    item = the(report_of(growing(probed), flat(probed, out=None)), "hybrid")
    assert item["cache_saved"]["state_elements"] == [4 * 8]  # the fake's value_path cap, 8


def test_a_hybrid_whose_states_outgrow_the_cache_is_a_finding(probed):
    # layer 1 declares 10 elements; a fixed state of 4 over 12 channels holds 48
    report = report_of(growing(probed), with_cache(flat(probed), cache=10))
    assert "hybrid" not in kinds(report)
    (finding,) = [f for f in report["findings"] if f.get("topic") == "hybrid_no_saving"]
    assert finding["cache_saved"]["saved_bytes"] == -76  # (10 - 48) x 2 B
    assert "no cache saved by a hybrid at T = 32" in finding["text"]
