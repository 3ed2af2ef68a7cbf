"""The matrix-free probe of Hugging Face models (budgets.hf.probe): the same ranks as the exact
path, without a [T, T] tensor, the model's attention implementation restored afterwards.

Tiny random models are built in memory from configs: nothing is downloaded or saved. The
matrix-free threshold is set low (16) so that a T = 64 probe takes the matrix-free path.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

import budgets.hf.capture  # noqa: E402
import budgets.hf.probe  # noqa: E402
import budgets.probe.calls  # noqa: E402
import budgets.rank.matfree  # noqa: E402
from budgets.hf.capture import CAPTURE_ATTENTION  # noqa: E402
from budgets.hf.probe import ProbeProgress, probe_hf_model  # noqa: E402

B, T, H, G, K, D = 2, 64, 4, 2, 8, 32
MIXING = ("past_future", "mixing", "mixing_centered")


def _model(family: str) -> torch.nn.Module:
    """A 2-layer random model of `family` on the eager path (GQA but for GPT-2)."""
    torch.manual_seed(0)
    if family == "GPT2":
        config = transformers.GPT2Config(n_embd=D, n_layer=2, n_head=H, vocab_size=64,
                                         n_positions=128, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        extra = {"Mistral": {"sliding_window": 24},  # W < T: the window shapes the ranks
                 "Gemma2": {"sliding_window": 24, "attn_logit_softcapping": 5.0}}
        config = getattr(transformers, f"{family}Config")(
            hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=H,
            num_key_value_heads=G, head_dim=K, vocab_size=64, max_position_embeddings=128,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra.get(family, {}))
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    model.set_attn_implementation("eager")
    return model.eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))  # [B, T]


@pytest.fixture(scope="module")
def llama():
    return _model("Llama")


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Gemma2", "GPT2"])
def test_matfree_ranks_equal_the_exact_path(family):
    model, ids = _model(family), _ids()
    exact, loss_exact = probe_hf_model(model, ids, matfree_from=None)
    free, loss_free = probe_hf_model(model, ids, matfree_from=16)
    assert free["matfree"] == {"from": 16, "k_max": budgets.rank.matfree.K_MAX}
    assert "matfree" not in exact
    assert loss_free == pytest.approx(loss_exact, rel=1e-5)  # SDPA's output, not eager's
    assert free["final_hidden"]["erank"] == pytest.approx(exact["final_hidden"]["erank"],
                                                          rel=1e-4)
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["budget"] == b["budget"]
        for q in MIXING:
            assert b["quantities"][q]["rank_eps"] == a["quantities"][q]["rank_eps"], q
            assert b["quantities"][q]["stable_rank"] == pytest.approx(
                a["quantities"][q]["stable_rank"], rel=1e-4), q
        # the rest is read from the attention call instead of the cache and hooks
        for q in ("hidden_centered", "inference.k", "inference.v", "qk"):
            assert b["quantities"][q]["erank"] == pytest.approx(
                a["quantities"][q]["erank"], rel=1e-4), q


def test_no_t_by_t_tensor_in_matfree_mode(monkeypatch, llama):
    # chunks of 8 query rows' worth of scores and at most 16 singular values sought: at
    # T = 64 a whole block would fit in one chunk, and a basis of T vectors would be T x T
    monkeypatch.setattr(budgets.rank.matfree, "CHUNK_ELEMENTS", B * H * T * 8)
    shapes = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                shapes.append(tuple(out.shape))
            return out

    measure = budgets.probe.calls.mixing_figures_matfree

    def spied(*args, **kwargs):
        with Spy():
            return measure(*args, **kwargs)

    monkeypatch.setattr(budgets.probe.calls, "mixing_figures_matfree", spied)
    calls, weights = [], []
    hooks = [llama.register_forward_pre_hook(lambda m, a, kw: calls.append(kw),
                                             with_kwargs=True)]
    hooks += [layer.self_attn.register_forward_hook(lambda m, a, out: weights.append(out[1]))
              for layer in llama.model.layers]
    try:
        probe, _ = probe_hf_model(llama, _ids(), matfree_from=16, k_max=16)
    finally:
        for h in hooks:
            h.remove()
    assert len(probe["layers"]) == 2 and shapes
    assert not any(kw.get("output_attentions") for kw in calls)
    assert weights and all(w is None for w in weights)  # no attention probabilities returned
    # the largest: the Krylov basis of k_max + one block of 16 vectors [B * H, T, 32], half
    # of P's size
    assert max(torch.Size(s).numel() for s in shapes) == B * H * T * (16 + 16)
    assert not any(s[-2:] == (T, T) for s in shapes)


def test_attention_implementation_restored_when_the_probe_fails(llama):
    functions = budgets.hf.capture.transformers_attention()[0]

    def fail(p: ProbeProgress) -> None:
        raise RuntimeError("stop after the first layer")

    with pytest.raises(RuntimeError, match="stop after the first layer"):
        probe_hf_model(llama, _ids(), matfree_from=16, progress=fail)
    assert llama.config._attn_implementation == "eager"
    assert CAPTURE_ATTENTION not in functions
    probe, _ = probe_hf_model(llama, _ids(), matfree_from=None)  # the exact path works again
    assert "matfree" not in probe


@pytest.mark.parametrize("matfree_from", [None, 16])
def test_only_the_layers_asked_for_are_measured(monkeypatch, llama, matfree_from):
    measured = []
    for name in ("mixing_figures", "mixing_figures_matfree"):
        original = getattr(budgets.probe.calls, name)
        monkeypatch.setattr(budgets.probe.calls, name, lambda *a, f=original, **kw: (
            measured.append(1), f(*a, **kw))[1])
    steps = []
    probe, _ = probe_hf_model(llama, _ids(), matfree_from=matfree_from, layers=[1],
                              progress=steps.append)
    assert [ly["layer"] for ly in probe["layers"]] == [1] and len(measured) == 1
    assert [(s.layer, s.done, s.total) for s in steps] == [(1, 1, 1)]
    assert steps[0].elapsed > 0 and steps[0].eta == 0


def test_layers_out_of_range_name_the_layer_count(llama):
    with pytest.raises(ValueError, match=r"layers=2: out of range; the llama model has 2 "
                                         r"layers \(0-1\)"):
        probe_hf_model(llama, _ids(), layers=[0, 2])


def test_progress_counts_every_layer(llama):
    steps: list[ProbeProgress] = []
    probe_hf_model(llama, _ids(), matfree_from=16, progress=steps.append)
    assert [(s.layer, s.done, s.total) for s in steps] == [(0, 1, 2), (1, 2, 2)]
    assert steps[0].eta == pytest.approx(steps[0].elapsed) and steps[1].eta == 0
