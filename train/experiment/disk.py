"""Before the first step: the disk space a run will write, against what is free there.

    notes = disk_preflight(exp, exp_dir, overwrite, resume)   # ValueError when it cannot fit

The need, summed over every run (variants or sweep grid points, then fine-tunes):
  checkpoint   P x b x (1 + s) + 64 KiB    (weights and optimizer state, as the memory
                                            estimate counts them, train/experiment/preflight.py;
                                            plus Lightning's own state and the RNG states; a
                                            fine-tune is counted as its base, a bound: its
                                            optimizer state covers only the adapters)
  ranks.jsonl  M x L x (2 + H) KiB + L x 8 x H x T_p x 12 B   (M = max_steps /
                                            monitor.every_n_steps + 1 records; the last one
                                            keeps the spectra: about 8 quantities of H rows
                                            of T_p values)
  TensorBoard  (max_steps / log_every_n_steps) x 8 x 64 B + M x L x H x 8 x 64 B, and
               M x L x 5 x 4 KiB of histograms when monitor.histograms is on
and once more the largest checkpoint: a save writes the new file beside the old one before
the rename. Only one last.ckpt is kept per run, so the count of checkpoints is the count
of runs. On --resume, what the directory already holds is there already (the need shrinks
by its size, to no less than the largest checkpoint); on --overwrite it is deleted first,
so its size counts as free.

More than is free is refused (nothing is written); less than twice is a warning, since
other processes write to the same disk.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Experiment, lora_name
from ..lm.decoder import max_heads
from ..rundir.files import free_bytes
from .preflight import gib, static_estimate

CHECKPOINT_OVERHEAD = 64 * 2**10
TB_POINT = 64  # bytes per TensorBoard scalar event, about


def disk_preflight(exp: Experiment, exp_dir: Path, overwrite: bool = False,
                   resume: bool = False, free: int | None = None) -> list[str]:
    """Warnings (a list of lines) when the run's estimated need is close to the free
    space; a ValueError naming both when it exceeds it. `free` replaces the filesystem's
    figure, for tests."""
    need, largest = disk_need(exp)
    present = tree_bytes(exp_dir)
    if resume:
        need = max(largest, need - present)
    free = free_bytes(exp_dir) if free is None else free
    if free is None:
        return []
    if overwrite:
        free += present
    shown = (f"the run in {exp_dir} needs about {gib(need)} of disk (checkpoints, rank "
             f"records, TensorBoard events), and {gib(free)} is free there")
    if need > free:
        raise ValueError(f"{shown}; free some space, lower train.max_steps or the model's "
                         "size, or set --runs-dir to another disk")
    return [f"{shown}: less than twice the need"] if 2 * need > free else []


def disk_need(exp: Experiment) -> tuple[int, int]:
    """(bytes the whole experiment writes, the largest single checkpoint)."""
    checkpoints = {run: checkpoint_bytes(exp, run) for run in exp.variants}
    logs = sum(log_bytes(exp, run) for run in exp.variants)
    if exp.finetune is not None:
        runs = {v: next(r for r, x in exp.variants.items() if (x.base or r) == v)
                for v in exp.finetune_variants()}
        view = exp.finetune_view()
        for variant, run in runs.items():
            per_r = checkpoint_bytes(exp, run)
            for r in exp.finetune.ranks:
                checkpoints[lora_name(variant, r)] = per_r
                logs += log_bytes(view, run)
    largest = max(checkpoints.values(), default=0)
    return sum(checkpoints.values()) + largest + logs, largest


def checkpoint_bytes(exp: Experiment, run: str) -> int:
    estimate = static_estimate(exp, run, exp.variants[run].base or run)
    return estimate.weights + estimate.optimizer + CHECKPOINT_OVERHEAD


def log_bytes(exp: Experiment, run: str) -> int:
    """ranks.jsonl and TensorBoard events of one run (the module docstring)."""
    config = exp.variant_config(run)
    t, m = exp.train, exp.monitor
    L, H = config["model"]["n_layers"], max_heads(config)
    T_p = min(exp.data.seq_len, m.probe_len)
    records = t.max_steps // m.every_n_steps + 1
    ranks = records * L * (2 + H) * 2**10 + L * 8 * H * T_p * 12
    events = (t.max_steps // t.log_every_n_steps) * 8 * TB_POINT + records * L * H * 8 * TB_POINT
    if m.histograms:
        events += records * L * 5 * 4 * 2**10
    return ranks + events


def tree_bytes(root: Path) -> int:
    """The bytes of every file under `root` (0 when it does not exist)."""
    root = Path(root)
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
