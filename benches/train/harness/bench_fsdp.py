"""1 process against 2-process DDP and 2-process FSDP, side by side, on this machine.

    python -m benches.train.harness.bench_fsdp [--steps N] [--batch-size B] [--seq-len T]
        [--d-model D] [--layers L] [--accelerator cpu|gpu]

Trains one config (a 2-layer d_model 256 softmax model on the Markov language by default)
four times with `rankzoo train`: on 1 process (on torch's threads, one per core, and on 1
thread, as Lightning runs each of several processes on a CPU), on 2 under DDP
(train.strategy ddp) and on 2 under FSDP (train.strategy fsdp, train/harness/sharding.py),
the same global batch (data.batch_size) in each. It prints per run the tokens per second
of its fit (the report's tokens_per_second: every step's tokens over the fit's seconds,
validation and the rank monitor kept rare), the final training loss (equal where the runs
compute the same), and each process's peak resident memory (its own ru_maxrss, written as
it exits). On a CPU FSDP trades memory for communication: each rank holds half the
weights, gradients and optimizer state, and gathers a layer's weights for its forward and
again for its backward.
Everything is written into a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PROG = "python -m benches.train.harness.bench_fsdp"
WORKER = "--worker"  # argv[1] of the launches: train through main, record peak memory
RSS_DIR = "RANKZOO_BENCH_RSS"
# name -> (overrides, environment): 1 process on torch's threads (one per core) and on 1,
# as Lightning gives each of 2 processes on a CPU
RUNS = {"1 process": ([], {}), "1 process, 1 thread": ([], {"OMP_NUM_THREADS": "1"}),
        "2-process DDP": (["train.devices=2", "train.strategy=ddp"], {}),
        "2-process FSDP": (["train.devices=2", "train.strategy=fsdp"], {})}


def config(args) -> dict:
    return {
        "name": "bench_fsdp", "seed": 0,
        "data": {"task": "markov", "vocab_size": 256, "rank": 16, "seq_len": args.seq_len,
                 "train_size": args.batch_size * (args.steps + 1), "val_size": args.batch_size,
                 "batch_size": args.batch_size},
        "model": {"d_model": args.d_model, "n_layers": args.layers},
        "block_defaults": {"n_heads": 4},
        "variants": {"mha": {"block": "softmax"}},
        "train": {"max_steps": args.steps, "warmup_steps": 2, "accelerator": args.accelerator,
                  "val_every_n_steps": args.steps, "checkpoint_every_n_steps": args.steps,
                  "log_every_n_steps": args.steps},
        "monitor": {"every_n_steps": args.steps, "probe_size": 2, "probe_len": 64,
                    "histograms": False},
    }


def record_peak_memory() -> None:
    """At exit, this process's peak resident memory into $RANKZOO_BENCH_RSS/rank<r>."""
    out = Path(os.environ[RSS_DIR])
    rank = int(os.environ.get("LOCAL_RANK", "0")) + int(os.environ.get("NODE_RANK", "0"))

    def write() -> None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        (out / f"rank{rank}").write_text(str(kib * 1024))
    atexit.register(write)


def run(name: str, overrides: list[str], extra_env: dict, cfg: Path, tmp: Path) -> dict:
    rss = tmp / "rss" / "_".join(name.replace(",", "").split())
    rss.mkdir(parents=True)
    runs = rss.parent.parent / rss.name
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-m", "benches.train.harness.bench_fsdp", WORKER, "train", str(cfg),
         *overrides, "--runs-dir", str(runs), "--format", "json"],
        env={**env, **extra_env, RSS_DIR: str(rss)}, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{PROG}: {name} failed:\n{proc.stderr[-3000:]}")
    metrics = json.loads((runs / "bench_fsdp" / "mha" / "report.json").read_text())
    metrics = metrics["variants"][0]["metrics"]
    peaks = [int(f.read_text()) for f in sorted(rss.iterdir())]
    return {"tokens/s": metrics["tokens_per_second"], "loss": metrics["train/loss"],
            "peaks": peaks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench_fsdp.yaml"
        cfg.write_text(yaml.safe_dump(config(args)))
        results = {name: run(name, overrides, env, cfg, Path(tmp))
                   for name, (overrides, env) in RUNS.items()}
    print(f"{args.layers}-layer d_model {args.d_model}, global batch {args.batch_size} x "
          f"{args.seq_len} tokens, {args.steps} steps, {args.accelerator} "
          f"({os.cpu_count()} cores)")
    print("| run | tokens/s | final train/loss | peak memory per process (MiB) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        peaks = ", ".join(f"{p / 2**20:.0f}" for p in r["peaks"])
        print(f"| {name} | {r['tokens/s']:,.0f} | {r['loss']:.6f} | {peaks} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == WORKER:
        record_peak_memory()
        from train.cli import main as rankzoo

        sys.exit(rankzoo(sys.argv[2:]))
    sys.exit(main())
