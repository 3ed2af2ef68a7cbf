"""The tokenizers `data.tokenizer` and `rankzoo tokenize` name, loaded offline, and text
encoded through them in chunks, with a progress bar on long work.

A tokenizer is named by a string:

    path/to/tokenizer.json     a `tokenizers` file (what every fast Hugging Face tokenizer saves)
    path/to/model_dir          a Hugging Face model directory: its tokenizer.json, else its
                               tokenizer through transformers (AutoTokenizer, offline)
    bpe:4096                   a byte-level BPE of 4096 tokens trained by `tokenizers` on the
                               text itself at first use, cached (train_bpe; deterministic)

    tok = load_tokenizer("bpe:4096", train_text=lambda: text)
    ids = encode_text(tok, text)                  # np.ndarray, uint16 or uint32

Caches live under cache_root(): $RANKZOO_CACHE, else $XDG_CACHE_HOME/rankzoo, else
~/.cache/rankzoo. A trained BPE is tokenizers/bpe-<N>-<hash of its text and N>.json there.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .shards import token_dtype

BPE_PREFIX = "bpe:"
TOKENIZER_FILE = "tokenizer.json"
MIN_BPE, MAX_BPE = 257, 1 << 20  # past the 256 bytes it starts from; past any real vocab
BPE_RECIPE = "byte-level-bpe-1"  # train_bpe's settings: a new recipe trains anew
CHUNK_CHARS = 1 << 16  # text is encoded in pieces of about this many characters, cut at "\n"
BATCH_CHUNKS = 16  # pieces per encode_batch call: one step of the progress bar
PROGRESS_CHARS = 1 << 20  # show a progress bar from this much text on (about a second)
# files of a model directory that are weights, not tokenizer: left out of its digest
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack",
                   ".ckpt", ".onnx")


def cache_root() -> Path:
    """Where rankzoo keeps what it derives from data (trained tokenizers, tokenized text)."""
    if os.environ.get("RANKZOO_CACHE"):
        return Path(os.environ["RANKZOO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rankzoo"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: `encode` maps texts to id lists without special tokens;
    `digest` hashes what it was loaded from, so a cache keyed by it follows any change."""

    name: str
    vocab_size: int
    digest: str
    encode: Callable[[list[str]], list[list[int]]]


# ---------------------------------------------------------------- naming a tokenizer

def bpe_size(spec: str) -> int | None:
    """N of `bpe:N`, validated; None for a path."""
    if not spec.startswith(BPE_PREFIX):
        return None
    n = spec[len(BPE_PREFIX):]
    if not n.isdigit() or not MIN_BPE <= int(n) <= MAX_BPE:
        raise ValueError(f"data.tokenizer {spec!r}: bpe:N takes a vocabulary size N from "
                         f"{MIN_BPE} to {MAX_BPE}")
    return int(n)


def tokenizer_kind(spec: str) -> str:
    """"bpe", "file" or "dir"; a path that does not exist is an error naming it."""
    if bpe_size(spec) is not None:
        return "bpe"
    path = Path(spec)
    if path.is_dir():
        return "dir"
    if path.is_file():
        return "file"
    raise ValueError(f"data.tokenizer: {spec!r} does not exist (a tokenizer.json, a Hugging "
                     f"Face model directory, or bpe:N)")


def tokenizer_vocab_size(spec: str) -> int:
    """The vocabulary a tokenizer's ids index (added tokens included), without training a
    BPE: bpe:N has N (fewer are used when its text runs out of merges). Loaded once per
    process while its file is unchanged: a config is validated more than once."""
    n = bpe_size(spec)
    if n is not None:
        return n
    path = Path(spec)
    if tokenizer_kind(spec) == "dir" and (path / TOKENIZER_FILE).is_file():
        path = path / TOKENIZER_FILE  # edited in place, it changes; its directory does not
    stat = path.stat()
    return _vocab_size(spec, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _vocab_size(spec: str, mtime_ns: int, size: int) -> int:
    return load_tokenizer(spec).vocab_size


# ---------------------------------------------------------------- loading

def _from_json(name: str, path: Path):
    from tokenizers import Tokenizer as HFTokenizer  # imported on first use: rankzoo starts fast
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception for any bad file
        raise ValueError(f"data.tokenizer {name!r}: {str(path)!r} is not a tokenizer.json "
                         f"({str(e).splitlines()[0]})") from None
    return Tokenizer(name, tok.get_vocab_size(with_added_tokens=True),
                     sha256(path.read_bytes()),
                     lambda texts: [e.ids for e in tok.encode_batch(texts,
                                                                    add_special_tokens=False)])


def _load_file(spec: str, train_text=None) -> Tokenizer:
    return _from_json(spec, Path(spec))


def _load_dir(spec: str, train_text=None) -> Tokenizer:
    """A model directory's tokenizer.json through `tokenizers`; without one (a
    sentencepiece-only model), its tokenizer through transformers, offline."""
    path = Path(spec)
    if (path / TOKENIZER_FILE).is_file():
        return _from_json(spec, path / TOKENIZER_FILE)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"data.tokenizer {spec!r} has no {TOKENIZER_FILE}; its tokenizer "
                         f"needs transformers: pip install 'rankzoo[hf]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as e:  # transformers and tokenizers raise many types for a bad file
        raise ValueError(f"data.tokenizer {spec!r}: no tokenizer loads from this directory "
                         f"({str(e).splitlines()[0]})") from None
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix not in WEIGHT_SUFFIXES)
    digest = sha256(b"".join(p.name.encode() + sha256(p.read_bytes()).encode() for p in files))
    return Tokenizer(spec, len(tok), digest,
                     lambda texts: tok(texts, add_special_tokens=False)["input_ids"])


def _load_bpe(spec: str, train_text: Callable[[], str] | None = None) -> Tokenizer:
    if train_text is None:
        raise ValueError(f"data.tokenizer {spec!r}: a BPE is trained on the text it encodes; "
                         f"name a tokenizer.json here")
    return _from_json(spec, trained_bpe(bpe_size(spec), train_text()))


LOADERS: dict[str, Callable[..., Tokenizer]] = {
    "file": _load_file, "dir": _load_dir, "bpe": _load_bpe,
}


def load_tokenizer(spec: str, train_text: Callable[[], str] | None = None) -> Tokenizer:
    """The tokenizer `spec` names; `train_text` gives the text a bpe:N is trained on."""
    return LOADERS[tokenizer_kind(spec)](spec, train_text)


# ---------------------------------------------------------------- training a BPE

def trained_bpe(n: int, text: str) -> Path:
    """The tokenizer.json of a byte-level BPE of n tokens trained on `text`: from the cache
    when one was trained on the same text, else trained now and cached. `tokenizers`
    trains deterministically (the same file for the same text, at any thread count)."""
    key = sha256(f"{BPE_RECIPE}\n{n}\n".encode() + text.encode())[:16]
    path = cache_root() / "tokenizers" / f"bpe-{n}-{key}.json"
    if path.is_file():
        return path
    with progress_bar(f"training a BPE of {n} tokens", len(text)) as advance:
        tok = train_bpe(n, pieces(text))
        advance(len(text))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tok.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def train_bpe(n: int, texts: Iterator[str]):
    """GPT-2's byte-level BPE: every byte is a token from the start, so any text encodes
    without an unknown token; no special tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


# ---------------------------------------------------------------- encoding

def pieces(text: str, size: int | None = None) -> Iterator[str]:
    """`text` in pieces of about `size` characters (CHUNK_CHARS), each ending at a newline
    where one is near: encoded one by one they give the ids of the whole but for the
    pieces' edges."""
    size, i = size or CHUNK_CHARS, 0
    while i < len(text):
        j = len(text) if i + size >= len(text) else text.rfind("\n", i, i + size) + 1
        j = j if j > i else i + size  # no newline in reach: cut at the size
        yield text[i:j]
        i = j


def encode_text(tok: Tokenizer, text: str, what: str = "text",
                progress: bool = True) -> np.ndarray:
    """The ids of `text`, BATCH_CHUNKS pieces per call, with a progress bar on long work
    (none when `progress` is false: the caller shows its own)."""
    out, batch = [], []
    total = len(text) if progress else 0
    with progress_bar(f"tokenizing {what} with {tok.name}", total) as advance:
        for piece in pieces(text):
            batch.append(piece)
            if len(batch) == BATCH_CHUNKS:
                out += [np.asarray(ids, dtype=np.int64) for ids in tok.encode(batch)]
                advance(sum(map(len, batch)))
                batch = []
        if batch:
            out += [np.asarray(ids, dtype=np.int64) for ids in tok.encode(batch)]
            advance(sum(map(len, batch)))
    ids = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return ids.astype(token_dtype(tok.vocab_size))


class progress_bar:
    """A rich progress bar on stderr over `total` characters, shown from PROGRESS_CHARS on
    and cleared when done; `with progress_bar(label, total) as advance: advance(n)`."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.bar = label, total, None

    def __enter__(self) -> Callable[[int], None]:
        if self.total < PROGRESS_CHARS:
            return lambda n: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task(f"rankzoo: {self.label}", total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
