"""The fault table: a run killed at every kind of write point, then resumed, against the
run that was never interrupted.

    python -m benches.train.experiment.bench_faults [--points P ...] [--signals SIGKILL SIGINT]
        [--no-ddp] [--jobs 2]

A tiny experiment with a sweep (two learning rates) and a LoRA stage (r = 1 and 2) runs
once uninterrupted, then once per kill point and signal: the run sends itself the signal
at that point (`rankzoo train` under a driver that patches the point in, below), and
`rankzoo train --resume` finishes it. The points, one per kind of write a run makes:

    first-steps        in the train step of step 2 of the first run, before any checkpoint
    checkpoint-write   while last.ckpt is written: its temporary file is whole, not yet renamed
    after-checkpoint   right after the checkpoint of step 3, before the next ranks.jsonl record
    variant-report     while the first run's report.json is written
    sweep-selection    in the sweep's selection of the best learning rate
    finetune-r1        in the train step of step 2 of the fine-tune at r = 1
    finetune-r2        the same, at r = 2
    finetune-summary   while finetune.json is written
    experiment-report  while report.md is written

A row passes when, after the resume, every run's report.json has the reference's
val/loss (to 1e-6) and val/accuracy, its ranks.jsonl the same steps (nothing duplicated,
nothing lost), sweep.json and finetune.json equal the reference's (numbers to 1e-6,
seconds and tokens per second left out), the same run directories exist, and no temporary
or lock file is left.
The DDP rows do the same with 2 CPU processes (gloo) on the experiment without its sweep
and fine-tune stage: rank zero is killed after a checkpoint, the rank it launched with it.

Everything runs in a temporary directory removed afterwards. The slow-marked test
tests/train/experiment/test_faults.py runs the whole table and asserts every row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from train.render.table import TableSpec, columns, to_markdown

TINY = {
    "name": "faults", "seed": 0,
    "data": {"task": "markov", "vocab_size": 16, "seq_len": 16, "rank": 2, "train_size": 32,
             "val_size": 8, "batch_size": 8},
    "model": {"d_model": 16, "n_layers": 1},
    "block_defaults": {"n_heads": 2},
    "variants": {"mha": {"block": "softmax"}},
    "train": {"max_steps": 6, "warmup_steps": 1, "val_every_n_steps": 3,
              "checkpoint_every_n_steps": 3, "log_every_n_steps": 1},
    "monitor": {"every_n_steps": 3, "probe_size": 2, "histograms": False},
}
STAGES = {
    "sweep": {"lr": [0.01, 0.02]},
    "finetune": {"ranks": [1, 2], "targets": ["q_proj", "v_proj"],
                 "data": {**TINY["data"], "rank": 3},  # a second chain
                 "train": {"max_steps": 6, "lr": 0.02, "warmup_steps": 0}},
}
POINTS = ("first-steps", "checkpoint-write", "after-checkpoint", "variant-report",
          "sweep-selection", "finetune-r1", "finetune-r2", "finetune-summary",
          "experiment-report")
SIGNALS = ("SIGKILL", "SIGINT")
DDP = ("train.devices=2", "train.strategy=ddp", "train.accelerator=cpu")
TOLERANCE = 1e-6
TIMEOUT = 600


# ---------------------------------------------------------------- the driver (a child process)

def drive(point: str, signame: str, argv: list[str]) -> int:
    """Run `rankzoo argv` with `signame` sent to this process at `point`, once. Only
    global rank zero signals itself: under DDP the other rank runs the same patches."""
    from train.experiment import stages
    from train.harness import checkpoint, module
    from train.harness.fit import is_global_zero
    from train.rundir import files

    # a process started in the background inherits SIGINT ignored; ^C must reach this one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fired = []

    def fire(now: bool = True) -> None:
        if now and not fired and is_global_zero():
            fired.append(point)
            os.kill(os.getpid(), getattr(signal, signame))

    step = module.LMModule.training_step

    def training_step(self, batch, batch_idx):
        variant = self.config.get("variant", "")
        fire(self.global_step == 2 and (
            point == "first-steps" or variant.endswith(f".lora-{point.split('-')[-1]}")))
        return step(self, batch, batch_idx)

    commit, by_file = files.commit, {"checkpoint-write": "last.ckpt",
                                     "variant-report": "report.json",
                                     "finetune-summary": "finetune.json",
                                     "experiment-report": "report.md"}

    def killing_commit(tmp, path):
        fire(Path(path).name == by_file.get(point))  # the temporary file is whole
        commit(tmp, path)

    save = checkpoint.StepCheckpoint.save

    def killing_save(self, trainer, metrics=None):
        save(self, trainer, metrics)
        fire(point == "after-checkpoint" and trainer.global_step == 3)

    summarize = stages.summarize

    def killing_summarize(*args, **kwargs):
        fire(point == "sweep-selection")
        return summarize(*args, **kwargs)

    module.LMModule.training_step = training_step
    files.commit = killing_commit
    checkpoint.StepCheckpoint.save = killing_save
    stages.summarize = killing_summarize
    return train(argv)


def train(argv: list[str]) -> int:
    """`rankzoo train CONFIG --runs-dir RUNS [flags]` as the CLI runs it, with its exit
    codes (the CLI itself is the package above this one)."""
    p = argparse.ArgumentParser()
    p.add_argument("verb", choices=["train"])
    p.add_argument("config")
    p.add_argument("--runs-dir", default="runs")
    args, overrides = p.parse_known_args(argv)
    from train.config import load_experiment  # here: the parent parses no config
    from train.experiment.stages import train_experiment

    try:
        train_experiment(load_experiment(args.config, overrides), runs_dir=args.runs_dir)
    except KeyboardInterrupt:
        return 130
    return 0


# ---------------------------------------------------------------- running and comparing

def child_env() -> dict[str, str]:
    """A clean launch, not a child rank of some distributed run."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")}


def rankzoo(args: list[str], driver: tuple[str, str] | None = None) -> tuple[int, str]:
    """(exit code, stderr's tail) of `rankzoo args`, under the driver when given; the
    process group is ended afterwards (a DDP rank left behind by a killed rank zero)."""
    head = ([sys.executable, "-m", __spec__.name, "drive", *driver, "--"] if driver
            else [sys.executable, "-m", "train.cli"])
    proc = subprocess.Popen([*head, *args], env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, err[-1500:]


def documents(exp_dir: Path) -> dict[str, Any]:
    """What a finished run must hold, for comparison: per run directory its final
    figures and ranks.jsonl steps; the sweep and fine-tune summaries; leftovers."""
    runs = {}
    for vdir in sorted(p for p in exp_dir.iterdir() if (p / "config.yaml").is_file()):
        report = json.loads((vdir / "report.json").read_text()) if (
            vdir / "report.json").is_file() else {"variants": [{"metrics": {}}]}
        metrics = report["variants"][0]["metrics"]
        lines = (vdir / "ranks.jsonl").read_text().splitlines() if (
            vdir / "ranks.jsonl").is_file() else []
        status = json.loads((vdir / "status.json").read_text())["state"] if (
            vdir / "status.json").is_file() else None
        runs[vdir.name] = {"val/loss": metrics.get("val/loss"),
                           "val/accuracy": metrics.get("val/accuracy"),
                           "steps": [json.loads(line)["step"] for line in lines],
                           "status": status}
    summaries = {name: without_seconds(json.loads((exp_dir / name).read_text()))
                 for name in ("sweep.json", "finetune.json") if (exp_dir / name).is_file()}
    leftovers = sorted(str(p.relative_to(exp_dir.parent)) for p in exp_dir.parent.rglob("*")
                       if p.name.endswith((".tmp", ".lock")))
    return {"runs": runs, "summaries": summaries, "report.md": (exp_dir / "report.md").is_file(),
            "leftovers": leftovers}


def without_seconds(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: without_seconds(v) for k, v in doc.items()  # times, and rates over them
                if "seconds" not in k and not k.endswith("per_second")}
    if isinstance(doc, list):
        return [without_seconds(v) for v in doc]
    return doc


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where two documents differ (numbers to TOLERANCE)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in dict.fromkeys([*want, *got])
                for d in differences(got.get(k), want.get(k), f"{where}/{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(got, float) and isinstance(want, float):
        same = (math.isnan(got) and math.isnan(want)) or abs(got - want) <= TOLERANCE
        return [] if same else [f"{where}: {got!r} != {want!r}"]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def fault_case(root: Path, config: Path, point: str, signame: str, reference: dict,
               extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Kill at `point` with `signame`, resume, compare; one row of the table."""
    runs = root / (f"{point}-{signame}" + ("-ddp" if extra else ""))
    train = ["train", str(config), "--runs-dir", str(runs), *extra]
    began = time.perf_counter()
    killed, err = rankzoo(train, driver=(point, signame))
    resumed, err2 = rankzoo([*train, "--resume"])
    diffs = ([f"resume exited {resumed}: {err2.strip().splitlines()[-1:]}"] if resumed
             else differences(documents(runs / TINY["name"]), reference))
    expected_exit = (-signal.SIGKILL,) if signame == "SIGKILL" else (1, 130)
    if killed not in expected_exit:
        diffs.insert(0, f"the killed run exited {killed}, not by {signame}: "
                        f"{err.strip().splitlines()[-1:]}")
    return {"point": point + (" (DDP)" if extra else ""), "signal": signame, "killed": killed,
            "resumed": resumed, "seconds": time.perf_counter() - began,
            "equal": not diffs, "differences": diffs[:3]}


def fault_table(points=POINTS, signals=SIGNALS, ddp: bool = True, jobs: int = 2,
                root: Path | None = None) -> list[dict[str, Any]]:
    """Every (point, signal) row, then the DDP rows; in `root` (a temporary directory
    removed afterwards when None)."""
    with contextlib.ExitStack() as stack:
        root = root or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        full, plain = root / "full.yaml", root / "plain.yaml"
        full.write_text(yaml.safe_dump({**TINY, **STAGES}))
        plain.write_text(yaml.safe_dump(TINY))
        cases = [(full, p, s, ()) for p in points for s in signals]
        if ddp:
            cases += [(plain, "after-checkpoint", s, DDP) for s in signals]
        refs = {(full, ()): None, **({(plain, DDP): None} if ddp else {})}
        for config, extra in refs:
            runs = root / f"reference-{config.stem}"
            code, err = rankzoo(["train", str(config), "--runs-dir", str(runs), *extra])
            if code:
                raise RuntimeError(f"the uninterrupted run exited {code}: {err}")
            refs[config, extra] = documents(runs / TINY["name"])
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            rows = pool.map(lambda c: fault_case(root, c[0], c[1], c[2], refs[c[0], c[3]],
                                                 c[3]), cases)
            return list(rows)


def table(rows: list[dict[str, Any]]) -> TableSpec:
    return TableSpec(
        title="Kills at each write point, then --resume, against the uninterrupted run",
        columns=columns("kill point", "signal", "killed run exit", "resume exit",
                        "result", "seconds", numeric=("killed run exit", "resume exit",
                                                       "seconds")),
        rows=[(r["point"], r["signal"], str(r["killed"]), str(r["resumed"]),
               "equal" if r["equal"] else "; ".join(r["differences"]), f"{r['seconds']:.0f}")
              for r in rows])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["drive"]:
        rest = argv.index("--")
        return drive(argv[1], argv[2], argv[rest + 1:])
    p = argparse.ArgumentParser(prog="python -m benches.train.experiment.bench_faults")
    p.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS))
    p.add_argument("--signals", nargs="+", choices=SIGNALS, default=list(SIGNALS))
    p.add_argument("--no-ddp", action="store_true", help="leave out the DDP rows")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once")
    args = p.parse_args(argv)
    rows = fault_table(args.points, args.signals, not args.no_ddp, args.jobs)
    print(to_markdown(table(rows)))
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
