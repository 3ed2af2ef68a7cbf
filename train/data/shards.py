"""Token shards on disk, the three formats people train from, read memory-mapped and
written whole or not at all.

    bin     nanoGPT's raw uint16 tokens, nothing else (train.bin, val.bin)
    modded  modded-nanogpt's: a header of 256 int32 (magic 20240520, version 1, the token
            count, then zeros), then that many uint16 tokens
    npy     a 1-D NumPy array of integer tokens (np.save), any integer dtype

    shard = open_shard("data/train_000000.bin")   # format from the suffix and the header
    shard.tokens()[i:j]                           # a np.memmap: only what is indexed is read
    write_shard(Path("out/train.bin"), ids, "bin")

`open_shard` reads the header and the file's size, never the tokens: a truncated file, a
bad header or a count that disagrees with the size is a ValueError naming the file and the
byte offset. Token ids are checked where they are read (`first_bad_id`, chunk by chunk).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODDED_MAGIC, MODDED_VERSION = 20240520, 1
HEADER_INTS = 256  # modded-nanogpt's header: 256 int32, 1024 bytes
HEADER_BYTES = 4 * HEADER_INTS
UINT16 = np.dtype("<u2")  # both nanoGPT formats: little-endian uint16 ids
FORMATS = ("bin", "modded", "npy")
SUFFIX = {"bin": ".bin", "modded": ".bin", "npy": ".npy"}
SCAN_CHUNK = 1 << 24  # tokens compared per step of an id scan: 32 MiB of uint16


@dataclass(frozen=True)
class Shard:
    """One shard: where its tokens start (in bytes), how many there are and their dtype."""

    path: Path
    format: str
    offset: int
    count: int
    dtype: np.dtype

    def tokens(self) -> np.ndarray:
        """The tokens as a read-only memory map (an empty array for an empty shard)."""
        if self.count == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=(self.count,))

    def byte_offset(self, token: int) -> int:
        return self.offset + token * self.dtype.itemsize


def bad_shard(path: Path, message: str) -> ValueError:
    return ValueError(f"token shard {str(path)!r}: {message}")


# ---------------------------------------------------------------- reading headers

def _read_bin(path: Path, size: int) -> Shard:
    if size % UINT16.itemsize:
        raise bad_shard(path, f"truncated: {size:,} bytes is not a whole number of uint16 "
                              f"tokens (a partial token at byte offset {size - 1:,})")
    return Shard(path, "bin", 0, size // UINT16.itemsize, UINT16)


def _read_modded(path: Path, size: int) -> Shard:
    if size < HEADER_BYTES:
        raise bad_shard(path, f"truncated header: the file ends at byte offset {size:,}, "
                              f"modded-nanogpt's header is {HEADER_BYTES} bytes")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = (int(x) for x in header[:3])
    if magic != MODDED_MAGIC:
        raise bad_shard(path, f"bad header: magic {magic} at byte offset 0, expected "
                              f"{MODDED_MAGIC} (modded-nanogpt's format)")
    if version != MODDED_VERSION:
        raise bad_shard(path, f"bad header: version {version} at byte offset 4, expected "
                              f"{MODDED_VERSION}")
    if count < 0:
        raise bad_shard(path, f"bad header: token count {count} at byte offset 8")
    held, rest = divmod(size - HEADER_BYTES, UINT16.itemsize)
    end = HEADER_BYTES + count * UINT16.itemsize
    if held < count:
        raise bad_shard(path, f"truncated: the header (byte offset 8) counts {count:,} "
                              f"tokens, the file ends at byte offset {size:,} after "
                              f"{held:,} (it should end at {end:,})")
    if held > count or rest:
        raise bad_shard(path, f"token count mismatch: the header (byte offset 8) counts "
                              f"{count:,} tokens, the file holds {size - end:,} more bytes "
                              f"from byte offset {end:,}")
    return Shard(path, "modded", HEADER_BYTES, count, UINT16)


def _read_npy(path: Path, size: int) -> Shard:
    fmt = np.lib.format
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version not in readers:
                raise ValueError(f"format version {version} is not 1.0 or 2.0")
            shape, _, dtype = readers[version](f)
        except (ValueError, OSError, SyntaxError) as e:
            raise bad_shard(path, f"bad header at byte offset 0: not a .npy file ({e})") from None
        offset = f.tell()
    if dtype.kind not in "iu":
        raise bad_shard(path, f"bad header at byte offset 0: dtype {dtype}, token ids are "
                              f"integers")
    if len(shape) != 1:
        raise bad_shard(path, f"bad header at byte offset 0: shape {shape}, expected a 1-D "
                              f"array of tokens")
    count, end = shape[0], offset + shape[0] * dtype.itemsize
    if size < end:
        raise bad_shard(path, f"truncated: the header counts {count:,} tokens, the file ends "
                              f"at byte offset {size:,} (it should end at {end:,})")
    if size > end:
        raise bad_shard(path, f"token count mismatch: the header counts {count:,} tokens, "
                              f"the file holds {size - end:,} more bytes from byte offset "
                              f"{end:,}")
    return Shard(path, "npy", offset, count, dtype)


READERS: dict[str, Callable[[Path, int], Shard]] = {
    "bin": _read_bin, "modded": _read_modded, "npy": _read_npy,
}


def detect_format(path: Path) -> str:
    """`npy` by its suffix; a .bin file whose first int32 is modded-nanogpt's magic is
    `modded`, any other file raw `bin`."""
    if path.suffix == ".npy":
        return "npy"
    with open(path, "rb") as f:
        first = f.read(4)
    return "modded" if first == np.int32(MODDED_MAGIC).astype("<i4").tobytes() else "bin"


def open_shard(path: str | Path, fmt: str = "auto") -> Shard:
    """The shard at `path`, its header checked against its size (the tokens are not
    read). `fmt`: one of FORMATS, or "auto" (detect_format)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        fmt = detect_format(path) if fmt == "auto" else fmt
    except OSError as e:
        raise bad_shard(path, f"cannot read it ({e.strerror})") from None
    if fmt not in READERS:
        raise ValueError(f"token shard format must be one of {['auto', *FORMATS]}, got {fmt!r}")
    return READERS[fmt](path, size)


def first_bad_id(shard: Shard, vocab_size: int, stop: int | None = None) -> int | None:
    """The offset of the first token id outside [0, vocab_size) among the first `stop`
    tokens (all by default), scanned SCAN_CHUNK tokens at a time; None when there is none."""
    tokens, stop = shard.tokens(), shard.count if stop is None else stop
    for start in range(0, stop, SCAN_CHUNK):
        chunk = np.asarray(tokens[start:min(stop, start + SCAN_CHUNK)])
        bad = chunk >= vocab_size
        if shard.dtype.kind == "i":
            bad |= chunk < 0
        if bad.any():
            return start + int(bad.argmax())
    return None


def bad_id_error(shard: Shard, token: int, vocab_size: int) -> ValueError:
    value = int(shard.tokens()[token])
    return bad_shard(shard.path, f"token id {value} at token offset {token:,} (byte offset "
                                 f"{shard.byte_offset(token):,}) is outside the vocabulary "
                                 f"(data.vocab_size {vocab_size})")


# ---------------------------------------------------------------- writing

def _header(count: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MODDED_MAGIC, MODDED_VERSION, count
    return header.tobytes()


def _npy_header(tokens: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {
        "descr": np.lib.format.dtype_to_descr(tokens.dtype), "fortran_order": False,
        "shape": (len(tokens),)})
    return buf.getvalue()


def _uint16(chunk: np.ndarray) -> np.ndarray:
    if chunk.size and int(chunk.max()) > np.iinfo(UINT16).max:
        raise ValueError(f"token id {int(chunk.max())} does not fit the uint16 of nanoGPT's "
                         f"formats; write npy shards")
    return chunk.astype(UINT16, copy=False)


# format -> (its header for these tokens, each chunk of tokens as written)
WRITERS: dict[str, tuple[Callable[[np.ndarray], bytes], Callable[[np.ndarray], np.ndarray]]] = {
    "bin": (lambda tokens: b"", _uint16),
    "modded": (lambda tokens: _header(len(tokens)), _uint16),
    "npy": (_npy_header, lambda chunk: chunk),
}


def write_shard(path: Path, tokens: np.ndarray, fmt: str) -> Path:
    """`tokens` (1-D, a memory map too: it is copied SCAN_CHUNK tokens at a time) as a
    shard of format `fmt`, written to a temporary file beside `path` and renamed onto it:
    a reader never sees half a shard."""
    if fmt not in WRITERS:
        raise ValueError(f"token shard format must be one of {list(FORMATS)}, got {fmt!r}")
    header, convert = WRITERS[fmt]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header(tokens))
            for start in range(0, len(tokens), SCAN_CHUNK):
                chunk = np.ascontiguousarray(tokens[start:start + SCAN_CHUNK])
                f.write(convert(chunk).tobytes())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id below vocab_size."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
