"""Benchmark of rankzoo's Muon against torch's: one optimizer step, measured in one run.

    python -m benches.train.harness.bench_muon [--config configs/quick.yaml]
        [--variant mha] [--steps N]

Builds the variant's model and times one Muon step over its hidden matrices (the
parameters `optimizer: muon` gives Muon; random gradients, the same each step) with
torch.optim.Muon (Newton-Schulz always in bf16) and with train/harness/muon.py's Muon in
bf16, in fp32 and as detected, after one 256x64 orthogonalization in each dtype. The
optimizers take turns step by step, so drift in the machine's load reaches all of them
alike; each figure is the median over the steps. It prints the CPU's bf16 flags, the
detection's verdict and each time as a ratio to torch's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from train.config import load_experiment
from train.harness.module import LMModule
from train.harness.muon import Muon, cpu_bf16_native, ortho_dtype, zeropower_batched
from train.harness.optim import muon_params

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> str:
    """The bf16 matmul flags /proc/cpuinfo lists (for the record; detection times a probe)."""
    path = Path("/proc/cpuinfo")
    words = set(path.read_text().split()) if path.exists() else set()
    found = [f for f in BF16_FLAGS if f in words]
    return ", ".join(found) if found else "none"


def hidden_matrices(config: str, variant: str) -> list[torch.nn.Parameter]:
    model = LMModule(load_experiment(config).variant_config(variant)).model
    params = [torch.nn.Parameter(p.detach().clone()) for p in muon_params(model)]
    torch.manual_seed(0)
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def optimizers(params: list[torch.nn.Parameter]) -> dict[str, torch.optim.Optimizer]:
    kw = {"lr": 1e-2, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    copies = lambda: [torch.nn.Parameter(p.detach().clone()) for p in params]  # noqa: E731
    named = {"torch Muon (bf16)": torch.optim.Muon(copies(), **kw),
             "ours, bf16": Muon(copies(), dtype=torch.bfloat16, **kw),
             "ours, fp32": Muon(copies(), dtype=torch.float32, **kw),
             "ours, detected": Muon(copies(), **kw)}
    for opt in named.values():
        for q, p in zip(opt.param_groups[0]["params"], params, strict=True):
            q.grad = p.grad
    return named


def time_steps(named: dict[str, torch.optim.Optimizer], steps: int) -> dict[str, float]:
    for opt in named.values():  # warm-up: state allocation, the detection's probe
        opt.step()
    seconds: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(steps):
        for name, opt in named.items():
            start = time.perf_counter()
            opt.step()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def newton_schulz_ms(dtype: torch.dtype, repeats: int = 50) -> float:
    """One 256x64 orthogonalization, the issue's figure (5.8 ms bf16, 0.74 ms fp32 on Zen 2)."""
    grad = torch.randn(1, 256, 64)  # [1, m, k]
    coeffs = torch.optim.Muon([torch.nn.Parameter(grad[0])]).defaults["ns_coefficients"]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        zeropower_batched(grad, coeffs, 5, 1e-7, dtype)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quick.yaml")
    parser.add_argument("--variant", default="mha")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    params = hidden_matrices(args.config, args.variant)
    shapes = sorted({tuple(p.shape) for p in params})
    print(f"{args.variant}: {len(params)} hidden matrices, shapes {shapes}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    detected = ortho_dtype(torch.device("cpu"))
    print(f"CPU bf16 flags: {cpu_flags()}; probe: bf16 matmul native = {cpu_bf16_native()}"
          f" -> Newton-Schulz in {str(detected).removeprefix('torch.')}")
    bf16, fp32 = newton_schulz_ms(torch.bfloat16), newton_schulz_ms(torch.float32)
    print(f"one 256x64 Newton-Schulz: bf16 {bf16:.3f} ms, fp32 {fp32:.3f} ms "
          f"(bf16 {bf16 / fp32:.2f}x fp32)")
    times = time_steps(optimizers(params), args.steps)
    base = times["torch Muon (bf16)"]
    for name, t in times.items():
        print(f"  {name:18s} {t * 1e3:7.3f} ms/step   {t / base:5.2f}x torch's")


if __name__ == "__main__":
    main()
