"""A run killed with SIGKILL mid-training resumes from its last checkpoint, and its
ranks.jsonl has no gaps or duplicate steps afterwards."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.train.conftest import tiny_experiment
from train.cli import main

ROOT = Path(__file__).resolve().parents[3]
EVERY = 5
CONFIG = tiny_experiment(
    "markov", name="killed", data={"train_size": 256},
    train={"max_steps": 100_000, "val_every_n_steps": 1000, "checkpoint_every_n_steps": EVERY,
           "log_every_n_steps": EVERY},
    monitor={"every_n_steps": EVERY})


def steps(path: Path, complete_only: bool = False) -> list[int]:
    """The recorded steps; while polling a live run, a line still being written is skipped."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if complete_only and lines and not text.endswith("\n"):
        lines = lines[:-1]
    return [json.loads(line)["step"] for line in lines if line.strip()]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_sigkill_then_resume_continues_without_gaps_or_duplicates(tmp_path, tiny_yaml):
    config, runs = tiny_yaml(CONFIG, file="killed.yaml"), tmp_path / "runs"
    vdir = runs / "killed" / "mha"
    proc = subprocess.Popen([sys.executable, "-m", "train.cli", "train", str(config),
                             "--runs-dir", str(runs)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        ranks = vdir / "ranks.jsonl"
        while len(steps(ranks, complete_only=True)) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = torch.load(vdir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert killed_at >= EVERY
    target = max(steps(vdir / "ranks.jsonl")) + 3 * EVERY
    assert main(["train", str(config), "--runs-dir", str(runs), "--resume",
                 f"train.max_steps={target}"]) == 0
    recorded = steps(vdir / "ranks.jsonl")
    assert recorded == list(range(EVERY, target + 1, EVERY))
    resumed = torch.load(vdir / "checkpoints" / "last.ckpt", weights_only=False)
    assert resumed["global_step"] == target
