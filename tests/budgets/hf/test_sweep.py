"""Every causal LM the installed transformers ships (tests/hf_sweep.py): each, built tiny
offline, is measured faithfully by `report --hf` (its captured P equal to eager attention's
in fp64, or each layer's output unchanged by the capture; every layer measured or named),
or refused in one line, or skipped with its reason (no tiny text causal LM to build); never
a traceback, never a silent difference. Each type's row is printed (`-rP`), skips list
their reasons (`-rs`), and the last test prints the table; the whole sweep (200 types in
transformers 5.25) takes ~20 s on 2 loaded CPU cores:

    python -m pytest -q tests/budgets/hf/test_sweep.py -rs
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("transformers", reason="the HF probe needs transformers")

from tests.hf_sweep import KNOWN, SWEEP, causal_lm_types, sweep_one  # noqa: E402

ROWS: dict[str, object] = {}


def _check(model_type: str) -> None:
    row = ROWS[model_type] = sweep_one(model_type)
    print(f"{row.model_type}: {row.outcome} ({row.seconds:.2f} s): {row.detail}")
    if model_type in KNOWN:
        assert row.outcome == "broken", f"{model_type} now {row.outcome}: drop it from KNOWN"
        pytest.xfail(KNOWN[model_type])
    assert row.outcome != "broken", f"{model_type}: {row.detail}"
    if row.outcome == "skipped":
        pytest.skip(f"{model_type}: {row.detail}")


@pytest.mark.parametrize("model_type", causal_lm_types())
def test_each_type_is_faithful_refused_or_skipped(model_type):
    _check(model_type)


def test_the_table():
    """The sweep's table, by outcome; every type swept so far has a row."""
    if not ROWS:
        pytest.skip("no type swept in this session")
    counts = Counter(r.outcome for r in ROWS.values())
    print(f"{len(ROWS)} causal LM types swept: " + ", ".join(
        f"{n} {k}" for k, n in sorted(counts.items())))
    for r in sorted(ROWS.values(), key=lambda r: (r.outcome, r.model_type)):
        print(f"| {r.model_type} | {r.outcome} | {r.detail} |")
    assert set(counts) <= {"faithful", "refused", "skipped", "broken"}


def test_an_encoder_attending_both_ways_is_refused_in_one_line(monkeypatch):
    """bert built without is_decoder (as its causal-LM class warns against) attends both
    ways: refused in one line naming the layer, not measured as if causal."""
    monkeypatch.setitem(SWEEP, "bert", {})
    row = sweep_one("bert")
    assert row.outcome == "refused" and "is_causal=False" in row.detail
    assert "bert.encoder.layer.0" in row.detail
