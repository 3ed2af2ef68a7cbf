"""The Trainer settings (accelerator, devices, precision, strategy, num_nodes) are checked
when the config is loaded, by --dry-run too: a bad one is one `rankzoo: error:` line
naming the value (exit 2), and nothing is written. A run that fails before its first
step leaves no run directory behind; one that fails later keeps what it trained."""

import importlib.util
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
from rich.console import Console

import train.harness.devices as devices
import train.harness.module as module_py
from tests.train.conftest import tiny_markov
from train.cli import main
from train.config import TrainConfig, parse_experiment
from train.config.sections import ACCELERATORS, PRECISIONS, STRATEGIES, device_request
from train.experiment.stages import train_experiment
from train.rundir.status import read_status

ROOT = Path(__file__).resolve().parents[3]
TINY = tiny_markov("settings", checkpoint_every=3)
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
NO_XLA = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None,
                            reason="torch_xla is installed")


@pytest.fixture
def config(tiny_yaml):
    return tiny_yaml(TINY, file="settings.yaml")


LATE_CRASHES = [  # each ended in a traceback after a run directory stub was written
    pytest.param("train.accelerator=gpu", "train.accelerator='gpu': this machine has no GPU",
                 marks=NO_CUDA, id="gpu-without-cuda"),
    pytest.param("train.accelerator=tpu", "train.accelerator='tpu': this machine has no TPU",
                 marks=NO_XLA, id="tpu"),
    pytest.param("train.devices=0", "train.devices must be a count >= 1, -1 or 'auto' (all), "
                 "or device indices like '0,2', got 0", id="devices-0"),
]


@pytest.mark.parametrize("dry_run", [False, True], ids=["train", "dry-run"])
@pytest.mark.parametrize("override, message", LATE_CRASHES)
def test_a_setting_this_machine_cannot_run_is_one_error_line(config, tmp_path, capsys,
                                                              override, message, dry_run):
    runs = tmp_path / "runs"
    argv = ["train", str(config), override, "--runs-dir", str(runs)]
    assert main(argv + ["--dry-run"] * dry_run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rankzoo: error: ") and message in err[0], err
    assert not runs.exists()


@NO_CUDA
def test_the_gpu_error_says_what_is_available_and_exits_2(config, tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "train.cli", "train", str(config),
                           "train.accelerator=gpu", "--runs-dir", str(runs)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "rankzoo: error: train.accelerator='gpu': this machine has no GPU (torch "
        f"{torch.__version__} sees no CUDA GPU); available here: cpu"]
    assert not runs.exists()


@pytest.mark.parametrize("key, value, named", [
    ("accelerator", "gpus", "train.accelerator must be one of"),
    ("precision", "8-true", "train.precision must be one of"),
    ("strategy", "dpp", "train.strategy must be one of"),
    ("devices", "0,x", "train.devices: expected device indices like '0,2', got '0,x'"),
    ("devices", "1,1", "train.devices: device index repeated in '1,1'"),
    ("devices", -2, "train.devices must be a count >= 1"),
    ("num_nodes", 0, "train.num_nodes must be >= 1, got 0"),
])
def test_values_lightning_does_not_accept_are_named(key, value, named):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{key: value})
    assert named in str(e.value) and repr(value) in str(e.value)


@pytest.mark.parametrize("devices, request_", [
    (1, 1), ("2", 2), (-1, "all"), ("auto", "auto"), ("0,2", (0, 2)), ("1,", (1,))])
def test_devices_read_as_lightning_reads_them(devices, request_):
    assert device_request(devices) == request_


def test_the_accepted_values_are_lightnings():
    from lightning.fabric import connector
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    assert set(ACCELERATORS) == {*AcceleratorRegistry.available_accelerators(), "gpu", "auto"}
    assert set(STRATEGIES) == {*StrategyRegistry.available_strategies(), "auto"}
    accepted = {str(p) for alias in (connector._PRECISION_INPUT_STR,
                                     connector._PRECISION_INPUT_STR_ALIAS)
                for p in typing.get_args(alias)}
    assert set(PRECISIONS) == accepted


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine as if it had one CUDA device."""
    monkeypatch.setattr(devices, "available", lambda: {"cpu": 2, "cuda": 1})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Old GPU")


@pytest.mark.parametrize("settings, message", [
    ({"devices": 2}, "train.devices=2: asks for 2 cuda devices; this machine has 1"),
    ({"devices": "0,3"}, "train.devices='0,3': no cuda device 3; this machine has 1"),
    ({"precision": "bf16-mixed"}, "train.precision='bf16-mixed': this GPU (Old GPU) has no bf16"),
    ({"strategy": "xla"}, "train.strategy='xla' needs a TPU (accelerator: cuda); available "
                          "here: cpu, cuda (1 device)"),
])
def test_a_gpu_setting_is_checked_against_the_gpus_there_are(one_gpu, settings, message):
    with pytest.raises(ValueError) as e:
        devices.check_machine(TrainConfig(accelerator="gpu", **settings))
    assert message in str(e.value)
    devices.check_machine(TrainConfig(accelerator="gpu", devices=1))  # this one it has


@pytest.mark.parametrize("settings, message", [
    ({"devices": -1}, "train.devices=-1: device indices and -1 select GPUs"),
    ({"precision": "16-mixed"}, "train.precision='16-mixed': fp16 mixed precision needs a GPU"),
    ({"strategy": "fsdp_cpu_offload"},
     "train.strategy='fsdp_cpu_offload' needs CUDA GPUs (accelerator: cpu)"),
])
def test_a_cpu_setting_lightning_would_refuse_or_swap_is_an_error(monkeypatch, settings,
                                                                    message):
    monkeypatch.setattr(devices, "available", lambda: {"cpu": 2})
    with pytest.raises(ValueError) as e:
        devices.check_machine(TrainConfig(**settings))
    assert message in str(e.value)


def test_fsdp_runs_on_a_cpu_through_lightnings_model_parallel_strategy(monkeypatch):
    from lightning.pytorch.strategies import ModelParallelStrategy

    from train.harness.fit import check_trainer, device_settings

    monkeypatch.setattr(devices, "available", lambda: {"cpu": 2})
    train = TrainConfig(strategy="fsdp", devices=2, num_nodes=1)
    devices.check_machine(train)
    check_trainer(train)
    strategy = device_settings(train)["strategy"]
    assert isinstance(strategy, ModelParallelStrategy)
    # all processes data-parallel, none tensor-parallel ("auto" would mean the reverse)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 1)


def test_several_nodes_need_a_launcher(monkeypatch):
    for name in devices.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="train.num_nodes=2: a multi-node run is started"):
        devices.check_machine(TrainConfig(num_nodes=2, devices=2, strategy="ddp"))
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    devices.check_machine(TrainConfig(num_nodes=2, devices=2, strategy="ddp"))


def test_the_finetune_stage_settings_are_checked_too(tmp_path):
    data = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2, "train_size": 32,
            "val_size": 8, "batch_size": 8}
    raw = {**TINY, "data": data, "finetune": {"ranks": [2], "targets": ["q_proj"],
                                              "data": {**data, "permute_seed": 1},
                                              "train": {"accelerator": "tpu"}}}
    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed")
    with pytest.raises(ValueError, match="finetune.train.accelerator='tpu'"):
        devices.check_experiment(parse_experiment(raw))


def test_lightning_refusals_are_named_before_anything_is_written(monkeypatch, tmp_path):
    from train.harness.fit import check_trainer

    with pytest.raises(ValueError) as e:
        check_trainer(TrainConfig(devices=-1))
    assert str(e.value).startswith("Lightning refuses train.accelerator='cpu', "
                                   "train.devices=-1, ")
    monkeypatch.setattr(devices, "check_machine", lambda *a, **k: None)  # as if it passed
    with pytest.raises(ValueError, match="Lightning refuses"):
        train_experiment(parse_experiment({**TINY, "train": {**TINY["train"], "devices": -1}}),
                         tmp_path, console=Console(quiet=True))
    assert not (tmp_path / "settings").exists()


def test_a_failure_before_the_first_step_leaves_no_stub(monkeypatch, tmp_path):
    def refuse(self):
        raise RuntimeError("no optimizer today")

    monkeypatch.setattr(module_py.LMModule, "configure_optimizers", refuse)
    with pytest.raises(RuntimeError, match="no optimizer today"):
        train_experiment(parse_experiment(TINY), tmp_path, console=Console(quiet=True))
    assert not (tmp_path / "settings").exists()


def test_a_failure_after_a_step_keeps_the_run_and_says_where_it_stopped(monkeypatch, tmp_path):
    step_fn = module_py.LMModule.training_step

    def fail_at_4(self, batch, batch_idx):
        if self.global_step == 4:
            raise RuntimeError("disk on fire")
        return step_fn(self, batch, batch_idx)

    monkeypatch.setattr(module_py.LMModule, "training_step", fail_at_4)
    with pytest.raises(RuntimeError, match="disk on fire"):
        train_experiment(parse_experiment(TINY), tmp_path, console=Console(quiet=True))
    status = read_status(tmp_path / "settings" / "mha")
    assert (status["state"], status["step"]) == ("stopped", 4)
    assert status["reason"] == "RuntimeError: disk on fire"
    assert (tmp_path / "settings" / "mha" / "checkpoints" / "last.ckpt").is_file()
