"""The `rankzoo` command: blocks, pick, train, report, compress, tokenize, claims, export,
eval.

Every verb prints rich tables for people, or with `--format json` exactly one JSON
document on stdout for programs (progress and notes go to stderr). Bad input ends with a
one-line `rankzoo: error: ...` on stderr and exit code 2. Lightning is imported only by
`train` (and matplotlib only by `--plot`), so `blocks`, `pick` and `report` start
fast.

One module per verb (train/cli/blocks.py, pick.py, train.py, report.py, compress.py,
tokenize.py), each with its subparser and its `cmd_<verb>`; what they share is
train/cli/common.py. A new verb is one new module and one row of COMMANDS.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console

from zoo.ops.registry import BackendUnavailable  # light: no kernels are imported

from ..harness.stop import Terminated  # light: signals only
from . import blocks, claims, compress, export, pick, report, tokenize, train
from . import eval as eval_verb
from .common import BAD_INPUT, console


@dataclass(frozen=True)
class Verb:
    add_parser: Callable[[argparse._SubParsersAction], None]  # declares the subparser
    run: Callable[[argparse.Namespace, Console], int]  # the exit code
    # the unknown arguments this verb takes (True when it took them all); else an error
    take_extra: Callable[[argparse.Namespace, list[str]], bool] | None = None
    # checks across arguments, after parsing: p.error(...) on a bad combination
    check: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None


COMMANDS = {
    "blocks": Verb(blocks.add_parser, blocks.cmd_blocks),
    "pick": Verb(pick.add_parser, pick.cmd_pick),
    "train": Verb(train.add_parser, train.cmd_train, take_extra=train.take_overrides),
    "report": Verb(report.add_parser, report.cmd_report, check=report.check_args),
    "compress": Verb(compress.add_parser, compress.cmd_compress),
    "tokenize": Verb(tokenize.add_parser, tokenize.cmd_tokenize),
    "claims": Verb(claims.add_parser, claims.cmd_claims, check=claims.check_args),
    "export": Verb(export.add_parser, export.cmd_export),
    "eval": Verb(eval_verb.add_parser, eval_verb.cmd_eval),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rankzoo",
        description="An attention-architecture zoo with rank-budget accounting.")
    sub = p.add_subparsers(dest="verb", required=True,
                           metavar="{" + ",".join(COMMANDS) + "}")
    for verb in COMMANDS.values():
        verb.add_parser(sub)
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting `train`'s key=value overrides come after options too."""
    p = parser()
    args, extra = p.parse_known_args(argv)
    verb = COMMANDS[args.verb]
    if extra and not (verb.take_extra is not None and verb.take_extra(args, extra)):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if verb.check is not None:
        verb.check(p, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = console()
    try:
        return COMMANDS[args.verb].run(args, out)
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
    except Terminated as e:  # SIGTERM or SIGHUP, taken as ^C is (train/harness/stop.py)
        print(f"rankzoo: terminated ({e})", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

