"""`rankzoo blocks`: the zoo's block families, their declared budgets and costs at a model
size, and the kernels available on this machine."""

from __future__ import annotations

from rich.console import Console

from ..commands.blocks import blocks_document
from ..render.blocks import blocks_tables
from .common import add_cache_dtype, add_format, model_width, positive_int, print_document


def add_parser(sub) -> None:
    b = sub.add_parser("blocks", help="the zoo: declared budgets, costs, kernels available here")
    b.add_argument("--d-model", type=model_width, default=256)
    b.add_argument("--n-heads", type=positive_int, default=8)
    b.add_argument("--seq-len", type=positive_int, default=1024)
    add_cache_dtype(b, "dtype the cache is counted in bytes at")
    add_format(b)


def cmd_blocks(args, out: Console) -> int:
    doc = blocks_document(args.d_model, args.n_heads, args.seq_len, args.cache_dtype)
    print_document(doc, args.format, out, blocks_tables)
    return 0
