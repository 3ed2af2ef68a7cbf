"""One fit: the single path every stage trains through (a variant, a sweep's grid point, a
LoRA fine-tune), given a small RunSpec.

    entry = fit_run(RunSpec(name, exp, config), exp_dir, resume, console)

writes runs/<experiment>/<name>/: config.yaml, checkpoints/last.ckpt, ranks.jsonl,
report.json, status.json (train/rundir/status.py), TensorBoard event files. Lightning supplies
the loop, devices, precision and the progress bar; this module wires the pieces
together. Every run starts from its config's seed, sees the same data in the same order
and runs the train section's max_steps. A resume continues from last.ckpt exactly where
the interrupted run was (train/harness/checkpoint.py: data position, RNG, dropped run files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from rich.console import Console
from torch.utils.data import DataLoader

import budgets

from ..config import Experiment, TrainConfig
from ..data import EpochBatches, make_loaders
from ..rundir.files import DISK_ERRORS, WriteFailed, write_failed, write_text, write_yaml
from ..rundir.layout import VariantFiles
from ..rundir.read import (
    check_shapes,
    finished_entry,
    finite_metrics,
    last_record,
    pattern_of,
    run_config,
)
from ..rundir.status import read_status, run_status, status_line, write_status
from .callbacks import DEFAULT_HISTOGRAMS, RankMonitor
from .checkpoint import (
    StepCheckpoint,
    TrainScalars,
    drop_records_from,
    resume_checkpoint,
)
from .module import LMModule, NonFiniteLoss
from .sharding import fsdp_strategy
from .stop import Terminated


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


def ended(e: BaseException, vdir: Path, start: int, trainer) -> BaseException:
    """What a fit that stopped with `e` raises, its status recorded first: ^C as the CLI's
    "interrupted" (exit code 130), a full or read-only disk (a library's own writes too,
    TensorBoard's events) as one WriteFailed line, anything else as it came."""
    e = interrupted(e, trainer)
    record_end(vdir, e, start if trainer is None else trainer.global_step)
    if isinstance(e, OSError) and e.errno in DISK_ERRORS:
        failed = write_failed(Path(e.filename or vdir), e)
        return WriteFailed(f"{failed}; --resume continues from the last checkpoint",
                           failed.errno, failed.filename)
    return e


def fit_run(spec: RunSpec, exp_dir: Path, resume: bool, console: Console,
            labelled: bool = False) -> dict | None:
    """Train one run; return its report entry {probe, step, params, metrics}, or None on a
    non-zero rank of a distributed run (which trains alongside but writes nothing).
    `labelled`: its validation lines name the run, as when runs train side by side
    (train/experiment/parallel.py) and their lines interleave."""
    vdir = exp_dir / spec.name
    done = finished_entry(vdir, spec.exp.train.max_steps) if resume else None
    if done is not None:  # its report stands; a refit would only rewrite it
        console.print(f"{spec.name}: finished at step {done['step']}; skipped")
        if not is_global_zero():
            return None
        mark_finished(vdir, done["step"])
        return done
    L.seed_everything(spec.config["seed"], workers=True, verbose=False)
    train_loader, val_loader, probe_batch = seeded_data(spec.exp, spec.config["seed"])
    module = spec.module(val_loader)
    params = module.model.param_count()
    files = VariantFiles(vdir)
    last_ckpt = files.checkpoint
    ckpt_path = str(last_ckpt) if resume and last_ckpt.is_file() else None
    resumed = resume_checkpoint(last_ckpt) if ckpt_path else None
    start = resumed.step if resumed else 0
    if resumed:  # another size than the config's: one line naming the file, not Lightning's
        check_shapes(module, resumed.state_dict, last_ckpt)
    if is_global_zero():
        vdir.mkdir(parents=True, exist_ok=True)
        write_yaml(files.config, {**spec.config, "params": params})
        if resume:  # what the interrupted run wrote after its checkpoint
            drop_records_from(files.ranks, after(start, ckpt_path))
        write_status(vdir, "running", start)
    console.print(describe(spec, params)
                  + (f", resuming from {last_ckpt} (step {start})" if ckpt_path else ""))
    trainer = None
    if resume:
        after_event_files(vdir)
    try:
        trainer = make_trainer(spec.exp, spec.name, exp_dir, probe_batch, console,
                               batches=train_loader.batch_sampler,
                               purge_step=after(start, ckpt_path) if resume else None,
                               label=spec.name if labelled else None)
        began = time.perf_counter()
        final = fit_and_validate(trainer, module, train_loader, val_loader, ckpt_path)
        seconds = time.perf_counter() - began
    except BaseException as e:  # the status says how it ended, whatever ended it
        out = ended(e, vdir, start, trainer)
        if out is e:
            raise
        raise out from None
    if not trainer.is_global_zero:
        return None
    rate = tokens_per_second(spec.exp, trainer.global_step - start, seconds)
    console.print(outcome(spec, trainer.global_step, final, seconds, rate))
    backends = sorted({b.backend for b in module.model.blocks})
    write_yaml(files.config, {**spec.config, "params": params, "backend_used": backends})
    entry = write_run_report(spec.exp, spec.name, vdir, params, final, seconds, rate,
                             seed=spec.config["seed"])
    write_status(vdir, "finished", trainer.global_step)
    console.print(f"{spec.name}: {status_line(entry['status'])}")
    return entry


def after(start: int, ckpt_path: str | None) -> int:
    """The first step a resume from `start` logs again: everything a run logs for step k
    (train and validation scalars, rank records and points, all at step k) is on disk
    before the checkpoint of step k is written, so a resume from that checkpoint keeps
    step k and redoes k + 1 on; without a checkpoint it starts over, from step 0."""
    return start + 1 if ckpt_path else 0


def after_event_files(vdir: Path) -> None:
    """Wait (a second at most) until this second is past the newest TensorBoard event
    file's in vdir. TensorBoard reads a run's files in name order, and the name starts
    with the writer's second, then host and pid: a resume that starts within the second of
    the killed run's writer could sort first (by pid), and its points would show before
    the ones they follow."""
    stamps = [int(part) for f in vdir.glob("events.out.tfevents.*")
              if (part := f.name.split(".")[3]).isdigit()]
    wait = max(stamps, default=0) + 1 - time.time()
    if wait > 0:
        time.sleep(wait)


def mark_finished(vdir: Path, step: int) -> None:
    """A run killed after its report but before its status said so: say so now (a status
    that already says finished is left as it is)."""
    with contextlib.suppress(ValueError):  # unreadable: rewritten
        if (read_status(vdir) or {}).get("state") == "finished":
            return
    write_status(vdir, "finished", step)


def interrupted(error: BaseException, trainer: L.Trainer | None) -> BaseException:
    """^C as a KeyboardInterrupt again: Lightning catches it, shuts down, ignores SIGINT
    from then on and calls sys.exit(1), the code a diverged run ends with."""
    if not (isinstance(error, SystemExit) and trainer is not None and trainer.interrupted):
        return error
    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second ^C works again
    return KeyboardInterrupt()


def record_end(vdir: Path, error: BaseException, step: int) -> None:
    """status.json for a fit that raised: diverged (a non-finite loss), else stopped."""
    if not is_global_zero() or not vdir.is_dir():
        return
    state = "diverged" if isinstance(error, NonFiniteLoss) else "stopped"
    if isinstance(error, Terminated):  # SIGTERM or SIGHUP (train/harness/stop.py)
        reason = f"interrupted ({error})"
    elif isinstance(error, (KeyboardInterrupt, SystemExit)):  # ^C, or an exit from inside
        reason = f"interrupted ({type(error).__name__})"
    else:
        message = str(error).splitlines()[0][:300] if str(error) else ""
        reason = f"{type(error).__name__}: {message}".rstrip(": ")
    with contextlib.suppress(WriteFailed):  # a full disk: the error that ended the fit says so
        write_status(vdir, state, step, reason=reason)


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
                                            data.batch_size, seed=seed,
                                            micro_batches=exp.train.accumulate_grad_batches)
    m = exp.monitor
    return train_loader, val_loader, val_loader.dataset.tensors[0][:m.probe_size, :m.probe_len]


def blocks_text(config: dict) -> str:
    """`softmax(n_heads=4)`, or a layer pattern's `local, global` with each label's block."""
    def call(spec: dict) -> str:
        kwargs = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
        return f"{spec['name']}({kwargs})"
    if "layers" not in config:
        return call(config["block"])
    seen = dict(zip(config["pattern"], config["layers"], strict=True))
    labels = ", ".join(config["pattern"])  # no brackets: rich would read them as markup
    return f"layers ({labels}) with " + "; ".join(f"{k} = {call(v)}" for k, v in seen.items())


def describe(spec: RunSpec, params: int) -> str:
    """The line announcing a run: its block and size, or for a fine-tune its adapters."""
    f = spec.config.get("finetune")
    if f is None:
        return f"[bold]{spec.name}[/]: {blocks_text(spec.config)}, {params:,} parameters"
    return (f"[bold]{spec.name}[/]: LoRA r={f['r']} alpha={f['alpha']:g} on {len(f['adapted'])} "
            f"projections ({', '.join(f['targets'])}) of {f['base_variant']} (step "
            f"{f['base_step']}), {f['trainable_params']:,} trainable of {params:,} parameters")


def outcome(spec: RunSpec, step: int, final: dict[str, float], seconds: float,
            rate: float | None = None) -> str:
    """The line closing a run: its final figures (a fine-tune's beside its zero-shot), the
    fit's seconds and tokens per second (of this process: under `rankzoo train --jobs`,
    on its worker's threads, beside the other workers)."""
    zero_shot = spec.config.get("finetune", {}).get("zero_shot")
    before = "" if zero_shot is None else f" (zero-shot {zero_shot['val/accuracy']:.3f})"
    speed = "" if rate is None else f", {rate:,.0f} tokens/s"
    return (f"{spec.name}: step {step}, val/accuracy {float(final['val/accuracy']):.3f}{before}, "
            f"val/loss {float(final['val/loss']):.3f} ({seconds:.0f} s{speed})")


def tokens_per_step(exp: Experiment) -> int:
    """The tokens one optimizer step trains on, all ranks together: data.batch_size is the
    global batch (train/data/loaders.py EpochBatches shares it among the ranks)."""
    return exp.data.batch_size * exp.data.seq_len


def tokens_per_second(exp: Experiment, steps: int, seconds: float) -> float | None:
    """Training throughput over a fit's wall time (its validations and rank measurements
    included): the tokens of the `steps` steps it took, per second; None for no steps."""
    if steps <= 0 or seconds <= 0:
        return None
    return steps * tokens_per_step(exp) / seconds


# ---------------------------------------------------------------- Lightning

def quiet_lightning() -> None:
    """Keep Lightning to warnings, and drop the ones that do not apply to small CPU runs."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (".*does not have many workers.*",
                    ".*smaller than the logging interval.*",
                    ".*Checkpoint directory .* exists and is not empty.*",
                    ".*treespec, LeafSpec.*",
                    # the train loader is: StepCheckpoint moves its EpochBatches to the
                    # checkpoint's step, a way Lightning does not know of
                    ".*your dataloader is not resumable.*"):
        warnings.filterwarnings("ignore", message=pattern)


class StepProgressBar(RichProgressBar):
    """Lightning's rich bar, without the "Epoch 0/-2" it shows when only max_steps is set."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"Epoch {current_epoch}"


class ValidationLog(Callback):
    """One line per validation: the plain-text stand-in for the progress bar, with the
    tokens per second since the line before (or the start of training); `label` (the
    run's name) starts the line where several runs print at once."""

    def __init__(self, console: Console, tokens_per_step: int = 0, label: str | None = None):
        self.console, self.tokens_per_step = console, tokens_per_step
        self.prefix = f"{label} " if label else ""
        self.since: tuple[float, int] | None = None  # (perf_counter, global step) of the last line

    def on_train_start(self, trainer, pl_module) -> None:
        self.since = (time.perf_counter(), trainer.global_step)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        shown = " ".join(f"{k} {float(v):.4g}" for k, v in trainer.callback_metrics.items()
                         if k.startswith(("train/loss", "val/")))
        now, step = time.perf_counter(), trainer.global_step
        if self.since is not None and step > self.since[1] and self.tokens_per_step:
            rate = (step - self.since[1]) * self.tokens_per_step / (now - self.since[0])
            shown += f" · {rate:,.0f} tokens/s"
        self.since = (now, step)
        self.console.print(f"  {self.prefix}step {step}: {shown}")


def make_trainer(exp: Experiment, name: str, exp_dir: Path, probe_batch: torch.Tensor,
                 console: Console, batches: EpochBatches | None = None,
                 purge_step: int | None = None, label: str | None = None) -> L.Trainer:
    """Lightning supplies the loop; checkpoints, rank monitor, progress, TensorBoard. On a
    resume, `purge_step` is the step after the checkpoint's (fit.after): TensorBoard hides
    the points that the interrupted run logged from it on. `batches`, the train loader's
    sampler, is moved to the checkpoint's step when Lightning loads it. Every TensorBoard
    point of step k sits at k, as the console shows it: train and validation scalars
    (train/harness/checkpoint.py TrainScalars), rank scalars and histograms (RankMonitor).
    `label` starts each validation line (ValidationLog) where runs print side by side."""
    t, m, vdir = exp.train, exp.monitor, exp_dir / name
    files = VariantFiles(vdir)
    monitor = RankMonitor(m.every_n_steps, probe_batch, eps=m.eps, out_path=files.ranks,
                          histograms=DEFAULT_HISTOGRAMS if m.histograms else None)
    # a live progress bar on a terminal; in logs and pipes, one line per validation instead
    progress = ([StepProgressBar(console_kwargs={"stderr": True})] if console.is_terminal
                else [ValidationLog(console, tokens_per_step(exp), label)])
    saver = StepCheckpoint(files.checkpoint, t.checkpoint_every_n_steps,
                           t.val_every_n_steps, batches,
                           on_save=lambda step: write_status(vdir, "running", step))
    return L.Trainer(
        max_steps=t.max_steps,
        max_epochs=-1,  # max_steps alone stops (an epoch bound miscounts after a resume)
        **device_settings(t),
        # micro-batches per step: EpochBatches cuts each rank's share of the batch to match
        accumulate_grad_batches=t.accumulate_grad_batches,
        # EpochBatches shards the train split itself: Lightning's distributed sampler would
        # replace it and could not start mid-epoch (each rank validates the whole split)
        use_distributed_sampler=False,
        logger=TensorBoardLogger(save_dir=str(exp_dir), name=name, version="",
                                 default_hp_metric=False,
                                 **({} if purge_step is None else {"purge_step": purge_step})),
        enable_checkpointing=False,  # StepCheckpoint, last in the list: after the others
        callbacks=[monitor, TrainScalars(t.log_every_n_steps), *progress, saver],
        enable_progress_bar=console.is_terminal,
        # Lightning counts the interval in batches: micro-batches under accumulation
        val_check_interval=t.val_every_n_steps * t.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps,
        gradient_clip_val=t.grad_clip,
        num_sanity_val_steps=0, enable_model_summary=False,
        default_root_dir=str(vdir),
    )


def device_settings(t: TrainConfig) -> dict[str, Any]:
    """The Trainer's device arguments; fsdp, which Lightning names no strategy by, is its
    ModelParallelStrategy as FSDP2 (train/harness/sharding.py)."""
    strategy = fsdp_strategy(t) if t.strategy == "fsdp" else t.strategy
    return {"accelerator": t.accelerator, "devices": t.devices, "strategy": strategy,
            "precision": t.precision, "num_nodes": t.num_nodes}


def check_trainer(t: TrainConfig, section: str = "train") -> None:
    """Build a Trainer from the device settings and drop it: whatever Lightning refuses
    (an accelerator, strategy or precision this machine cannot run) is a ValueError
    naming the settings, raised before the run directory is touched."""
    try:
        L.Trainer(**device_settings(t), logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
    except Exception as e:  # Lightning raises several types, all meaning "not this setting"
        shown = ", ".join(f"{section}.{k}={getattr(t, k)!r}" for k in device_settings(t))
        message = " ".join(str(e).split())
        raise ValueError(f"Lightning refuses {shown}: {message}") from None


def fit_and_validate(trainer: L.Trainer, module: LMModule, train_loader, val_loader,
                     ckpt_path: str | None) -> dict[str, float]:
    """Fit, leave last.ckpt holding the final weights, and return the final metrics."""
    saver = next(c for c in trainer.callbacks if isinstance(c, StepCheckpoint))
    try:
        trainer.fit(module, train_loader, val_loader, ckpt_path=ckpt_path)
    except NonFiniteLoss as e:
        kept = (f"kept the last good checkpoint {saver.path}" if saver.path.is_file()
                else "no checkpoint had been written yet")
        raise NonFiniteLoss(f"{e}; {kept}") from None
    for monitor in trainer.callbacks:  # a fit resumed at its last step measures nothing
        if isinstance(monitor, RankMonitor):
            monitor.measure(trainer, module)
    # the metrics of a checkpoint resumed at its last step, updated by whatever ran since;
    # "step" is the step the last validation logged (LMModule.on_validation_epoch_end)
    final = {**saver.restored_metrics,
             **{k: float(v) for k, v in trainer.callback_metrics.items()}}
    if final.get("step") != trainer.global_step or "val/accuracy" not in final:
        trainer.validate(module, val_loader, verbose=False)  # the last step was not validated
        final.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    # last.ckpt: the final weights, saved after everything the last step logs (a resume
    # from it keeps that step's points, fit.after) and holding the final metrics
    if trainer.global_step != saver.saved_step:
        saver.save(trainer, final)  # (a validation above left only its own callback metrics)
    return final


def write_run_report(exp: Experiment, name: str, vdir: Path, params: int,
                     final: dict[str, float], seconds: float, rate: float | None,
                     seed: int) -> dict:
    """report.json from the last rank record and the final metrics (with the fit's
    seconds and tokens per second, `rate`, where it took steps); returns the entry, with
    the run's status: finished, and whether it learned against the baseline of its task
    drawn from `seed` (train/rundir/status.py run_status)."""
    record = last_record(VariantFiles(vdir).ranks)
    # the per-count accuracies (val/accuracy/kv<n>) feed the recall-vs-capacity view
    metrics = finite_metrics({k: v for k, v in final.items()
                              if k in ("val/loss", "val/accuracy", "train/loss")
                              or k.startswith("val/accuracy/kv")})
    metrics["chance_accuracy"] = exp.data.chance_accuracy
    metrics["fit_seconds"] = seconds
    if rate is not None:
        metrics["tokens_per_second"] = rate
    status = run_status("finished", record["step"], exp.train.max_steps, metrics,
                        exp.data.spec().baseline(seed))
    entry = {"probe": {k: v for k, v in record.items() if k != "step"},
             "step": record["step"], "params": params, "metrics": metrics, "status": status,
             **pattern_of(run_config(vdir))}
    report = budgets.build_report({name: entry}, experiment=exp.name)
    report["variants"][0]["status"] = status  # build_report copies it too, where it does
    write_text(VariantFiles(vdir).report, budgets.to_json(report) + "\n")
    return entry
