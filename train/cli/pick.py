"""`rankzoo pick`: size every block family's knob to a model's constraints; the candidates,
their costs and measured evidence; with --emit, the shortlist as an experiment to train."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from ..commands import pick
from ..render.pick import pick_tables
from ..sizing.units import dtype_name, parse_bytes, parse_count
from .common import (
    add_cache_dtype,
    add_format,
    model_width,
    positive_int,
    print_document,
    print_notes,
)


def add_parser(sub) -> None:
    k = sub.add_parser("pick", help="size every block family's knob to a model's constraints; "
                                    "the candidates, their costs and measured evidence")
    k.add_argument("--d-model", type=model_width, required=True)
    k.add_argument("--n-heads", type=positive_int, required=True)
    k.add_argument("--n-layers", type=positive_int, required=True)
    k.add_argument("--seq-len", type=positive_int, required=True,
                   help="the target length the cache and the caps are sized at")
    k.add_argument("--cache-budget", required=True, metavar="BYTES",
                   help="cache per sequence at --seq-len, all layers: 256KiB, 1MiB, 262144")
    add_cache_dtype(k, "dtype of the cache")
    k.add_argument("--params-budget", metavar="N",
                   help="the blocks' parameters, all layers (MLPs left out), e.g. 100M")
    k.add_argument("--flops-budget", metavar="N",
                   help="the blocks' FLOPs per token at --seq-len (prefill), all layers, "
                        "e.g. 2G")
    k.add_argument("--associations", type=positive_int, default=16,
                   help="key-value pairs the model must recall (16); --emit's MQAR pairs")
    k.add_argument("--runs", nargs="+", metavar="DIR",
                   help="finished runs (experiment or variant directories) whose "
                        "measurements join the candidates they trained")
    k.add_argument("--emit", metavar="FILE",
                   help="write an experiment of the shortlist to FILE (.yaml) for "
                        "`rankzoo train`")
    k.add_argument("--shortlist", choices=("front", "all"), default="front",
                   help="with --emit: the Pareto front (default) or every candidate")
    k.add_argument("--force", action="store_true", help="with --emit: overwrite FILE")
    k.add_argument("--hybrids", choices=pick.KEEP, default="best",
                   help="hybrids (a global layer every N, cheap layers between) to show: "
                        "those no other hybrid outdoes (best, the default), all that fit, "
                        "or none")
    k.add_argument("--global-every", type=positive_int, nargs="+", metavar="N",
                   help="hybrids' unit lengths: one global layer every N (default: 2 4 6 8, "
                        "those that divide --n-layers)")
    k.add_argument("--global-kv-heads", type=positive_int, metavar="G",
                   help="the hybrids' global softmax layers' key/value heads (default: the "
                        "GQA preset's G)")
    add_format(k)


def cmd_pick(args, out: Console) -> int:
    """Size every family's knob to the constraints; print the candidates; with --emit,
    write the shortlist's experiment (never over an existing file without --force)."""
    if args.force and args.emit is None:
        raise ValueError("--force only applies with --emit FILE")
    constraints = _constraints(args)
    hybrids = _hybrids(args)
    if args.emit is not None and Path(args.emit).exists() and not args.force:
        raise FileExistsError(f"--emit {args.emit}: exists; pass --force to overwrite it "
                              "(nothing was written)")  # before the work, not after it
    doc = pick.pick_document(constraints, runs=args.runs or (), hybrids=hybrids)
    print_notes(doc["notes"])
    if args.emit is not None:
        _emit(doc, args, constraints)
    print_document(doc, args.format, out, pick_tables)
    return 0


def _constraints(args) -> pick.Constraints:
    return pick.Constraints(
        d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
        seq_len=args.seq_len, cache_budget=parse_bytes(args.cache_budget),
        cache_dtype=dtype_name(args.cache_dtype),
        params_budget=(None if args.params_budget is None
                       else parse_count(args.params_budget, "--params-budget")),
        flops_budget=(None if args.flops_budget is None
                      else parse_count(args.flops_budget, "--flops-budget")),
        associations=args.associations)


def _hybrids(args) -> pick.Hybrids:
    """The hybrids asked for; their flags without hybrids are an error, not ignored."""
    if args.hybrids == "none":
        given = [flag for flag, value in (("--global-every", args.global_every),
                                          ("--global-kv-heads", args.global_kv_heads))
                 if value is not None]
        if given:
            raise ValueError(f"{given[0]} only applies with hybrids, not --hybrids none")
    return pick.Hybrids(every=None if args.global_every is None else tuple(args.global_every),
                        global_kv_heads=args.global_kv_heads, keep=args.hybrids)


def _emit(doc: dict, args, constraints: pick.Constraints) -> None:
    """Write the shortlist's experiment; note it in the document and on stderr."""
    raw = pick.emit(doc, args.emit, force=args.force, which=args.shortlist)
    doc["emitted"] = {"path": args.emit, "experiment": raw["name"],
                      "variants": list(raw["variants"])}
    print(f"rankzoo: wrote {args.emit}: {len(raw['variants'])} variants "
          f"({', '.join(raw['variants'])}), matched in parameters, on MQAR with "
          f"{constraints.associations} key-value pairs at {constraints.seq_len} tokens; "
          f"next: rankzoo train {args.emit}", file=sys.stderr)
