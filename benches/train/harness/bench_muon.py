"""Benchmark of rankzoo's Muon against torch's: one optimizer step, measured in one run.

    python -m benches.train.harness.bench_muon [--config configs/quick.yaml]
        [--variant mha] [--steps N] [--curve]

Builds the variant's model and times one Muon step over its hidden matrices (the
parameters `optimizer: muon` gives Muon; random gradients, the same each step) with
torch.optim.Muon (Newton-Schulz always in bf16) and with train/harness/muon.py's Muon in
bf16, in fp32 and as detected (per shape, the clearly faster of the two on this CPU),
after one 256x64 orthogonalization in each dtype. The optimizers take turns step by step,
so drift in the machine's load reaches all of them alike; each figure is the median over
the steps. It prints the CPU's bf16 flags, the
detection's verdict per shape and each time as a ratio to torch's.

With --curve it trains the variant instead, for the config's steps in bench_loop's plain
loop (the same model, data, schedule and clipping as the harness) from one seed, once with
torch.optim.Muon and once with each of ours, and compares their training-loss curves:
the largest gap step by step and between 50-step means, and the final 50-step mean. The
yardstick is torch's Muon against itself from another seed: a Muon whose curve is
further from torch's than that does not train the same way.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import torch

from train.config import load_experiment
from train.harness.module import LMModule
from train.harness.muon import Muon, ortho_dtype, zeropower_batched
from train.harness.optim import muon_params

from .bench_loop import plain_loop

WINDOW = 50  # steps per mean: one step's loss is one batch's, noisy

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


# ---------------------------------------------------------------- --curve

MUONS = {"torch Muon (bf16)": torch.optim.Muon,
         "ours, bf16": functools.partial(Muon, dtype=torch.bfloat16),
         "ours, fp32": functools.partial(Muon, dtype=torch.float32),
         "ours, detected": Muon}


def window_means(losses: list[float]) -> torch.Tensor:
    curve = torch.tensor(losses, dtype=torch.float64)  # [steps]
    return curve.unfold(0, min(WINDOW, len(losses)), 1).mean(-1)  # [steps - WINDOW + 1]


def curve_gaps(losses: list[float], reference: list[float]) -> dict[str, float]:
    """How far one training-loss curve is from another: the largest step gap, the largest
    gap between WINDOW-step means, and the final mean of each."""
    step = (torch.tensor(losses) - torch.tensor(reference)).abs().max().item()
    ours, ref = window_means(losses), window_means(reference)
    return {"step": step, "mean": (ours - ref).abs().max().item(),
            "final": ours[-1].item(), "final_ref": ref[-1].item()}


def curves(config: str, variant: str) -> dict[str, list[float]]:
    """The variant's training-loss curve with each Muon, from its seed; and torch's from
    the next seed (the yardstick)."""
    exp = load_experiment(config)
    if exp.variant_config(variant)["train"].get("optimizer") != "muon":
        raise SystemExit(f"variant {variant!r} of {config} does not train with Muon")
    seed = exp.variant_config(variant)["seed"]
    other = load_experiment(config, [f"seed={seed + 1}"])
    out = {name: plain_loop(exp, variant, muon)["losses"] for name, muon in MUONS.items()}
    out["torch Muon, seed +1"] = plain_loop(other, variant, torch.optim.Muon)["losses"]
    return out


def print_curves(config: str, variant: str) -> bool:
    """Print each curve's gaps to torch's; True where every one of ours is within the
    seed-to-seed yardstick."""
    losses = curves(config, variant)
    base = losses.pop("torch Muon (bf16)")
    gaps = {name: curve_gaps(curve, base) for name, curve in losses.items()}
    yard = gaps["torch Muon, seed +1"]
    print(f"{variant}: {len(base)} steps, training loss against torch's Muon from the same "
          f"seed (final {WINDOW}-step mean {yard['final_ref']:.4f})")
    for name, g in gaps.items():
        shift = g["final"] - g["final_ref"]
        print(f"  {name:20s} largest step gap {g['step']:.4f}, largest {WINDOW}-step-mean "
              f"gap {g['mean']:.4f}, final mean {g['final']:.4f} ({shift:+.4f})")
    ok = all(g["mean"] <= yard["mean"] for n, g in gaps.items() if n.startswith("ours"))
    print(f"ours within torch's seed-to-seed gap ({yard['mean']:.4f}): {'yes' if ok else 'NO'}")
    return ok


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quick.yaml")
    parser.add_argument("--variant", default="mha")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--curve", action="store_true",
                        help="train the variant with each Muon and compare loss curves")
    args = parser.parse_args(argv)
    if args.curve:
        raise SystemExit(0 if print_curves(args.config, args.variant) else 1)
    params = hidden_matrices(args.config, args.variant)
    shapes = sorted({tuple(p.shape) for p in params})
    print(f"{args.variant}: {len(params)} hidden matrices, shapes {shapes}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cpu = torch.device("cpu")
    verdicts = ", ".join(f"{m}x{k} {str(ortho_dtype(cpu, (m, k))).removeprefix('torch.')}"
                         for m, k in shapes)
    print(f"CPU bf16 flags: {cpu_flags()}; the probe's Newton-Schulz dtype per shape: "
          f"{verdicts}")
    bf16, fp32 = newton_schulz_ms(torch.bfloat16), newton_schulz_ms(torch.float32)
    print(f"one 256x64 Newton-Schulz: bf16 {bf16:.3f} ms, fp32 {fp32:.3f} ms "
          f"(bf16 {bf16 / fp32:.2f}x fp32)")
    times = time_steps(optimizers(params), args.steps)
    base = times["torch Muon (bf16)"]
    for name, t in times.items():
        print(f"  {name:18s} {t * 1e3:7.3f} ms/step   {t / base:5.2f}x torch's")


if __name__ == "__main__":
    main()
