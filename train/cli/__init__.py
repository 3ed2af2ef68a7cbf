"""The `rankzoo` command: blocks, pick, train, report, compress.

Every verb prints rich tables for people, or with `--format json` exactly one JSON
document on stdout for programs (progress and notes go to stderr). Bad input ends with a
one-line `rankzoo: error: ...` on stderr and exit code 2. Lightning is imported only by
`train` (and matplotlib only by `--plot`), so `blocks`, `pick` and `report` start
fast.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from zoo.ops.registry import BackendUnavailable  # light: no kernels are imported

from ..commands import pick
from ..commands.blocks import blocks_document, blocks_tables
from ..config import load_experiment
from ..experiment.plan import plan_document, plan_table
from ..experiment.sweep import run_summary, summarize
from ..harness.devices import check_experiment
from ..rundir.read import load_run
from ..sizing.units import dtype_name, parse_bytes, parse_count

# a path the user named that cannot serve (unreadable, a directory, not writable) is bad
# input too: one line, exit code 2
BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
             IsADirectoryError, PermissionError)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rankzoo",
        description="An attention-architecture zoo with rank-budget accounting.")
    sub = p.add_subparsers(dest="verb", required=True,
                           metavar="{blocks,pick,train,report,compress}")

    b = sub.add_parser("blocks", help="the zoo: declared budgets, costs, kernels available here")
    b.add_argument("--d-model", type=_positive_int, default=256)
    b.add_argument("--n-heads", type=_positive_int, default=8)
    b.add_argument("--seq-len", type=_positive_int, default=1024)
    b.add_argument("--cache-dtype", default="bf16", metavar="DTYPE",
                   help="dtype the cache is counted in bytes at: bf16 (default), fp16, fp32, "
                        "fp8, int8")
    b.add_argument("--format", choices=("table", "json"), default="table")

    k = sub.add_parser("pick", help="size every block family's knob to a model's constraints; "
                                    "the candidates, their costs and measured evidence")
    k.add_argument("--d-model", type=_positive_int, required=True)
    k.add_argument("--n-heads", type=_positive_int, required=True)
    k.add_argument("--n-layers", type=_positive_int, required=True)
    k.add_argument("--seq-len", type=_positive_int, required=True,
                   help="the target length the cache and the caps are sized at")
    k.add_argument("--cache-budget", required=True, metavar="BYTES",
                   help="cache per sequence at --seq-len, all layers: 256KiB, 1MiB, 262144")
    k.add_argument("--cache-dtype", default="bf16", metavar="DTYPE",
                   help="dtype of the cache: bf16 (default), fp16, fp32, fp8, int8")
    k.add_argument("--params-budget", metavar="N",
                   help="the blocks' parameters, all layers (MLPs left out), e.g. 100M")
    k.add_argument("--flops-budget", metavar="N",
                   help="the blocks' FLOPs per token at --seq-len (prefill), all layers, "
                        "e.g. 2G")
    k.add_argument("--associations", type=_positive_int, default=16,
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
    k.add_argument("--format", choices=("table", "json"), default="table")

    t = sub.add_parser("train", help="train the side-by-side variants of an experiment")
    t.add_argument("config", help="experiment YAML, e.g. configs/quick.yaml")
    t.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides parsed as YAML, e.g. train.max_steps=100")
    t.add_argument("--runs-dir", default="runs", help="parent of the run directory (runs)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true",
                      help="delete an existing run directory of this experiment and redo it")
    mode.add_argument("--resume", action="store_true",
                      help="continue each variant from its checkpoints/last.ckpt")
    t.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: print the final report as one JSON document on stdout")
    t.add_argument("--dry-run", action="store_true",
                   help="print the matched table (parameters, declared budget, costs per "
                        "variant) and stop: no training, the run directory is not touched")

    r = sub.add_parser("report", help="declared vs realized ranks of a finished run, or of a "
                                      "Hugging Face causal LM (--hf)")
    r.add_argument("run_dir", nargs="?",
                   help="runs/<experiment> (all variants) or one variant directory")
    r.add_argument("--hf", metavar="PATH",
                   help="instead of RUN_DIR: a Hugging Face causal LM saved by save_pretrained "
                        "(read offline, never written to)")
    r.add_argument("--text", metavar="FILE", help="with --hf: the text the probe batch is cut from")
    r.add_argument("--seq-len", type=_positive_int, default=128,
                   help="with --hf: tokens per probe sequence (128)")
    r.add_argument("--probe-size", type=_positive_int, default=4,
                   help="with --hf: sequences in the probe batch (4)")
    r.add_argument("--adapter", metavar="DIR",
                   help="with --hf: a PEFT LoRA adapter (save_pretrained directory) applied "
                        "to the model; its ranks fill the adapter axis")
    _add_hf_probe_options(r)
    r.add_argument("--format", choices=("table", "md", "json"), default="table")
    r.add_argument("--plot", metavar="DIR",
                   help="also write PNG figures into DIR (a new or empty directory)")
    _add_compress(sub)
    return p


def _add_compress(sub) -> None:
    c = sub.add_parser("compress", help="check the report's KV advice: the eval loss with the "
                                        "cache (or state) projected to low rank, per cache size")
    c.add_argument("run_dir", nargs="?", help="a trained variant: runs/<experiment>/<variant>")
    c.add_argument("--hf", metavar="PATH",
                   help="instead of RUN_DIR: a Hugging Face causal LM saved by save_pretrained "
                        "(read offline, never written to)")
    c.add_argument("--text", metavar="FILE",
                   help="with --hf: the calibration text (the bases are fitted on its start)")
    c.add_argument("--eval-text", metavar="FILE",
                   help="with --hf: the evaluation text (the calibration file itself is read "
                        "after its calibration tokens)")
    c.add_argument("--seq-len", type=_positive_int, help="with --hf: tokens per sequence (128)")
    c.add_argument("--device", choices=("cpu", "cuda", "auto"),
                   help="with --hf: where the model runs (auto: cuda when available)")
    c.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="with --hf: dtype of the forward passes (float32)")
    c.add_argument("--ratios", default="1.5,2,4,8", metavar="LIST",
                   help="target ratios full / low-rank cache, each > 1 (1.5,2,4,8)")
    c.add_argument("--eps", metavar="LIST",
                   help="also measure r per layer = rank_eps at each eps (0 < eps < 1)")
    c.add_argument("--alloc", default="uniform,greedy", metavar="LIST",
                   help="how ranks are spread at each ratio: uniform (one r), greedy (by "
                        "energy per byte, per layer and head) (uniform,greedy)")
    c.add_argument("--keys", default="auto", metavar="{auto,pre-rope,post-rope}",
                   help="keys that get a basis: before RoPE (auto with RoPE) or as cached")
    c.add_argument("--cache-dtype", default="bf16", metavar="DTYPE",
                   help="dtype the cache is counted in bytes at: bf16 (default), fp16, fp32, "
                        "fp8, int8")
    c.add_argument("--length", type=_positive_int, metavar="T",
                   help="the length bases are amortized at (the report's probe length)")
    c.add_argument("--tolerance", default="0.02", metavar="NATS",
                   help="eval loss change per token that the advice may cost (0.02)")
    c.add_argument("--advice-eps", metavar="EPS",
                   help="with --hf: the eps of the report whose advice is checked (0.1)")
    c.add_argument("--calib-size", type=_positive_int, metavar="N",
                   help="calibration sequences (a run: 64 of its training split; --hf: 4)")
    c.add_argument("--eval-size", type=_positive_int, metavar="N",
                   help="evaluation sequences (a run: its validation split; --hf: 4)")
    c.add_argument("--batch-size", type=_positive_int, metavar="N",
                   help="sequences per forward pass (a run: its batch size; --hf: 1)")
    c.add_argument("--overlap", action="store_true",
                   help="allow calibration and evaluation on the same data")
    c.add_argument("--format", choices=("table", "md", "json"), default="table")
    c.add_argument("--plot", metavar="DIR",
                   help="also write compress.png into DIR (a new or empty directory)")
    c.add_argument("--save", metavar="DIR",
                   help="write the compressed model at the largest ratio within the "
                        "tolerance, with its bases, into DIR (a new or empty directory)")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting `train`'s key=value overrides come after options too."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and args.verb == "train" and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verb == "report":
        _check_report_args(p, args)
    return args


def _check_report_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exactly one source: a run directory, or --hf PATH with --text FILE."""
    if (args.run_dir is None) == (args.hf is None):
        p.error("report needs exactly one of RUN_DIR or --hf PATH"
                + (f", got both ({args.run_dir!r} and --hf {args.hf!r})" if args.hf else ""))
    if args.hf is not None and args.text is None:
        p.error(f"--hf {args.hf} needs --text FILE (the text the probe batch is cut from)")
    for option in ("text", "adapter"):
        if args.hf is None and getattr(args, option) is not None:
            p.error(f"--{option} {getattr(args, option)} only applies with --hf PATH")
    _check_hf_probe_options(p, args)


# report --hf's probe options, parsed from text in _check_hf_probe_options so that a bad value
# reads `rankzoo: error: --flag VALUE: ...`. Absent when not given (SUPPRESS): probe_hf's
# defaults apply, and "only with --hf" is "present".
HF_PROBE_OPTIONS = {  # dest -> (metavar, help)
    "device": ("{cpu,cuda,auto}", "where the forward pass and the measurements run (auto, the "
                                  "default: cuda when available)"),
    "dtype": ("{float32,bfloat16,float16}", "dtype of the forward pass (float32); the metrics "
                                            "are computed in fp32/fp64 either way"),
    "eps": ("EPS", "energy threshold of rank_eps, 0 < EPS < 1 (0.1)"),
    "layers": ("LIST", "measure only these layers, e.g. 0,5,10-12 (all)"),
    "matfree_from": ("T", "from this probe length on, measure attention matrix-free, never "
                          "forming a T x T matrix (2048); 'never': always exactly"),
    "k_max": ("K", "matrix-free: the most singular values sought per head (64)"),
}


def _add_hf_probe_options(r: argparse.ArgumentParser) -> None:
    for dest, (metavar, text) in HF_PROBE_OPTIONS.items():
        r.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar=metavar,
                       default=argparse.SUPPRESS, help=f"with --hf: {text}")


def _eps(text: str) -> float:
    try:
        eps = float(text)
    except ValueError:
        raise ValueError("expected a number between 0 and 1") from None
    if not 0.0 < eps < 1.0:
        raise ValueError("expected 0 < eps < 1")
    return eps


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
        layers.update(range(lo, hi + 1))
    return sorted(layers)


def _matfree_from(text: str) -> int | None:
    return None if text == "never" else _positive_int(text)


HF_PROBE_PARSERS = {"eps": _eps, "layers": _layer_list, "matfree_from": _matfree_from,
                    "k_max": _positive_int}


def _check_hf_probe_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The probe options given: only with --hf, and each parsed from its text."""
    for dest in HF_PROBE_OPTIONS:
        if not hasattr(args, dest):
            continue
        flag, text = "--" + dest.replace("_", "-"), getattr(args, dest)
        if args.hf is None:
            p.error(f"{flag} {text} only applies with --hf PATH")
        try:
            setattr(args, dest, HF_PROBE_PARSERS.get(dest, str)(text))
        except (ValueError, argparse.ArgumentTypeError) as e:
            p.error(f"{flag} {text}: {e}")


# ---------------------------------------------------------------- blocks

def cmd_blocks(args, out: Console) -> int:
    doc = blocks_document(args.d_model, args.n_heads, args.seq_len, args.cache_dtype)
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        for table in blocks_tables(doc):
            out.print(table)
    return 0


# ---------------------------------------------------------------- pick

def cmd_pick(args, out: Console) -> int:
    """Size every family's knob to the constraints; print the candidates; with --emit,
    write the shortlist's experiment (never over an existing file without --force)."""
    if args.force and args.emit is None:
        raise ValueError("--force only applies with --emit FILE")
    constraints = pick.Constraints(
        d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
        seq_len=args.seq_len, cache_budget=parse_bytes(args.cache_budget),
        cache_dtype=dtype_name(args.cache_dtype),
        params_budget=(None if args.params_budget is None
                       else parse_count(args.params_budget, "--params-budget")),
        flops_budget=(None if args.flops_budget is None
                      else parse_count(args.flops_budget, "--flops-budget")),
        associations=args.associations)
    if args.emit is not None and Path(args.emit).exists() and not args.force:
        raise FileExistsError(f"--emit {args.emit}: exists; pass --force to overwrite it "
                              "(nothing was written)")  # before the work, not after it
    doc = pick.pick_document(constraints, runs=args.runs or ())
    for note in doc["notes"]:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: note: {note}", file=sys.stderr)
    if args.emit is not None:
        raw = pick.emit(doc, args.emit, force=args.force, which=args.shortlist)
        doc["emitted"] = {"path": args.emit, "experiment": raw["name"],
                          "variants": list(raw["variants"])}
        print(f"rankzoo: wrote {args.emit}: {len(raw['variants'])} variants "
              f"({', '.join(raw['variants'])}), matched in parameters, on MQAR with "
              f"{constraints.associations} key-value pairs at {constraints.seq_len} tokens; "
              f"next: rankzoo train {args.emit}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        for table in pick.pick_tables(doc):
            out.print(table)
    return 0


# ---------------------------------------------------------------- train

def cmd_train(args, out: Console) -> int:
    exp = load_experiment(args.config, args.overrides)  # fails before Lightning is imported
    check_experiment(exp)  # the device settings on this machine, by a dry run too
    if args.dry_run:
        return _dry_run(exp, args.format, out)
    # Lightning, imported here only: `blocks`, `report` and a dry run start without it
    from ..experiment.stages import train_experiment
    from ..harness.module import NonFiniteLoss

    try:
        report = train_experiment(exp, runs_dir=args.runs_dir, overwrite=args.overwrite,
                                  resume=args.resume, console=console(stderr=True))
    except NonFiniteLoss as e:  # a diverged run is not a crash: say which, keep what is saved
        print(f"rankzoo: error: {e}", file=sys.stderr)
        return 1
    if report is None:  # a non-zero rank of a distributed run: rank zero reports
        return 0
    summary = summarize(exp, report) if exp.sweep is not None else None
    _print_report(report, summary, args.format, out, advice=True)  # as `report` ends
    return 0


def _print_report(report: dict, sweep: dict | None, fmt: str, out: Console,
                  advice: bool = False) -> None:
    """The report as one JSON document (the sweep summary under "sweep"), Markdown, or
    tables (the sweep's after the variants'; then the advice, if asked)."""
    import budgets

    from ..experiment.sweep import sweep_markdown, sweep_table
    from ..render import render_advice, render_table
    from ..render.recall import recall_table, recall_view
    from ..rundir.read import report_markdown, summary_table

    view = recall_view(report)  # None unless the variants ran MQAR with per-count accuracies
    if fmt == "json":
        extra = {**({"sweep": sweep} if sweep is not None else {}),
                 **({"recall": view} if view is not None else {})}
        print(budgets.to_json({**report, **extra}))
    elif fmt == "md":
        print(report_markdown(report) + ("\n" + sweep_markdown(sweep) if sweep else ""), end="")
    else:
        out.print(render_table(report))
        out.print(summary_table(report))
        if sweep is not None:
            out.print(sweep_table(sweep))
        if view is not None:
            out.print(recall_table(view))
        if advice:
            out.print(render_advice(report))


def _dry_run(exp, fmt: str, out: Console) -> int:
    doc = plan_document(exp)
    if fmt == "json":
        print(json.dumps(doc, indent=2))
    else:
        out.print(plan_table(doc))
    return 0


# ---------------------------------------------------------------- report

def cmd_report(args, out: Console) -> int:
    if args.hf is not None:
        return _report_hf(args, out)
    notes: list[str] = []
    report = load_run(args.run_dir, notes=notes)
    for note in notes:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: note: {note}", file=sys.stderr)
    sweep = run_summary(args.run_dir, report)  # None unless the experiment is a sweep
    if args.plot:
        _plot(args.run_dir, report, args.plot)
    _print_report(report, sweep, args.format, out, advice=True)
    return 0


def _report_hf(args, out: Console) -> int:
    import budgets
    from budgets.hf import build_hf_report

    from ..render import hf_report_markdown, render_advice, render_hf_table, render_table

    if args.plot:
        from ..render.plots import prepare_dir

        prepare_dir(args.plot)  # refuse a non-empty --plot DIR before the slow part
    name, entry = _probe_hf(args)
    report = build_hf_report(name, entry)
    if args.plot:
        _plot_hf(name, entry, report, args.plot)
    if args.format == "json":
        print(budgets.to_json(report))
    elif args.format == "md":
        print(hf_report_markdown(report), end="")
    else:
        out.print(render_table(report))
        out.print(render_hf_table(report))  # no training: no variant summary to show
        out.print(render_advice(report))
    return 0


# hf_io's errors name its parameters; the user of `report --hf` typed these flags
HF_FLAGS = {"model_dir": "--hf", "text": "--text", "seq_len": "--seq-len",
            "probe_size": "--probe-size", "adapter": "--adapter", "device": "--device",
            "dtype": "--dtype", "layers": "--layers", "matfree_from": "--matfree-from"}
HF_PARAM = re.compile(r"\b(" + "|".join(HF_FLAGS) + r")=")


def _probe_hf(args) -> tuple[str, dict]:
    """hf_io.probe_hf on the flags, its progress on stderr; its notes on stderr (even when
    it fails after them), its errors with `param=value` put as `--flag value`."""
    from ..hf import probe_hf

    notes: list[str] = []
    options = {dest: getattr(args, dest) for dest in HF_PROBE_OPTIONS if hasattr(args, dest)}
    options.setdefault("device", "auto")  # the library defaults to cpu; a user wants speed
    try:
        return probe_hf(args.hf, args.text, seq_len=args.seq_len, probe_size=args.probe_size,
                        with_spectra=bool(args.plot), adapter=args.adapter, notes=notes,
                        progress=_show_progress, **options)
    except BAD_INPUT as e:
        message = HF_PARAM.sub(lambda m: HF_FLAGS[m[1]] + " ", str(e))
        message = message.replace("--matfree-from None", "--matfree-from never")
        raise (type(e) if type(e) in BAD_INPUT else ValueError)(message) from None
    finally:  # stderr: stdout stays one JSON document with --format json
        for note in notes:
            print(f"rankzoo: note: {note}", file=sys.stderr)


def progress_line(p) -> str:
    """A budgets.ProbeProgress for people: `layer 11 · 12/30 measured · 14.2 s · ETA 21 s`."""
    return (f"layer {p.layer} · {p.done}/{p.total} measured · {p.elapsed:.1f} s · "
            f"ETA {p.eta:.0f} s")


def _show_progress(p) -> None:
    """The probe's progress on stderr (stdout stays the report): one line per measured
    layer, or on a terminal one line rewritten in place."""
    tty = sys.stderr.isatty()
    end = "\n" if not tty or p.done == p.total else ""
    print(("\r\033[K" if tty else "") + f"rankzoo: {progress_line(p)}", end=end,
          file=sys.stderr, flush=True)


def _plot_hf(name: str, entry: dict, report: dict, out_dir: str) -> None:
    from ..render.plots import write_probe_plots

    written, notes = write_probe_plots(name, entry, report, out_dir)
    for note in notes:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: {note}", file=sys.stderr)
    print(f"rankzoo: wrote {len(written)} figures to {out_dir}", file=sys.stderr)


def _plot(run_dir: str, report: dict, out_dir: str) -> None:
    from ..render.plots import write_plots

    written, notes = write_plots(run_dir, report, out_dir)
    for note in notes:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: note: {note}", file=sys.stderr)
    print(f"rankzoo: wrote {len(written)} figures to {out_dir}", file=sys.stderr)


# ---------------------------------------------------------------- compress

# train/commands/compress/__init__.py's errors name its parameters; the user of `compress` typed these flags
COMPRESS_FLAGS = {"model_dir": "--hf", "eval_text": "--eval-text", "text": "--text",
                  "seq_len": "--seq-len", "calib_size": "--calib-size",
                  "eval_size": "--eval-size", "batch_size": "--batch-size",
                  "ratios": "--ratios", "advice_eps": "--advice-eps", "eps": "--eps",
                  "alloc": "--alloc", "keys": "--keys", "cache_dtype": "--cache-dtype",
                  "length": "--length", "tolerance": "--tolerance", "save": "--save",
                  "device": "--device", "dtype": "--dtype"}
COMPRESS_PARAM = re.compile(r"\b(" + "|".join(COMPRESS_FLAGS) + r")=")


def _numbers(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} {text}: expected numbers separated by commas") from None


def _compress_options(args):
    """CompressOptions from the flags; a bad combination is one ValueError line."""
    from ..commands.compress import CompressOptions, cache_dtype

    if (args.run_dir is None) == (args.hf is None):
        raise ValueError("compress needs exactly one of RUN_DIR or --hf PATH"
                         + (f", got both ({args.run_dir!r} and --hf {args.hf!r})"
                            if args.hf else ""))
    if args.hf is not None:
        if args.text is None:
            raise ValueError(f"--hf {args.hf} needs --text FILE (the calibration text)")
        if args.eval_text is None:
            raise ValueError(f"--hf {args.hf} needs --eval-text FILE: the loss is measured on "
                             f"text the bases were not fitted on (--eval-text {args.text} "
                             f"reads it after the calibration tokens)")
    else:
        for flag in ("text", "eval_text", "seq_len", "device", "dtype", "advice_eps"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)} only "
                                 f"applies with --hf PATH")
    tolerance = _numbers(args.tolerance, "--tolerance")
    advice_eps = _numbers(args.advice_eps or "0.1", "--advice-eps")
    if len(tolerance) != 1 or len(advice_eps) != 1:
        raise ValueError("--tolerance and --advice-eps take one number each")
    return CompressOptions(
        ratios=_numbers(args.ratios, "--ratios"),
        eps=_numbers(args.eps, "--eps") if args.eps else (),
        allocations=tuple(a.strip() for a in args.alloc.split(",") if a.strip()),
        keys=args.keys, cache_dtype=cache_dtype(args.cache_dtype), length=args.length,
        tolerance=tolerance[0], advice_eps=advice_eps[0], calib_size=args.calib_size,
        eval_size=args.eval_size, overlap=args.overlap, batch_size=args.batch_size,
        save=args.save)


def cmd_compress(args, out: Console) -> int:
    """The compress table (or Markdown, or one JSON document); --plot and --save write
    only into new or empty directories; exit code 1 when --save found nothing to save."""
    from ..commands.compress import compress_hf, compress_markdown, compress_run, compress_table

    notes: list[str] = []
    try:
        options = _compress_options(args)
        if args.plot:
            from ..render.plots import prepare_dir

            prepare_dir(args.plot)  # refuse a non-empty --plot DIR before the slow part
        progress = _compress_progress()
        if args.hf is not None:
            doc = compress_hf(args.hf, args.text, args.eval_text, options,
                              seq_len=args.seq_len or 128, device=args.device or "auto",
                              dtype=args.dtype or "float32", notes=notes, progress=progress)
        else:
            doc = compress_run(args.run_dir, options, notes=notes, progress=progress)
    except BAD_INPUT as e:
        message = COMPRESS_PARAM.sub(lambda m: COMPRESS_FLAGS[m[1]] + " ", str(e))
        raise (type(e) if type(e) in BAD_INPUT else ValueError)(message) from None
    finally:  # stderr: stdout stays one JSON document with --format json
        for note in notes:
            note = COMPRESS_PARAM.sub(lambda m: COMPRESS_FLAGS[m[1]] + " ", note)
            print(f"rankzoo: note: {note}", file=sys.stderr)
    doc["notes"] = [COMPRESS_PARAM.sub(lambda m: COMPRESS_FLAGS[m[1]] + " ", n)
                    for n in doc["notes"]]  # as the user typed them, in md and json too
    if args.plot:
        from ..commands.compress import write_plot

        print(f"rankzoo: wrote {write_plot(doc, args.plot)}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(doc, indent=2, allow_nan=False))
    elif args.format == "md":
        print(compress_markdown(doc), end="")
    else:
        out.print(compress_table(doc))
    if options.save is not None:
        if doc.get("saved") is None:
            return 1
        print(f"rankzoo: wrote {doc['saved']['dir']} ({doc['saved']['setting']}, "
              f"{doc['saved']['ratio']:.2f}x)", file=sys.stderr)
    return 0


def _compress_progress():
    def show(line: str) -> None:
        tty = sys.stderr.isatty()
        print(("\r\033[K" if tty else "") + f"rankzoo: compress: {line}", end="" if tty else "\n",
              file=sys.stderr, flush=True)
    return show


def console(stderr: bool = False) -> Console:
    """A rich console; 160 columns wide when not a terminal (logs, pipes, CI)."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


COMMANDS = {"blocks": cmd_blocks, "pick": cmd_pick, "train": cmd_train,
            "report": cmd_report, "compress": cmd_compress}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = console()
    try:
        return COMMANDS[args.verb](args, out)
    except (*BAD_INPUT, BackendUnavailable) as e:
        # a kernel backend asked for by name that cannot serve here is bad input, not a bug
        if os.environ.get("RANKZOO_DEBUG"):
            raise
        message = str(e).replace("\n", " ")
        print(f"rankzoo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rankzoo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
