"""A run SIGKILLed at any moment and resumed with --resume ends exactly as the run that
was never interrupted: the same train losses at every logged step, the same TensorBoard
points, the same RNG draws per step, the same ranks.jsonl and the same report.

The killed runs are subprocesses that SIGKILL themselves at a chosen point (a driver
script patches the point in, then runs the CLI); the uninterrupted run and the resumes
run in this process, with the same patch recording the RNG draws. Kill points, with a
checkpoint every 2 steps, validation every 4 (a checkpoint at a step that validates is
saved after the validation, the others at the end of the train step), a measurement
every 3 and 5 batches per epoch:

- before the first checkpoint (step 1): the resume starts over;
- between checkpoints (in the train step of step 7): the checkpoint is step 6's, and
  TensorBoard holds the points of step 7 past it;
- during a measurement (step 9; the checkpoint at 8 was saved after its validation);
- right after a checkpoint (step 10, the end of the second epoch).
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train.harness.module as module_py
from tests.train.conftest import tiny_experiment
from train.cli import main
from train.rundir.status import read_status

ROOT = Path(__file__).resolve().parents[3]
CONFIG = tiny_experiment(
    "markov", name="exact",
    data={"train_size": 80, "batch_size": 16},  # 5 batches per epoch
    train={"max_steps": 12, "val_every_n_steps": 4, "checkpoint_every_n_steps": 2},
    monitor={"histograms": None})  # histograms on (the default): they are purged too
KILLS = {  # name -> (point, the step it is reached at, the checkpoint step it leaves)
    "before-first-checkpoint": ("train_step", 1, None),
    "between-checkpoints": ("train_step", 7, 6),
    "during-measurement": ("measure", 9, 8),
    "after-checkpoint": ("after_save", 10, 10),
}
DRIVER = '''
import os, signal, sys
sys.path[:0] = [os.getcwd()]
import budgets
import train.harness.checkpoint as checkpoint
from tests.train.harness.test_exact_resume import record_draws
from train.cli import main

point, at, config, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

record_draws(os.path.join(runs, "draws.jsonl"), kill_at=at if point == "train_step" else None,
             die=die)
if point == "measure":  # every 3 steps: the call at step `at`, inside the measurement
    probe, calls = budgets.probe_model, []
    def killing_probe(*args, **kwargs):
        calls.append(1)
        out = probe(*args, **kwargs)
        if 3 * len(calls) == at:
            die()
        return out
    budgets.probe_model = killing_probe
if point == "after_save":
    save = checkpoint.StepCheckpoint.save
    def killing_save(self, trainer):
        save(self, trainer)
        if trainer.global_step == at:
            die()
    checkpoint.StepCheckpoint.save = killing_save
sys.exit(main(["train", config, "--runs-dir", runs]))
'''


def record_draws(path, kill_at=None, die=None):
    """Patch LMModule.training_step to draw from every global RNG at each step and append
    the draws to `path` (and to die at step `kill_at`): a resume must continue each stream."""
    step_fn = module_py.LMModule.training_step

    def training_step(self, batch, batch_idx):
        if self.global_step == kill_at:
            die()
        draws = {"step": self.global_step, "torch": torch.rand(1).item(),
                 "python": random.random(), "numpy": float(np.random.rand())}
        with open(path, "a") as f:
            f.write(json.dumps(draws) + "\n")
        return step_fn(self, batch, batch_idx)

    module_py.LMModule.training_step = training_step
    return step_fn


def run_here(config: Path, runs: Path, *extra: str) -> None:
    step_fn = record_draws(runs / "draws.jsonl")
    try:
        runs.mkdir(parents=True, exist_ok=True)
        assert main(["train", str(config), "--runs-dir", str(runs), *extra]) == 0
    finally:
        module_py.LMModule.training_step = step_fn


def tensorboard(vdir: Path) -> dict:
    """Every scalar and histogram as TensorBoard shows it: events purged on a restart
    (SummaryWriter's purge_step) are not shown."""
    events = EventAccumulator(str(vdir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    shown = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
             for tag in events.Tags()["scalars"]}
    shown.update({tag: [(e.step, e.histogram_value.bucket) for e in events.Histograms(tag)]
                  for tag in events.Tags()["histograms"]})
    return shown


def draws(runs: Path, from_step: int = 0) -> dict[int, dict]:
    """The RNG draws per step, the last process's where a step was drawn twice."""
    lines = (runs / "draws.jsonl").read_text().splitlines()
    by_step = {d["step"]: d for d in map(json.loads, lines)}
    return {s: d for s, d in by_step.items() if s >= from_step}


def report(vdir: Path) -> dict:
    doc = json.loads((vdir / "report.json").read_text())
    for v in doc["variants"]:  # the wall time, and the throughput over it
        v["metrics"].pop("fit_seconds")
        v["metrics"].pop("tokens_per_second", None)
    return doc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run, and every killed run (in parallel subprocesses)."""
    tmp = tmp_path_factory.mktemp("exact")
    config = tmp / "exact.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    (tmp / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {}
    for name, (point, at, _) in KILLS.items():
        (tmp / name).mkdir()
        procs[name] = subprocess.Popen(
            [sys.executable, str(tmp / "driver.py"), point, str(at), str(config),
             str(tmp / name)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
    run_here(config, tmp / "uninterrupted")
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, f"{name} was not killed:\n{err[-2000:]}"
    return tmp, config


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
@pytest.mark.parametrize("kill", list(KILLS))
def test_a_killed_run_resumes_to_the_uninterrupted_run(runs, kill):
    tmp, config = runs
    reference, killed = tmp / "uninterrupted" / "exact" / "mha", tmp / kill / "exact" / "mha"
    ckpt = KILLS[kill][2]
    status = read_status(killed)
    assert status["state"] == "interrupted" and status["step"] == (ckpt or 0)
    assert (killed / "checkpoints" / "last.ckpt").is_file() == (ckpt is not None)

    run_here(config, tmp / kill, "--resume")

    shown = tensorboard(killed)
    assert shown == tensorboard(reference)
    assert [s for s, _ in shown["train/loss"]] == list(range(1, 13))  # each step's loss, once
    assert (killed / "ranks.jsonl").read_text() == (reference / "ranks.jsonl").read_text()
    assert report(killed) == report(reference)
    assert draws(tmp / kill, ckpt or 0) == draws(tmp / "uninterrupted", ckpt or 0)
    assert read_status(killed)["state"] == "finished"
    assert read_status(killed)["step"] == 12


def test_a_run_stopped_between_its_last_checkpoint_and_its_report_resumes_to_it(runs):
    """What a kill after the final checkpoint leaves: everything but report.json. The
    resume has no step left to train; it measures and validates the last step again."""
    tmp, config = runs
    copy = tmp / "after-last-checkpoint"
    shutil.copytree(tmp / "uninterrupted", copy)
    vdir, reference = copy / "exact" / "mha", tmp / "uninterrupted" / "exact" / "mha"
    (vdir / "report.json").unlink()
    (copy / "draws.jsonl").unlink()

    run_here(config, copy, "--resume")

    assert tensorboard(vdir) == tensorboard(reference)
    assert (vdir / "ranks.jsonl").read_text() == (reference / "ranks.jsonl").read_text()
    assert report(vdir) == report(reference)
    assert not (copy / "draws.jsonl").exists()  # not a step trained again


def test_a_resume_writes_its_events_in_a_later_second_than_the_run_before(tmp_path):
    """TensorBoard reads a run's event files in name order (the writer's second, then host
    and pid): a resume within the killed writer's second waits for the next one, so that
    its file sorts after (a resume 2 s after its run's start sorted first once, by pid)."""
    import time

    from train.harness.fit import after_event_files

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now}.host.example.99999.0").touch()
    start = time.perf_counter()
    after_event_files(tmp_path)
    assert int(time.time()) > now and time.perf_counter() - start < 1.1
    (tmp_path / f"events.out.tfevents.{now - 60}.host.1.0").touch()
    start = time.perf_counter()
    after_event_files(tmp_path)  # every file of an earlier second: no wait
    after_event_files(tmp_path / "new")  # no directory yet: no wait
    assert time.perf_counter() - start < 0.05
