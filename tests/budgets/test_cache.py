"""A cache's bytes (budgets/cache.py): the dtype table, the formulas, cost models, keys."""

from __future__ import annotations

import json

import pytest

from budgets.cache import (
    CostModel,
    Keys,
    cache_size,
    dtype_bytes,
    full_cache_bytes,
    lowrank_cache_bytes,
)


def test_cost_models_and_keys_read_as_their_values_in_documents():
    doc = {"cost_model": CostModel.SHARED, "keys": Keys.PRE_ROPE}
    assert json.loads(json.dumps(doc)) == {"cost_model": "shared_basis", "keys": "pre-rope"}
    assert f"{CostModel.PER_SEQUENCE}" == str(CostModel.PER_SEQUENCE) == "per_sequence_basis"
    assert CostModel("shared_basis") is CostModel.SHARED and CostModel.SHARED == "shared_basis"
    assert [m.rank_field for m in CostModel] == ["rank_eps_pooled", "rank_eps_max"]


def test_keys_know_their_probe_field_and_label():
    assert Keys.of_field("k_pre_rope") is Keys.PRE_ROPE and Keys.POST_ROPE.field == "k"
    assert Keys.PRE_ROPE.label_for(rope=True) == "keys before RoPE"
    assert Keys.POST_ROPE.label_for(rope=False) == "keys"  # no RoPE: just keys
    with pytest.raises(ValueError, match="no keys are probed as 'q'"):
        Keys.of_field("q")


def test_full_and_low_rank_bytes_under_each_cost_model():
    assert full_cache_bytes([16, 16] * 4, 2) == 256  # 4 KV heads x (K + V) at 2 B
    low = lowrank_cache_bytes((16, 16), (4, 2), 2, 32)
    assert low == {"bytes_per_token": 12, "basis_bytes": 192, "bytes_per_token_at_T": 18.0}
    shared = cache_size(12, 192, 64, 32, CostModel.SHARED)  # the basis is a weight
    assert shared == {"cache_bytes_per_token": 12, "ratio": 64 / 12}
    per_sequence = cache_size(12, 192, 64, 32, CostModel.PER_SEQUENCE)
    assert per_sequence == {"cache_bytes_per_token": 18.0, "ratio": 64 / 18}


def test_an_unknown_dtype_is_an_error_naming_it():
    assert dtype_bytes("bfloat16") == 2
    with pytest.raises(ValueError, match="'bf16' is not one of"):
        dtype_bytes("bf16")
