"""`report --hf` names each layer by the model's own number, the index in its layer list
that `layer_types` and the module path use (budgets/probe/places.py), never by its place
among the calls the probe read: where a layer's mixer is not read, where one layer holds
several mixers (falcon_h1's SSM beside its attention; zamba's shared attention and two
Mamba scans), and under `--layers`."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers", reason="--hf needs transformers (pip install 'rankzoo[hf]')")

from budgets.hf import delta, hooked  # noqa: E402
from budgets.hf.probe import build_hf_report, probe_hf_model  # noqa: E402
from tests.hf_tiny import tiny_model  # noqa: E402
from train.hf.probe import probe_notes  # noqa: E402
from train.monitor.core import Monitor  # noqa: E402
from train.render.hf import hf_spec, unmeasured_line  # noqa: E402

T, B = 32, 2
# the decoder layer's number in a module path: model.layers.3.mamba_decoder.mamba -> 3
NUMBER = re.compile(r"\.(\d+)(?=\.|$)")


def _report(model_type: str, **options) -> dict:
    ids = torch.randint(3, 128, (B, T), generator=torch.Generator().manual_seed(0))
    probe, loss = probe_hf_model(tiny_model(model_type), ids, **options)
    entry = {"probe": probe, "step": 0, "params": 1, "metrics": {"probe/loss": loss},
             "source": {"model_type": model_type, "text": "random ids", "tokens": "ids",
                        "probe_size": B, "seq_len": T}}
    return build_hf_report(model_type, entry)


def _unread(monkeypatch) -> None:
    """Take away the readers of short convolutions, RG-LRU, lightning attention and the
    delta rule: their layers become mixers the probe skips."""
    for suffix in ("ShortConv", "Rglru", "LightningAttention"):
        monkeypatch.delitem(hooked.HOOKED, suffix)
    monkeypatch.setattr(delta, "CHUNK_NAMES", ())


def _check_numbers(report: dict) -> None:
    """Every row's number is the one in its module path; one number names one decoder
    layer; two mixers of one layer are told apart; advice, kinds and the table agree."""
    layers = report["variants"][0]["layers"]
    skipped = report.get("unmeasured_mixers", [])
    owner: dict[int, str] = {}
    for row in layers + skipped:
        found = NUMBER.search(row["name"])
        assert row["layer"] == int(found[1]), row
        prefix = row["name"][:found.end()]  # model.layers.3
        assert owner.setdefault(row["layer"], prefix) == prefix, (row, owner)
    keys = [(ly["layer"], ly.get("mixer")) for ly in layers]
    assert len(set(keys)) == len(keys)
    assert not {m["layer"] for m in skipped} & {ly["layer"] for ly in layers}
    for item in report["advice"] + report["findings"]:
        if "layer" in item:
            assert (item["layer"], item.get("mixer")) in keys, item
            assert f"layer {item['layer']}" in item["text"]
    assert {i for k in report["kinds"] for i in k["layers"]} == {ly["layer"] for ly in layers}
    cells = [row[0] for row in hf_spec(report).rows]
    assert [int(c.split()[0]) for c in cells] == [ly["layer"] for ly in layers]
    assert len(set(cells)) == len(cells)


@pytest.mark.parametrize("model_type", ["lfm2", "minimax", "qwen3_next", "recurrent_gemma"])
def test_a_skipped_layer_keeps_the_numbers_of_the_others(monkeypatch, model_type):
    _unread(monkeypatch)
    report = _report(model_type)
    skipped = report["unmeasured_mixers"]
    assert skipped and all(m["class"] for m in skipped)
    _check_numbers(report)
    line = unmeasured_line(report)
    assert all(str(m["layer"]) in line and m["class"] in line for m in skipped)


@pytest.mark.parametrize("model_type", ["lfm2", "minimax", "qwen3_next", "zamba", "falcon_h1"])
def test_every_mixer_read_is_numbered_by_its_layer(model_type):
    report = _report(model_type)
    assert "unmeasured_mixers" not in report
    _check_numbers(report)


def test_mixers_of_one_layer_are_told_apart():
    # zamba: layers 1 and 3 run the shared attention block and a Mamba mixer of two scans
    report = _report("zamba")
    layers = report["variants"][0]["layers"]
    hybrid = [ly for ly in layers if ly["layer"] == 3]
    assert len(hybrid) == 3 and all(ly["name"].startswith("model.layers.3.") for ly in hybrid)
    attention = [ly for ly in layers if ly["kind"]["attention"] != "ssm"]
    assert [ly["shared"]["layers"] for ly in attention] == [[1, 3], [1, 3]]
    assert [ly["layer"] for ly in attention] == [1, 3]


def test_layers_asked_are_the_models_numbers(monkeypatch):
    # falcon_h1: layer 1 holds an SSM and an attention mixer, both measured
    probe, _ = probe_hf_model(tiny_model("falcon_h1"), torch.randint(3, 128, (B, T)),
                              layers=[1])
    assert [ly["layer"] for ly in probe["layers"]] == [1, 1]
    assert probe_notes(probe, "float32", 2) == ["measured 1 of the model's 2 layers: 1"]
    _unread(monkeypatch)
    model = tiny_model("lfm2")  # attention in layer 1 alone is read
    probe, _ = probe_hf_model(model, torch.randint(3, 128, (B, T)), layers=[1])
    assert [ly["name"] for ly in probe["layers"]] == ["model.layers.1.self_attn"]
    with pytest.raises(ValueError, match=r"layers=\[0\]: the probe reads no mixer in that "
                                         r"layer of the lfm2 model; it reads layers 1$"):
        probe_hf_model(model, torch.randint(3, 128, (B, T)), layers=[0])


def test_the_monitor_logs_two_mixers_of_a_layer_apart(tmp_path):
    # falcon_h1: an SSM and attention in each layer, each its own TensorBoard tag and spectra
    ids = torch.randint(3, 128, (B, T), generator=torch.Generator().manual_seed(0))
    monitor = Monitor(ids, out_dir=tmp_path)
    record = monitor.measure(tiny_model("falcon_h1"), 0, final=True)
    assert [(ly["layer"], ly["mixer"]) for ly in record["layers"]] == [
        (0, "mamba"), (0, "self_attn"), (1, "mamba"), (1, "self_attn")]
    tags = {t.split("/")[1] for t in monitor.scalars_of(record)}
    assert tags == {"L0.mamba", "L0.self_attn", "L1.mamba", "L1.self_attn"}
    # each row keeps its own spectra: the SSM's mixing has its 8 heads, attention's its 4
    heads = [len(ly["spectra"]["past_future"]) for ly in record["layers"]]
    assert heads == [8, 4, 8, 4]
