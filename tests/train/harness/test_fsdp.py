"""FSDP2 on CPU (train.strategy: fsdp): 2 gloo processes train what 1 process trains.

One config, data.batch_size the global batch: per-step losses and final weights of 1
process, of 2 under FSDP and of 2 under DDP agree within 1e-6; under FSDP every layer's
parameters are DTensors of which each rank holds half (a silent fallback to DDP fails);
a launch killed with SIGKILL at a step and resumed ends where the uninterrupted run did;
bf16-mixed runs; accumulation and activation checkpointing change nothing computed; what
cannot run is refused in one line. The 2-process runs go through
tests/train/harness/fsdp_worker.py, a subprocess (Lightning's launcher re-executes the
command line for rank 1, which under pytest would re-run pytest).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.train.conftest import tiny_experiment
from train.cli import main

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("fsdp_worker.py")
STEPS = 6
# the Markov language labels every position, so each rank's share of a batch holds as many
# labelled tokens as the other's and the mean of their losses is the batch's
CONFIG = tiny_experiment("markov", name="fsdp", model={"d_model": 16, "n_layers": 2},
                         data={"train_size": 64, "val_size": 8},
                         train={"max_steps": STEPS, "checkpoint_every_n_steps": 2})
TOL = 1e-6

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available here")


def launch(config: Path, runs: Path, *overrides: str, env: dict | None = None,
           resume: bool = False) -> subprocess.CompletedProcess:
    """rankzoo train on 2 processes, in a session of its own (a kill takes its group)."""
    clean = {k: v for k, v in os.environ.items()  # a clean launch, not a child rank
             if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, str(WORKER), "train", str(config), "train.devices=2", *overrides,
         "--runs-dir", str(runs), *(["--resume"] if resume else [])],
        cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120,
        start_new_session=True)


def weights(runs: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(runs / "fsdp" / "mha" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == STEPS
    return ckpt["state_dict"]


def losses(runs: Path) -> list[float]:
    """train/loss at steps 1..STEPS, from TensorBoard (logged every step), once each, and
    the validations and rank records at their steps (every 3), once each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(runs / "fsdp" / "mha"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == list(range(1, STEPS + 1))  # each step once
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 6]
    ranks = [json.loads(line)["step"] for line in
             (runs / "fsdp" / "mha" / "ranks.jsonl").read_text().splitlines()]
    assert ranks == [3, 6]  # measured once per step
    return [e.value for e in events]


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fsdp") / "fsdp.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def one_process(config) -> Path:
    runs = config.parent / "one"
    assert main(["train", str(config), "--runs-dir", str(runs)]) == 0
    return runs


@pytest.fixture(scope="module")
def fsdp(config) -> tuple[subprocess.CompletedProcess, Path]:
    runs = config.parent / "fsdp_runs"
    proc = launch(config, runs, "train.strategy=fsdp",
                  env={"RANKZOO_TEST_SHARDS": str(config.parent / "shards")})
    return proc, runs


def test_fsdp_trains_what_one_process_trains(one_process, fsdp):
    proc, runs = fsdp
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss_gap = max(abs(a - b) for a, b in zip(losses(runs), losses(one_process), strict=True))
    weight_gap = difference(weights(runs), weights(one_process))
    print(f"\n1 process vs 2-process FSDP, {STEPS} steps: per-step train/loss within "
          f"{loss_gap:.2e}, final weights within {weight_gap:.2e}")
    assert loss_gap <= TOL and weight_gap <= TOL
    # the report reads the checkpoint in one process: full, unsharded tensors
    assert all(type(t) is torch.Tensor for t in weights(runs).values())
    assert main(["report", str(runs / "fsdp"), "--format", "json"]) == 0
    # the monitor probed the gathered weights: the figures one process measured
    sharded, whole = (numbers([json.loads(line) for line in (r / "fsdp" / "mha" / "ranks.jsonl")
                               .read_text().splitlines()]) for r in (runs, one_process))
    assert sharded.keys() == whole.keys() and len(whole) > 50
    assert max(abs(sharded[k] - whole[k]) / max(1.0, abs(whole[k])) for k in whole) < 1e-4


def numbers(tree, path: str = "") -> dict[str, float]:
    """Every number of a JSON tree, by its path."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in numbers(sub, f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in numbers(sub, f"{path}/{i}").items()}
    return {path: float(tree)} if isinstance(tree, (int, float)) else {}


def test_every_layer_is_sharded_half_on_each_rank(config, fsdp):
    proc, _ = fsdp
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((config.parent / "shards" / f"rank{r}.json").read_text())
            for r in (0, 1)]
    assert seen[0]["compute_dtypes"] == ["torch.float32"]
    held = [s["parameters"] for s in seen]
    layers = [name for name in held[0] if name.startswith("layers.")]
    assert layers and held[0].keys() == held[1].keys()
    lines = []
    for name in held[0]:
        p0, p1 = held[0][name], held[1][name]
        assert p0["type"] == p1["type"] == "DTensor", f"{name} is not sharded: {p0['type']}"
        assert p0["placements"] == ["S(0)"], (name, p0["placements"])
        assert p0["local"] + p1["local"] == p0["whole"], name
        assert p0["local"] == p1["local"] == p0["whole"] // 2, name
        lines.append(f"  {name:34s} {p0['type']} {p0['placements'][0]}: "
                     f"rank 0 {p0['local']}, rank 1 {p1['local']} of {p0['whole']}")
    print("\nFSDP parameters (2 ranks):\n" + "\n".join(lines))


def test_ddp_shares_the_global_batch_alike(config, one_process):
    runs = config.parent / "ddp_runs"
    proc = launch(config, runs, "train.strategy=ddp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss_gap = max(abs(a - b) for a, b in zip(losses(runs), losses(one_process), strict=True))
    weight_gap = difference(weights(runs), weights(one_process))
    print(f"\n1 process vs 2-process DDP: losses within {loss_gap:.2e}, weights {weight_gap:.2e}")
    assert loss_gap <= TOL and weight_gap <= TOL


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_killed_at_a_step_and_resumed_ends_as_the_uninterrupted_run(config, fsdp):
    runs = config.parent / "killed"
    killed = launch(config, runs, "train.strategy=fsdp", env={"RANKZOO_TEST_KILL_AT": "4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ckpt = runs / "fsdp" / "mha" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4
    resumed = launch(config, runs, "train.strategy=fsdp", resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout + resumed.stderr
    gap = difference(weights(runs), weights(fsdp[1]))
    print(f"\nFSDP killed at step 4 and resumed vs uninterrupted: weights within {gap:.2e}")
    assert gap <= TOL
    ranks = [json.loads(line)["step"] for line in
             (runs / "fsdp" / "mha" / "ranks.jsonl").read_text().splitlines()]
    assert ranks == [3, 6]
    assert json.loads((runs / "fsdp" / "mha" / "status.json").read_text())["state"] == "finished"


def test_bf16_mixed_under_fsdp_runs(config, one_process):
    runs = config.parent / "bf16"
    shards = config.parent / "bf16_shards"
    proc = launch(config, runs, "train.strategy=fsdp", "train.precision=bf16-mixed",
                  env={"RANKZOO_TEST_SHARDS": str(shards)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):  # FSDP's MixedPrecisionPolicy: the gathered weights cast to bf16
        assert json.loads((shards / f"rank{r}.json").read_text())["compute_dtypes"] == \
            ["torch.bfloat16"]
    gap = max(abs(a - b) for a, b in zip(losses(runs), losses(one_process), strict=True))
    assert 0 < gap < 0.05  # bf16 compute: close to fp32, not equal
    assert all(t.dtype == torch.float32 for t in weights(runs).values())  # fp32 masters


@pytest.mark.parametrize("overrides", [
    ["train.accumulate_grad_batches=2"],  # 2 x 4 sequences per step, as one step of 8
    ["train.activation_checkpointing=true"],
])
def test_accumulation_and_recomputation_change_nothing(config, one_process, overrides):
    runs = config.parent / overrides[0].split("=")[0]
    assert main(["train", str(config), "--runs-dir", str(runs), *overrides]) == 0
    assert max(abs(a - b) for a, b in zip(losses(runs), losses(one_process),
                                          strict=True)) <= TOL
    assert difference(weights(runs), weights(one_process)) <= TOL


def test_recomputation_runs_each_layer_again_in_the_backward():
    from train.config import parse_experiment
    from train.harness.module import LMModule

    config = parse_experiment(CONFIG).variant_config("mha")
    module = LMModule({**config, "train": {**config["train"], "activation_checkpointing": True}})
    module.configure_model()
    calls = []
    module.model.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    module.model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
    assert len(calls) == 2  # the forward, then again in the backward
    with torch.no_grad():
        module.model(torch.zeros(2, 8, dtype=torch.long))
    assert len(calls) == 3  # no backward, nothing kept: once


@pytest.mark.parametrize("overrides, message", [
    (["train.strategy=fsdp", "train.optimizer=muon"],
     "train.optimizer='muon' with train.strategy='fsdp': Muon orthogonalizes whole "
     "matrices and FSDP gives each process a shard of them; use adamw or lion"),
    (["train.strategy=fsdp", "variants.mha.train.optimizer=muon"],
     "variants.mha.train.optimizer='muon' with train.strategy='fsdp': Muon orthogonalizes"),
    (["train.strategy=fsdp", "data.batch_size=7"],
     "data.batch_size=7 (the global batch) does not divide among 2 processes"),
    (["train.strategy=ddp", "data.batch_size=8", "train.accumulate_grad_batches=3"],
     "data.batch_size=8 (the global batch) does not divide among 2 processes x 3 "
     "micro-batches"),
    (["train.strategy=fsdp2"], "train.strategy must be one of"),
])
def test_what_cannot_run_is_refused_in_one_line(config, capsys, overrides, message):
    runs = config.parent / "refused"
    assert main(["train", str(config), "train.devices=2", *overrides,
                 "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err
    assert not runs.exists()
