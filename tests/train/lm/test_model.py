import pytest
import torch

from train.lm.decoder import DecoderLM


def tiny(**kw):
    args = dict(vocab_size=32, d_model=16, n_layers=2, block="softmax",
                block_kwargs={"n_heads": 2}, max_len=24)
    return DecoderLM(**{**args, **kw})


def test_shapes_blocks_and_params():
    torch.manual_seed(0)
    model = tiny()
    tokens = torch.randint(32, (3, 20))
    assert model(tokens).shape == (3, 20, 32)
    assert len(model.blocks) == 2
    assert all(b.kind == "softmax" for b in model.blocks)
    assert model.param_count() == sum(p.numel() for p in model.parameters())
    assert model.head.weight is not model.embed.weight  # untied by default
    tied = tiny(tie_embeddings=True)
    assert tied.head.weight is tied.embed.weight
    assert tied.param_count() == model.param_count() - 32 * 16


def test_init_scales():
    torch.manual_seed(0)
    model = tiny(vocab_size=256, d_model=64)
    assert abs(model.embed.weight.std().item() - 1.0) < 0.05
    assert abs(model.head.weight.std().item() - 0.02) < 0.002
    with torch.no_grad():  # untied head: the initial loss is about ln(vocab)
        logits = model(torch.randint(256, (4, 20)))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                 torch.randint(256, (80,)))
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5


def test_gqa_kwargs_reach_the_block():
    model = tiny(block_kwargs={"n_heads": 4, "n_kv_heads": 1})
    assert all(b.config.n_kv_heads == 1 for b in model.blocks)


def test_causal():
    torch.manual_seed(0)
    model = tiny().eval()
    a = torch.randint(32, (2, 20))
    b = a.clone()
    b[:, 12:] = torch.randint(32, (2, 8))
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :12], lb[:, :12])
    assert not torch.allclose(la[:, 12:], lb[:, 12:])


def test_bad_input_names_the_value():
    model = tiny()
    with pytest.raises(ValueError, match=r"\[B, T\].*\(2, 3, 4\)"):
        model(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="30 exceeds max_len 24"):
        model(torch.zeros(1, 30, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tokens"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="d_model"):
        tiny(block_kwargs={"n_heads": 2, "d_model": 8})
    with pytest.raises(ValueError, match="n_layers"):
        tiny(n_layers=0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        tiny(block_kwargs={"n_heads": 2, "n_kv_heads": 3})
