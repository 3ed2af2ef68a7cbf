"""Text tokenized once: the ids of each part of a corpus (its train and validation text)
kept as .npy files under the cache root and memory-mapped back on every later run.

    ids = tokenized_parts({"train": b"...", "val": b"..."}, "path/to/tokenizer.json")
    ids["train"]                              # np.memmap of uint16 (uint32 past 65536 ids)

The cache key is a hash of the tokenizer's content (train/data/tokenizer.py `digest`: its
tokenizer.json, or a model directory's tokenizer files), of each part's bytes and of the
encoding recipe, so an edited text or tokenizer is tokenized anew and an unchanged one
never twice. Files: <cache root>/tokens/<key>.<part>.npy, each written whole or not at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .shards import open_shard, write_shard
from .tokenizer import cache_root, encode_text, load_tokenizer, sha256

ENCODING = "pieces-1"  # encode_text's recipe: a new one tokenizes anew


def cache_files(key: str, parts: list[str]) -> dict[str, Path]:
    return {part: cache_root() / "tokens" / f"{key}.{part}.npy" for part in parts}


def parts_key(digest: str, parts: dict[str, bytes]) -> str:
    """The cache key of these parts under the tokenizer of `digest`."""
    text = "".join(f"{name}:{sha256(data)}\n" for name, data in parts.items())
    return sha256(f"{ENCODING}\n{digest}\n{text}".encode())[:24]


def tokenized_parts(parts: dict[str, bytes], tokenizer: str,
                    train_part: str = "train") -> dict[str, np.ndarray]:
    """The ids of each part (UTF-8 text, a broken character replaced by U+FFFD), from the
    cache or encoded now and cached; a bpe:N tokenizer is trained on `train_part`'s text."""
    texts = {name: data.decode("utf-8", errors="replace") for name, data in parts.items()}
    tok = load_tokenizer(tokenizer, train_text=lambda: texts[train_part])
    files = cache_files(parts_key(tok.digest, parts), list(parts))
    if not all(path.is_file() for path in files.values()):
        files[train_part].parent.mkdir(parents=True, exist_ok=True)
        for name, path in files.items():
            write_shard(path, encode_text(tok, texts[name], f"the {name} text"), "npy")
    return {name: open_shard(path, "npy").tokens() for name, path in files.items()}

