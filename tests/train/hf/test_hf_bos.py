"""Sequences as the model expects them: each probe, calibration and evaluation sequence
starts with the BOS its tokenizer adds, said so in the report; --no-bos turns it off."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="--hf needs transformers (pip install 'rankzoo[hf]')")

from tests.hf_tiny import tiny_model  # noqa: E402
from train.cli import main  # noqa: E402
from train.hf import bos_of, probe_batch  # noqa: E402

WORDS = ("the", "cat", "sat", "on", "a", "mat", "rank", "budget", "zoo", "heads")
BOS = 1


def _tokenizer(adds_bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[BOS]": BOS, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="[BOS] $A", special_tokens=[("[BOS]", BOS)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                                bos_token="[BOS]")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bos")
    g = torch.Generator().manual_seed(0)
    (root / "text.txt").write_text(" ".join(WORDS[i] for i in torch.randint(
        len(WORDS), (600,), generator=g).tolist()))
    tiny_model("llama").save_pretrained(root / "llama")
    _tokenizer(True).save_pretrained(root / "llama")
    return root / "llama", root / "text.txt"


def test_bos_of_reads_what_the_tokenizer_adds():
    assert bos_of(_tokenizer(True)) == BOS
    assert bos_of(_tokenizer(False)) is None


def test_probe_rows_start_with_the_bos():
    ids = torch.arange(10, 40)
    batch = probe_batch(ids, 8, 3, "t", bos=BOS)
    assert batch[:, 0].tolist() == [BOS] * 3
    assert torch.equal(batch[:, 1:].flatten(), ids[:21])  # 7 text tokens a row
    assert torch.equal(probe_batch(ids, 8, 3, "t"), ids[:24].view(3, 8))
    with pytest.raises(ValueError, match="seq_len=1: a sequence after the BOS needs a token"):
        probe_batch(ids, 1, 3, "t", bos=BOS)


def _report(files, capsys, *flags):
    model_dir, text = files
    code = main(["report", "--hf", str(model_dir), "--text", str(text), "--seq-len", "16",
                 "--probe-size", "2", "--format", "json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_report_states_the_bos_and_no_bos_turns_it_off(files, capsys):
    with_bos = _report(files, capsys)
    without = _report(files, capsys, "--no-bos")
    assert with_bos["source"]["bos"] == f"BOS (id {BOS}) first, as the tokenizer adds it"
    assert without["source"]["bos"] == f"no BOS (--no-bos; the tokenizer adds id {BOS})"
    loss = [r["variants"][0]["metrics"]["probe/loss"] for r in (with_bos, without)]
    assert loss[0] != loss[1]  # other sequences were measured


def test_compress_states_the_bos(files, capsys):
    model_dir, text = files
    code = main(["compress", "--hf", str(model_dir), "--text", str(text), "--eval-text",
                 str(text), "--seq-len", "16", "--ratios", "2", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["source"]["bos"].startswith(f"BOS (id {BOS}) first")
