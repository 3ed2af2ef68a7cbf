"""data.tokenizer: tokenizers loaded offline (a tokenizer.json, a model directory, bpe:N),
text tokenized once into a cache that an unchanged text and tokenizer reuse and any
change invalidates, and the vocabulary the config takes from it."""

import json

import numpy as np
import pytest

import train.data.token_cache as token_cache
import train.data.tokenizer as tokenizer
from train.config import parse_experiment
from train.data import load_tokenizer, make_splits, tokenizer_vocab_size, trained_bpe
from train.data.token_cache import tokenized_parts

from ..conftest import tiny_experiment

WORDS = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "None"]


def corpus(seed: int = 0, lines: int = 300) -> str:
    rng = np.random.default_rng(seed)
    return "".join(" ".join(rng.choice(WORDS, size=6)) + ":\n    pass\n" for _ in range(lines))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def encodes(monkeypatch):
    """How many texts have been encoded since the test began."""
    calls = []
    real = token_cache.encode_text
    monkeypatch.setattr(token_cache, "encode_text",
                        lambda tok, text, what: calls.append(what) or real(tok, text, what))
    return calls


def test_a_bpe_is_trained_once_and_deterministically(cache, tmp_path, monkeypatch):
    path = trained_bpe(300, corpus())
    stamp = path.stat().st_mtime_ns
    assert trained_bpe(300, corpus()) == path and path.stat().st_mtime_ns == stamp
    monkeypatch.setenv("RANKZOO_CACHE", str(tmp_path / "elsewhere"))
    again = trained_bpe(300, corpus())
    assert again != path and again.read_bytes() == path.read_bytes()
    assert trained_bpe(300, corpus(seed=1)).read_bytes() != path.read_bytes()
    assert load_tokenizer(str(path)).vocab_size <= 300 == tokenizer_vocab_size("bpe:300")


def test_ids_are_the_tokenizers_own(tmp_path, monkeypatch):
    path = trained_bpe(300, corpus())
    tok = load_tokenizer(str(path))
    from tokenizers import Tokenizer

    direct = Tokenizer.from_file(str(path)).encode(corpus(1)).ids
    ids = tokenizer.encode_text(tok, corpus(1))  # shorter than one piece: one call
    assert ids.dtype == np.uint16 and ids.tolist() == direct
    monkeypatch.setattr(tokenizer, "PROGRESS_CHARS", 0)  # the progress bar's path too
    monkeypatch.setattr(tokenizer, "CHUNK_CHARS", 1000)
    pieces = list(tokenizer.pieces(corpus(1), 1000))
    assert "".join(pieces) == corpus(1) and all(p.endswith("\n") for p in pieces)
    assert tokenizer.encode_text(tok, corpus(1)).tolist() == [
        i for p in pieces for i in Tokenizer.from_file(str(path)).encode(p).ids]


def test_tokenized_text_is_reused_until_the_text_or_tokenizer_changes(cache, encodes):
    parts = {"train": corpus(0).encode(), "val": corpus(1, 40).encode()}
    first = tokenized_parts(parts, "bpe:300")
    assert encodes == ["the train text", "the val text"]
    files = sorted((cache / "tokens").iterdir())
    stamps = [p.stat().st_mtime_ns for p in files]
    again = tokenized_parts(parts, "bpe:300")
    assert len(encodes) == 2 and [p.stat().st_mtime_ns for p in files] == stamps
    assert all((np.asarray(again[k]) == np.asarray(first[k])).all() for k in parts)
    tokenized_parts({**parts, "val": corpus(2, 40).encode()}, "bpe:300")  # the text changed
    assert len(encodes) == 4 and len(list((cache / "tokens").iterdir())) == 4
    other = trained_bpe(260, corpus(0))  # the tokenizer changed
    tokenized_parts(parts, str(other))
    assert len(encodes) == 6
    other.write_bytes(trained_bpe(280, corpus(0)).read_bytes())  # edited in place
    tokenized_parts(parts, str(other))
    assert len(encodes) == 8 and len(list((cache / "tokens").iterdir())) == 8


def test_a_model_directory_loads_offline(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer(str(trained_bpe(300, corpus())))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(trained_bpe(300, corpus())))
    fast.add_special_tokens({"eos_token": "<|end|>"})
    fast.save_pretrained(tmp_path / "model")
    loaded = load_tokenizer(str(tmp_path / "model"))
    assert loaded.vocab_size == len(fast) == tok.vocab_size + 1  # added tokens count
    assert loaded.encode([corpus(1)]) == tok.encode([corpus(1)])
    # no tokenizer.json: GPT-2's vocab.json and merges.txt, read by transformers
    from tokenizers import Tokenizer

    (tmp_path / "slow").mkdir()
    Tokenizer.from_file(str(trained_bpe(300, corpus()))).model.save(str(tmp_path / "slow"))
    (tmp_path / "slow" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    slow = load_tokenizer(str(tmp_path / "slow"))
    assert slow.encode([corpus(1)]) == tok.encode([corpus(1)])
    assert slow.vocab_size >= tok.vocab_size and slow.digest != tok.digest
    (tmp_path / "slow" / "vocab.json").write_text("{}")  # a broken one is named
    with pytest.raises(ValueError, match=r"slow'.*no tokenizer loads from this directory"):
        load_tokenizer(str(tmp_path / "slow"))


def text_experiment(tmp_path, **data) -> dict:
    (tmp_path / "corpus.py").write_text(corpus(0, 600))
    return {**tiny_experiment(), "data": {
        "task": "text", "paths": [str(tmp_path / "corpus.py")], "seq_len": 16,
        "train_size": 32, "val_size": 8, "batch_size": 8, **data}}


def test_the_config_takes_the_tokenizers_vocabulary(tmp_path, encodes):
    path = str(trained_bpe(300, corpus()))
    size = load_tokenizer(path).vocab_size
    exp = parse_experiment(text_experiment(tmp_path, tokenizer=path))
    assert exp.data.vocab_size == size and exp.data.to_dict()["tokenizer"] == path
    assert parse_experiment(text_experiment(tmp_path, tokenizer=path,
                                            vocab_size=512)).data.vocab_size == 512
    (x, _), (vx, _) = make_splits(exp.data.spec(), 32, 8, seed=0)
    assert int(x.max()) < size and x.shape == (32, 16) and vx.shape == (8, 16)
    assert parse_experiment(text_experiment(tmp_path)).data.vocab_size == 256  # bytes
    for data, match in [
        ({"tokenizer": path, "vocab_size": 100},
         rf"data\.vocab_size 100 is smaller than the vocabulary of data\.tokenizer "
         rf"'.*' \({size} tokens\)"),
        ({"vocab_size": 300}, r"unknown text data key 'data\.vocab_size'"),  # bytes: 256
        ({"tokenizer": str(tmp_path / "nope.json")}, r"nope\.json' does not exist"),
        ({"tokenizer": "bpe:12"}, r"bpe:N takes a vocabulary size N from 257"),
        ({"tokenizer": str(tmp_path / "corpus.py")}, r"corpus\.py' is not a tokenizer\.json"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_experiment(text_experiment(tmp_path, **data))
