"""`rankzoo report --model pkg.module:factory`: a model of one's own, written to a module
here as a user would, its checkpoint saved as nanoGPT saves one, reported like --hf."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from train.cli import main
from train.own.load import own_tokens

MODULE = '''
import torch, torch.nn as nn, torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.H, self.c_attn, self.c_proj = H, nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.H, -1).transpose(1, 2)
                   for t in self.c_attn(x).split(D, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))

class GPT(nn.Module):
    def __init__(self, V=128, D=32, H=4, L=2):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.h = nn.ModuleList(Attention(D, H) for _ in range(L))
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for layer in self.h:
            x = x + layer(x)
        return self.lm_head(x), None

def small():
    return GPT()

def wide():  # a vocabulary a trained BPE fits in
    return GPT(V=512)
'''


@pytest.fixture
def own(tmp_path, monkeypatch):
    (tmp_path / "own_gpt.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import own_gpt

    torch.manual_seed(0)
    torch.save({"model": own_gpt.small().state_dict(), "iter_num": 3}, tmp_path / "ckpt.pt")
    g = torch.Generator().manual_seed(0)
    (tmp_path / "text.txt").write_bytes(bytes(torch.randint(32, 127, (2000,), generator=g)
                                              .tolist()))
    return tmp_path


def _report(own, *extra) -> list[str]:
    return ["report", "--model", "own_gpt:small", "--checkpoint", str(own / "ckpt.pt"),
            "--text", str(own / "text.txt"), "--seq-len", "32", "--probe-size", "2", *extra]


def test_report_model_prints_every_layer_from_the_checkpoint(own, capsys):
    assert main(_report(own, "--format", "json")) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    layers = report["variants"][0]["layers"]
    assert [ly["name"] for ly in layers] == ["h.0", "h.1"]
    assert report["kinds"][0]["zoo_block"] == "softmax"  # a global layer mirrors softmax
    assert report["source"]["checkpoint"].endswith("ckpt.pt") and "raw bytes" in err
    # the checkpoint's weights are the ones measured: another draw reads differently
    torch.manual_seed(1)
    import own_gpt

    torch.save(own_gpt.small().state_dict(), own / "ckpt.pt")  # a bare state dict works too
    assert main(_report(own, "--format", "json")) == 0
    other = json.loads(capsys.readouterr()[0])["variants"][0]["layers"]
    assert other[0]["axes"] != layers[0]["axes"]


@pytest.mark.parametrize("change, message", [
    (["--model", "own_gpt"], "--model own_gpt: expected pkg.module:factory"),
    (["--model", "no_such_pkg:small"], "cannot import no_such_pkg"),
    (["--model", "own_gpt:large"], "has no callable large"),
    (["--checkpoint", "missing.pt"], "--checkpoint missing.pt: file not found"),
], ids=["no-factory", "no-module", "no-attribute", "no-checkpoint"])
def test_bad_input_is_one_line_naming_the_flag(own, capsys, change, message):
    args = _report(own)
    i = args.index(change[0])
    args[i + 1] = change[1]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_of_another_model_is_refused(own, capsys):
    torch.save({"model": {"wte.weight": torch.zeros(3, 3)}}, own / "ckpt.pt")
    assert main(_report(own)) == 2
    assert "does not fit --model own_gpt:small" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--model", "x:y"], "needs --text FILE"),
    (["runs/x", "--tokenizer", "bpe:64"], "--tokenizer bpe:64 only applies with --model"),
    (["runs/x", "--model", "x:y", "--text", "t"], "exactly one of RUN_DIR, --hf PATH or --model"),
], ids=["no-text", "tokenizer-alone", "two-sources"])
def test_flags_are_checked_before_anything_loads(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["report", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_example_s_model_is_reported(own, capsys):
    """examples/nanogpt/model.py, as `rankzoo report --model` reads it (its README line)."""
    assert main(["report", "--model", "examples.nanogpt.model:small", "--text",
                 str(own / "text.txt"), "--seq-len", "32", "--probe-size", "2",
                 "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [ly["name"] for ly in report["variants"][0]["layers"]]
    assert names == [f"h.{i}.attn" for i in range(4)]
    assert "unread_calls" not in report and "unmeasured_mixers" not in report


# ---------------------------------------------------------------- tokenizers

@pytest.fixture
def tokenizers(own, monkeypatch):
    """A BPE of 300 tokens trained on the text, saved as a tokenizer.json and in a model
    directory: each spec data.tokenizer takes, as a user would have it on disk."""
    from train.data.tokenizer import trained_bpe

    monkeypatch.setenv("RANKZOO_CACHE", str(own / "cache"))
    trained = trained_bpe(300, (own / "text.txt").read_text())
    (own / "tokenizer.json").write_bytes(trained.read_bytes())
    (own / "model_dir").mkdir()
    (own / "model_dir" / "tokenizer.json").write_bytes(trained.read_bytes())
    import own_gpt

    torch.save({"model": own_gpt.wide().state_dict()}, own / "wide.pt")
    return own


@pytest.mark.parametrize("spec", ["bpe:300", "tokenizer.json", "model_dir"],
                         ids=["bpe", "tokenizer-json", "model-dir"])
def test_every_tokenizer_spec_gives_the_ids_the_tokenizer_gives(tokenizers, spec, capsys):
    from train.data.tokenizer import encode_text, load_tokenizer

    name = spec if spec.startswith("bpe:") else str(tokenizers / spec)
    args = ["report", "--model", "own_gpt:wide", "--text", str(tokenizers / "text.txt"),
            "--tokenizer", name, "--checkpoint", str(tokenizers / "wide.pt"),
            "--seq-len", "32", "--probe-size", "2", "--format", "json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["source"]["tokens"] == name and "raw bytes" not in err
    # the probe reads the tokenizer's ids, not bytes: its loss is the model's on them
    text = (tokenizers / "text.txt").read_text()
    ids = encode_text(load_tokenizer(name, lambda: text), text, progress=False)
    assert len(ids) < len(text.encode())  # merges: fewer tokens than bytes
    got = own_tokens(text.encode(), name, 512, "text", [])
    assert got.tolist() == ids.tolist()
    # a BPE trained here is not the one a checkpoint trained on: the report says so
    assert ("--tokenizer bpe:300 trains a BPE on this text" in err) == spec.startswith("bpe:")


def test_a_tokenizer_wider_than_the_model_is_one_line(tokenizers, capsys):
    assert main(_report(tokenizers, "--tokenizer", str(tokenizers / "tokenizer.json"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "its 300 tokens do not fit the model's vocab of 128" in err


def test_a_module_under_the_current_directory_is_found(tmp_path, monkeypatch, capsys):
    """As `python -m` finds it: the console script's sys.path has no current directory."""
    pkg = tmp_path / "mine"
    pkg.mkdir()
    (pkg / "gpt.py").write_text(MODULE)
    (tmp_path / "t.txt").write_text("some text " * 40)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = list(sys.path)
    assert main(["report", "--model", "mine.gpt:small", "--text", "t.txt", "--seq-len", "16",
                 "--probe-size", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["variants"][0]["layers"]
    assert sys.path == before  # the path is as it was
