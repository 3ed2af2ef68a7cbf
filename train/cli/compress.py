"""`rankzoo compress`: check the report's KV advice, the eval loss with the cache (or
state) projected to low rank per cache size, for a trained variant or (--hf) a Hugging
Face causal LM; --save writes the compressed model, --record keeps the document in the
variant's directory for `rankzoo report`."""

from __future__ import annotations

import sys

from rich.console import Console

from .common import (
    BAD_INPUT,
    add_cache_dtype,
    add_format,
    add_hf_model,
    add_plot,
    as_flags,
    as_flags_error,
    check_plot_dir,
    one_source_error,
    only_with_hf,
    positive_int,
    print_document,
    print_notes,
    show_progress,
)


def add_parser(sub) -> None:
    c = sub.add_parser("compress", help="check the report's KV advice: the eval loss with the "
                                        "cache (or state) projected to low rank, per cache size")
    c.add_argument("run_dir", nargs="?", help="a trained variant: runs/<experiment>/<variant>")
    add_hf_model(c)
    c.add_argument("--text", metavar="FILE",
                   help="with --hf: the calibration text (the bases are fitted on its start)")
    c.add_argument("--eval-text", metavar="FILE",
                   help="with --hf: the evaluation text (the calibration file itself is read "
                        "after its calibration tokens)")
    c.add_argument("--seq-len", type=positive_int, help="with --hf: tokens per sequence (128)")
    c.add_argument("--device", choices=("cpu", "cuda", "auto"),
                   help="with --hf: where the model runs (auto: cuda when available)")
    c.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="with --hf: dtype of the forward passes (float32)")
    c.add_argument("--ratios", default="1.5,2,4,8", metavar="LIST",
                   help="target ratios full / low-rank cache, each > 1 (1.5,2,4,8)")
    c.add_argument("--eps", metavar="LIST",
                   help="also measure r per layer = rank_eps at each eps (0 < eps < 1)")
    c.add_argument("--alloc", default="uniform,sensitivity,mixed", metavar="LIST",
                   help="how the bytes are spread at each ratio: uniform (one r), "
                        "sensitivity (r per layer, head, keys and values by the loss "
                        "predicted per byte, from uniform up, kept only if no worse than "
                        "uniform on calibration), mixed (per KV head full, low rank or a "
                        "window + sinks, the same way), greedy (the former default: each "
                        "head's share of its gain per byte), greedy-scaled "
                        "(uniform,sensitivity,mixed)")
    c.add_argument("--keys", default="auto", metavar="{auto,pre-rope,post-rope}",
                   help="keys that get a basis: before RoPE (auto with RoPE) or as cached")
    c.add_argument("--bases", default="output", metavar="{output,energy}",
                   help="output: errors weighted as the reader sees them (keys by the "
                        "queries, values by W_O); energy: top directions by energy (output)")
    add_cache_dtype(c, "dtype the cache is counted in bytes at")
    c.add_argument("--length", type=positive_int, metavar="T",
                   help="the length a per-sequence basis is amortized at, for "
                        "ratio_per_sequence (the report's probe length)")
    c.add_argument("--tolerance", default="0.02", metavar="NATS",
                   help="eval loss change per token that the advice may cost (0.02)")
    c.add_argument("--advice-eps", metavar="EPS",
                   help="with --hf: the eps of the report whose advice is checked (0.1)")
    c.add_argument("--calib-size", type=positive_int, metavar="N",
                   help="calibration sequences (a run: 64 of its training split; --hf: 4)")
    c.add_argument("--eval-size", type=positive_int, metavar="N",
                   help="evaluation sequences (a run: its validation split; --hf: 4)")
    c.add_argument("--batch-size", type=positive_int, metavar="N",
                   help="sequences per forward pass (a run: its batch size; --hf: 1)")
    c.add_argument("--overlap", action="store_true",
                   help="allow calibration and evaluation on the same data")
    add_format(c, md=True)
    add_plot(c, "compress.png")
    c.add_argument("--save", metavar="DIR",
                   help="write the compressed model at the largest ratio within the "
                        "tolerance, with its bases, into DIR (a new or empty directory)")
    c.add_argument("--heal", metavar="TOKENS",
                   help="also fine-tune the setting --heal-at names for TOKENS tokens of the "
                        "calibration text (LoRA on the attention projections, the cache's "
                        "projections in place) and print its eval loss against them; with "
                        "--save, the healed setting is the one saved (e.g. 500k)")
    c.add_argument("--heal-at", metavar="RATIO",
                   help="with --heal: the target ratio healed, one of --ratios (the best "
                        "allocation measured there; default: the largest)")
    c.add_argument("--heal-loss", metavar="{distill,lm}",
                   help="with --heal: distill (KL to the uncompressed model's logits, the "
                        "default) or lm (next-token cross-entropy)")
    c.add_argument("--record", action="store_true",
                   help="also write the document into the variant's directory as "
                        "compress.json: `rankzoo report` then shows the measured loss beside "
                        "its KV advice (not with --hf)")
    c.add_argument("--force", action="store_true",
                   help="with --record: replace a compress.json recorded before")


def cmd_compress(args, out: Console) -> int:
    """The compress table (or Markdown, or one JSON document); --plot and --save write
    only into new or empty directories, --record only a new compress.json (or, --force,
    over one); exit code 1 when --save found nothing to save."""
    from ..render.compress import compress_markdown, compress_table
    from ..render.heal import heal_markdown, heal_table, saved_cache_text

    doc = _measure(args)
    if args.plot:
        from ..render.compress import write_plot
        from ..render.heal import write_heal_plot

        print(f"rankzoo: wrote {write_plot(doc, args.plot)}", file=sys.stderr)
        if doc.get("heal"):
            print(f"rankzoo: wrote {write_heal_plot(doc, args.plot)}", file=sys.stderr)
    healed = bool(doc.get("heal"))
    print_document(doc, args.format, out,
                   lambda d: [compress_table(d), *([heal_table(d)] if healed else [])],
                   lambda d: compress_markdown(d) + ("\n" + heal_markdown(d) if healed else ""))
    if args.record:  # after printing: a refusal now keeps the measurement on stdout
        from ..commands.compress.saved.record import write_record

        path = write_record(args.run_dir, doc, args.force)
        print(f"rankzoo: wrote {path}: `rankzoo report` on the run shows it beside the KV "
              f"advice", file=sys.stderr)
    if args.save is not None:
        if doc.get("saved") is None:
            return 1
        cache = saved_cache_text(doc)
        print(f"rankzoo: wrote {doc['saved']['dir']} ({doc['saved']['setting']}, "
              f"{doc['saved']['ratio']:.2f}x{', healed' if doc['saved'].get('healed') else ''})"
              + (f"; {cache}" if cache else ""), file=sys.stderr)
    return 0


def _measure(args) -> dict:
    """The compress document of the run or the --hf model; its notes on stderr (even when
    it fails after them) and in the document, errors and notes with flags for parameters."""
    from ..commands.compress import compress_hf, compress_run

    notes: list[str] = []
    try:
        options = _compress_options(args)
        if args.plot:
            check_plot_dir(args.plot)
        if args.record:  # refused before the minutes of measuring, not after them
            from ..commands.compress.saved.record import check_record

            check_record(args.run_dir, args.force)
        if args.hf is not None:
            doc = compress_hf(args.hf, args.text, args.eval_text, options,
                              seq_len=args.seq_len or 128, device=args.device or "auto",
                              dtype=args.dtype or "float32", notes=notes,
                              progress=_compress_progress, bos=args.bos)
        else:
            doc = compress_run(args.run_dir, options, notes=notes, progress=_compress_progress)
    except BAD_INPUT as e:
        raise as_flags_error(e) from None
    finally:
        print_notes(as_flags(note) for note in notes)
    doc["notes"] = [as_flags(n) for n in doc["notes"]]  # as the user typed them, md and json too
    return doc


def _compress_progress(line: str) -> None:
    show_progress(f"compress: {line}")


def _compress_options(args):
    """CompressOptions from the flags; a bad combination is one ValueError line."""
    from ..commands.compress import CompressOptions, cache_dtype
    from ..sizing.units import parse_count

    problem = one_source_error("compress", args.run_dir, args.hf)
    if problem is not None:
        raise ValueError(problem)
    if args.record and args.hf is not None:
        raise ValueError(f"--record writes into a run's variant directory; --hf {args.hf} "
                         "has none (keep its document with --format json > FILE)")
    if args.force and not args.record:
        raise ValueError("--force only applies with --record")
    if args.hf is not None:
        if args.text is None:
            raise ValueError(f"--hf {args.hf} needs --text FILE (the calibration text)")
        if args.eval_text is None:
            raise ValueError(f"--hf {args.hf} needs --eval-text FILE: the loss is measured on "
                             f"text the bases were not fitted on (--eval-text {args.text} "
                             f"reads it after the calibration tokens)")
    else:
        for dest in ("text", "eval_text", "seq_len", "device", "dtype", "advice_eps"):
            if getattr(args, dest) is not None:
                raise ValueError(only_with_hf(dest, getattr(args, dest)))
    if args.heal is None and (args.heal_at is not None or args.heal_loss is not None):
        raise ValueError(f"--heal-{'at' if args.heal_at is not None else 'loss'} only "
                         f"applies with --heal TOKENS")
    heal_at = _numbers(args.heal_at, "--heal-at") if args.heal_at is not None else (None,)
    tolerance = _numbers(args.tolerance, "--tolerance")
    advice_eps = _numbers(args.advice_eps or "0.1", "--advice-eps")
    if len(tolerance) != 1 or len(advice_eps) != 1 or len(heal_at) != 1:
        raise ValueError("--tolerance, --advice-eps and --heal-at take one number each")
    return CompressOptions(
        ratios=_numbers(args.ratios, "--ratios"),
        eps=_numbers(args.eps, "--eps") if args.eps else (),
        allocations=tuple(a.strip() for a in args.alloc.split(",") if a.strip()),
        keys=args.keys, bases=args.bases, cache_dtype=cache_dtype(args.cache_dtype),
        length=args.length,
        tolerance=tolerance[0], advice_eps=advice_eps[0], calib_size=args.calib_size,
        eval_size=args.eval_size, overlap=args.overlap, batch_size=args.batch_size,
        save=args.save, heal=None if args.heal is None else parse_count(args.heal, "--heal"),
        heal_at=heal_at[0], heal_loss=args.heal_loss or "distill")


def _numbers(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} {text}: expected numbers separated by commas") from None
