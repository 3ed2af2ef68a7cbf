"""One fit: the single path every stage trains through (a variant, a sweep's grid point, a
LoRA fine-tune), given a small RunSpec.

    entry = fit_run(RunSpec(name, exp, config), exp_dir, resume, console)

writes runs/<experiment>/<name>/: config.yaml, checkpoints/last.ckpt, ranks.jsonl,
report.json, TensorBoard event files. Lightning supplies the loop, devices, precision,
checkpoints and the progress bar; this module wires the pieces together. Every run
starts from its config's seed, sees the same data in the same order and runs the train
section's max_steps.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from rich.console import Console
from torch.utils.data import DataLoader

import budgets

from .callbacks import DEFAULT_HISTOGRAMS, RankMonitor
from .config import Experiment
from .data import make_loaders
from .io import write_yaml
from .module import LMModule, NonFiniteLoss
from .results import finished_entry, finite_metrics, last_record


@dataclass(frozen=True)
class RunSpec:
    """What one fit needs: the run directory's name, the experiment as this run sees it
    (its data, train and monitor sections: a fine-tune's are the second task's), the
    resolved config written to config.yaml, and how the module is built when it is not
    LMModule(config) (a fine-tune loads its base weights and attaches adapters; it gets
    the validation loader, on which it measures its zero-shot figures)."""

    name: str
    exp: Experiment
    config: dict[str, Any]
    build: Callable[[DataLoader], LMModule] | None = None

    def module(self, val_loader: DataLoader) -> LMModule:
        return self.build(val_loader) if self.build else LMModule(self.config)


def fit_run(spec: RunSpec, exp_dir: Path, resume: bool, console: Console) -> dict | None:
    """Train one run; return its report entry {probe, step, params, metrics}, or None on a
    non-zero rank of a distributed run (which trains alongside but writes nothing)."""
    vdir = exp_dir / spec.name
    done = finished_entry(vdir, spec.exp.train.max_steps) if resume else None
    if done is not None:  # its report stands; a refit would only rewrite it
        console.print(f"{spec.name}: finished at step {done['step']}; skipped")
        return done if is_global_zero() else None
    L.seed_everything(spec.config["seed"], workers=True, verbose=False)
    train_loader, val_loader, probe_batch = seeded_data(spec.exp, spec.config["seed"])
    module = spec.module(val_loader)
    params = module.model.param_count()
    if is_global_zero():
        vdir.mkdir(parents=True, exist_ok=True)
        write_yaml(vdir / "config.yaml", {**spec.config, "params": params})
    last_ckpt = vdir / "checkpoints" / "last.ckpt"
    ckpt_path = str(last_ckpt) if resume and last_ckpt.is_file() else None
    console.print(describe(spec, params)
                  + (f", resuming from {last_ckpt}" if ckpt_path else ""))
    trainer = make_trainer(spec.exp, spec.name, exp_dir, probe_batch, console)
    start = time.perf_counter()
    final = fit_and_validate(trainer, module, train_loader, val_loader, ckpt_path, spec.exp)
    seconds = time.perf_counter() - start
    if not trainer.is_global_zero:
        return None
    console.print(outcome(spec, trainer.global_step, final, seconds))
    backends = sorted({b.backend for b in module.model.blocks})
    write_yaml(vdir / "config.yaml", {**spec.config, "params": params, "backend_used": backends})
    return write_run_report(spec.exp, spec.name, vdir, params, final, seconds)


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


def seeded_data(exp: Experiment, seed: int) -> tuple[DataLoader, DataLoader, torch.Tensor]:
    """Train and validation loaders of exp.data drawn from `seed`, and the monitor's fixed
    probe batch: the first monitor.probe_size validation examples cut to their first
    monitor.probe_len tokens, [P, min(T, probe_len)]."""
    data = exp.data
    train_loader, val_loader = make_loaders(data.spec(), data.train_size, data.val_size,
                                            data.batch_size, seed=seed)
    m = exp.monitor
    return train_loader, val_loader, val_loader.dataset.tensors[0][:m.probe_size, :m.probe_len]


def describe(spec: RunSpec, params: int) -> str:
    """The line announcing a run: its block and size, or for a fine-tune its adapters."""
    block, f = spec.config["block"], spec.config.get("finetune")
    if f is None:
        kwargs = ", ".join(f"{k}={v}" for k, v in block.items() if k != "name")
        return f"[bold]{spec.name}[/]: {block['name']}({kwargs}), {params:,} parameters"
    return (f"[bold]{spec.name}[/]: LoRA r={f['r']} alpha={f['alpha']:g} on {len(f['adapted'])} "
            f"projections ({', '.join(f['targets'])}) of {f['base_variant']} (step "
            f"{f['base_step']}), {f['trainable_params']:,} trainable of {params:,} parameters")


def outcome(spec: RunSpec, step: int, final: dict[str, float], seconds: float) -> str:
    """The line closing a run: its final figures (a fine-tune's beside its zero-shot)."""
    zero_shot = spec.config.get("finetune", {}).get("zero_shot")
    before = "" if zero_shot is None else f" (zero-shot {zero_shot['val/accuracy']:.3f})"
    return (f"{spec.name}: step {step}, val/accuracy {float(final['val/accuracy']):.3f}{before}, "
            f"val/loss {float(final['val/loss']):.3f} ({seconds:.0f} s)")


# ---------------------------------------------------------------- Lightning

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


def make_trainer(exp: Experiment, name: str, exp_dir: Path, probe_batch: torch.Tensor,
                 console: Console) -> L.Trainer:
    """Lightning supplies the loop: checkpoints, rank monitor, progress, TensorBoard."""
    t, m, vdir = exp.train, exp.monitor, exp_dir / name
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
        logger=TensorBoardLogger(save_dir=str(exp_dir), name=name, version="",
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


def fit_and_validate(trainer: L.Trainer, module: LMModule, train_loader, val_loader,
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


def write_run_report(exp: Experiment, name: str, vdir: Path, params: int,
                     final: dict[str, float], seconds: float) -> dict:
    """report.json from the last rank record and the final metrics; returns the entry."""
    record = last_record(vdir / "ranks.jsonl")
    metrics = finite_metrics({k: v for k, v in final.items()
                              if k in ("val/loss", "val/accuracy", "train/loss")})
    metrics["chance_accuracy"] = exp.data.chance_accuracy
    metrics["fit_seconds"] = seconds
    entry = {"probe": {k: v for k, v in record.items() if k != "step"},
             "step": record["step"], "params": params, "metrics": metrics}
    report = budgets.build_report({name: entry}, experiment=exp.name)
    (vdir / "report.json").write_text(budgets.to_json(report) + "\n")
    return entry
