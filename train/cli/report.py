"""`rankzoo report`: declared vs realized ranks of a finished run, or (--hf) of a Hugging
Face causal LM, or (--model) of a model of one's own, probed on a text; `print_report` is
also how `rankzoo train` ends."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from ..experiment.sweep import run_summary
from ..rundir.read import load_run, rank_histories
from .common import (
    BAD_INPUT,
    add_details,
    add_format,
    add_hf_model,
    add_plot,
    as_flags_error,
    check_plot_dir,
    flag,
    model_width,
    only_with_hf,
    positive_int,
    print_document,
    print_notes,
    show_progress,
)


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="declared vs realized ranks of a finished run, or of a "
                                      "Hugging Face causal LM (--hf)")
    r.add_argument("run_dir", nargs="?",
                   help="runs/<experiment> (all variants) or one variant directory")
    add_hf_model(r)
    r.add_argument("--model", metavar="PKG.MODULE:FACTORY",
                   help="instead of RUN_DIR: a model of your own, built by calling FACTORY "
                        "and read through its F.scaled_dot_product_attention calls; the "
                        "module is found under the current directory first, as python -m "
                        "finds it, then on the installed path")
    r.add_argument("--checkpoint", metavar="FILE",
                   help="with --model: its state dict (torch.save; nanoGPT's ckpt.pt works)")
    r.add_argument("--tokenizer", metavar="SPEC",
                   help="with --model: tokenizer.json, a Hugging Face tokenizer directory or "
                        "bpe:N (default: the text's bytes modulo the vocabulary)")
    r.add_argument("--text", metavar="FILE",
                   help="with --hf or --model: the text the probe batch is cut from")
    r.add_argument("--seq-len", type=positive_int, default=128,
                   help="with --hf or --model: tokens per probe sequence (128)")
    r.add_argument("--probe-size", type=positive_int, default=4,
                   help="with --hf or --model: sequences in the probe batch (4)")
    r.add_argument("--adapter", metavar="DIR",
                   help="with --hf: a PEFT LoRA adapter (save_pretrained directory) applied "
                        "to the model; its ranks fill the adapter axis")
    for dest, (metavar, text) in HF_PROBE_OPTIONS.items():
        r.add_argument(flag(dest), dest=dest, metavar=metavar, default=argparse.SUPPRESS,
                       help=f"with --hf or --model: {text}")
    add_format(r, md=True)
    add_details(r)
    add_plot(r, "PNG figures")
    add_check_flags(r)
    add_mirror_flags(r)


def add_check_flags(r) -> None:
    """The flags that check the advice against an outcome (train/commands/check/)."""
    r.add_argument("--compressed", nargs="+", metavar="FILE",
                   help="compress documents (`rankzoo compress RUN_DIR/<variant> --format json "
                        "> FILE`): each KV advice item of that variant shows the loss change "
                        "measured at its advised ranks, and the verdict")
    r.add_argument("--check", action="store_true",
                   help="run rankzoo compress at the advised ranks of each variant with KV "
                        "advice (slow: says what it costs first) and show the measured loss "
                        "change and the verdict; nothing is written")
    r.add_argument("--emit-check", metavar="FILE",
                   help="write a .yaml experiment that trains the cheaper blocks a variant's "
                        "advice suggests beside it, matched in parameters; `rankzoo report` "
                        "on its run shows the advice verified or refuted")
    r.add_argument("--force", action="store_true",
                   help="with --emit-check or --emit: overwrite an existing FILE")


# --emit's sizes of the mirrored experiment (train/commands/mirror/), only with --emit
MIRROR_SIZES = ("d_model", "n_heads", "n_layers", "train_seq_len", "window")


def add_mirror_flags(r) -> None:
    """--hf --emit: the model's layer pattern as an experiment, at the sizes given."""
    r.add_argument("--emit", metavar="FILE",
                   help="with --hf: write a .yaml experiment that trains the model's layer "
                        "pattern at --d-model and --n-heads beside each of its kinds in "
                        "every layer, matched in parameters")
    r.add_argument("--d-model", type=model_width, metavar="D",
                   help="with --emit: the experiment's model width (required)")
    r.add_argument("--n-heads", type=positive_int, metavar="H",
                   help="with --emit: its query heads (required)")
    r.add_argument("--n-layers", type=positive_int, metavar="L",
                   help="with --emit: its layers, whole units of the pattern (default: the "
                        "model's count, or the nearest multiple of its unit)")
    r.add_argument("--train-seq-len", type=positive_int, metavar="T",
                   help="with --emit: its sequence length (default: --seq-len)")
    r.add_argument("--window", type=positive_int, metavar="W",
                   help="with --emit: every sliding layer's window (default: the model's "
                        "own, which must be below T)")


# --hf's probe options, parsed from text in check_args so that a bad value reads
# `rankzoo: error: --flag VALUE: ...`. Absent when not given (SUPPRESS): probe_hf's defaults
# apply, and "only with --hf" is "present".
HF_PROBE_OPTIONS = {  # dest -> (metavar, help)
    "device": ("{cpu,cuda,auto}", "where the forward pass and the measurements run (auto, the "
                                  "default: cuda when available)"),
    "dtype": ("{float32,bfloat16,float16}", "dtype of the forward pass (float32); the metrics "
                                            "are computed in fp32/fp64 either way"),
    "eps": ("EPS", "energy threshold of rank_eps, 0 < EPS < 1 (0.1)"),
    "layers": ("LIST", "measure only these layers, e.g. 0,5,10-12 (all)"),
    "matfree_from": ("T", "from this probe length on, measure attention matrix-free, never "
                          "forming a T x T matrix (2048); 'never': always exactly"),
    "k_max": ("K", "matrix-free: the most singular values sought per head (256)"),
}


def _eps(text: str) -> float:
    try:
        eps = float(text)
    except ValueError:
        raise ValueError("expected a number between 0 and 1") from None
    if not 0.0 < eps < 1.0:
        raise ValueError("expected 0 < eps < 1")
    return eps


# the largest layer index --layers takes: the model checks its own range later, but the
# list is spelled out first, and 0-99999999999 would not fit in memory
MAX_LAYER = 9999


def _layer_list(text: str) -> list[int]:
    """`0,5,10-12` -> [0, 5, 10, 11, 12] (sorted, each once); the model checks the range."""
    layers: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"expected layer indices and ranges like 0,5,10-12, got {part!r}")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"the range {part!r} runs backwards")
        if hi > MAX_LAYER:  # checked before the range is spelled out in memory
            raise ValueError(f"layer {hi} is past any model's layers (at most {MAX_LAYER})")
        layers.update(range(lo, hi + 1))
    return sorted(layers)


def _matfree_from(text: str) -> int | None:
    return None if text == "never" else positive_int(text)


HF_PROBE_PARSERS = {"eps": _eps, "layers": _layer_list, "matfree_from": _matfree_from,
                    "k_max": positive_int}


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exactly one source: a run directory, --hf PATH or --model SPEC, the last two with
    --text FILE; the probe options only with them, each parsed from its text."""
    check_source(p, args)
    probed = args.hf if args.hf is not None else args.model
    for dest in ("text", *HF_PROBE_OPTIONS):
        if probed is None and getattr(args, dest, None) is not None:
            p.error(f"{flag(dest)} {getattr(args, dest)} only applies with --hf PATH or "
                    f"--model SPEC")
    if args.hf is None and args.adapter is not None:
        p.error(only_with_hf("adapter", args.adapter))
    for dest in ("checkpoint", "tokenizer"):
        if args.model is None and getattr(args, dest) is not None:
            p.error(f"{flag(dest)} {getattr(args, dest)} only applies with --model SPEC")
    for dest in ("compressed", "check", "emit_check"):
        if probed is not None and getattr(args, dest):
            p.error(f"{flag(dest)} applies to a run directory, not to a probed model")
    check_mirror_args(p, args)
    if args.force and not args.emit_check and not args.emit:
        p.error("--force only applies with --emit-check FILE or --hf PATH --emit FILE")
    if args.hf is None and not args.bos:  # the probe batch of a run is its own data
        p.error("--no-bos only applies with --hf PATH")
    for dest in HF_PROBE_OPTIONS:
        if hasattr(args, dest):
            text = getattr(args, dest)
            try:
                setattr(args, dest, HF_PROBE_PARSERS.get(dest, str)(text))
            except (ValueError, argparse.ArgumentTypeError) as e:
                p.error(f"{flag(dest)} {text}: {e}")


def check_source(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exactly one of RUN_DIR, --hf PATH and --model SPEC; a probed one with --text."""
    given = [f"{name} {value!r}" for name, value in (("RUN_DIR", args.run_dir),
                                                       ("--hf", args.hf), ("--model", args.model))
             if value is not None]
    if len(given) != 1:
        p.error("report needs exactly one of RUN_DIR, --hf PATH or --model SPEC"
                + (f", got {' and '.join(given)}" if given else ""))
    probed = args.hf if args.hf is not None else args.model
    if probed is not None and args.text is None:
        p.error(f"{given[0]} needs --text FILE (the text the probe batch is cut from)")
    if args.model is not None and args.plot:
        p.error(f"--plot {args.plot} applies to a run directory or --hf PATH")


def check_mirror_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--emit only with --hf, with --d-model and --n-heads; its sizes only with --emit."""
    if args.emit is not None and args.hf is None:
        p.error(f"--emit {args.emit} applies to --hf PATH (a run's advice: --emit-check FILE)")
    for dest in MIRROR_SIZES:
        if args.emit is None and getattr(args, dest) is not None:
            p.error(f"{flag(dest)} {getattr(args, dest)} only applies with --emit FILE")
    if args.emit is not None and (args.d_model is None or args.n_heads is None):
        p.error(f"--emit {args.emit} needs --d-model D and --n-heads H (the sizes of the "
                f"experiment it writes)")
    if args.emit is not None and hasattr(args, "layers"):  # refused before the probe
        p.error(f"--emit {args.emit} reads the pattern from every layer's kind; drop "
                f"--layers {args.layers}")


# ---------------------------------------------------------------- a run

def cmd_report(args, out: Console) -> int:
    if args.hf is not None:
        return _report_hf(args, out)
    if args.model is not None:
        return _report_model(args, out)
    notes: list[str] = []
    report = load_run(args.run_dir, notes=notes)
    notes += _check_advice(args, report)
    print_notes(notes)
    sweep = run_summary(args.run_dir, report)  # None unless the experiment is a sweep
    if args.plot:
        _plot(args.run_dir, report, args.plot)
    print_report(report, sweep, args.format, out, details=args.details,
                 again=f"rankzoo report {args.run_dir} --details", run_dir=args.run_dir)
    return 0


def _check_advice(args, report: dict) -> list[str]:
    """The advice against its outcome: the loss changes measured at the advised KV ranks
    (each variant's recorded compress.json, unless --compressed names that variant or
    --check measures anew), the check experiment written (--emit-check). The notes."""
    from ..commands.check import (
        attach_measured,
        check_kv,
        emit_check,
        read_compressed,
        read_recorded,
    )

    given = read_compressed(args.compressed) if args.compressed else []
    notes = []
    if not args.check:
        recorded, notes = read_recorded(args.run_dir, report, skip={
            (d.get("source") or {}).get("variant") for d in given})
        notes += attach_measured(report, recorded)
    notes += attach_measured(report, given)
    if args.check:
        notes += check_kv(args.run_dir, report)
    if args.emit_check:
        raw = emit_check(report, args.run_dir, args.emit_check, args.force)
        notes.append(f"wrote {args.emit_check}: {', '.join(raw['variants'])}; train it with "
                     f"`rankzoo train {args.emit_check}`")
    return notes


def print_report(report: dict, sweep: dict | None, fmt: str, out: Console,
                 details: bool = False, again: str = "", run_dir=None) -> None:
    """The report as one JSON document (the sweep summary under "sweep"), Markdown, or
    for people: the short answer (with `details`, every table: the report's sections, the
    variant summary, the sweep's, then the advice, findings and the verdicts of check
    variants), and recall vs capacity.
    `again`: the command that shows the details, named under the short answer; `run_dir`:
    the run directory, whose variants' config.yaml say which check which (outcome.py)."""
    from ..commands.check.outcome import attach_checks, recorded_checks
    from ..render import render_advice, render_table
    from ..render.answer import render_answer
    from ..render.document import report_markdown
    from ..render.evals import evals_tables
    from ..render.recall import recall_table, recall_view
    from ..render.summary import summary_table
    from ..render.sweep import sweep_markdown, sweep_table

    # a check experiment's verdicts (none: no key)
    attach_checks(report, recorded_checks(run_dir) if run_dir is not None else {})
    view = recall_view(report)  # None unless the variants ran MQAR with per-count accuracies

    def tables(_) -> list:
        recall = [] if view is None else [recall_table(view)]
        if details:
            return [render_table(report), summary_table(report),
                    *([] if sweep is None else [sweep_table(sweep)]), *recall,
                    render_advice(report)]
        # lm-eval's scores beside the rank figures (--details: in render_table)
        return [render_answer(report, f"every table: `{again}`" if again else ""),
                *evals_tables(report), *recall]

    def markdown(_) -> str:
        return report_markdown(report) + ("\n" + sweep_markdown(sweep) if sweep else "")

    # the JSON document: the report with the sweep summary and the recall view beside it
    doc = {**report, **({"sweep": sweep} if sweep is not None else {}),
           **({"recall": view} if view is not None else {})}
    print_document(doc, fmt, out, tables, markdown)


def _plot(run_dir: str, report: dict, out_dir: str) -> None:
    from ..render.plots import write_plots

    check_plot_dir(out_dir)  # refused before the records are read, as before any figure
    written, notes = write_plots(rank_histories(run_dir), report, out_dir, run_dir)
    print_notes(notes)
    print(f"rankzoo: wrote {len(written)} figures to {out_dir}", file=sys.stderr)


# ---------------------------------------------------------------- a Hugging Face model

def _report_hf(args, out: Console) -> int:
    from budgets.hf.probe import build_hf_report

    from ..hf import zoo_blocks
    from ..render import hf_report_markdown

    if args.plot:  # write_probe_plots creates it: a refused probe writes nothing
        check_plot_dir(args.plot, create=False)
    sizes = _mirror_sizes(args)  # None without --emit; checked before the probe
    name, entry = _probe_hf(args)
    report = build_hf_report(name, entry, zoo_blocks=zoo_blocks())
    if sizes is not None:
        _emit_mirror(entry, args, sizes)
    if args.plot:
        _plot_hf(name, entry, report, args.plot)
    print_document(report, args.format, out, hf_tables if args.details else hf_answer,
                   hf_report_markdown)
    return 0


def _report_model(args, out: Console) -> int:
    """`report --model`: the report of a model of one's own, as --hf prints one."""
    from ..own import report_own
    from ..render import hf_report_markdown

    notes: list[str] = []
    options = {dest: getattr(args, dest) for dest in HF_PROBE_OPTIONS if hasattr(args, dest)}
    options.pop("dtype", None)  # the model is probed in the dtype its factory builds
    try:
        report = report_own(args.model, args.text, args.checkpoint, args.tokenizer,
                            seq_len=args.seq_len, probe_size=args.probe_size, notes=notes,
                            progress=_show_progress, **options)
    except BAD_INPUT as e:
        raise as_flags_error(e) from None
    finally:
        print_notes(notes)
    print_document(report, args.format, out, hf_tables if args.details else hf_answer,
                   hf_report_markdown)
    return 0


def _mirror_sizes(args):
    """--emit's sizes (a MirrorSizes), checked with FILE before the slow probe; None
    without --emit."""
    if args.emit is None:
        return None
    from ..commands.mirror.emit import MirrorSizes, check_emit

    sizes = MirrorSizes(d_model=args.d_model, n_heads=args.n_heads,
                        seq_len=args.train_seq_len or args.seq_len, n_layers=args.n_layers,
                        window=args.window)
    check_emit(args.emit, sizes, args.force)
    return sizes


def _emit_mirror(entry: dict, args, sizes) -> None:
    from ..commands.mirror.emit import emit_mirror

    raw, notes = emit_mirror(entry, args.emit, sizes, args.force)
    print_notes([*notes, f"wrote {args.emit}: {', '.join(raw['variants'])}; train it with "
                         f"`rankzoo train {args.emit}`"])


def hf_tables(report: dict) -> list:
    """`report --hf --details`: the report's sections (no training: no variant summary)."""
    from ..render import render_advice, render_hf_table, render_table

    return [render_table(report), render_hf_table(report), render_advice(report)]


def hf_answer(report: dict) -> list:
    """`report --hf`: the short answer, then what each kind of layer uses (local vs
    global, SSM)."""
    from ..render import render_hf_table
    from ..render.answer import render_answer

    return [render_answer(report, "every table: the same command with --details"),
            render_hf_table(report)]


def _probe_hf(args) -> tuple[str, dict]:
    """probe_hf on the flags, its progress on stderr; its notes on stderr (even when it
    fails after them), its errors with `param=value` put as `--flag value`."""
    from ..hf import probe_hf

    notes: list[str] = []
    options = {dest: getattr(args, dest) for dest in HF_PROBE_OPTIONS if hasattr(args, dest)}
    options.setdefault("device", "auto")  # the library defaults to cpu; a user wants speed
    try:
        return probe_hf(args.hf, args.text, seq_len=args.seq_len, probe_size=args.probe_size,
                        with_spectra=bool(args.plot), adapter=args.adapter, notes=notes,
                        bos=args.bos,
                        progress=_show_progress, **options)
    except BAD_INPUT as e:
        raise as_flags_error(e) from None
    finally:
        print_notes(notes)


def progress_line(p) -> str:
    """A budgets.ProbeProgress for people: `layer 11 · 12/30 measured · 14.2 s · ETA 21 s`."""
    return (f"layer {p.layer} · {p.done}/{p.total} measured · {p.elapsed:.1f} s · "
            f"ETA {p.eta:.0f} s")


def _show_progress(p) -> None:
    show_progress(progress_line(p), last=p.done == p.total)


def _plot_hf(name: str, entry: dict, report: dict, out_dir: str) -> None:
    from ..render.plots import write_probe_plots

    written, notes = write_probe_plots(name, entry, report, out_dir)
    for note in notes:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: {note}", file=sys.stderr)
    print(f"rankzoo: wrote {len(written)} figures to {out_dir}", file=sys.stderr)
