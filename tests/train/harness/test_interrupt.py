"""How a fit ends when it cannot go on: ^C is exit 130 with `rankzoo: interrupted` and
the status "stopped"; a checkpoint of another model size and a ranks.jsonl that is not
UTF-8 are one line naming the file, on resume."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.train.cli.test_fuzz import run_cli, snapshot
from tests.train.conftest import tiny_experiment

ROOT = Path(__file__).resolve().parents[3]
LONG = tiny_experiment(
    name="long", data={"train_size": 256},
    train={"max_steps": 100_000, "val_every_n_steps": 1000, "checkpoint_every_n_steps": 5,
           "log_every_n_steps": 5},
    monitor={"every_n_steps": 5})


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs SIGINT")
def test_sigint_during_training_exits_130_with_status_stopped(tmp_path, tiny_yaml):
    config, runs = tiny_yaml(LONG, file="long.yaml"), tmp_path / "runs"
    vdir = runs / "long" / "mha"
    proc = subprocess.Popen(
        [sys.executable, "-m", "train.cli", "train", str(config), "--runs-dir", str(runs)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal has it
    try:
        deadline = time.monotonic() + 60
        while not (vdir / "checkpoints" / "last.ckpt").is_file() and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be interrupted"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the training loop, past the first checkpoint
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "rankzoo: interrupted"
    status = json.loads((vdir / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] >= 5
    assert status["reason"] == "interrupted (KeyboardInterrupt)"


@pytest.fixture
def finished(tmp_path, tiny_yaml):
    config = tiny_yaml(tiny_experiment(train={"max_steps": 3, "checkpoint_every_n_steps": 3}))
    code, _, err = run_cli(["train", config, "--runs-dir", tmp_path / "runs"], tmp_path)
    assert code == 0, err
    return config, tmp_path / "runs" / "tiny" / "mha"


def resume(config, vdir, tmp_path) -> str:
    code, _, err = run_cli(["train", config, "--resume", "train.max_steps=6",
                            "--runs-dir", vdir.parent.parent], tmp_path)
    assert code == 2 and err.count("rankzoo: error:") == 1 and "Traceback" not in err, err
    return err


def test_a_checkpoint_of_another_size_is_one_line(finished, tmp_path):
    config, vdir = finished
    ckpt = vdir / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    key = next(k for k in state["state_dict"] if k.endswith("embed.weight"))
    state["state_dict"][key] = torch.zeros(7, 3)
    torch.save(state, ckpt)
    err = resume(config, vdir, tmp_path)
    assert f"{ckpt}: weight '{key}' is [7, 3], the config's model has" in err


def test_a_ranks_jsonl_that_is_not_utf8_is_named(finished, tmp_path):
    config, vdir = finished
    ranks = vdir / "ranks.jsonl"
    ranks.write_bytes(ranks.read_bytes() + b"\xff\xfe\n")
    before = snapshot(vdir.parent)
    err = resume(config, vdir, tmp_path)
    assert f"{ranks}:" in err and "not UTF-8" in err
    assert snapshot(vdir.parent) == before  # refused before anything was rewritten
