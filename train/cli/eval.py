"""`rankzoo eval DIR|RUN/VARIANT --tasks LIST --include DIR`: lm-evaluation-harness on an
exported model or a trained variant, offline on local task files (train/commands/eval.py)."""

from __future__ import annotations

from rich.console import Console

from .common import add_format, positive_int, print_document, print_notes


def add_parser(sub) -> None:
    e = sub.add_parser("eval", help="lm-evaluation-harness on an exported model or a "
                                    "trained variant, offline on local task files")
    e.add_argument("source", metavar="DIR|RUN/VARIANT",
                   help="a model directory rankzoo export wrote, or a trained variant "
                        "(exported to a temporary directory; its scores kept as eval.json)")
    e.add_argument("--tasks", required=True, metavar="LIST",
                   help="comma-separated task names, defined under --include")
    e.add_argument("--include", required=True, metavar="DIR",
                   help="task YAMLs (lm-eval's own list is not read): each names its data "
                        "as a local file (dataset_path: json, dataset_kwargs.data_files)")
    e.add_argument("--batch-size", type=positive_int, default=1, help="(1)")
    e.add_argument("--device", default="cpu", help="where the model runs (cpu)")
    e.add_argument("--limit", type=positive_int, metavar="N",
                   help="the first N examples of each task only")
    e.add_argument("--no-record", dest="record", action="store_false",
                   help="with RUN/VARIANT: do not keep the scores as its eval.json")
    add_format(e)


def cmd_eval(args, out: Console) -> int:
    from ..commands.eval import eval_document

    tasks = [t for t in args.tasks.split(",") if t]
    doc = eval_document(args.source, tasks, args.include, args.batch_size, args.device,
                        args.limit, args.record)
    print_notes(doc["notes"])
    print_document(doc, args.format, out, lambda d: [
        f"{task}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()))
        for task, m in d["tasks"].items()] + (
        [f"recorded: {d['recorded']}"] if d["recorded"] else []))
    return 0
