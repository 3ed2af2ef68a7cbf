"""The modular-addition task: disjoint seeded splits, the sum at `=`, errors naming values."""

from __future__ import annotations

import pytest

from train.config.sections import DataConfig
from train.data import IGNORE, ModAddSpec, make_splits


def test_splits_are_disjoint_and_labelled():
    spec = ModAddSpec(modulus=7, vocab_size=8)
    (tx, ty), (vx, vy) = make_splits(spec, 30, 19, seed=3)
    assert tx.shape == (30, 3) and vx.shape == (19, 3)
    assert (tx[:, 2] == 7).all() and (ty[:, :2] == IGNORE).all()
    assert (ty[:, 2] == (tx[:, 0] + tx[:, 1]) % 7).all()
    pairs = lambda x: {tuple(r) for r in x[:, :2].tolist()}  # noqa: E731
    assert not pairs(tx) & pairs(vx) and len(pairs(tx)) == 30


def test_config_resolves_the_vocabulary_and_names_bad_values():
    data = DataConfig(task="modadd", modulus=11, seq_len=3, train_size=60, val_size=61)
    assert data.vocab_size == 12 and data.spec().modulus == 11
    with pytest.raises(ValueError, match="seq_len must be 3"):
        DataConfig(task="modadd", modulus=11, seq_len=4)
    with pytest.raises(ValueError, match=r"121"):
        make_splits(data.spec(), 100, 30, seed=0)
