"""`report --hf FILE.gguf`: a tiny llama written offline as a GGUF file (matrices stored as
Q8_0) reads as the same model saved by save_pretrained, and the report names how its
weights were stored."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="--hf needs transformers (pip install 'rankzoo[hf]')")
gguf = pytest.importorskip("gguf", reason="GGUF input needs gguf (pip install 'rankzoo[hf]')")

from tests.hf_tiny import tiny_model  # noqa: E402
from tests.train.hf.conftest import probe_report  # noqa: E402
from train.cli import main  # noqa: E402

T, P = 32, 2


def _permuted(w, n_heads: int):
    """llama.cpp's order of a q/k projection's rows (the GGUF loader undoes it)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(
        1, 2).reshape(w.shape)


def _tokens(vocab: int) -> list[str]:
    chars = ["<unk>", "<s>", "</s>", "\u2581"] + [chr(i) for i in range(33, 127)]
    return chars + [f"<0x{i:02X}>" for i in range(vocab - len(chars))]


def write_tiny_gguf(path, model) -> dict[str, int]:
    """Write `model` (a llama) as a GGUF file, matrices as Q8_0, vectors as F32, with a
    sentencepiece-style tokenizer; returns {storage type: tensors written}."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    tokens = _tokens(c.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    w.add_token_types([3] * 3 + [1] * 95 + [6] * (len(tokens) - 98))  # control, normal, byte
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, c.num_hidden_layers)
    counts: dict[str, int] = {}
    for name, t in model.state_dict().items():
        base, suffix = name.rsplit(".", 1)
        a = t.float().numpy()
        if "q_proj" in name or "k_proj" in name:
            a = _permuted(a, c.num_attention_heads if "q_proj" in name else
                          c.num_key_value_heads)
        kind = gguf.GGMLQuantizationType.Q8_0 if a.ndim == 2 else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(a, kind) if a.ndim == 2 else a
        w.add_tensor(f"{names.get_name(base)}.{suffix}", data, raw_dtype=kind)
        counts[kind.name] = counts.get(kind.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the GGUF file, the same model and tokenizer saved by save_pretrained, the storage
    types written, the text)."""
    root = tmp_path_factory.mktemp("gguf")
    original = tiny_model("llama")
    counts = write_tiny_gguf(root / "tiny.gguf", original)
    where = dict(gguf_file="tiny.gguf", local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(root, **where)
    for (name, a), b in zip(model.state_dict().items(), original.state_dict().values(),
                            strict=True):  # Q8_0: 8-bit blocks, within ~1% of the largest
        torch.testing.assert_close(a.float(), b, rtol=0, atol=0.01 * float(b.abs().max()),
                                   msg=name)
    # the same weights saved by save_pretrained (a GGUF-loaded model does not save itself)
    same = tiny_model("llama")
    same.load_state_dict(model.state_dict())
    same.save_pretrained(root / "saved")
    transformers.AutoTokenizer.from_pretrained(root, **where).save_pretrained(root / "saved")
    text = root / "corpus.txt"
    g = torch.Generator().manual_seed(0)
    text.write_bytes(bytes(torch.randint(32, 127, (4000,), generator=g).tolist()))
    return root / "tiny.gguf", root / "saved", counts, text


def _numbers(x, path=""):
    """Every number of a report, by its path."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _numbers(val, f"{path}.{key}").items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in _numbers(val, f"{path}[{i}]").items()}
    return {path: x} if isinstance(x, (int, float)) and not isinstance(x, bool) else {}


def test_a_gguf_file_reports_as_the_saved_model(files):
    path, saved, counts, text = files
    got = probe_report(path, text, seq_len=T, probe_size=P)
    want = probe_report(saved, text, seq_len=T, probe_size=P)
    assert got["source"]["gguf"] == {"file": "tiny.gguf", "quantization": counts}
    assert got["source"]["tokens"] == "tokenizer" and got["source"]["model_type"] == "llama"
    assert "gguf" not in want["source"]
    a, b = _numbers(got["variants"]), _numbers(want["variants"])
    assert a.keys() == b.keys() and a
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_the_markdown_names_the_quantization(files, capsys):
    path, _, counts, text = files
    code = main(["report", "--hf", str(path), "--text", str(text), "--seq-len", str(T),
                 "--probe-size", str(P), "--format", "md"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (f"weights: GGUF file tiny.gguf, stored as F32 ({counts['F32']} tensors), "
            f"Q8_0 ({counts['Q8_0']} tensors)") in out
    code = main(["report", "--hf", str(path), "--text", str(text), "--seq-len", str(T),
                 "--probe-size", str(P), "--format", "json"])
    out, _ = capsys.readouterr()
    assert json.loads(out)["source"]["gguf"]["quantization"] == counts


def test_a_broken_gguf_file_is_a_clear_error(tmp_path, files, capsys):
    _, _, _, text = files
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF not really")
    code = main(["report", "--hf", str(bad), "--text", str(text)])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert err.splitlines()[-1].startswith(f"rankzoo: error: --hf {bad}: the GGUF file does "
                                           f"not load")
