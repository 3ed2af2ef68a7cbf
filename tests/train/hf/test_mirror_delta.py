"""`report --hf --emit` of hybrids with delta-rule layers (qwen3_next's Gated DeltaNet,
kimi_linear's KDA; tests/hf_tiny.py): each GDN or KDA layer becomes the zoo's delta block
with the checkpoint's gate, key width and value heads per head, and the file loads.

The kind maps to its block through the blocks' own facts (train/hf/probe.py zoo_blocks);
the mapping is given here where the zoo does not declare it yet, so that the emitted
specs are checked against the delta block's config either way."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers",
                    reason="rankzoo report --hf needs transformers (pip install 'rankzoo[hf]')")

import zoo  # noqa: E402
from tests.hf_tiny import tiny_model  # noqa: E402
from train.commands.mirror import emit  # noqa: E402
from train.config.load import load_experiment  # noqa: E402
from train.hf import probe_hf, zoo_blocks  # noqa: E402

pytestmark = pytest.mark.skipif("delta" not in zoo.names(), reason="no zoo delta block")
T = 32
SIZES = emit.MirrorSizes(d_model=64, n_heads=4, seq_len=T)


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    text = root / "corpus.txt"
    g = torch.Generator().manual_seed(0)
    text.write_text(" ".join(str(i) for i in torch.randint(100, (200,), generator=g).tolist()))

    def get(model_type: str) -> dict:
        tiny_model(model_type).save_pretrained(root / model_type)
        return probe_hf(root / model_type, text, seq_len=T, probe_size=1)[1]
    return get


@pytest.fixture(autouse=True)
def delta_mirrored(monkeypatch):
    monkeypatch.setattr(emit, "zoo_blocks", lambda: {"delta": "delta", **zoo_blocks()})


@pytest.mark.parametrize("model_type, spec", [
    # 2 query/key heads each read by 2 value heads: n_v_heads = 2 x --n-heads
    ("qwen3_next", {"block": "delta", "gate": "scalar", "output_gate": "silu", "key_dim": 16,
                    "n_v_heads": 8}),
    ("kimi_linear", {"block": "delta", "gate": "channel", "output_gate": "sigmoid",
                     "key_dim": 16}),
])
def test_delta_layers_become_the_zoo_delta_block(entry, tmp_path, model_type, spec):
    path = tmp_path / "mirror.yaml"
    raw, _ = emit.emit_mirror(entry(model_type), path, SIZES)
    assert raw["variants"]["pattern"]["pattern"] == ["delta"] * 3 + ["global"]
    assert raw["variants"]["delta"] == spec
    exp = load_experiment(path)  # every block's config checked
    labels = [s.label for s in exp.variants["pattern"].layer_specs(exp.model.n_layers)]
    assert labels == ["delta"] * 3 + ["global"]


def test_a_key_width_above_the_zoo_range_is_capped_with_a_note(entry):
    layer = emit.decoder_kinds(entry("qwen3_next"))[0]
    spec, _, notes = emit.mirrored_block(layer, emit.MirrorSizes(2, 1, T), "q")
    assert spec["key_dim"] == 8 and "K=16" in notes[0]  # the zoo sizes K up to 4 x d_model
