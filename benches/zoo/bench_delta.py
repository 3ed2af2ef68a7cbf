"""The delta rule's kernels: fp64 agreement, and the chunked path's time as ratios.

    python -m benches.zoo.bench_delta [--lengths 2048 8192] [--repeats 3] [--dim 64]

1. fp64 agreement (B=2, H=3, T=100, K=V=16, chunks of 32): the largest absolute difference
   between the chunked WY/UT path, the per-token recurrence and the closed-form M
   (budgets/mixing/delta.py) applied to v, in the outputs and in the gradients of q, k, v,
   beta and the gate, for DeltaNet, Gated DeltaNet and KDA.
2. forward + backward at each length (B=1, H=4, K=V=--dim): the chunked path against the
   recurrence, and against linear attention's chunked path (zoo/ops/linear_attn) with the
   same K x V state per head. Times are the best of --repeats after a warm-up (on a shared
   machine the minimum is the steadiest estimate of what a kernel costs), in one process,
   so the ratios travel between machines better than the times do.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from budgets.mixing.delta import delta_mixing
from zoo.ops.delta import chunked_delta, recurrent_delta
from zoo.ops.linear_attn import chunked_linear_attn

from .bench_kernels import median_seconds


def best_seconds(fn, repeats: int) -> float:
    """The fastest of `repeats` timed calls after one warm-up."""
    fn()
    return min(median_seconds(fn, repeats=1, warmup=0) for _ in range(repeats))

GATES = {"DeltaNet": "none", "GDN": "scalar", "KDA": "channel"}


def machine() -> str:
    """The CPU's model name, as lscpu gives it (or /proc/cpuinfo)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines
             if line.lower().startswith("model name")]
    return names[0] if names else "unknown CPU"


def inputs(T: int, gate: str, B: int, H: int, K: int, V: int, dtype) -> list[torch.Tensor]:
    """q, k (L2-normed, q scaled), v, beta and the log gate (if any), leaves with grads."""
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(B, H, T, K, generator=g), dim=-1) / K ** 0.5
    k = F.normalize(torch.randn(B, H, T, K, generator=g), dim=-1)
    v, beta = torch.randn(B, H, T, V, generator=g), torch.rand(B, H, T, generator=g)
    shape = {"none": None, "scalar": (B, H, T), "channel": (B, H, T, K)}[gate]
    tensors = [q, k, v, beta] + ([] if shape is None else
                                 [F.logsigmoid(torch.randn(*shape, generator=g) + 3)])
    return [t.to(dtype).requires_grad_() for t in tensors]


def outputs_and_grads(fn, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    o = fn(*tensors)
    cot = torch.cos(torch.arange(o.numel(), dtype=o.dtype)).view_as(o)
    return [o.detach(), *torch.autograd.grad(o, tensors, cot)]


def agreement() -> Table:
    table = Table(title="fp64 agreement, max |difference|, B=2 H=3 T=100 K=V=16, chunks of 32")
    table.add_column("gate")
    for column in ("ch-rec o", "grads", "Mv-rec o", "grads", "Mv-ch o", "grads"):
        table.add_column(column, justify="right")
    for name, gate in GATES.items():
        tensors = inputs(100, gate, 2, 3, 16, 16, torch.float64)
        paths = {
            "chunked": lambda *t: chunked_delta(*t, chunk_size=32)[0],
            "recurrence": lambda *t: recurrent_delta(*t)[0],
            "closed": lambda q, k, v, beta, *g: delta_mixing(q, k, beta, *g) @ v,
        }
        got = {key: outputs_and_grads(fn, tensors) for key, fn in paths.items()}
        cells = []
        for a, b in (("chunked", "recurrence"), ("closed", "recurrence"), ("closed", "chunked")):
            diffs = [float((x - y).abs().max()) for x, y in zip(got[a], got[b], strict=True)]
            cells += [f"{diffs[0]:.1e}", f"{max(diffs[1:]):.1e}"]
        table.add_row(name, *cells)
    table.caption = ("ch: the chunked WY/UT path; rec: the per-token recurrence; Mv: the "
                     "closed form applied to v; grads: the largest over q, k, v, beta and the "
                     "gate")
    return table


def fwd_bwd(fn, tensors: list[torch.Tensor]):
    def step() -> None:
        o, state = fn(*tensors)
        torch.autograd.grad(o.sum() + state.sum(), tensors)
    return step


def timings(args: argparse.Namespace) -> Table:
    K = V = args.dim
    table = Table(title=f"fwd+bwd, B=1 H=4 K=V={K}, chunks of 64, "
                        f"{torch.get_num_threads()} threads")
    for column in ("gate", "T", "ch ms", "rec ms", "rec/ch", "linear ms", "ch/linear"):
        table.add_column(column, justify="left" if column == "gate" else "right")
    for T in args.lengths:
        lin = inputs(T, "none", 1, 4, K, V, torch.float32)[:3]
        linear = best_seconds(fwd_bwd(chunked_linear_attn, lin), args.repeats)
        for name, gate in GATES.items():
            tensors = inputs(T, gate, 1, 4, K, V, torch.float32)
            chunked = best_seconds(fwd_bwd(chunked_delta, tensors), args.repeats)
            recurrence = best_seconds(fwd_bwd(recurrent_delta, tensors), args.repeats)
            table.add_row(name, str(T), f"{1e3 * chunked:.0f}", f"{1e3 * recurrence:.0f}",
                          f"{recurrence / chunked:.0f}x", f"{1e3 * linear:.0f}",
                          f"{chunked / linear:.1f}x")
    table.caption = ("ch: the chunked path; rec: the per-token recurrence; linear: "
                     "zoo/ops/linear_attn's chunked path, unnormalized, the same K x V state "
                     "per head, no decay and no delta correction")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64, help="K = V per head")
    args = parser.parse_args(argv)
    console = Console()
    console.print(f"machine: {machine()}, torch {torch.__version__}")
    console.print(agreement())
    console.print(timings(args))


if __name__ == "__main__":
    main()
