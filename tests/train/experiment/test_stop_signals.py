"""`rankzoo train` stopped the way schedulers stop it. SIGTERM (what `kill`, `timeout`,
`docker stop` and `scancel` send) and SIGHUP reach the parent alone, not its process
group as a terminal's ^C does: the workers training variants side by side stop too, each
run records itself as interrupted, the command exits 128 + the signal, and `--resume`
ends the experiment exactly as the run never stopped. A parent killed with SIGKILL cannot
clean up: its workers notice within seconds and stop by themselves."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.train.conftest import MQA, tiny_experiment
from tests.train.experiment.test_parallel import report_without_time
from train.cli import main
from train.experiment.parallel import WATCH_SECONDS

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not Path("/proc").is_dir(),
                                reason="needs POSIX signals and /proc (Linux)")

ROOT = Path(__file__).resolve().parents[3]
# two variants long enough to be stopped in the middle (hundreds of steps past the first
# checkpoint) and short enough to resume in a few seconds side by side; on Muon, as the
# main job trains (its two optimizers must take the schedule after a resume too)
CONFIG = tiny_experiment(
    name="stopped", variants={"mha": {"block": "softmax"}, "mqa": MQA}, data={"train_size": 512},
    train={"optimizer": "muon", "lr": 0.01, "max_steps": 1000, "val_every_n_steps": 500,
           "checkpoint_every_n_steps": 5, "log_every_n_steps": 50},
    monitor={"every_n_steps": 250})
ORPHAN_SECONDS = 15  # a worker whose parent is gone is gone itself within this


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def workers_of(pid: int) -> list[int]:
    """The worker processes `pid` spawned (not multiprocessing's resource tracker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == pid and b"spawn_main" in command:
                out.append(int(entry.name))
    return out


def start(config: Path, runs: Path) -> tuple[subprocess.Popen, list[int]]:
    """`rankzoo train CONFIG --jobs 2` in a session of its own (no signal reaches its
    workers but through it), once both variants are past their first checkpoint; and its
    worker processes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "train.cli", "train", str(config), "--runs-dir", str(runs),
         "--jobs", "2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    ckpts = [runs / "stopped" / v / "checkpoints" / "last.ckpt" for v in CONFIG["variants"]]
    deadline = time.monotonic() + 120
    while not all(c.is_file() for c in ckpts):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run ended or stalled before it could be stopped: "
                        f"{proc.communicate()[1]}")
        time.sleep(0.02)
    workers = [pid for pid in workers_of(proc.pid) if alive(pid)]
    return proc, workers


def statuses(runs: Path) -> dict[str, dict]:
    return {v: json.loads((runs / "stopped" / v / "status.json").read_text())
            for v in CONFIG["variants"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The experiment run straight through, side by side as the stopped ones were."""
    runs = tmp_path_factory.mktemp("straight")
    config = runs / "stopped.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    assert main(["train", str(config), "--runs-dir", str(runs), "--jobs", "2",
                 "--format", "json"]) == 0
    return runs / "stopped"


def resumed_equals(config: Path, runs: Path, straight: Path) -> None:
    assert main(["train", str(config), "--runs-dir", str(runs), "--resume", "--jobs", "2",
                 "--format", "json"]) == 0
    for variant in CONFIG["variants"]:
        got, want = runs / "stopped" / variant, straight / variant
        assert report_without_time(got) == report_without_time(want), variant
        assert (got / "ranks.jsonl").read_text() == (want / "ranks.jsonl").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_a_stop_signal_to_the_parent_stops_every_worker(signum, tmp_path, tiny_yaml,
                                                       uninterrupted, capfd):
    config, runs = tiny_yaml(CONFIG, file="stopped.yaml"), tmp_path / "runs"
    proc, workers = start(config, runs)
    assert len(workers) == 2, workers
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == f"rankzoo: terminated ({name})"
    assert "Traceback" not in err
    assert not [pid for pid in workers if alive(pid)]  # the parent waited for them
    for variant, status in statuses(runs).items():
        assert status["state"] == "stopped", (variant, status)
        assert status["reason"].startswith("interrupted (SIGTERM"), status
        assert 5 <= status["step"] < CONFIG["train"]["max_steps"]
    if signum == signal.SIGTERM:  # one resume is enough: both stop the same way
        resumed_equals(config, runs, uninterrupted)


def test_workers_of_a_parent_killed_outright_stop_by_themselves(tmp_path, tiny_yaml,
                                                               uninterrupted):
    config, runs = tiny_yaml(CONFIG, file="stopped.yaml"), tmp_path / "runs"
    proc, workers = start(config, runs)
    assert len(workers) == 2, workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while any(alive(pid) for pid in workers) and time.monotonic() - killed < ORPHAN_SECONDS:
        time.sleep(WATCH_SECONDS / 5)
    assert not [pid for pid in workers if alive(pid)], \
        f"workers still alive {ORPHAN_SECONDS} s after their parent was killed"
    for variant, status in statuses(runs).items():
        assert status["state"] == "stopped", (variant, status)
        assert f"its parent process {proc.pid} is gone" in status["reason"], status
    resumed_equals(config, runs, uninterrupted)
