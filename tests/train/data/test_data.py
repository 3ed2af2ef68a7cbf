import pytest
import torch

from train.data import IGNORE, MQARSpec, accuracy, make_mqar, mqar_loaders

SPEC = MQARSpec(vocab_size=64, seq_len=48, num_kv_pairs=6)


def test_deterministic_for_a_seed():
    a, la = make_mqar(SPEC, 10, seed=3)
    b, lb = make_mqar(SPEC, 10, seed=3)
    c, _ = make_mqar(SPEC, 10, seed=4)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, c)
    assert a.shape == la.shape == (10, 48) and a.dtype == torch.long


def test_labels_sit_on_the_keys_that_recur():
    tokens, labels = make_mqar(SPEC, 50, seed=0)
    n, half = SPEC.num_kv_pairs, SPEC.vocab_size // 2
    for x, y in zip(tokens, labels, strict=True):
        keys, values = x[0:2 * n:2], x[1:2 * n:2]
        assert ((keys >= 1) & (keys < half)).all() and (values >= half).all()
        assert len(set(keys.tolist())) == n
        pos = (y != IGNORE).nonzero().flatten()
        assert len(pos) == n and (pos >= 2 * n).all()  # one query per key, after the context
        pairs = dict(zip(keys.tolist(), values.tolist(), strict=True))
        for p in pos.tolist():
            assert pairs[x[p].item()] == y[p].item()  # the query key's value is the label
    assert (tokens < SPEC.vocab_size).all() and (tokens >= 0).all()


def test_accuracy_at_query_positions_only():
    _, labels = make_mqar(SPEC, 4, seed=0)
    logits = torch.zeros(4, 48, 64)
    perfect = logits.scatter(2, labels.clamp(min=0).unsqueeze(-1), 1.0)
    acc, count = accuracy(perfect, labels)
    assert count == 4 * SPEC.num_kv_pairs and acc.item() == 1.0
    acc, _ = accuracy(logits, labels)  # argmax 0 is never a value
    assert acc.item() == 0.0


def test_loaders_split_and_order():
    t1, v1 = mqar_loaders(SPEC, 64, 16, 8, seed=0)
    t2, _ = mqar_loaders(SPEC, 64, 16, 8, seed=0)
    assert not torch.equal(t1.dataset.tensors[0][:16], v1.dataset.tensors[0])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(t1, t2, strict=True))


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=64, seq_len=20, num_kv_pairs=6), r"num_kv_pairs \(6\).*seq_len \(20\)"),
    (dict(vocab_size=12, seq_len=64, num_kv_pairs=6), r"num_kv_pairs \(6\).*vocab_size \(12\)"),
    (dict(vocab_size=64, seq_len=0, num_kv_pairs=6), "seq_len must be a positive int, got 0"),
])
def test_bad_spec_names_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MQARSpec(**kwargs)
