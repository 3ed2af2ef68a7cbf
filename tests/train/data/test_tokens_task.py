"""data.task: tokens: windows from memory-mapped shards, validation from a named shard or
the last fraction, ids checked where they are read, and the config's checks."""

import numpy as np
import pytest
import torch

from train.config import parse_experiment
from train.data import TokensSpec, make_splits, write_shard
from train.data.tokens import segments_of

from ..conftest import tiny_experiment


def shards(tmp_path, fmt="modded", n=2, size=400, vocab=1000):
    """n shards whose ids count up: token i of the stream is i % vocab, so a window's
    first id says where it starts."""
    ext = ".npy" if fmt == "npy" else ".bin"
    stream = np.arange(n * size) % vocab
    for i in range(n):
        write_shard(tmp_path / f"train_{i:06d}{ext}", stream[i * size:(i + 1) * size]
                    .astype(np.uint16), fmt)
    return stream


@pytest.mark.parametrize("fmt", ["bin", "modded", "npy"])
def test_windows_are_runs_of_one_shard_and_validation_is_the_last_fraction(tmp_path, fmt):
    shards(tmp_path, fmt, n=2, size=400, vocab=1000)
    spec = TokensSpec((str(tmp_path),), seq_len=16, vocab_size=1000, val_fraction=0.25)
    (x, y), (vx, vy) = make_splits(spec, 64, 16, seed=0)
    assert x.dtype == vx.dtype == torch.int64 and x.shape == (64, 16) and vx.shape == (16, 16)
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])  # next-token labels
    steps = np.diff(np.concatenate([x, y[:, -1:]], axis=1), axis=1)
    assert (steps == 1).all()  # consecutive ids: no window crosses a shard boundary here
    cut = 600  # the last quarter of 800 tokens validates: the tail of the second shard
    assert (x[:, 0] + 16 < cut).all() and (vx[:, 0] >= cut).all()
    train, val = segments_of(spec, *spec.shards())
    assert [(s.start, s.stop) for s in train] == [(0, 400), (0, 200)]
    assert [(s.start, s.stop) for s in val] == [(200, 400)]


def test_a_named_validation_shard(tmp_path):
    shards(tmp_path, n=1, size=300)
    write_shard(tmp_path / "val.npy", np.full(100, 999, dtype=np.int32), "npy")
    spec = TokensSpec((str(tmp_path / "train_*.bin"),), seq_len=8, vocab_size=1000,
                      val_paths=(str(tmp_path / "val.npy"),))
    (x, _), (vx, _) = make_splits(spec, 8, 4, seed=0)
    assert (x < 300).all() and (vx == 999).all()
    again = make_splits(spec, 8, 4, seed=0)
    assert (again[0][0] == x).all() and not (make_splits(spec, 8, 4, seed=1)[0][0] == x).all()


def test_an_id_outside_the_vocabulary_names_the_shard_and_its_first_offset(tmp_path):
    tokens = np.arange(200, dtype=np.uint16) % 50
    tokens[[120, 150]] = 60  # the first of them is named, whichever window met one
    write_shard(tmp_path / "bad.bin", tokens, "modded")
    spec = TokensSpec((str(tmp_path / "bad.bin"),), seq_len=16, vocab_size=50)
    with pytest.raises(ValueError, match=r"bad\.bin'.*token id 60 at token offset 120 "
                                         r"\(byte offset 1,264\).*data\.vocab_size 50"):
        make_splits(spec, 64, 8, seed=0)


def test_too_short_shards_and_empty_directories_are_named(tmp_path):
    write_shard(tmp_path / "a.bin", np.arange(10, dtype=np.uint16), "bin")
    with pytest.raises(ValueError, match="too few|at most seq_len 16"):
        make_splits(TokensSpec((str(tmp_path),), seq_len=16, vocab_size=100), 4, 4, 0)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("not a shard")
    with pytest.raises(ValueError, match=r"docs'.*holds no \.bin or \.npy shard"):
        TokensSpec((str(tmp_path / "docs"),), seq_len=4, vocab_size=100)


def tokens_experiment(tmp_path, **data) -> dict:
    """The tiny experiment on one shard of 300 tokens, with `data`'s keys."""
    shards(tmp_path, n=1, size=300)
    return {**tiny_experiment(), "data": {
        "task": "tokens", "paths": [str(tmp_path / "train_000000.bin")], "seq_len": 8,
        "train_size": 32, "val_size": 8, "batch_size": 8, **data}}


def test_config_takes_the_vocabulary_and_refuses_what_cannot_work(tmp_path):
    exp = parse_experiment(tokens_experiment(tmp_path, vocab_size=1000))
    assert exp.data.vocab_size == 1000 and exp.data.val_fraction == 0.1
    again = parse_experiment({**tiny_experiment(), "data": exp.data.to_dict()})
    assert again.data == exp.data  # the resolved section loads back
    shard = str(tmp_path / "train_000000.bin")
    for data, match in [
        ({}, r"data\.vocab_size is missing: task tokens"),
        ({"vocab_size": 1000, "val_paths": [shard], "val_fraction": 0.2},
         r"data\.val_paths and data\.val_fraction both set"),
        ({"vocab_size": 1000, "format": "bim"}, r"data\.format must be one of"),
        ({"vocab_size": 1000, "max_bytes": 10}, r"unknown tokens data key 'data\.max_bytes'"),
        ({"vocab_size": 1000, "format": "npy"}, r"train_000000\.bin'.*bad header at byte offset 0"),
        ({"vocab_size": 1000, "paths": [str(tmp_path / "gone.bin")]}, r"gone\.bin' does not exist"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_experiment(tokens_experiment(tmp_path, **data))
