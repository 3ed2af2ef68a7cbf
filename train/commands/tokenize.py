"""`rankzoo tokenize FILES --tokenizer PATH --out DIR`: text files tokenized into shards
that rankzoo's `data.task: tokens` and a nanoGPT-style trainer both read.

    doc = tokenize_document(["corpus/"], "tokenizer.json", Path("shards"), "modded")

The files (files, directories, globs, `stdlib`, as `data.paths` takes them) are read in
sorted order, one at a time, and their ids appended to a temporary file in DIR; the last
`val_fraction` of the ids is the validation split. Then the shards are cut from it:

    bin      train.bin, val.bin: one file per split, as nanoGPT's prepare.py writes them
    modded   train_000000.bin, ... val_000000.bin: shards of `shard_tokens` ids each
    npy      train_000000.npy, ... val_000000.npy: likewise

With `bpe:N` a byte-level BPE is trained on the files first and saved as DIR/tokenizer.json.
Shards of an earlier run in DIR are refused unless `overwrite`; then they are removed
first, so that no stale shard is globbed with the new ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..data import (
    SHARD_SUFFIX,
    Tokenizer,
    bpe_size,
    encode_text,
    expand_paths,
    load_tokenizer,
    token_dtype,
    write_shard,
)
from ..data.tokenizer import pieces, progress_bar, train_bpe

SPLITS = ("train", "val")
SHARD_TOKENS = 100_000_000  # modded-nanogpt's shard size
TOKENIZER_OUT = "tokenizer.json"  # where a bpe:N trained here is saved, beside the shards


def input_files(entries: list[str]) -> list[Path]:
    """The files the entries name, each once, in the order given (each entry's sorted)."""
    return list(dict.fromkeys(p for entry in entries for p in expand_paths(entry, None)))


def shard_names(fmt: str, split: str, count: int) -> list[str]:
    """The names of a split's `count` shards in format `fmt`."""
    if fmt == "bin":
        return [f"{split}.bin"]
    return [f"{split}_{i:06d}{SHARD_SUFFIX[fmt]}" for i in range(count)]


def existing_outputs(out: Path, fmt: str, bpe: bool) -> list[Path]:
    """What an earlier run of this format left in `out` (its shards, a trained tokenizer)."""
    found = [p for split in SPLITS
             for p in (out.glob(f"{split}_*{SHARD_SUFFIX[fmt]}") if fmt != "bin"
                       else [out / f"{split}.bin"]) if p.is_file()]
    if bpe and (out / TOKENIZER_OUT).is_file():
        found.append(out / TOKENIZER_OUT)
    return sorted(found)


def check_outputs(out: Path, fmt: str, bpe: bool, overwrite: bool) -> None:
    """Refuse to write over an earlier run's shards unless asked; asked, remove them."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {str(out)!r} exists and is not a directory")
    found = existing_outputs(out, fmt, bpe) if out.is_dir() else []
    if found and not overwrite:
        raise FileExistsError(f"--out {str(out)!r} already holds {found[0].name}"
                              + (f" and {len(found) - 1} more" if len(found) > 1 else "")
                              + "; pass --overwrite to replace them")
    for path in found:
        path.unlink()


def read_file(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"cannot read {str(path)!r} ({e.strerror})") from None


def file_texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        yield from pieces(read_file(path))


def the_tokenizer(spec: str, files: list[Path], out: Path) -> tuple[Tokenizer, str | None]:
    """The tokenizer, and the file a bpe:N trained here was saved to (None otherwise)."""
    n = bpe_size(spec)
    if n is None:
        return load_tokenizer(spec), None
    size = sum(p.stat().st_size for p in files)
    with progress_bar(f"training a BPE of {n} tokens", size) as advance:
        tok = train_bpe(n, file_texts(files))
        advance(size)
    saved = out / TOKENIZER_OUT
    tok.save(str(saved))
    return load_tokenizer(str(saved)), str(saved)


def encode_files(tok: Tokenizer, files: list[Path], dest: Path) -> int:
    """Append the ids of every file to `dest` (raw, token_dtype); the number written."""
    total, dtype = 0, token_dtype(tok.vocab_size)
    size = sum(p.stat().st_size for p in files)
    with open(dest, "wb") as f, progress_bar(f"tokenizing {len(files)} files with "
                                             f"{tok.name}", size) as advance:
        for path in files:
            ids = encode_text(tok, read_file(path), str(path), progress=False)
            f.write(ids.astype(dtype, copy=False).tobytes())
            total += len(ids)
            advance(path.stat().st_size)
    return total


def write_splits(tokens: np.ndarray, out: Path, fmt: str, val_fraction: float,
                 shard_tokens: int) -> list[dict]:
    """The shards of both splits cut from `tokens`: [{path, split, tokens}]."""
    n_val = round(len(tokens) * val_fraction)
    bounds = {"train": (0, len(tokens) - n_val), "val": (len(tokens) - n_val, len(tokens))}
    written = []
    for split, (start, stop) in bounds.items():
        if stop == start:
            continue
        step = stop - start if fmt == "bin" else shard_tokens
        cuts = range(start, stop, step)
        for name, a in zip(shard_names(fmt, split, len(cuts)), cuts, strict=True):
            b = min(stop, a + step)
            path = write_shard(out / name, tokens[a:b], fmt)
            written.append({"path": str(path), "split": split, "tokens": b - a})
    return written


def tokenize_document(entries: list[str], tokenizer: str, out: Path, fmt: str = "modded",
                      val_fraction: float = 0.1, shard_tokens: int = SHARD_TOKENS,
                      overwrite: bool = False) -> dict:
    """Tokenize the files `entries` names into shards in `out`; the document of what was
    written (SCHEMAS.md, rankzoo tokenize --format json)."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    files = input_files(entries)
    check_outputs(out, fmt, bpe_size(tokenizer) is not None, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    tok, trained = the_tokenizer(tokenizer, files, out)
    if fmt != "npy" and tok.vocab_size > 1 << 16:
        raise ValueError(f"--shard-format {fmt} holds uint16 ids; {tokenizer!r} has "
                         f"{tok.vocab_size:,} tokens: use --shard-format npy")
    raw = out / f".tokens.{os.getpid()}.tmp"
    try:
        count = encode_files(tok, files, raw)
        if count == 0:
            raise ValueError(f"{entries}: the files hold no text to tokenize")
        tokens = np.memmap(raw, dtype=token_dtype(tok.vocab_size), mode="r")
        shards = write_splits(tokens, out, fmt, val_fraction, shard_tokens)
        del tokens  # the memory map closes before its file is removed
    finally:
        raw.unlink(missing_ok=True)
    return {"tokenizer": tokenizer, "tokenizer_file": trained, "vocab_size": tok.vocab_size,
            "format": fmt, "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "tokens": count, "val_fraction": val_fraction, "out": str(out), "shards": shards,
            "data": data_section(out, fmt, tok.vocab_size, shards)}


def data_section(out: Path, fmt: str, vocab_size: int, shards: list[dict]) -> dict:
    """The experiment's data section that trains on these shards."""
    data: dict = {"task": "tokens"}
    for split, key in (("train", "paths"), ("val", "val_paths")):
        if any(s["split"] == split for s in shards):
            name = f"{split}.bin" if fmt == "bin" else f"{split}_*{SHARD_SUFFIX[fmt]}"
            data[key] = [str(out / name)]
    return {**data, "vocab_size": vocab_size}
