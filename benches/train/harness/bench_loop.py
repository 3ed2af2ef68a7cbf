"""The harness against a plain PyTorch loop: `rankzoo train` beside the loop a user would write.

    python -m benches.train.harness.bench_loop [--config configs/quick.yaml]
        [--variant mha gqa ...] [--steps N] [--repeats R] [--threads T] [--device cuda]
        [--harness-tree DIR ...]

For each variant (default: every variant of the config) it times two processes from start
to exit, in turns (the order rotates from one repeat to the next, so that drift in the
machine's load reaches both alike):

- the harness: `python -m train.cli train CONFIG` on that variant alone, at the width the
  config's parameter matching gives it beside the others (its `model.d_mlp`, matching
  off), for --steps steps: validation, rank monitor, checkpoints, TensorBoard, report;
- a plain loop: the same DecoderLM built from the same resolved config and seed, the same
  optimizer (train/harness/optim.py's: e.g. Muon on the hidden matrices with AdamW on the
  rest), learning-rate schedule, gradient clipping, batches and steps, and nothing else:
  no validation, logging or checkpoints, and no Lightning.

It prints per variant the seconds of each process (its fastest of --repeats: the least
disturbed by other work on the machine), their ratio and the ratio of their CPU seconds
(steadier where others load the machine), the tokens per second of each (the tokens
trained over the process's seconds), then where the time goes: the training alone (the
harness's fit, the loop's steps), the rest of each process (start, imports, set-up, the
report), and the final training loss of each, equal where the two compute the same.
--threads sets both processes' intra-op threads (default: torch's choice); --device cuda
trains both on the GPU; --harness-tree DIR adds the harness of another source tree (an
older commit's `git archive`, run with PYTHONPATH=DIR) beside this one, against the same
loop, to compare versions of the harness. Everything is written into a temporary
directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from train.config import Experiment, load_experiment
from train.data import IGNORE, make_loaders
from train.harness.muon import Muon
from train.harness.optim import build_optimizer, build_schedule
from train.lm.decoder import build_model

TARGET_RATIO = 1.6  # the harness's budget against the plain loop, process start included
PROG = "python -m benches.train.harness.bench_loop"
DEVICES = {"cpu": ["train.accelerator=cpu"],  # --device -> the run's train settings
           "cuda": ["train.accelerator=cuda", "train.devices=1"]}
AUTOCAST = {"32-true": None, "32": None, "bf16-mixed": torch.bfloat16}  # the loop's precisions


@dataclass(frozen=True)
class Timing:
    """One process: its wall seconds (start to exit), the seconds of its training alone
    (the harness's fit, the loop's steps), the tokens it trained, its last train loss and
    its CPU seconds (user and system, every thread: steadier than wall time on a machine
    that others load too)."""

    seconds: float
    train_seconds: float
    tokens: int
    loss: float
    cpu: float = 0.0


# ---------------------------------------------------------------- the variant alone

def alone_overrides(exp: Experiment, config: str, variant: str, steps: int,
                    device: str) -> list[str]:
    """The overrides that train `variant` of `config` alone as it trains beside the others:
    its spec, the MLP width matching gave it (matching off: alone it would match itself),
    `steps` steps, on `device`. Checked: it resolves to the variant's config in the whole
    experiment (but for the steps and the device)."""
    resolved = exp.variant_config(variant)
    overrides = [f"variants={json.dumps({variant: exp.to_dict()['variants'][variant]})}",
                 "match.params=false", f"model.d_mlp={resolved['model']['d_mlp']}",
                 f"train.max_steps={steps}", *DEVICES[device]]
    alone = load_experiment(config, overrides).variant_config(variant)
    moved = {k: alone["train"][k] for k in ("max_steps", "accelerator", "devices")}
    want = {**resolved, "train": {**resolved["train"], **moved}}
    changed = sorted(k for k in {*want, *alone} - {"match"} if want.get(k) != alone.get(k))
    if changed:
        raise ValueError(f"variant {variant!r} of {config} alone resolves differently in "
                         f"{changed}; it cannot be benchmarked alone")
    return overrides


# ---------------------------------------------------------------- the two processes

def child_env(threads: int | None, tree: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    return env


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_process(cmd: list[str], threads: int | None,
                tree: str | None = None) -> tuple[float, float, str]:
    """Run `cmd` to its end: (wall seconds, CPU seconds, its stdout); a failure is a
    RuntimeError with the tail of its stderr. With `tree`, it runs in that directory:
    `python -m` puts the working directory ahead of PYTHONPATH, so from here it would
    import this tree's train/ whatever PYTHONPATH says."""
    cpu, start = children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(threads, tree),
                          cwd=tree)
    seconds, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {done.returncode}:\n"
                           + done.stderr[-2000:])
    return seconds, cpu, done.stdout


def harness_timing(args: argparse.Namespace, overrides: list[str], variant: str, tokens: int,
                   runs: Path, tree: str | None) -> Timing:
    """`rankzoo train` on the variant alone, in a run directory of its own under `runs`;
    from the source tree `tree` (PYTHONPATH) where given."""
    config = str(Path(args.config).resolve())  # the tree's process runs in the tree
    seconds, cpu, out = run_process([sys.executable, "-m", "train.cli", "train", config,
                                     *overrides, "--runs-dir", tempfile.mkdtemp(dir=runs),
                                     "--format", "json"], args.threads, tree)
    metrics = next(v for v in json.loads(out)["variants"] if v["variant"] == variant)["metrics"]
    return Timing(seconds, metrics["fit_seconds"], tokens, metrics["train/loss"], cpu)


def loop_timing(args: argparse.Namespace, overrides: list[str], variant: str) -> Timing:
    """This module's --plain-loop, in a process of its own."""
    seconds, cpu, out = run_process([sys.executable, "-m", "benches.train.harness.bench_loop",
                                     "--plain-loop", variant, "--config", args.config,
                                     "--overrides", json.dumps(overrides)], args.threads)
    r = json.loads(out.strip().splitlines()[-1])
    return Timing(seconds, r["train_seconds"], r["tokens"], r["loss"], cpu)


# ---------------------------------------------------------------- the plain loop

def seed_all(seed: int) -> None:
    """The generators the harness seeds (Lightning's seed_everything) before its data and
    model: the model starts from the same weights."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed)


def plain_loop(exp: Experiment, variant: str, muon: type[torch.optim.Optimizer] = Muon) -> dict:
    """Train `variant` for train.max_steps steps in a plain PyTorch loop: forward, loss
    (with MoE's balancing term, as the harness adds it), backward, clipping, step (`muon`:
    the Muon class, where the optimizer is Muon; bench_muon passes torch's). Returns
    the steps' seconds, the tokens, the training loss of every step (before its update)
    and whether Lightning was imported (it should not be)."""
    config = exp.variant_config(variant)
    t, d = config["train"], exp.data
    if t["precision"] not in AUTOCAST:
        raise ValueError(f"the plain loop runs precision {list(AUTOCAST)}; "
                         f"got train.precision={t['precision']!r}")
    device = torch.device("cpu" if t["accelerator"] == "cpu" else "cuda")
    seed_all(config["seed"])
    train_loader, _ = make_loaders(d.spec(), d.train_size, d.val_size, d.batch_size,
                                   seed=config["seed"])
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, t, muon)
    schedule = build_schedule(optimizer, t)
    # clipped in the optimizer's order, as Lightning does: the norm's sum, to the last bit
    params = [p for group in optimizer.param_groups for p in group["params"]]
    dtype = AUTOCAST[t["precision"]]
    steps, tokens, losses = t["max_steps"], 0, []
    start = time.perf_counter()
    while steps > 0:
        for x, y in train_loader:  # x, y: [B, T]
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                logits = model(x)  # [B, T, vocab]
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(),
                                   ignore_index=IGNORE)
            aux = [b.aux_loss for b in model.blocks if getattr(b, "aux_loss", None) is not None]
            optimizer.zero_grad(set_to_none=True)
            (loss + sum(aux) if aux else loss).backward()
            if t["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
            optimizer.step()
            schedule.step()
            losses.append(loss.detach())
            tokens, steps = tokens + x.numel(), steps - 1
            if steps == 0:
                break
    curve = torch.stack(losses).tolist()  # waits for the device
    return {"train_seconds": time.perf_counter() - start, "tokens": tokens, "loss": curve[-1],
            "losses": curve, "lightning": "lightning" in sys.modules}


# ---------------------------------------------------------------- the benchmark

def bench_variant(args: argparse.Namespace, overrides: list[str], variant: str, tokens: int,
                  runs: Path) -> tuple[list[Timing], dict[str, list[Timing]]]:
    """The loop and each harness in turns, args.repeats times: (the loop's timings, each
    harness's by its label: "harness", or "harness @ DIR" for another tree's)."""
    trees = {"harness": None, **{f"harness @ {t}": t for t in args.harness_tree}}
    loop: list[Timing] = []
    harness: dict[str, list[Timing]] = {label: [] for label in trees}
    turns = ["loop", *trees]
    for r in range(args.repeats):
        for label in turns[r % len(turns):] + turns[:r % len(turns)]:
            if label == "loop":
                loop.append(loop_timing(args, overrides, variant))
                done = loop[-1]
            else:
                harness[label].append(harness_timing(args, overrides, variant, tokens, runs,
                                                     trees[label]))
                done = harness[label][-1]
            print(f"  {variant}, repeat {r + 1}: {label} {done.seconds:.1f} s "
                  f"({done.train_seconds:.1f} s training, {done.cpu:.1f} s CPU)",
                  file=sys.stderr, flush=True)
    return loop, harness


def fastest(timings: list[Timing]) -> Timing:
    """The repeat least disturbed by other work on the machine: the one that took least."""
    return min(timings, key=lambda t: t.seconds)


def rows(variant: str, loop: list[Timing], harness: dict[str, list[Timing]]
         ) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Per harness: its row of the ratios table and of the where-the-time-goes table,
    each process by its fastest repeat (and CPU seconds by their least)."""
    p, p_cpu = fastest(loop), min(t.cpu for t in loop)
    out = []
    for label, timings in harness.items():
        name = variant if label == "harness" else f"{variant} ({label.removeprefix('harness ')})"
        h, h_cpu = fastest(timings), min(t.cpu for t in timings)
        cpu = f"{h_cpu / p_cpu:.2f}x" if p_cpu else "-"
        out.append(((name, f"{h.seconds:.1f}", f"{p.seconds:.1f}", f"{h.seconds / p.seconds:.2f}x",
                     cpu, f"{h.tokens / h.seconds:,.0f}", f"{p.tokens / p.seconds:,.0f}"),
                    (name, f"{h.train_seconds:.1f}", f"{p.train_seconds:.1f}",
                     f"{h.seconds - h.train_seconds:.1f}", f"{p.seconds - p.train_seconds:.1f}",
                     f"{h.loss:.6g}", f"{p.loss:.6g}")))
    return out


def tables(steps: int, found: list[tuple[tuple[str, ...], tuple[str, ...]]]) -> list:
    from train.render.table import TableSpec, columns, to_rich

    ratios = TableSpec(
        title=f"rankzoo train against a plain PyTorch loop: {steps} steps, each process "
              "timed from start to exit",
        columns=columns("variant", "harness s", "loop s", "ratio", "CPU ratio", "harness tok/s",
                        "loop tok/s", numeric=("harness s", "loop s", "ratio", "CPU ratio",
                                               "harness tok/s", "loop tok/s")),
        rows=[r for r, _ in found],
        legend=f"each process's fastest repeat; ratio: harness s / loop s (target <= "
               f"{TARGET_RATIO}x); CPU ratio: their least CPU seconds; tok/s: tokens trained "
               "over the process's seconds")
    split = TableSpec(
        title="where the time goes (seconds)",
        columns=columns("variant", "fit", "steps", "rest h", "rest l", "loss h", "loss l",
                        numeric=("fit", "steps", "rest h", "rest l", "loss h", "loss l")),
        rows=[r for _, r in found],
        legend="fit: the harness's training (validation, monitor, checkpoints included); "
               "steps: the loop's; rest: the process's start, imports, set-up and end; "
               "loss: the last training loss of each")
    return [to_rich(ratios), to_rich(split)]


def imported_train(tree: str) -> Path:
    """The train/__init__.py a process started as the tree's harness imports."""
    _, _, out = run_process([sys.executable, "-c", "import train; print(train.__file__)"],
                            None, tree)
    return Path(out.strip()).resolve()


def check_args(args: argparse.Namespace, exp: Experiment) -> tuple[list[str], int]:
    """The variants and the step count asked for; a ValueError names a bad one."""
    variants = args.variant or list(exp.variants)
    unknown = [v for v in variants if v not in exp.variants]
    if unknown:
        raise ValueError(f"--variant {unknown[0]!r} is not in {args.config}; "
                         f"one of {list(exp.variants)}")
    steps = exp.train.max_steps if args.steps is None else args.steps
    if steps < 1 or args.repeats < 1:
        raise ValueError(f"--steps and --repeats must be >= 1, got {steps} and {args.repeats}")
    for tree in args.harness_tree:
        if not (Path(tree) / "train").is_dir():
            raise ValueError(f"--harness-tree {tree}: no train/ package there")
        imported = imported_train(tree)
        if Path(tree).resolve() not in imported.parents:
            raise ValueError(f"--harness-tree {tree}: its process imports {imported}, "
                             "not the tree's own train/")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() "
                         "is False)")
    return variants, steps


def bench_loop(args: argparse.Namespace) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    from rich.console import Console

    exp = load_experiment(args.config)
    variants, steps = check_args(args, exp)
    console = Console()
    threads = "torch's default" if args.threads is None else args.threads
    console.print(f"{args.config}: {len(variants)} variant(s), {steps} steps on "
                  f"{args.device}, {args.repeats} repeat(s), threads: {threads} ...",
                  highlight=False)
    found = []
    with tempfile.TemporaryDirectory(prefix="rankzoo-bench-") as tmp:
        for variant in variants:
            overrides = alone_overrides(exp, args.config, variant, steps, args.device)
            tokens = steps * exp.data.batch_size * exp.data.seq_len
            loop, harness = bench_variant(args, overrides, variant, tokens, Path(tmp))
            found += rows(variant, loop, harness)
            console.print("  " + ", ".join(f"{r[0]}: {r[3]}" for r, _ in found[-len(harness):]),
                          highlight=False)
    for table in tables(steps, found):
        console.print(table)
    within = sum(float(r[3].rstrip("x")) <= TARGET_RATIO for r, _ in found)
    console.print(f"{within} of {len(found)} within the {TARGET_RATIO}x target", highlight=False)
    return found


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/quick.yaml")
    p.add_argument("--variant", nargs="+", default=None,
                   help="default: every variant of the config")
    p.add_argument("--steps", type=int, default=None,
                   help="default: the config's train.max_steps")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of both processes (default: torch's)")
    p.add_argument("--device", choices=sorted(DEVICES), default="cpu")
    p.add_argument("--harness-tree", metavar="DIR", action="append", default=[],
                   help="also time the harness of this source tree (PYTHONPATH=DIR), e.g. "
                        "another commit's `git archive`; repeatable")
    p.add_argument("--plain-loop", metavar="VARIANT", help=argparse.SUPPRESS)
    p.add_argument("--overrides", default="[]", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.plain_loop:  # the loop's own process (loop_timing)
            exp = load_experiment(args.config, json.loads(args.overrides))
            print(json.dumps(plain_loop(exp, args.plain_loop)))
        else:
            bench_loop(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
