"""Hybrid LMs: a layer pattern of zoo blocks, every pair of families, decoded with one cache
per layer of each block's own type."""

from __future__ import annotations

import itertools

import pytest
import torch

import zoo
from train.lm.decoder import DecoderLM

D = 32
# each family at d_model 32 with a window, state or latent that binds at the lengths below
KNOBS = {
    "softmax": {"n_heads": 4},
    "sliding_window": {"n_heads": 4, "window": 5},
    "linear": {"n_heads": 4, "chunk_size": 8},
    "ssm": {"n_heads": 4, "d_state": 6, "n_groups": 2, "chunk_size": 8},
    "mla": {"n_heads": 4, "kv_lora_rank": 6},
    "moe": {"n_heads": 4, "top_k": 2},
    "delta": {"n_heads": 4, "key_dim": 6, "chunk_size": 8},
    "sparse": {"n_heads": 4, "top_k": 5},
}
PAIRS = list(itertools.combinations(zoo.families(), 2))


def hybrid(pattern, seed=0, max_len=64) -> DecoderLM:
    torch.manual_seed(seed)
    layers = [(name, KNOBS[name]) for name in pattern]
    return DecoderLM(vocab_size=50, d_model=D, n_layers=len(layers), layers=layers,
                     max_len=max_len).to(torch.float64).eval()


def tokens(B=2, T=17, seed=1):
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(seed))


def test_the_pairs_cover_every_registered_family():
    assert {name for pair in PAIRS for name in pair} == set(zoo.families()) == set(KNOBS)


@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_prefill_then_decode_equals_parallel_forward(pair):
    """Both orders of the pair, three layers (a, b, a): each layer continues from its own
    cache, so the logits of a prefill and one-token steps equal the parallel forward's."""
    for pattern in ((pair[0], pair[1], pair[0]), (pair[1], pair[0], pair[1])):
        model, ids = hybrid(pattern), tokens()
        with torch.no_grad():
            full = model(ids)  # [B, T, vocab]
            cache = model.init_cache(ids.shape[0])
            steps = [model(ids[:, :6], cache)]
            steps += [model(ids[:, t:t + 1], cache) for t in range(6, ids.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-9, atol=1e-9)


def test_each_layer_is_its_own_block_with_its_own_cache_type():
    pattern = ("sliding_window", "softmax", "ssm")
    model = hybrid(pattern)
    assert [b.kind for b in model.blocks] == list(pattern)
    caches = model.init_cache(2)
    assert [type(c) for c in caches] == [type(b.init_cache(2, 64)) for b in model.blocks]
    assert len({type(c) for c in caches}) == 3


def test_a_hybrid_is_causal():
    model, ids = hybrid(("ssm", "softmax")), tokens()
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_bad_layer_specs_name_the_values():
    with pytest.raises(ValueError, match="either block .* or layers"):
        DecoderLM(50, D, 2)
    with pytest.raises(ValueError, match="either block .* or layers"):
        DecoderLM(50, D, 2, block="softmax", layers=[("softmax", {})] * 2)
    with pytest.raises(ValueError, match="3 block specs for n_layers = 2"):
        DecoderLM(50, D, 2, layers=[("softmax", {"n_heads": 4})] * 3)
    with pytest.raises(ValueError, match="layer 1's block kwargs must not set d_model"):
        DecoderLM(50, D, 2, layers=[("softmax", {}), ("softmax", {"d_model": 32})])
    model = hybrid(("softmax", "ssm"))
    with pytest.raises(ValueError, match="the cache holds 1 layers, the model has 2"):
        model(tokens(), model.init_cache(2)[:1])
