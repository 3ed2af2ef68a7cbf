"""The sparse family (zoo/sparse.py): the gathered path against the reference (outputs and
all gradients, fp64), the output rebuilt from the mixing matrix, decoding, the selection
and the caps. The block contract is checked for every registered block in
tests/zoo/test_contract.py; the mixing math alone in tests/budgets/mixing/test_sparse.py."""

import logging

import pytest
import torch

import zoo
from budgets.mixing.sparse import compressed_mixing, selected_keys, sparse_mixing
from zoo.ops.sparse.select import index_scores

D, H = 32, 4
CONFIGS = {  # readable ids -> the block's knobs; chunk_size 5 puts chunk edges inside T
    "dsa-k4": {"selection": "token", "top_k": 4},
    "dsa-k4-gqa2": {"selection": "token", "top_k": 4, "n_kv_heads": 2},
    "dsa-covers-T": {"selection": "token", "top_k": 64},
    "moba-k2x4": {"selection": "block", "top_k": 2, "block_size": 4, "n_kv_heads": None},
    "nsa-k2x4-gated2-W3": {"selection": "block", "top_k": 2, "block_size": 4, "n_kv_heads": 2,
                           "compress": "gated", "rate": 2, "local_window": 3,
                           "gate": "sigmoid"},
    "dsa-k3-mean3-W5": {"selection": "token", "top_k": 3, "compress": "mean", "rate": 3,
                        "local_window": 5, "gate": "sigmoid"},
    # compressed-only (DeepSeek V4's HCA and CSA): no token's keys cached beyond the window
    "hca-gated3-W5": {"selection": "none", "compress": "gated", "rate": 3, "local_window": 5,
                      "gate": "sigmoid"},
    "csa-k2-gated2-W3-gqa2": {"selection": "slots", "top_k": 2, "compress": "gated",
                              "rate": 2, "local_window": 3, "gate": "sigmoid",
                              "n_kv_heads": 2},
    "hca-mean4": {"selection": "none", "compress": "mean", "rate": 4},
}
COMPRESSED = [label for label in CONFIGS if label.split("-")[0] in ("hca", "csa")]
IDS = list(CONFIGS)


def build(label, seed=0, **over):
    torch.manual_seed(seed)
    return zoo.build("sparse", d_model=D, n_heads=H,
                     **{"chunk_size": 5, **CONFIGS[label], **over}).double()


def x_of(B=2, T=17, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def readout(block, mixed):  # [B, H, T, V] -> y [B, T, D]
    B, _, T, _ = mixed.shape
    return block.o_proj(mixed.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("label", IDS)
def test_gathered_equals_reference_with_all_gradients_fp64(label):
    x = x_of().requires_grad_()
    w = torch.randn(2, 17, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = {}
    for backend in ("gathered", "reference"):
        block = build(label, backend=backend)
        y = block(x)
        loss = (y * w).sum() + (0 if block.aux_loss is None else block.aux_loss)
        grads = torch.autograd.grad(loss, [x, *block.parameters()])
        got[backend] = (y, block.aux_loss, grads)
        assert block.backend == backend
    (y_g, aux_g, grads_g), (y_r, aux_r, grads_r) = got["gathered"], got["reference"]
    torch.testing.assert_close(y_g, y_r, atol=1e-12, rtol=1e-10)
    if aux_r is not None:
        torch.testing.assert_close(aux_g, aux_r, atol=1e-12, rtol=1e-10)
    names = ["x", *(n for n, _ in build(label).named_parameters())]
    for name, a, b in zip(names, grads_g, grads_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10, msg=name)
        assert a.abs().sum() > 0, f"{name} gets no gradient"


@pytest.mark.parametrize("backend", ["gathered", "reference"])
@pytest.mark.parametrize("label", IDS)
def test_output_is_the_mixing_matrix_of_the_value_path(label, backend):
    """y == o_proj(M @ V) in fp64, compressed slots folded back to their tokens; M's rows
    carry the gates' sum (1 for the selection alone) where every branch sees a key."""
    block, x = build(label, backend=backend), x_of().requires_grad_()
    M = block._mixing_matrices(x)  # [B, H, T, T], fp64 (the contract's own casts to fp32)
    rebuilt, y = readout(block, M @ block.value_heads(x)), block(x)
    torch.testing.assert_close(rebuilt, y, atol=1e-12, rtol=1e-10)
    inputs = [x, *block.parameters()]  # the same gradients too (the indexer's: none in either)
    for a, b in zip(torch.autograd.grad(rebuilt.sum(), inputs, allow_unused=True),
                    torch.autograd.grad(y.sum(), inputs, allow_unused=True), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    M = M.detach()
    assert bool((M.triu(1) == 0).all()), "M reaches a future token"
    if block.config.gate == "none":  # a compressed-only layer: once its first slot is whole
        first = block.config.rate - 1 if label in COMPRESSED else 0
        rows = M.sum(-1)[..., first:]
        torch.testing.assert_close(rows, torch.ones_like(rows))
    fp32 = block.mixing_matrices(x)
    assert fp32.dtype == torch.float32 and (fp32.double() - M).abs().max() < 1e-5


DECODE = [[6] + [1] * 11, [1] * 17, [4, 5, 1, 7], [17]]


@pytest.mark.parametrize("chunks", DECODE, ids=["prefill6-steps", "steps", "chunks", "one"])
@pytest.mark.parametrize("label", IDS)
def test_prefill_and_decode_equal_the_parallel_forward(label, chunks):
    block, x = build(label), x_of()
    cache = block.init_cache(2, 17)
    with torch.no_grad():
        pieces, t = [], 0
        for n in chunks:
            pieces.append(block(x[:, t:t + n], cache=cache))
            t += n
        torch.testing.assert_close(torch.cat(pieces, 1), block(x), atol=1e-12, rtol=1e-10)
    assert cache.length == 17


@pytest.mark.parametrize("label", ["nsa-k2x4-gated2-W3", "dsa-k3-mean3-W5",
                                   "csa-k2-gated2-W3-gqa2"])
def test_no_branch_reads_the_future(label):
    """Every output position's gradient is zero on later inputs: an incomplete slot, a
    block's later keys or its mean never reach an earlier query."""
    block, x = build(label), x_of(B=1).requires_grad_()
    y = block(x)
    for t in (0, 2, 5, 8, 13):
        (g,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        assert g[0, t + 1:].abs().max() == 0, t
        assert g[0, :t + 1].abs().max() > 0, t


def test_token_selection_is_the_indexers_top_k_of_the_causal_keys():
    block, x = build("dsa-k4"), x_of(B=1)
    M = block._mixing_matrices(x)[0, 0]  # [T, T]: which keys the selection let through
    qi, ki, wi = block.indexer(x)
    scores = index_scores(qi, ki, wi)[0]  # [T, T]
    for t in range(17):
        chosen = set(torch.nonzero(M[t]).flatten().tolist())
        if t < 4:
            assert chosen == set(range(t + 1))  # fewer causal keys than k: all of them
        else:
            assert len(chosen) == 4 and max(chosen) <= t
            assert scores[t, sorted(chosen)].min() >= scores[t, :t + 1].topk(4).values.min()


def test_block_selection_keeps_the_own_block_and_whole_earlier_blocks():
    block, x = build("moba-k2x4"), x_of(B=1)
    M = block._mixing_matrices(x)[0]  # [H, T, T]
    for t in range(17):
        keys = set(torch.nonzero(M[0, t]).flatten().tolist())
        own = t // 4
        assert set(range(own * 4, t + 1)) <= keys  # the own block, up to t
        blocks = {s // 4 for s in keys}
        assert len(blocks) == min(2, own + 1)
        for b in blocks - {own}:  # earlier blocks whole
            assert set(range(b * 4, b * 4 + 4)) <= keys


def test_the_indexer_learns_only_through_its_loss():
    block, x = build("dsa-k4"), x_of()
    block(x).sum().backward()
    assert block.index_q.weight.grad is None and block.index_k.weight.grad is None
    block.aux_loss.backward()
    assert block.index_q.weight.grad.abs().sum() > 0 and block.q_proj.weight.grad is not None
    with torch.no_grad():
        block(x)
    assert block.aux_loss is None


def test_one_key_each_reaches_rank_t_over_two_so_the_mixing_cap_is_t_over_two():
    """k = 1 does not bound M[t:, :t]: query h + i picking key i is a permutation there."""
    T, h = 16, 8
    q, k = torch.randn(1, 1, T, 4, dtype=torch.float64), torch.randn(1, 1, T, 4,
                                                                     dtype=torch.float64)
    selected = torch.zeros(1, 1, T, T, dtype=torch.bool)
    selected[0, 0, torch.arange(T), torch.arange(T) % h] = True
    M = sparse_mixing(q, k, selected, scale=0.5)[0, 0]
    assert int(torch.linalg.matrix_rank(M[h:, :h])) == h
    assert build("dsa-k4", top_k=1).budget(T).mixing == h


@pytest.mark.parametrize("label", IDS)
def test_budget_counts_the_keys_and_the_cache_the_block_really_uses(label):
    block, T = build(label), 17
    b, c = block.budget(T), block.config
    cache = block.init_cache(1, T)
    with torch.no_grad():
        block(x_of(B=1, T=T), cache=cache)
    held = sum(t.numel() for t in vars(cache).values() if isinstance(t, torch.Tensor))
    assert b.cache_elements == held
    alone = c.gate == "none" and label not in COMPRESSED
    M = block._mixing_matrices(x_of(B=1, T=T)) if alone else None
    if M is not None:  # the selection alone: M's nonzeros are the selected keys
        assert int((M[0, 0] != 0).sum()) == selected_keys(c.shape(), T)
    mixing = compressed_mixing(c.shape(), T) if label in COMPRESSED else T // 2
    assert (b.mixing, b.logits, b.value_path) == (mixing, c.k_dim, min(D, c.kv_heads * c.k_dim))


def test_a_selection_that_cannot_bite_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="rankzoo"):
        build("dsa-k4").budget(4)
        build("moba-k2x4").budget(8)
    assert "top_k (4) covers seq_len 4: the selection cannot bite" in caplog.text
    assert "top_k (2 blocks of 4) covers seq_len 8" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rankzoo"):
        build("dsa-k4").budget(5)
        build("dsa-k3-mean3-W5").budget(6)
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="rankzoo"):
        build("dsa-k3-mean3-W5").budget(5)
    assert "local_window (5) covers seq_len 5: the window branch sees every" in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    ({"gate": "softmax"}, r"gate 'softmax' unknown; known: \['none', 'sigmoid'\]"),
    ({"selection": "random"}, r"selection 'random' unknown; known: \['token', 'block', "
                              r"'slots', 'none'\]"),
    ({"selection": "slots", "local_window": 4, "gate": "sigmoid"},
     r"selection 'slots' picks among compressed slots: set compress: mean or gated"),
    ({"selection": "none"}, r"selection 'none' needs a compressed branch or a local_window"),
    ({"compress": "max"}, r"compress 'max' unknown; known: \['none', 'mean', 'gated'\]"),
    ({"selection": "block", "block_size": 64, "compress": "mean", "rate": 24,
      "gate": "sigmoid"}, r"rate \(24\) must divide block_size \(64\)"),
    ({"compress": "mean"}, r"gate 'none' takes the selection alone, but the branches are "
                           r"\['selected', 'compressed'\]: set gate: sigmoid"),
    ({"top_k": 0}, r"sparse.top_k must be a positive int, got 0"),
    ({"local_window": 0, "gate": "sigmoid"}, r"sparse.local_window must be a positive int"),
    ({"rate": -2}, r"sparse.rate must be a positive int, got -2"),
    ({"index_dim": 5}, r"RoPE needs an even head_dim and index_dim, got 8 and 5"),
    ({"n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
    ({"backend": "flash"}, r"unknown sparse backend 'flash'"),
    ({"top_kk": 3}, r"'top_kk'; did you mean 'top_k'"),
], ids=["gate", "selection", "slots-without-compress", "none-without-branch", "compress",
        "rate-vs-block", "gate-none-two-branches", "top-k-0",
        "window-0", "rate-negative", "odd-index-dim", "kv-heads", "backend", "misspelt"])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        zoo.build("sparse", d_model=D, n_heads=H, **kwargs)


def test_gathered_path_allocates_no_t_by_t(quadratic_allocations):
    """T = 80 above every width: no tensor has two dims >= T, the indexer's included (its
    scores come a chunk of queries at a time)."""
    for label in ("dsa-k4", "nsa-k2x4-gated2-W3"):
        block = build(label, chunk_size=16)
        assert quadratic_allocations(block, x_of(B=1, T=80)) == [], label


def test_presets_are_dsa_nsa_moba_hca_and_csa_and_build():
    presets = zoo.block_class("sparse").variants(256, 8)
    assert [name for name, _ in presets] == ["sparse (DSA-like)", "sparse (NSA-like)",
                                             "sparse (MoBA-like)", "sparse (HCA-like)",
                                             "sparse (CSA-like)"]
    for _, kwargs in presets:
        with torch.device("meta"):
            block = zoo.build("sparse", d_model=256, n_heads=8, **kwargs)
        assert block.budget(4096).cache_elements > 0


def test_rankzoo_blocks_says_once_where_a_preset_cannot_bite(caplog):
    from train.commands.blocks import blocks_document

    with caplog.at_level(logging.WARNING, logger="rankzoo"):
        rows = [r for r in blocks_document(256, 8, 200)["blocks"] if r["family"] == "sparse"]
    assert len(rows) == 5 and not any(r.get("error") for r in rows)
    said = [r.getMessage() for r in caplog.records if "cannot bite" in r.getMessage()]
    assert said == [f"rankzoo: sparse top_k ({k}) covers seq_len 200: the selection cannot "
                    "bite, every causal key is attended"
                    for k in ("256", "4 blocks of 64", "3 blocks of 128")]


def test_a_compressed_cache_grows_only_by_its_slots():
    """What a compressed-only layer holds at max_len 64 and 128: the window's ring and the
    running pooling alike, the slots twice as many; its budget says the same."""
    block = build("hca-gated3-W5")
    held = {n: sum(t.numel() for t in vars(block.init_cache(1, n)).values()
                   if isinstance(t, torch.Tensor)) for n in (64, 128)}
    G, K = block.config.kv_heads, block.config.k_dim
    assert held[128] - held[64] == 2 * G * K * (128 // 3 - 64 // 3)
    assert held[128] == block.budget(128).cache_elements


def test_pick_fits_compressed_sparse_rows_under_256_mib_at_131072_tokens():
    """Every token's keys do not fit (the token selection's smallest top_k: 1.125 GiB); the
    HCA-like and CSA-like shapes, their rate sized, do."""
    from train.commands.pick.constraints import Constraints, size
    from train.sizing.families import shapes

    c = Constraints(d_model=1024, n_heads=16, n_layers=24, seq_len=131072,
                    cache_budget=256 * 2**20)
    sized = {s.label: s for s in (size(shape, c) for shape in shapes(1024, 16)
                                  if shape.block == "sparse")}
    assert not sized["sparse"].fits
    for label in ("sparse (HCA-like)", "sparse (CSA-like)"):
        s = sized[label]
        assert s.fits and s.cost.cache_bytes <= c.cache_budget and s.value == 4, label
        assert s.cost.budget.mixing == 127 + -(-(65536 - 127) // 4), label  # W - 1 + slots


@pytest.mark.parametrize("label", COMPRESSED)
def test_a_compressed_state_stays_within_its_inference_cap(label):
    """After a prefill of T = 40, each cached matrix (the window's ring, the slots) has rank
    <= min(T, slots + W, G K), and the window's holds exactly its last W keys."""
    block, T = build(label), 40
    cache = block.init_cache(2, T)
    with torch.no_grad():
        block(x_of(T=T), cache=cache)
    state, cap = block.inference_state(cache), block.budget(T).inference
    for name, m in state.items():
        assert int(torch.linalg.matrix_rank(m).max()) <= cap, name
    W = block.config.local_window
    if W is not None:
        keys = block.keys_values(x_of(T=T))[0][:, :, T - W:]  # [B, G, W, K]: the last W
        ring = cache.k[:, :, torch.arange(T - W, T) % W]
        torch.testing.assert_close(ring, keys, atol=1e-12, rtol=1e-10)


def test_compress_is_refused_a_cache_of_compressed_slots():
    """compress counts and projects every token's keys and values: a cache of pooled
    slots (and a window's ring) would be priced and evaluated as another cache."""
    import zoo

    plain = zoo.build("sparse", d_model=32, n_heads=2, top_k=4)
    assert [s.name for s in plain.cache_slots()] == ["k", "v"]
    for kwargs in ({"selection": "none", "compress": "mean", "rate": 4, "local_window": 4,
                    "gate": "sigmoid"},
                   {"selection": "token", "top_k": 4, "compress": "mean", "rate": 4,
                    "gate": "sigmoid"}):
        block = zoo.build("sparse", d_model=32, n_heads=2, **kwargs)
        with pytest.raises(ValueError, match="compressed slots of 4 tokens, which compress "
                                             "does not project"):
            block.cache_slots()


# ---------------------------------------------------------------- DSA's dense warm-up

def warm(top_k: int, dense_warmup: int = 0):
    import zoo

    torch.manual_seed(0)
    return zoo.build("sparse", d_model=32, n_heads=2, top_k=top_k,
                     dense_warmup=dense_warmup).double()


def test_the_warm_up_attends_to_every_key_for_its_steps_then_selects():
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    block, dense, sparse = warm(1, dense_warmup=3), warm(12), warm(1)
    block.train()
    for step, like in ((0, dense), (2, dense), (3, sparse), (40, sparse)):
        block.set_step(step)
        torch.testing.assert_close(block(x), like(x), atol=1e-12, rtol=0, msg=f"step {step}")
    block.set_step(0)
    with torch.no_grad():  # no gradients (validation, decoding): the configured selection
        torch.testing.assert_close(block(x), sparse(x), atol=1e-12, rtol=0)
    block.eval()
    torch.testing.assert_close(block(x), sparse(x), atol=1e-12, rtol=0)


def test_without_a_step_the_warm_up_counts_training_forwards():
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    block, dense, sparse = warm(1, dense_warmup=2), warm(12), warm(1)
    block.train()
    outs = [block(x) for _ in range(3)]
    torch.testing.assert_close(outs[0], dense(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(outs[1], dense(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(outs[2], sparse(x), atol=1e-12, rtol=0)
    assert block.aux_loss is not None  # the indexer trains through the warm-up too


def test_the_decoder_passes_its_step_to_the_blocks():
    from zoo.lm import DecoderLM

    model = DecoderLM(vocab_size=16, d_model=32, n_layers=2, d_mlp=64, block="sparse",
                      block_kwargs={"n_heads": 2, "top_k": 2, "dense_warmup": 5})
    model.set_step(7)
    assert [b.step for b in model.blocks] == [7, 7]


@pytest.mark.parametrize("kwargs, named", [
    ({"dense_warmup": -1}, "dense_warmup must be an int >= 0, got -1"),
    ({"dense_warmup": 5, "selection": "block", "block_size": 4},
     "needs selection: token and indexer_loss_weight > 0, got selection 'block'"),
    ({"dense_warmup": 5, "indexer_loss_weight": 0.0}, "indexer_loss_weight 0.0"),
], ids=["negative", "block-selection", "no-indexer-loss"])
def test_a_warm_up_without_an_indexer_to_train_is_named(kwargs, named):
    import zoo

    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        zoo.build("sparse", d_model=32, n_heads=2, **kwargs)
