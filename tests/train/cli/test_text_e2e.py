"""configs/text.yaml in miniature, end to end: a BPE trained on the text at first use,
MHA, a window-and-global hybrid and SwiGLU trained side by side on its tokens; then shards
written by `rankzoo tokenize` trained on as data.task: tokens, and a shard holding an id
outside the vocabulary refused in one line naming the file and the offset."""

import json

import numpy as np
import pytest
import yaml

from tests.train.conftest import tiny_experiment
from train.cli import main
from train.data import write_shard

WORDS = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "None"]
HYBRID = {"pattern": ["local", "global"],
          "blocks": {"local": {"block": "sliding_window", "window": 4},
                     "global": {"block": "softmax"}}}


def write_corpus(root) -> str:
    rng = np.random.default_rng(0)
    for i in range(2):
        (root / f"m{i}.py").write_text(
            "".join(" ".join(rng.choice(WORDS, 5)) + ":\n    pass\n" for _ in range(300)))
    return str(root / "m*.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text")
    cache = tmp / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RANKZOO_CACHE", str(cache))
        raw = tiny_experiment(
            model={"n_layers": 2}, match={"params": True},
            variants={"mha": {"block": "softmax"}, "lg": HYBRID,
                      "swiglu": {"block": "softmax", "model": {"mlp": "swiglu"}}},
            train={"max_steps": 4, "val_every_n_steps": 2, "checkpoint_every_n_steps": 2},
            monitor={"every_n_steps": 2})
        raw["data"] = {"task": "text", "paths": [write_corpus(tmp)], "tokenizer": "bpe:300",
                       "seq_len": 16, "train_size": 32, "val_size": 8, "batch_size": 8}
        config = tmp / "text.yaml"
        config.write_text(yaml.safe_dump(raw))
        assert main(["train", str(config), "--runs-dir", str(tmp / "runs")]) == 0
        cached = sorted(p.name for p in cache.rglob("*") if p.is_file())
        stamps = [p.stat().st_mtime_ns for p in sorted(cache.rglob("*")) if p.is_file()]
        assert main(["train", str(config), "--runs-dir", str(tmp / "runs"), "--dry-run"]) == 0
        again = [p.stat().st_mtime_ns for p in sorted(cache.rglob("*")) if p.is_file()]
    return tmp / "runs" / "tiny", cached, stamps == again


def test_the_variants_train_on_the_tokenizers_ids(trained):
    run, cached, unchanged = trained
    for variant in ("mha", "lg", "swiglu"):
        config = yaml.safe_load((run / variant / "config.yaml").read_text())
        assert config["data"]["tokenizer"] == "bpe:300" and config["data"]["vocab_size"] == 300
        assert json.loads((run / variant / "report.json").read_text())["variants"]
    assert yaml.safe_load((run / "swiglu" / "config.yaml").read_text())["model"]["mlp"] == "swiglu"
    # the BPE and both tokenized splits, made once (in preflight) for all three variants
    assert len([n for n in cached if n.startswith("bpe-300-")]) == 1
    assert len([n for n in cached if n.endswith((".train.npy", ".val.npy"))]) == 2
    assert unchanged


def test_shards_from_tokenize_train_and_a_bad_id_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANKZOO_CACHE", str(tmp_path / "cache"))
    shards = tmp_path / "shards"
    assert main(["tokenize", write_corpus(tmp_path), "--tokenizer", "bpe:300", "--out",
                 str(shards), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    raw = tiny_experiment(train={"max_steps": 2, "val_every_n_steps": 2,
                                 "checkpoint_every_n_steps": 2}, monitor={"every_n_steps": 2})
    raw["data"] = {**data, "seq_len": 16, "train_size": 16, "val_size": 4, "batch_size": 4}
    config = tmp_path / "tokens.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", str(config), "--runs-dir", str(tmp_path / "runs")]) == 0
    tokens = np.full(200, 7, dtype=np.uint16)
    tokens[40:] = 300  # the vocabulary is 300 (ids 0 to 299): every window meets one
    write_shard(tmp_path / "bad.bin", tokens, "modded")
    raw["data"] = {**raw["data"], "paths": [str(tmp_path / "bad.bin")], "seq_len": 50,
                   "val_paths": None, "val_fraction": None}
    raw["data"] = {k: v for k, v in raw["data"].items() if v is not None}
    config.write_text(yaml.safe_dump({**raw, "name": "bad"}))
    capsys.readouterr()
    assert main(["train", str(config), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err == [f"rankzoo: error: token shard '{tmp_path / 'bad.bin'}': token id 300 at "
                   f"token offset 40 (byte offset 1,104) is outside the vocabulary "
                   f"(data.vocab_size 300)"]


def test_an_exported_variant_carries_the_bpe_it_trained_on(trained, tmp_path, capsys,
                                                           monkeypatch):
    run, cached, _ = trained
    monkeypatch.setenv("RANKZOO_CACHE", str(run.parent.parent / "cache"))
    assert main(["export", str(run / "mha"), "--out", str(tmp_path / "hf"),
                 "--format", "json"]) == 0
    capsys.readouterr()
    from tokenizers import Tokenizer

    bpe = Tokenizer.from_file(str(next((run.parent.parent / "cache").rglob("bpe-300-*.json"))))
    out = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    text = "def parse(self):\n    return json.loads(data)\n"
    assert out.encode(text).ids == bpe.encode(text).ids and out.get_vocab() == bpe.get_vocab()
