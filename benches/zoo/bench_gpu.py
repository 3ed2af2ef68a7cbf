"""The kernels on a GPU: attention fwd+bwd TFLOP/s against the chip's bf16 peak, and the fused
linear-attention and SSD kernels against rankzoo's chunked torch paths.

    python -m benches.zoo.bench_gpu                       # CUDA, the sizes users train at
    python -m benches.zoo.bench_gpu --device cpu --small  # the same code on tiny sizes

Every backend is checked against the reference (or the chunked path) on the same inputs
before it is timed, so a fast wrong kernel shows up as an error, not as a figure. Times are
medians of CUDA-event-timed repeats after a warm-up; the figures to carry between machines
are the ratios and the fraction of peak. A backend that cannot serve here gets a row that
says why instead of a time. benches/gpu.sh runs this among the GPU checks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console, Group
from rich.table import Table

from zoo.ops.attention import ATTENTION, AttnSpec
from zoo.ops.linear_attn import LINEAR_ATTN, LinearAttnSpec
from zoo.ops.ssd import SSD, SSDSpec

# dense bf16 tensor-core peak, TFLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "4090": 165.0}

SKIPPED: list[str] = []  # "op backend at shape: why it was not timed", printed at the end
SIZES = {  # name -> (B, H, T, D) per op; --small for a CPU smoke run
    "full": {"attention": [(4, 16, 2048, 128), (1, 16, 8192, 128)],
             "linear_attn": [(4, 16, 4096, 64)], "ssd": [(4, 4096, 32, 64, 1, 128)]},
    "small": {"attention": [(1, 2, 128, 32)], "linear_attn": [(1, 2, 128, 16)],
              "ssd": [(1, 128, 2, 16, 1, 16)]},
}


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of fn over repeats after one warm-up (CUDA events on a GPU)."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def fwd_bwd(fn: Callable[..., object], inputs: list[torch.Tensor], **kw) -> Callable[[], list]:
    """One forward and backward of fn; returns its outputs and the inputs' gradients."""
    def step() -> list[torch.Tensor]:
        out = fn(*inputs, **kw)
        outs = list(out) if isinstance(out, tuple) else [out]
        loss = sum(o.float().sum() for o in outs)
        return [*outs, *torch.autograd.grad(loss, inputs)]

    return step


def agree(name: str, got: list[torch.Tensor], want: list[torch.Tensor], tol: float) -> None:
    """Raise naming the backend and the tensor when outputs or gradients differ."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item() + 1e-6
        if err > tol * scale:
            raise AssertionError(f"{name}: tensor {i} differs from the reference: max |diff| "
                                 f"{err:.3g} against max |ref| {scale:.3g} (tol {tol:g})")


def peak_of(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p for key, p in PEAK_BF16_TFLOPS.items() if key in name), None)


def bench_attention(args, device, dtype) -> Table:
    """Causal attention fwd+bwd per backend: ms, TFLOP/s, share of the bf16 peak. FLOPs:
    forward 2 B H T^2 D (two matmuls of 2 B H T^2 D halved by causality), backward 2.5x."""
    peak = peak_of(device)
    table = Table(title=f"causal attention fwd+bwd, {dtype}, {device_name(device)}")
    for column in ("B H T D", "backend", "ms", "TFLOP/s", "of peak", "vs sdpa"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for B, H, T, D in SIZES[args.sizes]["attention"]:
        g = torch.Generator(device).manual_seed(0)
        inputs = [torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g)
                  .requires_grad_() for _ in range(3)]
        spec = AttnSpec.of(*inputs, window=None)
        want, base = None, None
        flops = 3.5 * 2 * B * H * T * T * D
        for name in ("sdpa", "flash_attn", "flex", "reference"):
            reason = ATTENTION.why_not(name, spec)
            if reason or (name == "reference" and T > 4096):
                SKIPPED.append(f"attention {name} at {B} {H} {T} {D}: "
                               f"{reason or 'T x T scores past T = 4096'}")
                continue
            step = fwd_bwd(ATTENTION.get(name).fn, inputs, window=None, scale=D ** -0.5)
            got = step()
            want = want or got
            agree(f"attention {name}", got, want, 2e-2 if dtype != torch.float32 else 1e-3)
            seconds = timed(step, device, args.repeats)
            base = base or seconds
            tflops = flops / seconds / 1e12
            table.add_row(f"{B} {H} {T} {D}", name, f"{1e3 * seconds:.2f}", f"{tflops:.1f}",
                          f"{tflops / peak:.0%}" if peak else "n/a", f"{base / seconds:.2f}x")
    table.caption = (f"peak: {peak or 'unknown'} TFLOP/s dense bf16; vs sdpa: sdpa's time "
                     f"over the backend's (> 1: faster); each backend checked against sdpa")
    return table


def bench_scans(args, device, dtype) -> Group:
    """The fused linear-attention and SSD kernels (fla, mamba_ssm) and the torch chunked
    paths, fwd+bwd, each checked against the chunked path (itself tested against the
    reference in the suite)."""
    return Group(linear_table(args, device, dtype), ssd_table(args, device, dtype))


def linear_table(args, device, dtype) -> Table:
    table = scan_table(f"linear attention fwd+bwd, {dtype}, {device_name(device)}", "B H T F")
    for B, H, T, F in SIZES[args.sizes]["linear_attn"]:
        g = torch.Generator(device).manual_seed(0)
        q, k = (torch.randn(B, H, T, F, device=device, generator=g) * F ** -0.5 for _ in "qk")
        v = torch.randn(B, H, T, F, device=device, generator=g)
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        scan_rows(table, f"{B} {H} {T} {F}", LINEAR_ATTN, LinearAttnSpec.of(*inputs),
                  ("chunked", "fla"), inputs, args, device, dtype)
    return table


def ssd_table(args, device, dtype) -> Table:
    table = scan_table(f"SSD fwd+bwd, {dtype}, {device_name(device)}", "B T H P G N")
    for B, T, H, P, G, N in SIZES[args.sizes]["ssd"]:
        g = torch.Generator(device).manual_seed(0)
        x = torch.randn(B, T, H, P, device=device, generator=g)
        dt = torch.nn.functional.softplus(torch.randn(B, T, H, device=device, generator=g) - 2)
        A = -torch.exp(torch.randn(H, device=device, generator=g))
        Bm, Cm = torch.randn(2, B, T, G, N, device=device, generator=g)
        inputs = [x.to(dtype), dt, A, Bm.to(dtype), Cm.to(dtype)]
        inputs = [t.requires_grad_() for t in inputs]
        scan_rows(table, f"{B} {T} {H} {P} {G} {N}", SSD, SSDSpec.of(x, dt, Bm, Cm),
                  ("chunked", "mamba_ssm"), inputs, args, device, dtype)
    return table


def scan_table(title: str, shape: str) -> Table:
    table = Table(title=title)
    for column in (shape, "backend", "ms", "chunked / backend"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    table.caption = "chunked / backend: the torch chunked path's time over the backend's"
    return table


def scan_rows(table, shape, registry, spec, names, inputs, args, device, dtype) -> None:
    want, base = None, None
    for name in names:
        reason = registry.why_not(name, spec)
        if reason:
            SKIPPED.append(f"{registry.op} {name} at {shape}: {reason}")
            continue
        step = fwd_bwd(registry.get(name).fn, inputs, chunk_size=64)
        got = step()
        want = want or got
        agree(f"{registry.op} {name}", got, want, 3e-2 if dtype != torch.float32 else 1e-3)
        seconds = timed(step, device, args.repeats)
        base = base or seconds
        table.add_row(shape, name, f"{1e3 * seconds:.2f}", f"{base / seconds:.2f}x")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.zoo.bench_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_const", const="small", default="full",
                        dest="sizes", help="tiny sizes: a smoke run of the same code")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu: --device cuda but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); use --device cpu --small for a smoke run")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    SKIPPED.clear()
    console = Console()
    console.print(bench_attention(args, device, dtype))
    console.print(bench_scans(args, device, dtype))
    for line in SKIPPED:
        console.print(f"not timed: {line}", soft_wrap=True, markup=False)


if __name__ == "__main__":
    main()
