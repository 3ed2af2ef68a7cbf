import json

from train.cli import main


def test_blocks_table_and_json(capsys):
    assert main(["blocks", "--d-model", "64", "--n-heads", "4", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "MQA" in out and "kernel backends" in out and "sdpa" in out
    assert main(["blocks", "--d-model", "64", "--n-heads", "4", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["d_model"] == 64 and doc["seq_len"] == 1024
    softmax = [b for b in doc["blocks"] if b["block"] == "softmax"]
    assert len(softmax) == 3  # MHA, GQA, MQA
    mha, mqa = softmax[0], softmax[-1]
    assert mha["budget"]["inference"] == 64 and mqa["budget"]["inference"] == 16
    assert mha["cache_elements"] > mqa["cache_elements"] and mha["params"] > mqa["params"]
    assert doc["backends"]["attention"]["sdpa"] is None


def test_blocks_bad_width_is_one_line(capsys):
    assert main(["blocks", "--d-model", "66", "--n-heads", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rankzoo: error: ") and "66" in err and err.count("\n") == 1
