"""`rankzoo claims`: the low-rank-bottleneck theory's claims tested on the runs of
configs/claims/plan.yaml (RUNS_DIR), on a checkpoint (--hf MODEL --text FILE), and on
constructed matrices, each against a verdict rule fixed before any run (docs/CLAIMS.md)."""

from __future__ import annotations

import sys

from rich.console import Console

from .common import add_format, add_plot, check_plot_dir, positive_int, print_document, print_notes


def add_parser(sub) -> None:
    c = sub.add_parser("claims", help="test the low-rank-bottleneck theory's claims on runs and "
                                      "checkpoints, with verdict rules fixed before any run")
    c.add_argument("runs_dir", nargs="?", metavar="RUNS_DIR",
                   help="runs of configs/claims/plan.yaml (rankzoo claims --train writes them)")
    c.add_argument("--hf", metavar="MODEL", help="a Hugging Face causal LM (save_pretrained "
                                                 "directory): per-layer figures at eps 0.01")
    c.add_argument("--text", metavar="FILE", help="with --hf: the text the probe is cut from")
    c.add_argument("--seq-len", type=positive_int, default=256,
                   help="with --hf: tokens per probe sequence (256; 4096 tests the 4k claim)")
    c.add_argument("--probe-size", type=positive_int, default=2,
                   help="with --hf: sequences in the probe batch (2)")
    c.add_argument("--claim", action="append", metavar="NAME",
                   help="only this claim (repeatable); the claims are listed by --list")
    c.add_argument("--list", action="store_true", help="list the claims and their rules")
    c.add_argument("--train", metavar="PLAN",
                   help="first train the experiments of PLAN (configs/claims/plan.yaml) into "
                        "RUNS_DIR, those not yet finished")
    add_format(c)
    add_plot(c, "each claim's figure as PNG")


def check_args(p, args) -> None:
    if (args.hf is None) != (args.text is None):
        p.error("--hf MODEL and --text FILE go together" + (
            f" (got --hf {args.hf})" if args.hf else f" (got --text {args.text})"))
    if args.train and args.runs_dir is None:
        p.error(f"--train {args.train} needs RUNS_DIR, where the runs go")


def cmd_claims(args, out: Console) -> int:
    from ..commands.claims import CLAIMS, Evidence, claim, claims_document, read_runs
    from ..render.claims import claims_table

    if args.list:
        return _list(CLAIMS, args.format, out)
    for name in args.claim or ():
        claim(name)  # an unknown name fails before any work
    if args.plot:
        check_plot_dir(args.plot)
    if args.train:
        from ..commands.claims.plan import train_plan

        seconds = train_plan(args.train, args.runs_dir)
        print(f"rankzoo: trained {args.train} into {args.runs_dir} in {seconds / 60:.1f} min "
              f"(experiments already finished are skipped)", file=sys.stderr)
    ev = read_runs(args.runs_dir) if args.runs_dir is not None else Evidence()
    if args.hf is not None:
        ev = Evidence(ev.runs, _probe(args), ev.runs_dir)
    doc = claims_document(ev, args.claim)
    if args.plot:
        from ..render.claims import write_claims_plots

        written = write_claims_plots(doc, args.plot)
        print(f"rankzoo: wrote {len(written)} figures to {args.plot}", file=sys.stderr)
    print_document(doc, args.format, out, lambda d: [claims_table(d)])
    return 0


def _probe(args):
    from ..commands.claims.probed import probe_checkpoint

    notes: list[str] = []
    try:
        return probe_checkpoint(args.hf, args.text, args.seq_len, args.probe_size, notes)
    finally:
        print_notes(notes)


def _list(claims: dict, fmt: str, out: Console) -> int:
    from ..render.claims import claims_rules_table

    doc = {"schema": "rankzoo.claims.list", "claims": [
        {"claim": c.name, "sentence": c.sentence, "source": c.source, "quantity": c.quantity,
         "rule": c.rule, "thresholds": c.thresholds, "evidence": list(c.evidence)}
        for c in claims.values()]}
    print_document(doc, fmt, out, lambda d: [claims_rules_table(d)])
    return 0
