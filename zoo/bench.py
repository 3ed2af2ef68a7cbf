"""Benchmarks: commands that print figures measured in one run, as ratios.

    python -m zoo.bench softmax [--seq-len 1024] [--batch 4] [--d-model 256] [--n-heads 4]

Times are medians over repeats after a warm-up; ratios compare paths measured in the same
process on the same inputs, so they travel between machines better than the times do.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

import zoo


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def forward_backward(block: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        block.zero_grad(set_to_none=True)
        block(x).sum().backward()

    return step


def bench_softmax(args: argparse.Namespace) -> Table:
    """Fused (auto) vs reference forward+backward of the softmax block, MHA/GQA/MQA."""
    table = Table(title=f"softmax fwd+bwd, B={args.batch} T={args.seq_len} D={args.d_model} "
                        f"H={args.n_heads}, {torch.get_num_threads()} threads")
    table.add_column("variant", no_wrap=True)
    for column in ("fused backend", "fused ms", "reference ms", "reference / fused"):
        table.add_column(column, justify="right")
    x = torch.randn(args.batch, args.seq_len, args.d_model, requires_grad=True)
    for label, kwargs in zoo.block_class("softmax").variants(args.d_model, args.n_heads):
        times = {}
        for backend in ("auto", "reference"):
            torch.manual_seed(0)
            block = zoo.build("softmax", d_model=args.d_model, n_heads=args.n_heads,
                              backend=backend, **kwargs)
            times[backend] = median_seconds(forward_backward(block, x), args.repeats)
        table.add_row(label, block_backend(args, kwargs), f"{1e3 * times['auto']:.1f}",
                      f"{1e3 * times['reference']:.1f}", f"{times['reference'] / times['auto']:.2f}x")
    return table


def block_backend(args: argparse.Namespace, kwargs: dict) -> str:
    block = zoo.build("softmax", d_model=args.d_model, n_heads=args.n_heads, **kwargs)
    block(torch.randn(1, 2, args.d_model))
    return block.backend


BENCHMARKS = {"softmax": bench_softmax}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    Console().print(BENCHMARKS[args.name](args))


if __name__ == "__main__":
    main()
