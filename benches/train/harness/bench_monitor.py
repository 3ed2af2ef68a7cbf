"""Benchmarks of the training harness: figures measured in one run, as ratios.

    python -m benches.train.harness.bench_monitor monitor [--config configs/quick.yaml]
        [--variant mha] [--steps N]

`monitor` trains one variant of the config twice in this process, with the same seed,
data and data order: once without the RankMonitor and once with it at the config's
`monitor.every_n_steps` (probe size, eps and histograms as configured), both with
validation and a TensorBoard logger as `rankzoo train` has them (no checkpoints in
either). It prints the fit seconds of each and the monitor's overhead as a percentage of
the fit without it, two ways: the difference of the two fits (everything the monitor
costs, but as noisy as the machine) and the seconds spent inside the monitor's
measurements (the probes, ranks.jsonl writes and logging; steadier). A short warm-up fit
runs first so that neither timed fit pays the process's one-off costs. Everything is
written into a temporary directory that is removed afterwards; runs/ is not touched.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from rich.console import Console

from train.config import Experiment, load_experiment
from train.harness.callbacks import DEFAULT_HISTOGRAMS, RankMonitor
from train.harness.fit import quiet_lightning, seeded_data
from train.harness.module import LMModule
from train.render.table import TableSpec, columns, to_rich

TARGET_PERCENT = 5.0  # the monitor's budget at its default interval


class TimedMonitor(RankMonitor):
    """A RankMonitor that adds up the seconds its measurements take."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = 0.0
        self.calls = 0

    def measure(self, trainer, pl_module):
        start = time.perf_counter()
        record = super().measure(trainer, pl_module)
        if record is not None:
            self.seconds += time.perf_counter() - start
            self.calls += 1
        return record


def fit_seconds(exp: Experiment, variant: str, steps: int, root: Path, name: str,
                monitor: bool) -> tuple[float, TimedMonitor | None]:
    """Train `variant` for `steps` steps under root/name; (fit seconds, the monitor)."""
    t, m = exp.train, exp.monitor
    L.seed_everything(exp.seed, workers=True, verbose=False)
    train_loader, val_loader, probe_batch = seeded_data(exp, exp.seed)
    module = LMModule(exp.variant_config(variant))
    callbacks = []
    timed = None
    if monitor:
        timed = TimedMonitor(m.every_n_steps, probe_batch, eps=m.eps,
                             out_path=root / name / "ranks.jsonl",
                             histograms=DEFAULT_HISTOGRAMS if m.histograms else None)
        callbacks.append(timed)
    trainer = L.Trainer(
        max_steps=steps, max_epochs=-1,
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy,
        precision=t.precision,
        logger=TensorBoardLogger(save_dir=str(root), name=name, version="",
                                 default_hp_metric=False),
        callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
        val_check_interval=min(t.val_every_n_steps, steps), check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps, gradient_clip_val=t.grad_clip,
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=str(root / name),
    )
    start = time.perf_counter()
    trainer.fit(module, train_loader, val_loader)
    return time.perf_counter() - start, timed


def bench_monitor(args: argparse.Namespace, console: Console) -> dict:
    exp = load_experiment(args.config)
    variant = args.variant or next(iter(exp.variants))
    if variant not in exp.variants:
        raise ValueError(f"--variant {variant!r} is not in {args.config}; "
                         f"one of {list(exp.variants)}")
    steps = args.steps or exp.train.max_steps
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    quiet_lightning()
    interval = exp.monitor.every_n_steps
    console.print(f"[bold]{variant}[/] of {args.config}: {steps} steps, twice "
                  f"(without / with RankMonitor every {interval} steps) ...", highlight=False)
    with tempfile.TemporaryDirectory(prefix="rankzoo-bench-") as tmp:
        root = Path(tmp)
        fit_seconds(exp, variant, min(steps, 5), root, "warmup", monitor=True)
        without, _ = fit_seconds(exp, variant, steps, root, "without", monitor=False)
        with_, timed = fit_seconds(exp, variant, steps, root, "with", monitor=True)
    diff_pct = 100 * (with_ - without) / without
    inside_pct = 100 * timed.seconds / without

    table = TableSpec(
        title=f"RankMonitor overhead: {variant}, {steps} steps, probe every {interval} "
              f"steps ({exp.monitor.probe_size} examples)",
        columns=columns("fit", "seconds", "probes", "seconds in monitor",
                        numeric=("seconds", "probes", "seconds in monitor")),
        rows=[("without monitor", f"{without:.1f}", "0", "-"),
              ("with monitor", f"{with_:.1f}", str(timed.calls), f"{timed.seconds:.2f}")])
    console.print(to_rich(table))
    verdict = "within" if max(diff_pct, inside_pct) <= TARGET_PERCENT else "over"
    console.print(f"overhead (fit difference): {diff_pct:+.1f}%", highlight=False)
    console.print(f"overhead (time in monitor): {inside_pct:.1f}% "
                  f"({1e3 * timed.seconds / max(timed.calls, 1):.0f} ms per probe)",
                  highlight=False)
    console.print(f"{verdict} the {TARGET_PERCENT:.0f}% target", highlight=False)
    return {"without_s": without, "with_s": with_, "monitor_s": timed.seconds,
            "probes": timed.calls, "overhead_pct": diff_pct, "monitor_pct": inside_pct}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.train.harness.bench_monitor",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    monitor = sub.add_parser("monitor", help="RankMonitor overhead on one variant's training")
    monitor.add_argument("--config", default="configs/quick.yaml")
    monitor.add_argument("--variant", default=None, help="default: the config's first")
    monitor.add_argument("--steps", type=int, default=None,
                         help="default: the config's train.max_steps")
    args = parser.parse_args(argv)
    console = Console()
    try:
        bench_monitor(args, console)
    except (ValueError, FileNotFoundError) as e:
        print(f"python -m benches.train.harness.bench_monitor: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
