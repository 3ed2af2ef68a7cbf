"""Train every variant of an experiment (or every grid point of its sweep), one after
another or side by side on worker processes (train/experiment/parallel.py, --jobs), then
its fine-tune stage, and write the run directory.

    runs/<experiment>/                 TensorBoard root (variants overlay), experiment.yaml
    runs/<experiment>/<variant>/       config.yaml, checkpoints/last.ckpt, ranks.jsonl,
                                       report.json, TensorBoard event files, hparams.yaml
    runs/<experiment>/report.md        the side-by-side rank-budget report
    runs/<experiment>/sweep.json       a sweep's summary (train/experiment/sweep.py)
    runs/<experiment>/finetune.json    the fine-tune stage's summary (train/experiment/finetune.py)

Every run goes through train/harness/fit.py's fit_run; this module decides which runs, in which
order, and what a resume may continue.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

import budgets
from budgets.schema import read_text

from ..config import Experiment, lora_name, parse_experiment
from ..harness.devices import check_experiment
from ..harness.fit import RunSpec, check_trainer, fit_run, is_global_zero, quiet_lightning
from ..harness.module import NonFiniteLoss
from ..render.document import report_markdown
from ..render.sweep import sweep_markdown
from ..rundir.files import read_yaml, remove_temporaries, write_text, write_yaml
from ..rundir.layout import DIVERGED_FILE, EXPERIMENT_FILE, STATUS_FILE, VariantFiles
from ..rundir.lock import hold_run_dir
from ..rundir.read import load_checkpoint
from ..rundir.status import read_status
from .disk import disk_preflight
from .finetune import finetune_experiment
from .parallel import Jobs, TrainOne, choose_jobs, train_parallel
from .preflight import preflight as sizes_preflight
from .preflight import write_notes
from .sweep import best_runs, summarize, write_summary

__all__ = ["prepare_run_dir", "train_experiment", "train_variant"]


def train_experiment(exp: Experiment, runs_dir: str | Path = "runs", overwrite: bool = False,
                     resume: bool = False, console: Console | None = None,
                     jobs: int | str = 1) -> dict | None:
    """Train all variants of `exp` under runs_dir/<name>; return the combined report
    (None on a non-zero rank of a distributed run: rank zero writes and reports). `jobs`:
    worker processes for its runs, or "auto" (train/experiment/parallel.py choose_jobs)."""
    quiet_lightning()
    exp_dir = Path(runs_dir) / exp.name
    check_settings(exp)
    notes = preflight(exp)
    chosen = choose_jobs(exp, jobs)  # after preflight: the estimates auto reads fit alone
    notes += warn(list(chosen.notes))
    if not is_global_zero():
        # a rank that a launcher re-ran (e.g. Lightning's ddp): rank zero prepared the run
        # directory already; train alongside it, silently, and write nothing of our own
        train_all(exp, exp_dir, resume, Console(stderr=True, quiet=True))
        return None
    console = console or Console(stderr=True)
    created = missing_dirs(Path(runs_dir))  # removed again if a failure leaves them empty
    try:
        with hold_run_dir(exp_dir):  # one writer at a time: RunLocked names the holder
            notes += warn(disk_preflight(exp, exp_dir, overwrite, resume))
            return train_locked(exp, exp_dir, overwrite, resume, notes, console, chosen)
    except BaseException:
        remove_empty(created)
        raise


def missing_dirs(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def remove_empty(dirs: list[Path]) -> None:
    """Remove each directory of `dirs` (deepest first) that exists and is empty."""
    for d in dirs:
        with contextlib.suppress(OSError):  # not empty, or gone: left as it is
            d.rmdir()


def train_locked(exp: Experiment, exp_dir: Path, overwrite: bool, resume: bool,
                 notes: list[str], console: Console, jobs: Jobs | None = None) -> dict:
    """train_experiment's work on rank zero, holding the run directory's lock."""
    prepare_run_dir(exp_dir, overwrite=overwrite, resume=resume)
    if resume:
        check_resume(exp_dir, exp)  # before anything in the directory is rewritten
        remove_temporaries(exp_dir)  # left by writes a kill cut short; no one else writes
    fresh = not exp_dir.exists()
    exp_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_yaml(exp_dir / EXPERIMENT_FILE, exp.to_dict())
        write_notes(exp_dir, notes)
        entries, summary = train_all(exp, exp_dir, resume, console, jobs)
    except NonFiniteLoss:  # a finding: the directory keeps the notes that say where
        raise
    except BaseException:
        if fresh and not any_progress(exp_dir):  # a stub would only force --overwrite
            shutil.rmtree(exp_dir, ignore_errors=True)
        raise
    return write_reports(exp, exp_dir, entries, summary, console)


def check_settings(exp: Experiment) -> None:
    """The device settings against this machine, then against Lightning itself (the
    Trainer they make), before any file is written."""
    check_experiment(exp)
    check_trainer(exp.train)
    if exp.finetune is not None:
        check_trainer(exp.finetune.train_config(exp.train), section="finetune.train")


def any_progress(exp_dir: Path) -> bool:
    """Whether some run in exp_dir took a step (by its status.json; an unreadable one
    counts, to be safe): if none did, a failed fresh run leaves nothing worth keeping."""
    for status in exp_dir.glob(f"*/{STATUS_FILE}"):
        try:
            record = read_status(status.parent)
        except ValueError:
            return True
        if record is not None and record["step"] > 0:
            return True
    return False


def train_all(exp: Experiment, exp_dir: Path, resume: bool, console: Console,
              jobs: Jobs | None = None) -> tuple[dict[str, dict], dict | None]:
    """Every variant (or sweep run), in turn or on jobs.processes workers, then the
    fine-tune stage: the report entries by name and the sweep summary (None without a
    sweep). Every rank runs the same sequence of fits, or a distributed run falls out of
    step; only rank zero gets entries back."""
    train_one = train_sweep_run if exp.sweep else train_variant
    if jobs is not None and jobs.processes > 1:
        entries = train_parallel(exp, exp_dir, resume, console, jobs, train_one)
    else:
        entries = train_in_turn(exp, exp_dir, resume, console, train_one)
    zero = is_global_zero()
    if zero and not entries:
        raise NonFiniteLoss(f"every run of the sweep diverged; see {exp_dir}/*/{DIVERGED_FILE}")
    summary = None
    if zero and exp.sweep is not None:  # its grid points only: fine-tunes are not part of it
        summary = summarize(exp, budgets.build_report(entries, experiment=exp.name))
    if exp.finetune is not None:  # the LoRA stage, after pretraining
        sources = best_runs(summary) if summary is not None else None
        entries.update(finetune_experiment(exp, exp_dir, resume, console, sources))
    return entries, summary


def train_in_turn(exp: Experiment, exp_dir: Path, resume: bool, console: Console,
                  train_one: TrainOne) -> dict[str, dict]:
    """Every variant (or sweep run) one after another in this process, by `train_one`."""
    entries = {}
    for i, variant in enumerate(exp.variants, 1):
        console.rule(f"variant {i}/{len(exp.variants)}: {variant}")
        entry = train_one(exp, variant, exp_dir, resume, console)
        if entry is not None:
            entries[variant] = entry
    return entries


def train_variant(exp: Experiment, variant: str, exp_dir: Path, resume: bool,
                  console: Console, labelled: bool = False) -> dict | None:
    """Train one variant (or sweep run); its report entry, None on a non-zero rank.
    `labelled`: its validation lines name it (runs side by side)."""
    return fit_run(RunSpec(variant, exp, exp.variant_config(variant)), exp_dir, resume, console,
                   labelled)


def train_sweep_run(exp: Experiment, run: str, exp_dir: Path, resume: bool,
                    console: Console, labelled: bool = False) -> dict | None:
    """Train one grid point of a sweep; None when it diverged. A learning rate too high
    to train is a finding of the sweep, not the end of it: the run directory keeps the
    last good checkpoint and a note, and the sweep goes on."""
    diverged = exp_dir / run / DIVERGED_FILE
    if resume and diverged.is_file():
        console.print(f"{run}: diverged before ({diverged}); not retried")
        return None
    try:
        return train_variant(exp, run, exp_dir, resume, console, labelled)
    except NonFiniteLoss as e:
        if is_global_zero():
            write_text(diverged, f"{e}\n")
        console.print(f"[red]{run}: diverged[/]: {e}")
        return None


def write_reports(exp: Experiment, exp_dir: Path, entries: dict[str, dict],
                  summary: dict | None, console: Console) -> dict:
    """report.md (with the sweep's table), sweep.json; returns the combined report."""
    report = budgets.build_report(entries, experiment=exp.name)
    markdown = report_markdown(report)
    if summary is not None:
        path = write_summary(exp_dir, summary)
        markdown += "\n" + sweep_markdown(summary)
        console.print(f"wrote the sweep summary {path}")
    write_text(exp_dir / "report.md", markdown)  # whole or not at all
    console.print(f"wrote {exp_dir / 'report.md'}; TensorBoard: tensorboard --logdir {exp_dir}")
    return report


# ---------------------------------------------------------------- before the first fit

def preflight(exp: Experiment) -> list[str]:
    """Before the run directory is touched: every variant's memory estimate against what
    is available, its kernel backends on a few tokens, a text corpus read once
    (train/experiment/preflight.py). Its warnings go to stderr and are returned for the run's notes
    (train.experiment.preflight.write_notes)."""
    return warn(sizes_preflight(exp))


def warn(notes: list[str]) -> list[str]:
    for note in notes:
        print(f"rankzoo: warning: {note}", file=sys.stderr)
    return notes


def prepare_run_dir(exp_dir: Path, overwrite: bool = False, resume: bool = False) -> None:
    """Refuse an existing run directory unless asked to overwrite (delete) or resume it."""
    if overwrite and resume:
        raise ValueError("choose one of --overwrite and --resume, not both")
    if resume:
        if not exp_dir.is_dir():
            raise FileNotFoundError(f"nothing to resume: run directory {exp_dir} does not exist")
        return
    if not exp_dir.exists():
        return
    if not overwrite:
        raise FileExistsError(f"run directory {exp_dir} already exists; pass --overwrite to "
                              "delete and redo it, or --resume to continue it")
    if exp_dir.is_symlink():  # rmtree refuses a link; deleting what it points to is worse
        raise FileExistsError(f"{exp_dir} is a symbolic link; not deleting it or what it "
                              "points to (remove the link, or pass another --runs-dir)")
    if not exp_dir.is_dir():
        raise FileExistsError(f"{exp_dir} exists and is not a directory; not deleting it")
    if any(exp_dir.iterdir()) and not (exp_dir / EXPERIMENT_FILE).is_file():
        raise FileExistsError(f"{exp_dir} does not look like a rankzoo run (no {EXPERIMENT_FILE}); "
                              "not deleting it")
    shutil.rmtree(exp_dir)


# What a resume may change: more steps, a longer or new sweep, the fine-tune stage (each
# fine-tune checks its own config), and new variants; anything else would continue a
# checkpoint under settings it was not trained with.
RESUMABLE_CHANGES = ("train.max_steps", "sweep", "finetune")


def check_resume(exp_dir: Path, exp: Experiment) -> None:
    """Refuse to resume a run directory under a changed config, naming what changed."""
    path = exp_dir / EXPERIMENT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume {exp_dir}: it has no {EXPERIMENT_FILE}")
    old = read_yaml(path) or {}
    # through the parser, so that keys added since it was written read as defaults; if it
    # no longer parses, it is compared as written and the differences name what changed
    with contextlib.suppress(ValueError):
        old = parse_experiment(old, source=str(path)).to_dict()
    old_variants = set(old.get("variants") or {})
    new = exp.to_dict()
    changed = [k for k in config_changes(old, new)
               if not k.startswith(RESUMABLE_CHANGES)
               and not (k.startswith("variants.") and k.split(".")[1] not in old_variants)]
    if changed:
        shown = "; ".join(f"{k}: {lookup(old, k)!r} -> {lookup(new, k)!r}" for k in changed[:5])
        raise ValueError(f"--resume: {exp_dir} was trained under another config ("
                         + shown
                         + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
                         + f"); only {', '.join(RESUMABLE_CHANGES)} and new variants may "
                         "change on a resume (--overwrite redoes the run)")
    for name in exp.variants:  # a lower max_steps, only where no run has gone past it
        step = run_step(exp_dir / name)
        if step > exp.train.max_steps:
            raise ValueError(f"--resume: train.max_steps {exp.train.max_steps} is below step "
                             f"{step}, which {exp_dir / name} already reached; the report "
                             "would mix runs of different lengths (--overwrite redoes the run)")
    check_run_dirs(exp_dir, exp)


def run_step(vdir: Path) -> int:
    """The furthest step a run directory records (its status and its checkpoint), 0 when
    none is readable."""
    steps = [0]
    with contextlib.suppress(ValueError):
        steps.append((read_status(vdir) or {}).get("step", 0))
    with contextlib.suppress(ValueError):
        if VariantFiles(vdir).checkpoint.is_file():
            steps.append(load_checkpoint(VariantFiles(vdir).checkpoint).step or 0)
    return max(steps)


def check_run_dirs(exp_dir: Path, exp: Experiment) -> None:
    """Each run directory already there against the run this config makes in it: one
    copied in from another config would be kept and reported beside these. A fine-tune's
    data and train sections must be the same too (train/experiment/finetune.py refuses
    them again per run, but only after the variants are done)."""
    for name in exp.variants:
        changed = run_config_changes(exp_dir / name, exp.variant_config(name))
        if changed:
            refuse_run_dir(exp_dir / name, changed)
        if VariantFiles(exp_dir / name).ranks.is_file():  # a resume trims it: it must read
            read_text(VariantFiles(exp_dir / name).ranks)  # not UTF-8: the file and line named
    if exp.finetune is None:
        return
    ft = exp.finetune
    sections = {"data": {**ft.data.to_dict(), "vocab_size": ft.data.vocab_size},
                "train": exp.finetune_view().train.to_dict()}
    for variant in exp.finetune_variants():
        for r in ft.ranks:
            vdir = exp_dir / lora_name(variant, r)
            changed = run_config_changes(vdir, sections, steps_may_grow=False)
            if changed:
                refuse_run_dir(vdir, changed)


def run_config_changes(vdir: Path, expected: dict,
                       steps_may_grow: bool = True) -> list[tuple[str, Any, Any]]:
    """(key, written, expected) where vdir/config.yaml differs from `expected`, over the
    keys of `expected` (params and the backends used are the run's own figures); another
    train.max_steps allowed when `steps_may_grow`. No or an unreadable config.yaml: no changes (the
    fit rewrites it)."""
    try:
        path = VariantFiles(vdir).config
        written = read_yaml(path) if path.is_file() else None
    except ValueError:
        return []
    if not isinstance(written, dict):
        return []
    out = []
    for key in config_changes({k: written.get(k) for k in expected}, expected):
        was, now = lookup(written, key), lookup(expected, key)
        if key == "train.max_steps" and steps_may_grow:  # check_resume: the steps taken
            continue
        out.append((key, was, now))
    return out


def refuse_run_dir(vdir: Path, changed: list[tuple[str, Any, Any]]) -> None:
    shown = "; ".join(f"{k}: {was!r} -> {now!r}" for k, was, now in changed[:3])
    raise ValueError(f"--resume: {vdir} holds a run of another config ({shown}"
                     + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
                     + "); remove it, or --overwrite to redo the run")


def config_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts (both sides' keys)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix or "(top level)"]
    keys = dict.fromkeys([*old, *new])
    return [change for k in keys
            for change in config_changes(old.get(k), new.get(k), f"{prefix}.{k}" if prefix
                                         else str(k))]


def lookup(tree: Any, key: str) -> Any:
    """The value at a dotted key of nested dicts (None where the path ends early)."""
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree
