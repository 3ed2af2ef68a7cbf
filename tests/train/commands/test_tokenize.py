"""`rankzoo tokenize`: shards of every format that a nanoGPT-style reader and rankzoo read
back as the tokenizer's ids, refusals to overwrite, a BPE trained in place; and bad
shards refused by `rankzoo train` in one line naming the file and the offset."""

import glob
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from train.cli import main
from train.data import TokensSpec, load_tokenizer, make_splits, trained_bpe

from ..conftest import tiny_experiment

WORDS = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "None"]


# ------------------------------------------------------ a nanoGPT-style reader, 20 lines

def read_shard(path: str) -> np.ndarray:
    """One shard as nanoGPT (raw uint16) or modded-nanogpt (256-int32 header) reads it."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header.size == 256 and header[0] == 20240520:  # modded-nanogpt's _load_data_shard
        assert header[1] == 1, "unsupported version"
        tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=256 * 4)
        assert len(tokens) == header[2], "number of tokens read does not match header"
        return tokens
    return np.memmap(path, dtype=np.uint16, mode="r")  # nanoGPT's train.py


def get_batch(pattern: str, batch_size: int, block_size: int, seed: int = 0):
    """nanoGPT's get_batch over the shards `pattern` globs, in order."""
    data = np.concatenate([read_shard(p) for p in sorted(glob.glob(pattern))])
    ix = torch.randint(len(data) - block_size, (batch_size,),
                       generator=torch.Generator().manual_seed(seed))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64))
                     for i in ix])
    return x, y


# ------------------------------------------------------ the shards

@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """Three text files and a tokenizer.json trained on them; (files, tokenizer, ids of
    the files in order)."""
    monkeypatch.setenv("RANKZOO_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        path = tmp_path / "text" / f"f{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(" ".join(rng.choice(WORDS, 5)) + "\n" for _ in range(120)))
        files.append(path)
    text = "".join(p.read_text() for p in files)
    tok = str(trained_bpe(300, text))
    ids = np.concatenate([load_tokenizer(tok).encode([p.read_text()])[0] for p in files])
    return files, tok, ids


@pytest.mark.parametrize("fmt", ["bin", "modded", "npy"])
def test_shards_hold_the_tokenizers_ids_for_both_readers(corpus, tmp_path, capsys, fmt):
    files, tok, ids = corpus
    out = tmp_path / "shards"
    assert main(["tokenize", str(files[0].parent), "--tokenizer", tok, "--out", str(out),
                 "--shard-format", fmt, "--shard-tokens", "700", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokens"] == len(ids) and sum(s["tokens"] for s in doc["shards"]) == len(ids)
    names = sorted(p.name for p in out.iterdir())
    if fmt == "bin":
        assert names == ["train.bin", "val.bin"]
    else:
        ext = ".npy" if fmt == "npy" else ".bin"
        assert len(names) > 2 and all(n.endswith(ext) for n in names)
    read = (lambda p: np.load(p)) if fmt == "npy" else read_shard  # the user's own reader
    stream = np.concatenate([read(p) for split in ("train", "val")
                             for p in sorted(glob.glob(str(out / f"{split}*")))])
    np.testing.assert_array_equal(stream, ids)
    n_val = round(0.1 * len(ids))
    assert sum(s["tokens"] for s in doc["shards"] if s["split"] == "val") == n_val
    # rankzoo reads the same shards through the data section the document suggests
    data = doc["data"]
    spec = TokensSpec(tuple(data["paths"]), seq_len=16, vocab_size=data["vocab_size"],
                      val_paths=tuple(data["val_paths"]))
    (x, _), (vx, _) = make_splits(spec, 16, 4, seed=0)
    text = ids.tolist()
    assert all(_contains(text[:len(ids) - n_val], row) for row in x.tolist())
    assert all(_contains(text[len(ids) - n_val:], row) for row in vx.tolist())
    if fmt != "npy":
        x, y = get_batch(str(out / "train*.bin"), 4, 16)
        assert (x[:, 1:] == y[:, :-1]).all() and all(_contains(text, r) for r in x.tolist())


def _contains(seq: list, run: list) -> bool:
    return any(seq[i:i + len(run)] == run for i in range(len(seq) - len(run) + 1))


def test_existing_shards_are_refused_and_replaced_only_when_asked(corpus, tmp_path, capsys):
    files, tok, _ = corpus
    out = tmp_path / "shards"
    assert main(["tokenize", *map(str, files), "--tokenizer", tok, "--out", str(out),
                 "--shard-tokens", "300"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["tokenize", *map(str, files), "--tokenizer", tok, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds train_000000.bin and" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["tokenize", *map(str, files), "--tokenizer", tok, "--out", str(out),
                 "--overwrite"]) == 0  # one shard per split now: the old extra ones go
    assert sorted(p.name for p in out.iterdir()) == ["train_000000.bin", "val_000000.bin"]


def test_a_bpe_trained_in_place_is_saved_beside_the_shards(corpus, tmp_path, capsys):
    files, _, _ = corpus
    out = tmp_path / "shards"
    assert main(["tokenize", *map(str, files), "--tokenizer", "bpe:280", "--out", str(out),
                 "--val-fraction", "0", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tokenizer_file"] == str(out / "tokenizer.json") and "val_paths" not in doc["data"]
    from tokenizers import Tokenizer

    decoded = Tokenizer.from_file(doc["tokenizer_file"]).decode(
        read_shard(str(out / "train_000000.bin")).tolist())
    assert decoded == "".join(p.read_text() for p in files)  # byte-level BPE is lossless


# ------------------------------------------------------ bad shards, through rankzoo train

def header(magic=20240520, version=1, count=100) -> bytes:
    h = np.zeros(256, dtype="<i4")
    h[:3] = magic, version, count
    return h.tobytes()


TOKENS = (np.arange(100) % 50).astype("<u2").tobytes()
# file contents -> what the error line says. data.format: auto reads a .bin without the
# magic as nanoGPT's raw format, so the bad magic is refused under data.format: modded
BAD = {
    "truncated": (header() + TOKENS[:-9],
                  r"truncated: the header \(byte offset 8\) counts 100 tokens, the file ends "
                  r"at byte offset 1,215"),
    "magic": (header(magic=7) + TOKENS, r"bad header: magic 7 at byte offset 0"),
    "version": (header(version=3) + TOKENS, r"bad header: version 3 at byte offset 4"),
    "count": (header(count=120) + TOKENS,
              r"truncated: the header \(byte offset 8\) counts 120 tokens"),
    "extra": (header(count=80) + TOKENS,
              r"token count mismatch: the header \(byte offset 8\) counts 80 tokens, the file "
              r"holds 40 more bytes from byte offset 1,184"),
}


def tokens_config(tmp_path: Path, shard: Path, fmt: str = "modded", **train) -> Path:
    raw = {**tiny_experiment(train={"max_steps": 2, **train}), "data": {
        "task": "tokens", "paths": [str(shard)], "format": fmt, "vocab_size": 50,
        "seq_len": 8, "train_size": 16, "val_size": 4, "batch_size": 4}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_header_is_one_line_naming_the_file_and_offset(tmp_path, capsys, case):
    content, match = BAD[case]
    shard = tmp_path / "shard.bin"
    shard.write_bytes(content)
    fmt = "modded" if case == "magic" else "auto"
    assert main(["train", str(tokens_config(tmp_path, shard, fmt)), "--dry-run",
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rankzoo: error: ")
    assert str(shard) in err and re.search(match, err), err
    assert not (tmp_path / "runs").exists()
