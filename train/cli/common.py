"""What the verbs of the `rankzoo` command share: the flags declared once, the bad-input
errors, the one spelling of library parameters as flags, notes and progress on stderr.

Every verb's stdout is its document (rich tables, Markdown or exactly one JSON document);
notes, progress and errors go to stderr, so `--format json` stays parseable.
"""

from __future__ import annotations

import argparse
import re
import sys

from rich.console import Console

# a path the user named that cannot serve (unreadable, a directory, not writable) is bad
# input too: one line, exit code 2
BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
             IsADirectoryError, PermissionError)


def console(stderr: bool = False) -> Console:
    """A rich console; 160 columns wide when not a terminal (logs, pipes, CI)."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


# ---------------------------------------------------------------- flags declared once

def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    return value


def add_format(p: argparse.ArgumentParser, md: bool = False, help: str | None = None) -> None:
    """--format: rich tables (the default) or one JSON document; Markdown too with md."""
    choices = ("table", "md", "json") if md else ("table", "json")
    p.add_argument("--format", choices=choices, default="table", help=help)


def add_cache_dtype(p: argparse.ArgumentParser, what: str) -> None:
    """--cache-dtype, parsed by the verb (train/sizing/units.py) so that a bad one is one
    `rankzoo: error:` line naming the dtypes known."""
    p.add_argument("--cache-dtype", default="bf16", metavar="DTYPE",
                   help=f"{what}: bf16 (default), fp16, fp32, fp8, int8")


def add_plot(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--plot", metavar="DIR",
                   help=f"also write {what} into DIR (a new or empty directory)")


def add_hf_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", metavar="PATH",
                   help="instead of RUN_DIR: a Hugging Face causal LM saved by save_pretrained "
                        "(read offline, never written to)")


def flag(dest: str) -> str:
    """The flag of an argparse dest: `eval_text` -> `--eval-text`."""
    return "--" + dest.replace("_", "-")


def one_source_error(verb: str, run_dir: str | None, hf: str | None) -> str | None:
    """The complaint when not exactly one of RUN_DIR and --hf PATH is given, else None."""
    if (run_dir is None) != (hf is None):
        return None
    return (f"{verb} needs exactly one of RUN_DIR or --hf PATH"
            + (f", got both ({run_dir!r} and --hf {hf!r})" if hf else ""))


def only_with_hf(dest: str, value) -> str:
    return f"{flag(dest)} {value} only applies with --hf PATH"


def check_plot_dir(out_dir: str) -> None:
    """Refuse a non-empty --plot DIR before the slow part, not after it."""
    from ..render.plots import prepare_dir  # matplotlib's module: only with --plot

    prepare_dir(out_dir)


# ---------------------------------------------------------------- library errors as flags

# the library's errors and notes name its parameters (`seq_len=64: ...`); the user typed
# flags. One map for `report --hf` and `compress`: both name the same parameters alike.
LIBRARY_FLAGS = {
    "model_dir": "--hf", "eval_text": "--eval-text", "text": "--text", "seq_len": "--seq-len",
    "probe_size": "--probe-size", "adapter": "--adapter", "device": "--device",
    "dtype": "--dtype", "layers": "--layers", "matfree_from": "--matfree-from",
    "calib_size": "--calib-size", "eval_size": "--eval-size", "batch_size": "--batch-size",
    "ratios": "--ratios", "advice_eps": "--advice-eps", "eps": "--eps", "alloc": "--alloc",
    "keys": "--keys", "cache_dtype": "--cache-dtype", "length": "--length",
    "tolerance": "--tolerance", "save": "--save"}
LIBRARY_PARAM = re.compile(r"\b(" + "|".join(LIBRARY_FLAGS) + r")=")


def as_flags(message: str) -> str:
    """`seq_len=64: ...` -> `--seq-len 64: ...`; the library's matfree_from=None is the
    command line's `--matfree-from never`."""
    message = LIBRARY_PARAM.sub(lambda m: LIBRARY_FLAGS[m[1]] + " ", message)
    return message.replace("--matfree-from None", "--matfree-from never")


def as_flags_error(e: Exception) -> Exception:
    """A bad-input error of the library, reworded with flags (same type when it is one of
    BAD_INPUT): `raise as_flags_error(e) from None`."""
    return (type(e) if type(e) in BAD_INPUT else ValueError)(as_flags(str(e)))


# ---------------------------------------------------------------- stderr

def print_notes(notes) -> None:
    for note in notes:  # stderr: stdout stays one JSON document with --format json
        print(f"rankzoo: note: {note}", file=sys.stderr)


def show_progress(line: str, last: bool = False) -> None:
    """A progress line on stderr (stdout stays the document): one line per call, or on a
    terminal one line rewritten in place (ended by the last one)."""
    tty = sys.stderr.isatty()
    print(("\r\033[K" if tty else "") + f"rankzoo: {line}", end="\n" if not tty or last else "",
          file=sys.stderr, flush=True)
