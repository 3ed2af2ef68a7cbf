"""`report --hf` and `compress --hf` end to end on a tiny saved model of each type the probe
is checked on (tests/hf_tiny.py; built offline), and a clear error for what is out of
reach."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

transformers = pytest.importorskip(
    "transformers", reason="--hf needs transformers (pip install 'rankzoo[hf]')")

import budgets  # noqa: E402
from budgets.hf import hooked  # noqa: E402
from budgets.hf.probe import build_hf_report, probe_hf_model  # noqa: E402
from tests.hf_tiny import ATTENTION_TYPES, DSA_TYPES, MLA_TYPES, TINY, tiny_model  # noqa: E402
from tests.train.hf.conftest import probe_report  # noqa: E402
from train.cli import main  # noqa: E402
from train.commands.compress import CompressOptions, compress_hf  # noqa: E402

T, P = 32, 2


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    g = torch.Generator().manual_seed(0)
    path.write_bytes(bytes(torch.randint(32, 127, (4000,), generator=g).tolist()))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")

    def save(model_type: str):
        path = root / model_type
        if not path.exists():
            tiny_model(model_type).save_pretrained(path)
        return path
    return save


@pytest.mark.parametrize("model_type", list(TINY))
def test_report_runs_on_each_type(saved, text_file, model_type):
    report = probe_report(saved(model_type), text_file, seq_len=T, probe_size=P)
    if model_type in DSA_TYPES:  # a top-k selection is measured exactly only, never misread
        with pytest.raises(ValueError, match="measured exactly only"):
            probe_report(saved(model_type), text_file, seq_len=T, probe_size=P,
                         matfree_from=16)
    else:
        free = probe_report(saved(model_type), text_file, seq_len=T, probe_size=P,
                            matfree_from=16)
        assert [ly["kind"] for ly in free["variants"][0]["layers"]] == [
            ly["kind"] for ly in report["variants"][0]["layers"]]
    layers = report["variants"][0]["layers"]
    assert report["source"]["model_type"] == model_type and layers
    for layer in layers:
        rows = {a["quantity"]: a for a in layer["axes"]}
        kind = layer["kind"]
        if kind["attention"] == "ssm":  # its mixing M alone, capped by its state N
            assert set(rows) == {"past_future"} and "not_measured" in layer
            assert rows["past_future"]["declared"] == min(kind["state"], T // 2)
            continue
        cache = ({"inference.latent", "inference.rope_key"} if model_type in MLA_TYPES
                 else {"inference.k", "inference.v"})  # MLA caches its latent
        assert {"past_future", "out", *cache} <= set(rows)
        assert ("qk" in rows) == ("not_measured" not in layer)
        assert rows["past_future"]["declared"] == budgets.past_future_cap(
            T, kind["window"], kind.get("chunk"))
    assert sum(len(k["layers"]) for k in report["kinds"]) == len(layers)
    assert "unmeasured_mixers" not in report  # every decoder layer's mixer was read


# falcon_h1: attention beside the SSM in every layer; bamba: attention in layer 1 of 2 (a
# hybrid: its attention's KV cache projected, its SSM's state kept)
@pytest.mark.parametrize("model_type", [*(t for t in ATTENTION_TYPES if t not in MLA_TYPES),
                                        "falcon_h1", "bamba"])
def test_compress_runs_on_each_type(saved, text_file, model_type):
    doc = compress_hf(saved(model_type), text_file, text_file,
                      CompressOptions(ratios=(2,), calib_size=2, eval_size=2), seq_len=16)
    full = doc["rows"][0]
    assert full["allocation"] == "full" and doc["source"]["model_type"] == model_type
    assert all(r["loss"] >= 0 for r in doc["rows"])


def test_mla_compress_is_a_clear_error(saved, text_file, capsys):
    code = main(["compress", "--hf", str(saved("deepseek_v3")), "--text", str(text_file),
                 "--eval-text", str(text_file), "--seq-len", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "deepseek_v3" in err and "W_K, W_V" in err and "latent" in err


# mamba2: no attention
@pytest.mark.parametrize("model_type", ["mamba2"])
def test_compress_names_what_it_cannot_project(saved, text_file, model_type):
    with pytest.raises(ValueError, match=f"the {model_type} model"):
        compress_hf(saved(model_type), text_file, text_file, CompressOptions(ratios=(2,)),
                    seq_len=16)


class HandWritten(transformers.PreTrainedModel):
    """A causal LM whose attention is written out by hand (softmax of Q K^T), outside
    transformers' attention interface: what any model type without the interface looks like
    to the probe. It returns P, as eager models do, when asked for output_attentions."""

    config_class = transformers.PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        D, V, L = config.hidden_size, config.vocab_size, config.num_hidden_layers
        self.embed = nn.Embedding(V, D)
        self.qkv = nn.ModuleList(nn.Linear(D, 3 * D, bias=False) for _ in range(L))
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids, output_attentions=False, output_hidden_states=False,
                use_cache=None, **_):
        H, (B, T) = self.config.num_attention_heads, input_ids.shape
        x, hidden, attentions = self.embed(input_ids), [], []  # x: [B, T, D]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for qkv in self.qkv:
            hidden.append(x)
            q, k, v = qkv(x).view(B, T, 3, H, -1).permute(2, 0, 3, 1, 4)  # [B, H, T, K] each
            logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5  # [B, H, T, T]
            P = logits.masked_fill(~causal, float("-inf")).softmax(-1)
            attentions.append(P)
            x = x + (P @ v).transpose(1, 2).reshape(B, T, -1)
        hidden.append(x)
        return {"logits": self.head(x), "attentions": tuple(attentions) if output_attentions
                else None, "hidden_states": tuple(hidden) if output_hidden_states else None}


def _p_report(model, ids: torch.Tensor) -> dict:
    probe, loss = probe_hf_model(model, ids)
    entry = {"probe": probe, "step": 0, "params": 0, "metrics": {"probe/loss": loss},
             "source": {"model_type": model.config.model_type}}
    return build_hf_report("m", entry)


def _check_p(report: dict, attentions) -> None:
    """Each reported layer's past->future figure is the one its eager P gives."""
    for layer, A in zip(report["variants"][0]["layers"], attentions, strict=True):
        past_future = next(a for a in layer["axes"] if a["quantity"] == "past_future")
        want = budgets.rank_metrics(A[..., T // 2:, :T // 2].double())["rank_eps"].mean(0)
        assert past_future["per_head"] == pytest.approx(want.tolist())


def test_a_model_without_the_interface_gives_its_p(text_file):
    config = transformers.PretrainedConfig(model_type="hand_written", hidden_size=64,
                                           num_attention_heads=4, num_hidden_layers=2,
                                           vocab_size=128)
    torch.manual_seed(0)
    model = HandWritten(config).eval()
    ids = torch.tensor(list(text_file.read_bytes()[:P * T])).view(P, T) % 128
    report = _p_report(model, ids)
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True)["attentions"]
    for layer in report["variants"][0]["layers"]:
        assert {a["quantity"] for a in layer["axes"]} == {"past_future"}  # P alone
        assert "attention interface" in layer["not_measured"][0]  # the rest is named
    _check_p(report, attentions)


# types that attended outside the interface in some transformers release (falcon moved onto
# it in 5.25): whichever path the installed release takes, P is eager attention's, and a
# layer read through the interface carries the rows P alone cannot give
@pytest.mark.parametrize("model_type, sizes", [
    ("bloom", dict(n_layer=2, n_head=4)),
    ("falcon", dict(num_hidden_layers=2, num_attention_heads=4)),
])
def test_either_path_gives_eager_attentions_p(tmp_path, text_file, model_type, sizes):
    config = transformers.AutoConfig.for_model(model_type, hidden_size=64, vocab_size=128,
                                               **sizes)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    report = probe_report(tmp_path / "m", text_file, seq_len=T, probe_size=P)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "m", local_files_only=True, attn_implementation="eager")
    ids = torch.tensor(list(text_file.read_bytes()[:P * T])).view(P, T) % 128
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    for layer in report["variants"][0]["layers"]:
        rows = {a["quantity"] for a in layer["axes"]}
        eager = "attention interface" in " ".join(layer.get("not_measured", []))
        assert rows == {"past_future"} if eager else {
            "past_future", "qk", "value", "out", "inference.k", "inference.v"} <= rows
    _check_p(report, attentions)


def test_the_json_report_carries_kinds(saved, text_file, capsys):
    code = main(["report", "--hf", str(saved("gemma3_text")), "--text", str(text_file),
                 "--seq-len", str(T), "--probe-size", str(P), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    kinds = json.loads(out)["kinds"]
    assert [(k["kind"], k["layers"], k["zoo_block"]) for k in kinds] == [
        ("sliding W=8", [0, 1, 2, 3, 4], "sliding_window"), ("global", [5], "softmax")]
    assert kinds[0]["rows"]["past_future"]["declared"] == 7
    code = main(["report", "--hf", str(saved("gemma3_text")), "--text", str(text_file),
                 "--seq-len", str(T), "--probe-size", str(P), "--format", "md"])
    out, _ = capsys.readouterr()
    assert "Per kind of layer" in out and "| sliding W=8 | 0-4 | sliding_window |" in out


def test_what_is_out_of_reach_is_a_clear_error(saved, text_file, capsys):
    # xLSTM's mLSTM layers alone: no attention, no mixer a capture reads, no probabilities
    code = main(["report", "--hf", str(saved("xlstm")), "--text", str(text_file),
                 "--seq-len", str(T), "--probe-size", str(P)])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert err.splitlines()[-1].startswith("rankzoo: error: xlstm: no layer attends through "
                                           "transformers' attention interface")
    assert "layers 0, 1 (xLSTMLayer)" in err  # its mixers named


def test_other_mixers_are_named_as_not_measured(saved, text_file, capsys, monkeypatch):
    # lfm2: short convolutions in two layers, attention in one (tests/hf_tiny.py), with the
    # convolutions' reader taken away: a mixer no capture reads is named, not dropped
    monkeypatch.delitem(hooked.HOOKED, "ShortConv")
    path = saved("lfm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    convs = [i for i, t in enumerate(model.config.layer_types) if t == "conv"]
    report = probe_report(path, text_file, seq_len=T, probe_size=P)
    assert report["unmeasured_mixers"] == [
        {"model_type": "lfm2", "layer": i, "name": f"model.layers.{i}.conv",
         "class": type(model.model.layers[i].conv).__name__} for i in convs]
    assert [ly["name"] for ly in report["variants"][0]["layers"]] == [
        f"model.layers.{i}.self_attn" for i in range(3) if i not in convs]
    code = main(["report", "--hf", str(path), "--text", str(text_file), "--seq-len", str(T),
                 "--probe-size", str(P), "--format", "md"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "not measured: lfm2 layers 0, 2 (Lfm2ShortConv)" in out


def test_weights_shared_by_several_layers_are_measured_at_each_call(saved, text_file, capsys):
    """zamba ties one attention block across its hybrid layers, and each Mamba mixer runs
    a scan per Mamba head: every call is measured, and the report says which share."""
    path = saved("zamba")
    report = probe_report(path, text_file, seq_len=T, probe_size=P)
    layers = report["variants"][0]["layers"]
    attention = [ly for ly in layers if ly["kind"]["attention"] != "ssm"]
    assert len(attention) == 2  # layers 1 and 3 of the decoder
    groups = [ly["shared"]["layers"] for ly in attention]
    assert groups[0] == groups[1] == [ly["layer"] for ly in attention]
    assert all(ly.get("shared") for ly in layers)  # two scans per Mamba mixer
    assert main(["report", "--hf", str(path), "--text", str(text_file), "--seq-len", str(T),
                 "--probe-size", str(P)]) == 0
    out = capsys.readouterr().out
    assert "shared weights (one set, measured at each call)" in out
    assert "shared_transf.self_attn" in out


class TimeMix(nn.Linear):
    """A token mixer that neither attends nor scans (an RNN's time mixing, say)."""


class Recurrent(HandWritten):
    """Mixes through TimeMix layers, and returns their states where attention
    probabilities go, as rwkv did: not P, so nothing the probe can read."""

    def __init__(self, config):
        super().__init__(config)
        D, L = config.hidden_size, config.num_hidden_layers
        self.qkv = nn.ModuleList(TimeMix(D, 3 * D, bias=False) for _ in range(L))

    def forward(self, input_ids, output_attentions=False, **kw):
        out = super().forward(input_ids, output_attentions=output_attentions, **kw)
        if output_attentions:
            out["attentions"] = tuple(a[:, 0, 0] for a in out["attentions"])  # [B, T]
        return out


def test_a_mixer_without_probabilities_is_refused_naming_its_class(text_file):
    config = transformers.PretrainedConfig(model_type="recurrent", hidden_size=64,
                                           num_attention_heads=4, num_hidden_layers=2,
                                           vocab_size=128)
    ids = torch.tensor(list(text_file.read_bytes()[:P * T])).view(P, T) % 128
    with pytest.raises(ValueError, match="no layer attends through") as e:
        probe_hf_model(Recurrent(config).eval(), ids)
    assert "recurrent:" in str(e.value) and "TimeMix" in str(e.value)
