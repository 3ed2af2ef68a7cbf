"""Train every variant of an experiment, one after another, and write the run directory.

    runs/<experiment>/                 TensorBoard root (variants overlay), experiment.yaml
    runs/<experiment>/<variant>/       config.yaml, checkpoints/last.ckpt, ranks.jsonl,
                                       report.json, TensorBoard event files, hparams.yaml
    runs/<experiment>/report.md        the side-by-side rank-budget report

Lightning supplies the loop, devices, precision, checkpoints and the progress bar; this
module only wires the pieces together. Each variant starts from the same seed, sees the
same data in the same order and runs the same number of steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from rich.console import Console

import budgets
from zoo.ops.registry import BackendUnavailable

from .callbacks import DEFAULT_HISTOGRAMS, RankMonitor
from .data import make_loaders, make_splits
from .experiment import Experiment, parse_experiment
from .module import LMModule, NonFiniteLoss, build_model
from .results import (
    EXPERIMENT_FILE,
    finished_entry,
    finite_metrics,
    last_record,
    report_markdown,
    summary_table,
)
from .sweep import DIVERGED_FILE, best_runs, summarize, sweep_markdown, write_summary


def quiet_lightning() -> None:
    """Keep Lightning to warnings, and drop the ones that do not apply to small CPU runs."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*does not have many workers.*",
                    ".*smaller than the logging interval.*",
                    ".*Checkpoint directory .* exists and is not empty.*",
                    ".*treespec, LeafSpec.*"):
        warnings.filterwarnings("ignore", message=pattern)


class StepProgressBar(RichProgressBar):
    """Lightning's rich bar, without the "Epoch 0/-2" it shows when only max_steps is set."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"Epoch {current_epoch}"


class ValidationLog(Callback):
    """One line per validation: the plain-text stand-in for the progress bar."""

    def __init__(self, console: Console):
        self.console = console

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            shown = " ".join(f"{k} {float(v):.4g}" for k, v in trainer.callback_metrics.items()
                             if k.startswith(("train/loss", "val/")))
            self.console.print(f"  step {trainer.global_step}: {shown}")


def is_global_zero() -> bool:
    """False in a process that a launcher started as a non-zero rank: Lightning's `ddp`
    re-runs the command with LOCAL_RANK/NODE_RANK set, torchrun and SLURM set RANK or
    SLURM_PROCID. Such a rank must not create, refuse or delete the run directory, nor
    write the reports: global rank zero does that."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    if "SLURM_PROCID" in os.environ and "LOCAL_RANK" not in os.environ:
        return int(os.environ["SLURM_PROCID"]) == 0
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("LOCAL_RANK", "NODE_RANK"))


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


def config_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts (both sides' keys)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [prefix or "(top level)"]
    keys = dict.fromkeys([*old, *new])
    return [change for k in keys
            for change in config_changes(old.get(k), new.get(k), f"{prefix}.{k}" if prefix
                                         else str(k))]


def check_resume(exp_dir: Path, exp: Experiment) -> None:
    """Refuse to resume a run directory under a changed config, naming what changed."""
    path = exp_dir / EXPERIMENT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume {exp_dir}: it has no {EXPERIMENT_FILE}")
    old = yaml.safe_load(path.read_text()) or {}
    # through the parser, so that keys added since it was written read as defaults; if it
    # no longer parses, it is compared as written and the differences name what changed
    with contextlib.suppress(ValueError):
        old = parse_experiment(old, source=str(path)).to_dict()
    old_variants = set(old.get("variants") or {})
    changed = [k for k in config_changes(old, exp.to_dict())
               if not k.startswith(RESUMABLE_CHANGES)
               and not (k.startswith("variants.") and k.split(".")[1] not in old_variants)]
    if changed:
        def show(key):
            return f"{key}: {_lookup(old, key)!r} -> {_lookup(exp.to_dict(), key)!r}"
        raise ValueError(f"--resume: {exp_dir} was trained under another config ("
                         + "; ".join(show(k) for k in changed[:5])
                         + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
                         + f"); only {', '.join(RESUMABLE_CHANGES)} and new variants may "
                         "change on a resume (--overwrite redoes the run)")


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _write_yaml(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def train_variant(exp: Experiment, variant: str, exp_dir: Path, resume: bool,
                  console: Console) -> dict | None:
    """Train one variant; return its report entry {probe, step, params, metrics}, or None
    on a non-zero rank of a distributed run (which trains alongside but writes nothing)."""
    vdir = exp_dir / variant
    done = finished_entry(vdir, exp.train.max_steps) if resume else None
    if done is not None:  # its report stands; a refit would only rewrite it
        console.print(f"{variant}: finished at step {done['step']}; skipped")
        return done if is_global_zero() else None
    zero = is_global_zero()
    if zero:
        vdir.mkdir(parents=True, exist_ok=True)
    config = exp.variant_config(variant)

    seed = config["seed"]  # a sweep's grid point may set its own
    L.seed_everything(seed, workers=True, verbose=False)
    train_loader, val_loader = make_loaders(
        exp.data.spec(), exp.data.train_size, exp.data.val_size, exp.data.batch_size,
        seed=seed)
    probe_batch = val_loader.dataset.tensors[0][:exp.monitor.probe_size]  # [P, T], fixed
    module = LMModule(config)
    params = module.model.param_count()
    if zero:
        _write_yaml(vdir / "config.yaml", {**config, "params": params})

    last_ckpt = vdir / "checkpoints" / "last.ckpt"
    ckpt_path = str(last_ckpt) if resume and last_ckpt.is_file() else None
    kwargs = ", ".join(f"{k}={v}" for k, v in config["block"].items() if k != "name")
    console.print(f"[bold]{variant}[/]: {config['block']['name']}({kwargs}), {params:,} parameters"
                  + (f", resuming from {last_ckpt}" if ckpt_path else ""))

    trainer = make_trainer(exp, variant, exp_dir, probe_batch, console)
    start = time.perf_counter()
    final = fit(trainer, module, train_loader, val_loader, ckpt_path, exp)
    seconds = time.perf_counter() - start
    if not trainer.is_global_zero:
        return None
    console.print(f"{variant}: step {trainer.global_step}, "
                  f"val/accuracy {float(final['val/accuracy']):.3f}, "
                  f"val/loss {float(final['val/loss']):.3f} ({seconds:.0f} s)")
    backends = sorted({b.backend for b in module.model.blocks})
    _write_yaml(vdir / "config.yaml", {**config, "params": params, "backend_used": backends})
    return write_variant_report(exp, variant, vdir, params, final, seconds)


def make_trainer(exp: Experiment, variant: str, exp_dir: Path, probe_batch: torch.Tensor,
                 console: Console) -> L.Trainer:
    """Lightning supplies the loop: checkpoints, rank monitor, progress, TensorBoard."""
    t, m, vdir = exp.train, exp.monitor, exp_dir / variant
    monitor = RankMonitor(m.every_n_steps, probe_batch, eps=m.eps, out_path=vdir / "ranks.jsonl",
                          histograms=DEFAULT_HISTOGRAMS if m.histograms else None)
    # a live progress bar on a terminal; in logs and pipes, one line per validation instead
    progress = ([StepProgressBar(console_kwargs={"stderr": True})] if console.is_terminal
                else [ValidationLog(console)])
    return L.Trainer(
        max_steps=t.max_steps,
        max_epochs=-1,  # max_steps alone stops (an epoch bound miscounts after a resume)
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy,
        precision=t.precision,
        logger=TensorBoardLogger(save_dir=str(exp_dir), name=variant, version="",
                                 default_hp_metric=False),
        callbacks=[
            ModelCheckpoint(dirpath=vdir / "checkpoints", save_last=True, save_top_k=0,
                            every_n_train_steps=t.checkpoint_every_n_steps),
            monitor,
            *progress,
        ],
        enable_progress_bar=console.is_terminal,
        val_check_interval=t.val_every_n_steps, check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.grad_clip,
        num_sanity_val_steps=0, enable_model_summary=False,
        default_root_dir=str(vdir),
    )


def fit(trainer: L.Trainer, module: LMModule, train_loader, val_loader,
        ckpt_path: str | None, exp: Experiment) -> dict[str, float]:
    """Fit, leave last.ckpt holding the final weights, and return the final metrics."""
    t = exp.train
    last_ckpt = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    try:
        trainer.fit(module, train_loader, val_loader, ckpt_path=ckpt_path)
    except NonFiniteLoss as e:
        kept = (f"kept the last good checkpoint {last_ckpt}" if last_ckpt.is_file()
                else "no checkpoint had been written yet")
        raise NonFiniteLoss(f"{e}; {kept}") from None
    if trainer.global_step % t.checkpoint_every_n_steps:  # last.ckpt: the final weights
        trainer.save_checkpoint(last_ckpt)
    final = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.global_step % t.val_every_n_steps or "val/accuracy" not in final:
        trainer.validate(module, val_loader, verbose=False)  # the last step was not validated
        final.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    return final


def write_variant_report(exp: Experiment, variant: str, vdir: Path, params: int,
                         final: dict[str, float], seconds: float) -> dict:
    """report.json from the last rank record and the final metrics; returns the entry."""
    record = last_record(vdir / "ranks.jsonl")
    metrics = finite_metrics({k: v for k, v in final.items()
                              if k in ("val/loss", "val/accuracy", "train/loss")})
    metrics["chance_accuracy"] = exp.data.chance_accuracy
    metrics["fit_seconds"] = seconds
    entry = {"probe": {k: v for k, v in record.items() if k != "step"},
             "step": record["step"], "params": params, "metrics": metrics}
    report = budgets.build_report({variant: entry}, experiment=exp.name)
    (vdir / "report.json").write_text(budgets.to_json(report) + "\n")
    return entry


def train_sweep_run(exp: Experiment, run: str, exp_dir: Path, resume: bool,
                    console: Console) -> dict | None:
    """Train one grid point of a sweep; None when it diverged. A learning rate too high
    to train is a finding of the sweep, not the end of it: the run directory keeps the
    last good checkpoint and a note, and the sweep goes on."""
    diverged = exp_dir / run / DIVERGED_FILE
    if resume and diverged.is_file():
        console.print(f"{run}: diverged before ({diverged}); not retried")
        return None
    try:
        return train_variant(exp, run, exp_dir, resume, console)
    except NonFiniteLoss as e:
        if is_global_zero():
            diverged.write_text(f"{e}\n")
        console.print(f"[red]{run}: diverged[/]: {e}")
        return None


def preflight(exp: Experiment) -> None:
    """Run each variant's model once on a few tokens, before the run directory is touched,
    so that a kernel backend that cannot serve here fails the command up front; and read
    a text corpus once, so that an empty or unreadable path does too."""
    if exp.data.task == "text":
        make_splits(exp.data.spec(), 1, 1, exp.seed)
    if exp.train.accelerator != "cpu":
        return  # backends resolve per device; on an accelerator the first step tells
    tokens = torch.zeros(2, exp.data.seq_len, dtype=torch.long)  # [2, T]
    for variant in exp.variants:
        model = build_model(exp.variant_config(variant))
        try:
            with torch.no_grad():
                model(tokens)
        except BackendUnavailable as e:
            raise BackendUnavailable(f"variants.{variant}: {e}") from e


def train_experiment(exp: Experiment, runs_dir: str | Path = "runs", overwrite: bool = False,
                     resume: bool = False, console: Console | None = None) -> dict | None:
    """Train all variants of `exp` under runs_dir/<name>; return the combined report
    (None on a non-zero rank of a distributed run: rank zero writes and reports)."""
    quiet_lightning()
    exp_dir = Path(runs_dir) / exp.name
    preflight(exp)
    if not is_global_zero():
        # a rank that a launcher re-ran (e.g. Lightning's ddp): rank zero prepared the run
        # directory already; train alongside it, silently, and write nothing of our own
        train_all(exp, exp_dir, resume, Console(stderr=True, quiet=True))
        return None
    console = console or Console(stderr=True)
    prepare_run_dir(exp_dir, overwrite=overwrite, resume=resume)
    if resume:
        check_resume(exp_dir, exp)  # before anything in the directory is rewritten
    exp_dir.mkdir(parents=True, exist_ok=True)
    _write_yaml(exp_dir / EXPERIMENT_FILE, exp.to_dict())
    entries, summary = train_all(exp, exp_dir, resume, console)
    return write_reports(exp, exp_dir, entries, summary, console)


def train_all(exp: Experiment, exp_dir: Path, resume: bool,
              console: Console) -> tuple[dict[str, dict], dict | None]:
    """Every variant (or sweep run), then the fine-tune stage: the report entries by name
    and the sweep summary (None without a sweep). Every rank runs the same sequence of
    fits, or a distributed run falls out of step; only rank zero gets entries back."""
    entries = {}
    for i, variant in enumerate(exp.variants, 1):
        console.rule(f"variant {i}/{len(exp.variants)}: {variant}")
        entry = train_sweep_run(exp, variant, exp_dir, resume, console) if exp.sweep \
            else train_variant(exp, variant, exp_dir, resume, console)
        if entry is not None:
            entries[variant] = entry
    zero = is_global_zero()
    if zero and not entries:
        raise NonFiniteLoss(f"every run of the sweep diverged; see {exp_dir}/*/{DIVERGED_FILE}")
    summary = None
    if zero and exp.sweep is not None:  # its grid points only: fine-tunes are not part of it
        summary = summarize(exp, budgets.build_report(entries, experiment=exp.name))
    if exp.finetune is not None:  # the LoRA stage (train/finetune.py), after pretraining
        from .finetune import finetune_experiment
        sources = best_runs(summary) if summary is not None else None
        entries.update(finetune_experiment(exp, exp_dir, resume, console, sources))
    return entries, summary


def write_reports(exp: Experiment, exp_dir: Path, entries: dict[str, dict],
                  summary: dict | None, console: Console) -> dict:
    """report.md (with the sweep's table), sweep.json; returns the combined report."""
    report = budgets.build_report(entries, experiment=exp.name)
    (exp_dir / "report.md").write_text(report_markdown(report))
    if summary is not None:
        path = write_summary(exp_dir, summary)
        with (exp_dir / "report.md").open("a") as f:
            f.write("\n" + sweep_markdown(summary))
        console.print(f"wrote the sweep summary {path}")
    console.print(f"wrote {exp_dir / 'report.md'}; TensorBoard: tensorboard --logdir {exp_dir}")
    return report


__all__ = ["is_global_zero", "prepare_run_dir", "summary_table", "train_experiment",
           "train_variant"]
