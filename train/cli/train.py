"""`rankzoo train`: train the side-by-side variants of an experiment (or, with --dry-run,
show their matched sizes and stop). Lightning is imported only here, and only past the
dry run, so the other verbs start fast."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from ..config import load_experiment
from ..experiment.plan import plan_document
from ..experiment.sweep import summarize
from ..harness.devices import check_experiment
from ..harness.stop import stopping_on_signals
from ..render.plan import plan_table
from ..rundir.layout import CHECKPOINT_FILE
from .common import add_details, add_format, console, positive_int, print_document
from .report import print_report


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train the side-by-side variants of an experiment")
    t.add_argument("config", help="experiment YAML, e.g. configs/quick.yaml")
    t.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides parsed as YAML, e.g. train.max_steps=100")
    t.add_argument("--runs-dir", default="runs", help="parent of the run directory (runs)")
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true",
                      help="delete an existing run directory of this experiment and redo it")
    mode.add_argument("--resume", action="store_true",
                      help=f"continue each variant from its {CHECKPOINT_FILE}")
    add_format(t, help="json: print the final report as one JSON document on stdout")
    add_details(t)
    t.add_argument("--jobs", type=jobs_value, default="auto", metavar="N|auto",
                   help="train the runs on N worker processes of the CPU side by side, "
                        "each on cores/N threads; auto (default): one per core for two "
                        "runs or more of 200 steps or more, as many as memory holds, else "
                        "one at a time. Accelerators and distributed runs: one at a time")
    t.add_argument("--dry-run", action="store_true",
                   help="print the matched table (parameters, declared budget, costs per "
                        "variant) and stop: no training, the run directory is not touched")


def jobs_value(text: str) -> int | str:
    """--jobs: "auto" or a positive int (train/experiment/parallel.py check_jobs)."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'auto', got {text!r}") \
            from None


def take_overrides(args, extra: list[str]) -> bool:
    """key=value overrides may come after options too: argparse leaves them unknown."""
    if not all("=" in e and not e.startswith("-") for e in extra):
        return False
    args.overrides = [*args.overrides, *extra]
    return True


def cmd_train(args, out: Console) -> int:
    exp = load_experiment(args.config, args.overrides)  # fails before Lightning is imported
    check_experiment(exp)  # the device settings on this machine, by a dry run too
    if args.dry_run:
        return _dry_run(exp, args.format, out)
    # Lightning, imported here only: `blocks`, `report` and a dry run start without it
    from ..experiment.stages import train_experiment
    from ..harness.module import NonFiniteLoss

    try:
        # SIGTERM and SIGHUP stop the runs as ^C does: each records itself interrupted,
        # workers included, and the command exits 128 + the signal (train/harness/stop.py)
        with stopping_on_signals():
            report = train_experiment(exp, runs_dir=args.runs_dir, overwrite=args.overwrite,
                                      resume=args.resume, console=console(stderr=True),
                                      jobs=args.jobs)
    except NonFiniteLoss as e:  # a diverged run is not a crash: say which, keep what is saved
        print(f"rankzoo: error: {e}", file=sys.stderr)
        return 1
    if report is None:  # a non-zero rank of a distributed run: rank zero reports
        return 0
    summary = summarize(exp, report) if exp.sweep is not None else None
    print_report(report, summary, args.format, out, details=args.details,  # as `report` does
                 again=f"rankzoo report {Path(args.runs_dir) / exp.name} --details",
                 run_dir=Path(args.runs_dir) / exp.name)
    return 0


def _dry_run(exp, fmt: str, out: Console) -> int:
    print_document(plan_document(exp), fmt, out, lambda doc: [plan_table(doc)])
    return 0
