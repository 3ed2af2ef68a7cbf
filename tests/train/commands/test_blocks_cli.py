import json

import pytest

from train.cli import main


def blocks_json(capsys, *args):
    assert main(["blocks", "--d-model", "64", "--n-heads", "4", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_blocks_table_and_json(capsys):
    assert main(["blocks", "--d-model", "64", "--n-heads", "4", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "MQA" in out and "kernel backends" in out and "sdpa" in out
    doc = blocks_json(capsys)
    assert doc["d_model"] == 64 and doc["seq_len"] == 1024 and doc["cache_dtype"] == "bf16"
    softmax = {b["variant"]: b for b in doc["blocks"] if b["block"] == "softmax"}
    assert len(softmax) == 3  # MHA, GQA, MQA
    mha, mqa = softmax["softmax (MHA)"], softmax["softmax (MQA)"]
    assert mha["budget"]["inference"] == 64 and mqa["budget"]["inference"] == 16
    assert mha["cache_elements"] > mqa["cache_elements"] and mha["params"] > mqa["params"]
    assert doc["backends"]["attention"]["sdpa"] is None


def test_blocks_grouped_by_family_and_ordered_by_cache(capsys):
    doc = blocks_json(capsys)
    families = [b["family"] for b in doc["blocks"]]
    assert families == sorted(families, key=families.index)  # each family together
    for family in dict.fromkeys(families):
        caches = [b["cache_bytes"] for b in doc["blocks"] if b["family"] == family]
        assert caches == sorted(caches)
    smallest = [min(b["cache_bytes"] for b in doc["blocks"] if b["family"] == f)
                for f in dict.fromkeys(families)]
    assert smallest == sorted(smallest)


@pytest.mark.parametrize("dtype, size", [("bf16", 2), ("fp32", 4), ("float16", 2), ("fp8", 1)])
def test_blocks_cache_in_bytes_at_a_dtype(capsys, dtype, size):
    doc = blocks_json(capsys, "--cache-dtype", dtype)
    assert doc["dtype_bytes"] == size
    for b in doc["blocks"]:
        assert b["cache_bytes"] == size * b["cache_elements"]


def test_blocks_knobs_and_matched_parameters(capsys):
    assert main(["blocks", "--d-model", "256", "--n-heads", "8"]) == 0
    out = capsys.readouterr().out
    assert "K=16, F=153" in out  # the Taylor preset's knob, resolved
    assert "K=16 gives F=153" in out  # ... and the legend saying what it means
    assert "d_mlp" in out and "KiB" in out
    assert main(["blocks", "--d-model", "256", "--n-heads", "8", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ref = doc["reference"]["layer_params"]
    for b in doc["blocks"]:
        # raw: the block's own; matched: its layer within 5% of an MHA layer's with a 4 D MLP
        assert abs(b["layer_params_matched"] - ref) <= 0.05 * ref
    ssm = next(b for b in doc["blocks"] if b["variant"] == "ssm (Mamba-2, N=16)")
    mqa = next(b for b in doc["blocks"] if b["variant"] == "softmax (MQA)")
    assert ssm["params"] > mqa["params"] and ssm["d_mlp_matched"] < mqa["d_mlp_matched"]


def test_blocks_bad_width_is_one_line(capsys):
    assert main(["blocks", "--d-model", "66", "--n-heads", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: ") and "66" in err and err.count("\n") == 1


def test_blocks_unknown_dtype_is_one_line(capsys):
    assert main(["blocks", "--cache-dtype", "fp12"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: --cache-dtype fp12: unknown dtype")
    assert err.count("\n") == 1
