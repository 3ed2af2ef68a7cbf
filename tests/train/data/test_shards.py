"""Token shards: each format written and read back (by rankzoo and by a plain reader of
the format), and every bad shard refused in one line naming the file and the offset."""

from pathlib import Path

import numpy as np
import pytest

from train.data.shards import (
    HEADER_BYTES,
    MODDED_MAGIC,
    detect_format,
    first_bad_id,
    open_shard,
    write_shard,
)

TOKENS = np.random.default_rng(0).integers(0, 50_000, size=5_000).astype(np.uint16)


def plain_read(path: Path, fmt: str) -> np.ndarray:
    """Each format as its own project reads it: nanoGPT np.memmap's the raw file,
    modded-nanogpt checks its int32 header, np.load the .npy."""
    if fmt == "bin":
        return np.memmap(path, dtype=np.uint16, mode="r")
    if fmt == "modded":
        header = np.fromfile(path, dtype=np.int32, count=256)
        assert header[0] == MODDED_MAGIC and header[1] == 1
        tokens = np.fromfile(path, dtype=np.uint16, offset=HEADER_BYTES)
        assert len(tokens) == header[2]
        return tokens
    return np.load(path)


@pytest.mark.parametrize("fmt, name", [("bin", "s.bin"), ("modded", "s.bin"), ("npy", "s.npy")])
def test_each_format_round_trips(tmp_path, fmt, name):
    path = write_shard(tmp_path / name, TOKENS, fmt)
    assert detect_format(path) == fmt
    shard = open_shard(path)
    assert shard.format == fmt and shard.count == len(TOKENS)
    assert isinstance(shard.tokens(), np.memmap)  # mapped, not read
    np.testing.assert_array_equal(shard.tokens(), TOKENS)
    np.testing.assert_array_equal(plain_read(path, fmt), TOKENS)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_npy_keeps_wide_ids_and_uint16_formats_refuse_them(tmp_path):
    wide = np.array([0, 70_000, 5], dtype=np.uint32)
    np.testing.assert_array_equal(open_shard(write_shard(tmp_path / "w.npy", wide, "npy"))
                                  .tokens(), wide)
    with pytest.raises(ValueError, match="70000 does not fit the uint16"):
        write_shard(tmp_path / "w.bin", wide, "modded")
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob(".*"))


def modded(tmp_path: Path, magic=MODDED_MAGIC, version=1, count=None, tokens=TOKENS[:100],
           cut: int | None = None) -> Path:
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    data = header.tobytes() + tokens.astype("<u2").tobytes()
    path = tmp_path / "bad.bin"
    path.write_bytes(data[:cut])
    return path


@pytest.mark.parametrize("build, fmt, match", [
    (lambda p: modded(p, magic=12345), "modded",
     r"bad\.bin'.*bad header: magic 12345 at byte offset 0, expected 20240520"),
    (lambda p: modded(p, version=2), "auto", r"bad header: version 2 at byte offset 4"),
    (lambda p: modded(p, cut=1000), "modded",
     r"truncated header: the file ends at byte offset 1,000"),
    (lambda p: modded(p, cut=HEADER_BYTES + 51), "auto",
     r"truncated: the header \(byte offset 8\) counts 100 tokens, the file ends at byte "
     r"offset 1,075 after 25 \(it should end at 1,224\)"),
    (lambda p: modded(p, count=90), "auto",
     r"token count mismatch: the header \(byte offset 8\) counts 90 tokens, the file holds "
     r"20 more bytes from byte offset 1,204"),
    (lambda p: modded(p, count=-1), "auto", r"bad header: token count -1 at byte offset 8"),
])
def test_bad_modded_headers_name_the_file_and_offset(tmp_path, build, fmt, match):
    with pytest.raises(ValueError, match=match):
        open_shard(build(tmp_path), fmt)


def test_bad_raw_and_npy_shards(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match=r"odd\.bin'.*partial token at byte offset 2"):
        open_shard(odd)
    path = write_shard(tmp_path / "t.npy", TOKENS[:10], "npy")
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"t\.npy'.*truncated: the header counts 10 tokens"):
        open_shard(path)
    floats = tmp_path / "f.npy"
    np.save(floats, np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"f\.npy'.*dtype float32"):
        open_shard(floats)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not an array")
    with pytest.raises(ValueError, match=r"junk\.npy'.*bad header at byte offset 0"):
        open_shard(junk)
    with pytest.raises(ValueError, match=r"gone\.bin'.*cannot read it"):
        open_shard(tmp_path / "gone.bin")


def test_first_bad_id_scans_in_chunks(tmp_path, monkeypatch):
    import train.data.shards as shards

    monkeypatch.setattr(shards, "SCAN_CHUNK", 7)  # many chunks, the bad id in a late one
    tokens = np.arange(100, dtype=np.int64) % 50
    tokens[[63, 80]] = [50, -1]
    shard = open_shard(write_shard(tmp_path / "s.npy", tokens, "npy"))
    assert first_bad_id(shard, 50) == 63
    assert first_bad_id(shard, 51) == 80  # a negative id in a signed shard is bad too
    assert first_bad_id(shard, 51, stop=80) is None
