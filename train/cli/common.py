"""What the verbs of the `rankzoo` command share: the flags declared once, the bad-input
errors, the one spelling of library parameters as flags, the document printed, notes and
progress on stderr.

Every verb's stdout is its document (rich tables, Markdown or exactly one JSON document),
printed by print_document alone; notes, progress and errors go to stderr, so
`--format json` stays parseable.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable

from rich.console import Console

from ..config.sections import MAX_WIDTH
from ..rundir.files import WriteFailed
from ..rundir.lock import RunLocked

# a path the user named that cannot serve (unreadable, a directory, not writable) is bad
# input too: one line, exit code 2; so are a run file that could not be written (a full
# disk) and a run directory that another run is writing
BAD_INPUT = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
             IsADirectoryError, PermissionError, WriteFailed, RunLocked)


def console(stderr: bool = False) -> Console:
    """A rich console; 160 columns wide when not a terminal (logs, pipes, CI)."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


# ---------------------------------------------------------------- flags declared once

MAX_INT = 2**31 - 1


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value}")
    if value > MAX_INT:  # a size that indexes tensors: past int32 is no machine's
        raise argparse.ArgumentTypeError(f"expected at most {MAX_INT}, got {value}")
    return value


def model_width(text: str) -> int:
    """--d-model: a positive int up to the widest model a config may hold (MAX_WIDTH); the
    blocks are built on the meta device, whose storage size overflows past it."""
    value = positive_int(text)
    if value > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_WIDTH}, got {value}")
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


def directory_name(text: str) -> str:
    """A directory flag's value: '' names no directory (it would be read as "not given")."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r}")
    return text


def add_plot(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--plot", metavar="DIR", type=directory_name,
                   help=f"also write {what} into DIR (a new or empty directory)")


def add_details(p: argparse.ArgumentParser) -> None:
    p.add_argument("--details", action="store_true",
                   help="in the terminal, every table after the summary: the budget by part "
                        "and layer, totals, heads, residual stream, all advice and findings "
                        "(always in --format md and json)")


def add_hf_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", metavar="PATH",
                   help="instead of RUN_DIR: a Hugging Face causal LM saved by save_pretrained, "
                        "or a .gguf file (read offline, never written to)")
    p.add_argument("--no-bos", dest="bos", action="store_false",
                   help="with --hf: sequences start with the text itself, not with the BOS "
                        "token the model's tokenizer adds")


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


def check_plot_dir(out_dir: str, create: bool = True) -> None:
    """Refuse a non-empty --plot DIR before the slow part, not after it; created now, or
    (not `create`) by the writer that fills it, so that a refused probe leaves none."""
    from ..render.plots import prepare_dir  # matplotlib's module: only with --plot

    prepare_dir(out_dir, create)


# ---------------------------------------------------------------- library errors as flags

# the library's errors and notes name its parameters (`seq_len=64: ...`); the user typed
# flags. One map for `report --hf/--model` and `compress`: they name parameters alike.
LIBRARY_FLAGS = {
    "model_dir": "--hf", "eval_text": "--eval-text", "text": "--text", "seq_len": "--seq-len",
    "probe_size": "--probe-size", "adapter": "--adapter", "device": "--device",
    "dtype": "--dtype", "layers": "--layers", "matfree_from": "--matfree-from",
    "calib_size": "--calib-size", "eval_size": "--eval-size", "batch_size": "--batch-size",
    "ratios": "--ratios", "advice_eps": "--advice-eps", "eps": "--eps", "alloc": "--alloc",
    "keys": "--keys", "bases": "--bases", "cache_dtype": "--cache-dtype", "length": "--length",
    "tolerance": "--tolerance", "save": "--save", "heal": "--heal", "heal_at": "--heal-at",
    "heal_loss": "--heal-loss", "model": "--model", "checkpoint": "--checkpoint",
    "tokenizer": "--tokenizer"}
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


def print_document(doc: dict, fmt: str, out: Console, tables: Callable[[dict], Iterable],
                   markdown: Callable[[dict], str] | None = None) -> None:
    """The verb's document on stdout, the one way every verb prints it: `--format json`
    one JSON document (NaN refused: it is not JSON), `md` the text `markdown(doc)`, else
    for people each rich renderable of `tables(doc)`."""
    if fmt == "json":
        print(json.dumps(doc, indent=2, allow_nan=False))
    elif fmt == "md":
        if markdown is None:  # add_format(md=False) offers no md: a verb's own mistake
            raise ValueError(f"--format {fmt}: this command has no Markdown form")
        print(markdown(doc), end="")
    else:
        for table in tables(doc):
            out.print(table)


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
