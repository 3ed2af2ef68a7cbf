"""A capture never changes the model (budgets/probe/faithful.py, budgets/hf/keywords.py,
budgets/hf/indexer.py): the captured loss equals the model's own or the report is refused
in one line, naming the first layer that changed; a keyword the capture does not read is
refused; DSA's top-k selection (deepseek_v32, glm_moe_dsa) is read as the model applies
it, P equal to eager attention's in fp64, its indexer measured as a selector."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

transformers = pytest.importorskip(
    "transformers", reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

import budgets.hf.capture as hf_capture  # noqa: E402
from budgets.capture.attention import AttentionCall  # noqa: E402
from budgets.hf.capture import capture  # noqa: E402
from budgets.hf.keywords import HARMLESS, READ  # noqa: E402
from budgets.hf.probe import probe_hf_model  # noqa: E402
from budgets.probe.faithful import LOSS_TOLERANCE, Unfaithful  # noqa: E402
from budgets.probe.own import report_of_model  # noqa: E402
from tests.hf_tiny import DSA_TYPES, VOCAB, tiny_model  # noqa: E402
from train.cli import main  # noqa: E402

B, T, TOPK = 2, 64, 8  # TOPK: the tiny DSA models' index_topk (tests/hf_tiny.py)
FAITHFUL = ("llama", *DSA_TYPES)


def _ids(T: int = T) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    text = root / "corpus.txt"
    text.write_bytes(bytes(torch.randint(32, 127, (4000,),
                                         generator=torch.Generator().manual_seed(0)).tolist()))

    def save(model_type: str):
        path = root / model_type
        if not path.exists():
            tiny_model(model_type).save_pretrained(path)
        return path, text
    return save


# ---------------------------------------------------------------- DSA read exactly

@torch.no_grad()
@pytest.mark.parametrize("model_type", DSA_TYPES)
def test_dsa_probabilities_and_logits_equal_eager_in_fp64(model_type):
    """The capture receives the indexer's choice as `indices` (eager folds it into the
    mask itself): P, top-k mask included, and the logits are eager's."""
    model, ids = tiny_model(model_type, fp64=True), _ids()
    eager = model(input_ids=ids, output_attentions=True)
    calls: list[AttentionCall] = []
    with capture(model, calls.append, keep_probs=True):
        captured = model(input_ids=ids)
    assert len(calls) == len(eager.attentions) == model.config.num_hidden_layers
    torch.testing.assert_close(captured.logits, eager.logits, rtol=0, atol=1e-10)
    for call, P in zip(calls, eager.attentions, strict=True):
        assert call.selection is not None and call.selection.topk == TOPK
        torch.testing.assert_close(call.probs, P, rtol=0, atol=1e-6)
        # each query past the first k attends to exactly k keys
        nonzero = (call.probs[:, :, TOPK:] > 0).sum(-1)  # [B, H, T - k]
        assert int(nonzero.max()) == TOPK


@torch.no_grad()
def test_the_indexer_that_chose_is_named_on_a_layer_reusing_its_choice():
    """glm_moe_dsa's layer 1 reuses layer 0's top-k: its selection says whose, and its
    indices are layer 0's."""
    model, ids = tiny_model("glm_moe_dsa"), _ids()
    calls: list[AttentionCall] = []
    with capture(model, calls.append):
        model(input_ids=ids)
    own, shared, third = (c.selection for c in calls)
    assert own.shared_from is None and third.shared_from is None
    assert shared.shared_from == "model.layers.0.self_attn.indexer"
    assert torch.equal(shared.indices, own.indices)
    assert own.scores.shape == (B, T, T) and own.keys.shape == (B, T, 16)  # d_I = 16


@pytest.mark.parametrize("model_type", DSA_TYPES)
def test_dsa_layers_carry_their_kind_caps_and_indexer_figures(model_type):
    model, ids = tiny_model(model_type), _ids()
    probe, _ = probe_hf_model(model, ids, matfree_from=None)
    t = torch.arange(TOPK, T, dtype=torch.float64)  # queries where the selection bites
    for layer in probe["layers"]:
        assert layer["kind"]["label"] == f"dsa top-k {TOPK}" and layer["kind"]["topk"] == TOPK
        f = layer["indexer"]
        assert f["bites"] and f["topk"] == TOPK and f["index_dim"] == 16
        # a query of the second half carries at most k keys of the first
        past = f["past_future_keys"]
        assert past["declared"] == TOPK and 0 < past["realized"] <= past["realized_max"] <= TOPK
        # a query at t sees t + 1 keys and keeps k of them
        assert f["keys_kept"] == pytest.approx(float((TOPK / (t + 1)).mean()))
        for key in ("dense_mass", "topk_overlap"):
            assert len(f[key]) == 4 and all(0 < x <= 1 for x in f[key])
        shared = f["shared_from"] is not None
        assert ("logits" in f) != shared  # a reused choice has no logits of its own
        if not shared:
            assert 1 <= f["logits"]["rank_eps"] <= T and f["logits"]["shape"] == [T, T]
        # the cache: latent, rotary key and the indexer's keys, d_I = 16 per token
        assert {"inference.latent", "inference.rope_key", "inference.index_key"} <= set(
            layer["quantities"])
        assert layer["budget"]["cache_elements"] == T * (16 + 8 + 16)
        # a query carries at most k keys, but each picks its own: M[T/2:, :T/2] is capped
        # by T/2 as dense attention's (budgets/mixing/sparse.py), not by k
        assert layer["budget"]["mixing"] == T // 2


def test_a_probe_no_longer_than_k_says_the_selection_cannot_bite(saved, capsys):
    path, text = saved("deepseek_v32")
    code = main(["report", "--hf", str(path), "--text", str(text), "--seq-len", str(TOPK),
                 "--probe-size", "2", "--format", "json", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0
    report = json.loads(out)
    assert all(not ly["indexer"]["bites"] for ly in report["variants"][0]["layers"])
    assert "selection cannot bite at that length" in err


# ---------------------------------------------------------------- the loss check

@pytest.mark.parametrize("model_type", FAITHFUL)
def test_the_captured_loss_is_the_models_own(saved, capsys, model_type):
    path, text = saved(model_type)
    code = main(["report", "--hf", str(path), "--text", str(text), "--seq-len", str(T),
                 "--probe-size", "2", "--format", "json", "--device", "cpu"])
    out, _ = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    check = doc["source"]["loss_check"]
    assert check["tolerance"] == LOSS_TOLERANCE[torch.float32]
    assert abs(check["captured"] - check["uncaptured"]) <= check["tolerance"]
    assert check["captured"] == doc["variants"][0]["metrics"]["probe/loss"]
    kinds = {ly["kind"]["label"] for ly in doc["variants"][0]["layers"]}
    assert kinds == ({"global"} if model_type == "llama" else {f"dsa top-k {TOPK}"})


def test_the_machine_line_states_the_check_and_its_tolerance(saved, capsys):
    path, text = saved("llama")
    assert main(["report", "--hf", str(path), "--text", str(text), "--seq-len", "16",
                 "--probe-size", "2", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the line may wrap
    assert "without the capture (tolerance 1e-04)" in out


def _dense_dsa(monkeypatch) -> None:
    """The capture as it was before it read `indices`: DSA's selection dropped."""
    def dropped(module, indices, mask, latest, names):
        sel = real(module, indices, mask, latest, names)
        sel.fold = lambda mask, T, Tk, dtype: mask
        return sel
    real = hf_capture.selection_of
    monkeypatch.setattr(hf_capture, "selection_of", dropped)


def test_a_capture_that_changes_the_model_is_refused_and_nothing_is_written(
        saved, tmp_path, capsys, monkeypatch):
    path, text = saved("deepseek_v32")
    _dense_dsa(monkeypatch)
    plots, emitted = tmp_path / "plots", tmp_path / "mirror.yaml"
    code = main(["report", "--hf", str(path), "--text", str(text), "--seq-len", str(T),
                 "--probe-size", "2", "--device", "cpu", "--plot", str(plots),
                 "--emit", str(emitted), "--d-model", "64", "--n-heads", "4"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("rankzoo: error:")]
    assert len(lines) == 1 and "the capture changed the model's forward" in lines[0]
    assert "first differing output: model.layers.0.self_attn" in lines[0]
    assert not plots.exists() and not emitted.exists()


@torch.no_grad()
def test_the_first_layer_whose_output_changed_is_named():
    """Only layer 1's attention output is changed: the error names it, not layer 0, and
    says by how much."""
    model, ids = tiny_model("llama", num_hidden_layers=3), _ids(16)
    target = model.model.layers[1].self_attn
    real = hf_capture.attend

    def nudged(call, keep_probs, fused=False):
        out = real(call, keep_probs, fused)
        return out * 1.5 if call.module is target else out
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hf_capture, "attend", nudged)
        with pytest.raises(Unfaithful, match=r"first differing output: model\.layers\.1\."
                                             r"self_attn \(max \|difference\| [0-9.e-]+, "):
            probe_hf_model(model, ids, matfree_from=None)


# ---------------------------------------------------------------- keywords

@torch.no_grad()
def test_a_keyword_the_capture_does_not_read_is_refused_naming_it_and_the_layer():
    """A keyword reaching the attention function (the model's forward passes its kwargs on)
    is read or refused, never dropped: eager ignores this one, the capture refuses it."""
    model, ids = tiny_model("llama"), _ids(16)
    bias = torch.zeros(1, 4, 16, 16)
    model(input_ids=ids, position_bias=bias)  # the model's own attention runs with it
    refused = r"model\.layers\.0\.self_attn \(LlamaAttention\): its attention call passes " \
        r"position_bias=<tensor \(1, 4, 16, 16\) float32>, which the capture does not read"
    with pytest.raises(ValueError, match=refused), capture(model, lambda call: None):
        model(input_ids=ids, position_bias=bias)
    with capture(model, lambda call: None):  # None is no value: nothing to read
        model(input_ids=ids, position_bias=None)
    assert not set(READ) & set(HARMLESS)


@torch.no_grad()
def test_attention_dropout_in_training_mode_is_refused():
    model, ids = tiny_model("llama", attention_dropout=0.1), _ids(16)
    model.train()
    with (pytest.raises(ValueError, match=r"dropout=0\.1 \(attention dropout"),
          capture(model, lambda call: None)):
        model(input_ids=ids)


# ---------------------------------------------------------------- a model of one's own

class _Attend(nn.Module):
    def __init__(self, d: int = 32, h: int = 4):
        super().__init__()
        self.h, self.qkv, self.out = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(B, T, D))


@torch.no_grad()
def test_report_model_carries_the_loss_check():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.ModuleList([_Attend(), _Attend()]),
                          nn.Linear(32, VOCAB)).eval()
    blocks = model[1]

    def forward(m, tokens):
        x = m[0](tokens)
        for block in blocks:
            x = block(x)
        return m[2](x)
    report = report_of_model(model, _ids(16), forward=forward)
    check = report["source"]["loss_check"]
    assert abs(check["captured"] - check["uncaptured"]) <= check["tolerance"]
