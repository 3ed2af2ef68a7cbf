"""DDP on CPU: a 2-process gloo run of the CLI, as a subprocess.

Lightning's `ddp` launcher re-executes the command line for rank 1, so the run goes
through `python -m train.cli` in a child process (under pytest it would re-run pytest).
Rank 1 must neither refuse nor delete the run directory that rank 0 created, and ranks,
scalars and reports must be written once, by global rank zero.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from tests.train.conftest import tiny_experiment

ROOT = Path(__file__).resolve().parents[3]

TINY = tiny_experiment(name="ddp", data={"train_size": 64, "val_size": 16},
                       monitor={"every_n_steps": 2, "probe_size": 4, "histograms": None})


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available here")
    tmp = tmp_path_factory.mktemp("ddp")
    config = tmp / "ddp.yaml"
    config.write_text(yaml.safe_dump(TINY))
    runs = tmp / "runs"
    env = {k: v for k, v in os.environ.items()  # a clean launch, not a child rank
           if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-m", "train.cli", "train", str(config), "train.devices=2",
         "train.strategy=ddp", "--runs-dir", str(runs), "--format", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc, runs / "ddp"


def test_ddp_run_finishes_and_reports_once(ddp_run):
    proc, exp = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already exists" not in proc.stderr
    report = json.loads(proc.stdout)  # one JSON document: rank 1 printed nothing
    assert [v["variant"] for v in report["variants"]] == ["mha"]
    assert (exp / "report.md").is_file() and (exp / "mha" / "report.json").is_file()
    assert (exp / "mha" / "checkpoints" / "last.ckpt").is_file()


def test_ddp_ranks_recorded_once_per_step(ddp_run):
    proc, exp = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (exp / "mha" / "ranks.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6]


def test_ddp_tensorboard_scalars_logged_once(ddp_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc, exp = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = list((exp / "mha").glob("events.out.tfevents.*"))
    assert len(events) == 1, f"one event file, written by rank zero: {events}"
    acc = EventAccumulator(str(exp / "mha"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    rank_tag = next(t for t in tags if t.startswith("rank/") and t.endswith("/mean"))
    for tag, n_steps in ((rank_tag, 3), ("val/loss", 2)):  # monitor every 2, validate every 3
        counts = Counter(e.step for e in acc.Scalars(tag))
        assert len(counts) == n_steps, (tag, counts)
        assert set(counts.values()) == {1}, f"{tag} logged more than once per step: {counts}"
    assert sorted(Counter(e.step for e in acc.Scalars(rank_tag))) == [2, 4, 6]


@pytest.mark.parametrize("env, zero", [
    ({}, True),
    ({"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "2"}, True),
    ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, False),
    ({"LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "4"}, False),
    ({"RANK": "3", "LOCAL_RANK": "1"}, False),
])
def test_is_global_zero_reads_launcher_env(monkeypatch, env, zero):
    from train.harness.fit import is_global_zero

    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert is_global_zero() is zero
