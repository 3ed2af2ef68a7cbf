"""`rankzoo tokenize FILES --tokenizer PATH --out DIR`: text files into token shards that
`data.task: tokens` and a nanoGPT-style trainer read (train/commands/tokenize.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ..commands.tokenize import SHARD_TOKENS, tokenize_document
from ..data import SHARD_FORMATS
from ..render.tokenize import tokenize_tables
from .common import add_format, positive_int, print_document


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def add_parser(sub) -> None:
    t = sub.add_parser("tokenize", help="tokenize text files into shards (nanoGPT's .bin, "
                                        "modded-nanogpt's, .npy)")
    t.add_argument("files", nargs="+", metavar="FILES",
                   help="text files, directories, globs or stdlib, as data.paths takes them")
    t.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a tokenizer.json, a Hugging Face model directory, or bpe:N (a "
                        "byte-level BPE of N tokens trained on FILES, saved in DIR)")
    t.add_argument("--out", required=True, metavar="DIR", help="where the shards go")
    t.add_argument("--shard-format", choices=SHARD_FORMATS, default="modded",
                   help="bin: nanoGPT's raw uint16 train.bin/val.bin; modded: "
                        "modded-nanogpt's headered shards (the default); npy")
    t.add_argument("--val-fraction", type=fraction, default=0.1,
                   help="the last fraction of the tokens, written as val shards (0.1)")
    t.add_argument("--shard-tokens", type=positive_int, default=SHARD_TOKENS,
                   help=f"tokens per modded or npy shard ({SHARD_TOKENS:,})")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the shards an earlier run left in DIR")
    add_format(t)


def cmd_tokenize(args, out: Console) -> int:
    doc = tokenize_document(args.files, args.tokenizer, Path(args.out), args.shard_format,
                            args.val_fraction, args.shard_tokens, args.overwrite)
    print_document(doc, args.format, out, tokenize_tables)
    return 0
