"""`rankzoo export RUN/VARIANT --out DIR`: a trained variant as a Hugging Face model
directory (train/hf/export.py)."""

from __future__ import annotations

from rich.console import Console

from .common import add_format, positive_int, print_document, print_notes


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="a trained variant as a Hugging Face model directory "
                                      "(AutoModelForCausalLM loads it after `import zoo`)")
    e.add_argument("run_dir", metavar="RUN/VARIANT",
                   help="a trained variant: runs/<experiment>/<variant>")
    e.add_argument("--out", required=True, metavar="DIR",
                   help="the model directory to write: new or empty (nothing is overwritten)")
    e.add_argument("--max-len", type=positive_int, metavar="N",
                   help="the longest sequence it takes, prompt and generated tokens, and "
                        "the length its caches hold (the run's sequence length)")
    add_format(e)


def cmd_export(args, out: Console) -> int:
    from ..hf.export import export_variant  # transformers: only here

    doc = export_variant(args.run_dir, args.out, args.max_len)
    print_notes(doc["notes"])
    print_document(doc, args.format, out, lambda d: [
        f"{d['out']}: {', '.join(d['files'])}",
        f"step {d['step']}, layers {', '.join(d['layers'])}, max_len {d['max_len']}"])
    return 0
