"""`rankzoo train --jobs`: runs side by side on worker processes report what runs in turn
report, a failing run stops the start of the rest, and how many workers `auto` chooses."""

import json
import signal

import pytest
import torch

from tests.train.conftest import MQA, tiny_experiment
from train.cli import main, parse
from train.config import parse_experiment
from train.experiment import parallel
from train.experiment.parallel import MIN_STEPS, auto_jobs, check_jobs, choose_jobs
from train.experiment.stages import train_experiment
from train.harness.module import NonFiniteLoss

GIB = 2**30
TIMED = ("fit_seconds", "tokens_per_second")  # wall time: the one difference allowed


def report_without_time(vdir) -> dict:
    report = json.loads((vdir / "report.json").read_text())
    for variant in report["variants"]:
        for key in TIMED:
            variant["metrics"].pop(key)
    return report


def test_runs_side_by_side_report_what_runs_in_turn_report(tmp_path, capfd):
    # ssm first: the slower run, so that mqa ends first and the order is the experiment's
    raw = tiny_experiment(variants={"mha": None, "ssm": {"block": "ssm", "d_state": 4},
                                    "mqa": MQA})
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps(raw))  # JSON is YAML, in the order written
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # in turn at 1 thread; the workers get 1 // 2 -> 1 each
    try:
        out = {}
        for jobs in ("1", "2"):
            assert main(["train", str(config), "--runs-dir", str(tmp_path / jobs),
                         "--jobs", jobs, "--format", "json"]) == 0
            out[jobs] = capfd.readouterr()
    finally:
        torch.set_num_threads(threads)
    assert [v["variant"] for v in json.loads(out["2"].out)["variants"]] == ["ssm", "mqa"]
    for name in ("ssm", "mqa"):
        one, two = (report_without_time(tmp_path / jobs / "tiny" / name) for jobs in "12")
        assert one == two
        ranks = [(tmp_path / jobs / "tiny" / name / "ranks.jsonl").read_text() for jobs in "12"]
        assert ranks[0] == ranks[1]
    # one header instead of a rule per variant, and lines that name their run
    err = out["2"].err
    assert "training 2 variants on 2 processes x 1 thread (--jobs 2)" in err
    assert "variant 1/2" in out["1"].err and "variant 1/2" not in err
    for name in ("ssm", "mqa"):
        assert f"  {name} step 3: train/loss " in err and f"  {name} step 6: train/loss " in err
    assert "  step 3: train/loss " in out["1"].err  # in turn: as before


def test_a_failing_run_stops_the_start_of_the_rest(tmp_path, capfd):
    # bad, first in the pool's queue, starts first and diverges at step 1, while good
    # trains its 30 steps
    exp = parse_experiment(tiny_experiment(
        variants={"mha": None, "bad": {"block": "softmax", "train": {"lr": 1e4}},
                  "good": {"block": "softmax"}, "mqa": MQA},
        train={"max_steps": 30}))
    with pytest.raises(NonFiniteLoss, match="variant 'bad'"):
        train_experiment(exp, runs_dir=tmp_path, jobs=2)
    err = capfd.readouterr().err
    assert "bad: failed (NonFiniteLoss); not starting the 1 run left" in err
    run_dir = tmp_path / "tiny"
    assert json.loads((run_dir / "bad" / "status.json").read_text())["state"] == "diverged"
    # the run under way finished; the one not started was not
    assert json.loads((run_dir / "good" / "status.json").read_text())["state"] == "finished"
    assert not (run_dir / "mqa").exists()


def test_a_diverged_grid_point_is_a_finding_side_by_side_too(tmp_path, capfd):
    exp = parse_experiment(tiny_experiment(name="sw", sweep={"lr": [1e-3, 1e4]}))
    report = train_experiment(exp, runs_dir=tmp_path, jobs=2)
    assert [v["variant"] for v in report["variants"]] == ["mha_lr0.001"]
    assert (tmp_path / "sw" / "mha_lr10000" / "diverged.txt").is_file()
    assert "training 2 sweep runs on 2 processes" in capfd.readouterr().err


# ---------------------------------------------------------------- how many workers

@pytest.mark.parametrize("runs, steps, kind, cores, available, jobs", [
    (12, 600, "cpu", 2, None, 2),            # the main job on 2 cores
    (12, 600, "cpu", 64, None, 12),          # no more workers than runs
    (12, 600, "cpu", 64, 5 * GIB, 5),        # as many as fit side by side
    (12, 600, "cpu", 64, GIB // 2, 1),       # not even one fits: in turn (preflight judged it)
    (2, MIN_STEPS - 1, "cpu", 16, None, 1),  # short runs: a worker's start would cost more
    (2, MIN_STEPS, "cpu", 16, None, 2),
    (1, 600, "cpu", 16, None, 1),            # one run
    (12, 600, "cuda", 16, None, 1),          # one process drives the accelerator
    (12, 600, "mps", 16, None, 1),
], ids=["main-job", "runs", "memory", "no-memory", "short", "threshold", "one-run", "cuda",
        "mps"])
def test_auto_jobs(runs, steps, kind, cores, available, jobs):
    assert auto_jobs(runs, steps, kind, cores, available, per_worker=GIB) == jobs


def three_runs(**train):
    return parse_experiment(tiny_experiment(
        variants={"mqa": MQA, "gqa": {"block": "softmax", "n_kv_heads": 2}},  # and mha
        train=train))


def test_auto_keeps_a_short_experiment_in_turn_and_follows_the_memory(monkeypatch):
    assert choose_jobs(three_runs(), "auto", cores=8).processes == 1  # 6 steps
    long = three_runs(max_steps=MIN_STEPS)
    monkeypatch.setattr(parallel, "available_memory", lambda kind: 64 * GIB)
    assert choose_jobs(long, "auto", cores=8) == parallel.Jobs(3, 2, "auto")
    need = parallel.worker_bytes(long)  # the worker itself, and the largest run's estimate
    assert parallel.WORKER_BYTES < need < parallel.WORKER_BYTES + 2**20
    monkeypatch.setattr(parallel, "available_memory", lambda kind: 2 * need + 1)
    assert choose_jobs(long, "auto", cores=8).processes == 2
    assert choose_jobs(long, "auto", cores=1).processes == 1


def test_an_explicit_count_is_followed_up_to_the_runs():
    assert choose_jobs(three_runs(), 2, cores=8) == parallel.Jobs(2, 4, 2)
    assert choose_jobs(three_runs(), 16, cores=8) == parallel.Jobs(3, 2, 16)
    assert choose_jobs(three_runs(), 2, cores=1) == parallel.Jobs(2, 1, 2)


def test_a_distributed_run_trains_in_turn_and_says_so():
    jobs = choose_jobs(three_runs(devices=2, strategy="ddp"), 4, cores=8)
    assert jobs.processes == 1
    assert jobs.notes == ("--jobs 4: a distributed run (train.devices=2, train.num_nodes=1, "
                          "train.strategy='ddp'); its runs train one at a time",)
    assert choose_jobs(three_runs(devices=2, strategy="ddp"), "auto", cores=8).notes == ()


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", "all", True, None])
def test_bad_jobs_are_named(value):
    with pytest.raises(ValueError, match=f"jobs must be a positive int or 'auto', got "
                                         f"{value!r}"):
        check_jobs(value)


@pytest.mark.parametrize("flag, message", [
    ("0", "expected a positive int or 'auto', got '0'"),
    ("-2", "expected a positive int or 'auto', got '-2'"),
    ("two", "expected a positive int or 'auto', got 'two'"),
    ("1.5", "expected a positive int or 'auto', got '1.5'"),
])
def test_the_cli_refuses_a_bad_jobs_flag(flag, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(["train", "exp.yaml", f"--jobs={flag}"])
    assert e.value.code == 2
    assert f"argument --jobs: {message}" in capsys.readouterr().err


def test_the_cli_takes_auto_by_default_and_a_count():
    assert parse(["train", "exp.yaml"]).jobs == "auto"
    assert parse(["train", "exp.yaml", "--jobs", "3"]).jobs == 3
    assert parse(["train", "exp.yaml", "--jobs", "auto", "train.max_steps=9"]).jobs == "auto"


class Unpicklable(Exception):
    def __init__(self, code: int, why: str):  # args holds only the message: unpickling fails
        super().__init__(f"{code}: {why}")


def test_an_error_that_cannot_cross_to_the_parent_is_named_instead():
    assert parallel.picklable(NonFiniteLoss("x")) and not parallel.picklable(Unpicklable(1, "x"))

    def train_one(*args, **kwargs):
        raise Unpicklable(7, "no")
    exp = parse_experiment(tiny_experiment())
    handler = signal.getsignal(signal.SIGINT)  # work() leaves ^C ignored, as a worker idles
    try:
        with pytest.raises(RuntimeError, match=r"^mha: Unpicklable: 7: no$"):
            parallel.work(train_one, exp, "mha", None, False)
    finally:
        signal.signal(signal.SIGINT, handler)
