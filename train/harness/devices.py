"""The train section's Lightning settings against this machine, before anything is written.

TrainConfig.validate (train/config/sections.py) checks that accelerator, devices,
precision, strategy and num_nodes are values Lightning accepts; a config that names a GPU
stays loadable on a laptop (`rankzoo report` reads it back). Whether this machine can
run them is checked here, by `rankzoo train` and its --dry-run, with torch alone (Lightning
is slow to import): each failure is one line naming the setting, its value and what this
machine has. train/harness/fit.py's check_trainer then builds a Trainer from the settings, so that
anything Lightning refuses is refused before the run directory is touched too.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ..config import Experiment, TrainConfig
from ..config.sections import device_request
from ..data import check_divides

# Environment variables by which a launcher (SLURM, torchrun, LSF, MPI, or by hand) tells
# each node of a multi-node job where the others are: without one, Lightning's node 0
# would wait for nodes that never come.
LAUNCHER_VARIABLES = ("MASTER_ADDR", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "LSB_JOBID",
                      "OMPI_COMM_WORLD_SIZE")


# optimizers whose update is elementwise, so that a shard steps as its whole matrix would;
# Muon orthogonalizes whole matrices (train/harness/muon.py) and under FSDP would see shards
SHARDABLE_OPTIMIZERS = ("adamw", "lion")


def check_experiment(exp: Experiment) -> None:
    """The train section, and the fine-tune stage's (it may override it), on this machine;
    data.batch_size, the global batch, against the processes and micro-batches sharing it."""
    check_machine(exp.train)
    for name, variant in exp.variants.items():  # a variant may pick its own optimizer
        check_shardable(exp.train.strategy, variant.train.get("optimizer", "adamw"),
                        f"variants.{name}.train", "train")
    check_divides(exp.data.batch_size, world_size(exp.train), exp.train.accumulate_grad_batches)
    if exp.finetune is not None:
        check_machine(exp.finetune.train_config(exp.train), section="finetune.train")


def check_machine(train: TrainConfig, section: str = "train") -> None:
    """Raise ValueError naming the first setting this machine cannot run."""
    kind = accelerator_kind(train.accelerator, section)
    check_devices(train.devices, kind, section)
    check_precision(train.precision, kind, section)
    check_strategy(train.strategy, kind, section)
    check_shardable(train.strategy, train.optimizer, section)
    if train.num_nodes > 1 and not any(v in os.environ for v in LAUNCHER_VARIABLES):
        raise ValueError(f"{section}.num_nodes={train.num_nodes}: a multi-node run is started "
                         f"on every node by a launcher (SLURM, torchrun) or with MASTER_ADDR, "
                         f"MASTER_PORT and NODE_RANK set; none of {list(LAUNCHER_VARIABLES)} "
                         "is set here")


def check_shardable(strategy: str, optimizer: str, section: str = "train",
                    strategy_section: str | None = None) -> None:
    """Muon under FSDP would orthogonalize each process's shard instead of the matrix:
    refused, never run per shard (LMModule.configure_optimizers checks it again)."""
    if strategy == "fsdp" and optimizer not in SHARDABLE_OPTIMIZERS:
        raise ValueError(f"{section}.optimizer={optimizer!r} with "
                         f"{strategy_section or section}.strategy='fsdp': Muon orthogonalizes "
                         "whole matrices and FSDP gives each process a shard of them; use "
                         f"{' or '.join(SHARDABLE_OPTIMIZERS)}, or strategy ddp")


def processes(train: TrainConfig) -> int:
    """The processes a node runs for train.devices, as Lightning counts them: a count,
    the indices given, every GPU for -1 and 'auto' (one process on a CPU for 'auto')."""
    request = device_request(train.devices)
    if isinstance(request, tuple):
        return len(request)
    if isinstance(request, int):
        return request
    kind = accelerator_kind(train.accelerator)
    return 1 if kind == "cpu" else available()[kind]


def world_size(train: TrainConfig) -> int:
    """Processes on all nodes: what data.batch_size, the global batch, is shared among."""
    return processes(train) * train.num_nodes


def available() -> dict[str, int]:
    """The accelerators this machine has and their device counts (cpu: its cores)."""
    found = {"cpu": os.cpu_count() or 1}
    if torch.cuda.is_available():
        found["cuda"] = torch.cuda.device_count()
    if torch.backends.mps.is_available():
        found["mps"] = 1
    if importlib.util.find_spec("torch_xla") is not None:
        found["tpu"] = 1  # torch_xla counts its cores only once it starts; Lightning checks
    return found


def describe_available() -> str:
    """'cpu', or e.g. 'cpu, cuda (2 devices)': what the errors offer instead."""
    return ", ".join(name if name == "cpu" else f"{name} ({n} device{'s' * (n != 1)})"
                     for name, n in available().items())


def accelerator_kind(accelerator: str, section: str = "train") -> str:
    """cpu, cuda, mps or tpu: the accelerator asked for ('gpu' is cuda or mps, as in
    Lightning; 'auto' is the best one present); an error when this machine lacks it."""
    have = available()
    if accelerator == "auto":
        return next((k for k in ("cuda", "tpu", "mps") if k in have), "cpu")
    kind = {"gpu": "cuda" if "mps" not in have else "mps"}.get(accelerator, accelerator)
    if kind not in have:
        why = {"cuda": f"torch {torch.__version__} sees no CUDA GPU",
               "mps": "no Apple MPS device", "tpu": "torch_xla is not installed"}[kind]
        raise ValueError(f"{section}.accelerator={accelerator!r}: this machine has no "
                         f"{kind.upper() if kind != 'cuda' else 'GPU'} ({why}); available "
                         f"here: {describe_available()}")
    return kind


def check_devices(devices: int | str, kind: str, section: str = "train") -> None:
    """A count or indices this accelerator has (CPU: a count of processes, any number)."""
    request = device_request(devices)
    if kind == "cpu":
        if isinstance(request, tuple) or request == "all":
            raise ValueError(f"{section}.devices={devices!r}: device indices and -1 select "
                             "GPUs; on cpu, devices is a count of processes (e.g. 2) or 'auto'")
        return
    have = available()[kind]
    wanted = len(request) if isinstance(request, tuple) else request
    if isinstance(request, tuple) and max(request) >= have:
        raise ValueError(f"{section}.devices={devices!r}: no {kind} device {max(request)}; "
                         f"this machine has {have} (indices 0-{have - 1})")
    if isinstance(wanted, int) and wanted > have:
        raise ValueError(f"{section}.devices={devices!r}: asks for {wanted} {kind} devices; "
                         f"this machine has {have}")


def check_precision(precision: str, kind: str, section: str = "train") -> None:
    """Precisions this accelerator runs (Lightning would quietly swap fp16 AMP on a CPU
    for bf16; a config that says 16-mixed should get fp16 or an error)."""
    if kind == "cpu" and precision in ("16-mixed", "16"):
        raise ValueError(f"{section}.precision={precision!r}: fp16 mixed precision needs a "
                         "GPU; on cpu use bf16-mixed or 32-true")
    if precision.startswith("transformer-engine") and \
            importlib.util.find_spec("transformer_engine") is None:
        raise ValueError(f"{section}.precision={precision!r} needs NVIDIA's transformer_engine, "
                         "which is not installed")
    if kind == "cuda" and precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{section}.precision={precision!r}: this GPU "
                         f"({torch.cuda.get_device_name()}) has no bf16; use 16-mixed")


def check_strategy(strategy: str, kind: str, section: str = "train") -> None:
    """Strategies that need a GPU, a TPU or a package this machine lacks (fsdp, FSDP2,
    runs anywhere: gloo on CPUs; Lightning's older fsdp_cpu_offload needs CUDA)."""
    if strategy.startswith(("fsdp_", "deepspeed")) and kind != "cuda":
        raise ValueError(f"{section}.strategy={strategy!r} needs CUDA GPUs "
                         f"(accelerator: {kind}); available here: {describe_available()}")
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ValueError(f"{section}.strategy={strategy!r} needs deepspeed, which is not "
                         "installed")
    if strategy in ("xla", "xla_debug", "single_xla", "single_tpu") and kind != "tpu":
        raise ValueError(f"{section}.strategy={strategy!r} needs a TPU (accelerator: {kind}); "
                         f"available here: {describe_available()}")
