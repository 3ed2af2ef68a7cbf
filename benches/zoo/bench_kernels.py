"""Benchmarks: commands that print figures measured in one run, as ratios.

    python -m benches.zoo.bench_kernels softmax [--seq-len 1024] [--batch 4] [--d-model 256] \
        [--n-heads 4]
    python -m benches.zoo.bench_kernels ssd [--repeats 20]

Times are medians over repeats after a warm-up; ratios compare paths measured in the same
process on the same inputs, so they travel between machines better than the times do.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rich.console import Console, Group
from rich.table import Table

import zoo
from zoo.ops.ssd import chunked_ssd, expand_groups, segsum


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
                      f"{1e3 * times['reference']:.1f}",
                      f"{times['reference'] / times['auto']:.2f}x")
    return table


def block_backend(args: argparse.Namespace, kwargs: dict) -> str:
    block = zoo.build("softmax", d_model=args.d_model, n_heads=args.n_heads, **kwargs)
    block(torch.randn(1, 2, args.d_model))
    return block.backend


def bench_recurrent(args: argparse.Namespace) -> Table:
    """linear, ssm and softmax fwd+bwd time and peak memory vs T in {512, 2048, 8192}, B=1.

    Time: median over --repeats after a warm-up. Memory: one more fwd+bwd under a dispatch
    mode that counts the bytes of the live tensor storages the ops create (peak) and the
    largest one, and flags any tensor with two dims >= T: a T x T tensor (decidable only
    when T exceeds every parameter dim, else "n/a"). Ratios compare T with T/4: linear-time
    blocks read about 4x, quadratic ones about 16x.
    """
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveStorages(TorchDispatchMode):
        def __init__(self, seq_len: int):
            super().__init__()
            self.seq_len, self.live, self.now, self.peak, self.largest = seq_len, {}, 0, 0, 0
            self.quadratic = False

        def _release(self, key: int) -> None:
            nbytes, refs = self.live[key]
            if refs > 1:
                self.live[key] = (nbytes, refs - 1)
            else:
                del self.live[key]
                self.now -= nbytes

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                self.quadratic |= sum(d >= self.seq_len for d in t.shape) >= 2
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                refs = self.live.get(key, (nbytes, 0))[1]
                self.live[key] = (nbytes, refs + 1)
                if refs == 0:
                    self.now += nbytes
                    self.peak = max(self.peak, self.now)
                    self.largest = max(self.largest, nbytes)
                weakref.finalize(t, self._release, key)
            return out

    D, H, lengths = args.d_model, args.n_heads, (512, 2048, 8192)
    table = Table(title=f"fwd+bwd vs T, B=1 D={D} H={H}, {torch.get_num_threads()} threads")
    for column in ("block", "T", "ms", "time x", "peak MB", "peak x", "max MB", "TxT"):
        table.add_column(column, justify="left" if column == "block" else "right")
    backends, time_ratios = [], []
    for name in ("linear", "ssm", "softmax"):
        torch.manual_seed(0)
        block = zoo.build(name, d_model=D, n_heads=H)
        widest = max(max(p.shape) for p in block.parameters())
        previous = None
        for T in lengths:
            x = torch.randn(1, T, D, requires_grad=True)
            seconds = median_seconds(forward_backward(block, x), args.repeats)
            with LiveStorages(T) as memory:
                forward_backward(block, x)()
            flag = "n/a" if widest >= T else "yes" if memory.quadratic else "no"
            ratios = ("", "") if previous is None else (
                f"{seconds / previous[0]:.1f}", f"{memory.peak / previous[1]:.1f}")
            table.add_row(name, str(T), f"{1e3 * seconds:.0f}", ratios[0],
                          f"{memory.peak / 2**20:.1f}", ratios[1],
                          f"{memory.largest / 2**20:.1f}", flag)
            previous = (seconds, memory.peak)
        backends.append(f"{name}={block.backend}")
        time_ratios.append(f"{name} {ratios[0]}x")
    table.caption = (f"x: ratio to T/4 (linear ~4, quadratic ~16); max: largest tensor; TxT: any "
                     f"tensor with two dims >= T. time(8192)/time(2048): "
                     f"{', '.join(time_ratios)}. backends: {', '.join(backends)}")
    return table


def bench_softmax_family(args: argparse.Namespace) -> Group:
    """sliding_window vs softmax fwd+bwd at T in {1024, 4096, 8192} (B=1, W=128); MLA vs
    MHA/GQA/MQA cache bytes per token at matched width; MoE (E=8) fwd+bwd at k = 1, 2, 4.

    Ratios t(T)/t(1024): past the window the band grows about linearly (4, 8), full softmax
    about quadratically (16, 64). MoE ratios are to k=1; "dense" is the all-E-heads reference.
    Times here are the best of --repeats after a warm-up: on a shared machine the minimum is
    the steadiest estimate of what the kernel costs.
    """

    def best_seconds(fn: Callable[[], object]) -> float:
        return min(median_seconds(fn, repeats=1, warmup=0) for _ in range(args.repeats + 1))

    D, H, W = args.d_model, args.n_heads, 128
    lengths, threads = (1024, 4096, 8192), torch.get_num_threads()
    window = Table(title=f"sliding_window (W={W}) vs softmax fwd+bwd, B=1 D={D} H={H}, "
                         f"{threads} threads")
    window.add_column("block", no_wrap=True)
    for column in (*(f"{T} ms" for T in lengths), *(f"x{T}" for T in lengths[1:])):
        window.add_column(column, justify="right")
    times: dict[str, list[float]] = {}
    for name, kwargs in (("sliding_window", {"window": W}), ("softmax", {})):
        torch.manual_seed(0)
        block = zoo.build(name, d_model=D, n_heads=H, **kwargs)
        times[name] = [best_seconds(forward_backward(block, torch.randn(1, T, D)))
                       for T in lengths]
        window.add_row(f"{name} ({block.backend})", *(f"{1e3 * t:.0f}" for t in times[name]),
                       *(f"{t / times[name][0]:.1f}" for t in times[name][1:]))
    window.caption = "xT: t(T)/t(1024). softmax / sliding_window: " + ", ".join(
        f"{a / b:.1f}x at T={T}" for T, a, b in zip(lengths, times["softmax"],
                                                     times["sliding_window"], strict=True))

    caches = Table(title=f"cache bytes per token per layer (fp32) at D={D}, H={H}")
    for column in ("block", "elements", "bytes", "vs MHA", "params"):
        caches.add_column(column, justify="left" if column == "block" else "right")
    rows = [(label, "softmax", kw) for label, kw in zoo.block_class("softmax").variants(D, H)]
    rows += [(label, "mla", kw) for label, kw in zoo.block_class("mla").variants(D, H)]
    mha_bytes = None
    for label, name, kwargs in rows:
        block = zoo.build(name, d_model=D, n_heads=H, **kwargs)
        cache = block.init_cache(1, 64)
        block(torch.randn(1, 64, D), cache=cache)
        state = block.inference_state(cache)
        per_token = sum(t.numel() for t in state.values()) // 64
        nbytes = sum(t.nbytes for t in state.values()) // 64
        mha_bytes = mha_bytes or nbytes
        caches.add_row(label, str(per_token), str(nbytes), f"{nbytes / mha_bytes:.2f}",
                       str(block.param_count()))

    T, E = args.seq_len, 8
    moe = Table(title=f"moe fwd+bwd, top-k of E={E} heads, B=1 T={T} D={D}, {threads} threads")
    for column in ("k", "fused ms", "t(k)/t(1)", "dense ms", "dense/fused"):
        moe.add_column(column, justify="right")
    x, base = torch.randn(1, T, D), None
    for k in (1, 2, 4):
        torch.manual_seed(0)
        block = zoo.build("moe", d_model=D, n_heads=E, top_k=k)
        fused = best_seconds(forward_backward(block, x))

        def dense_step(block=block) -> None:
            block.zero_grad(set_to_none=True)
            block.dense_forward(x).sum().backward()

        dense = best_seconds(dense_step)
        base = base or fused
        moe.add_row(str(k), f"{1e3 * fused:.1f}", f"{fused / base:.2f}",
                    f"{1e3 * dense:.1f}", f"{dense / fused:.1f}x")
    moe.caption = f"fused attention backend: {block.backend}; dense: every head, zero gates"
    return Group(window, caches, moe)


def four_step_ssd(x, dt, A, B, C, *, initial_state=None, chunk_size: int = 64):
    """The four steps of the Mamba-2 paper's listing (Dao & Gu 2024, "ssd_minimal"), as it
    states them, to time the chunked backend against: B and C per head [B, T, H, N], T a
    multiple of chunk_size; the other arguments and the outputs as `zoo.ops.ssd`'s."""
    b, T, H, P = x.shape
    L = chunk_size
    X = (x * dt[..., None]).unflatten(1, (T // L, L))  # [B, T/C, C, H, P]
    B, C = B.unflatten(1, (T // L, L)), C.unflatten(1, (T // L, L))  # [B, T/C, C, H, N]
    a = (dt * A).unflatten(1, (T // L, L)).permute(0, 3, 1, 2)  # [B, H, T/C, C]
    a_cum = torch.cumsum(a, dim=-1)
    # 1. the diagonal blocks: each chunk's output from its own inputs
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, torch.exp(segsum(a)), X)
    # 2. each chunk's final state from its own inputs
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [B, H, T/C, C]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, to_end, X)  # [B, T/C, H, P, N]
    # 3. the recurrence over chunks: a segment sum of the chunks' total decays
    if initial_state is None:
        initial_state = states.new_zeros(b, H, P, B.shape[-1])
    states = torch.cat([initial_state[:, None], states], dim=1)  # [B, T/C + 1, H, P, N]
    decay_chunk = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # [B, H, T/C+1, T/C+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    # 4. each chunk's entering state read out through C
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states[:, :-1], torch.exp(a_cum))
    return (y_diag + y_off).reshape(b, T, H, P), states[:, -1]


def ssd_inputs(T: int, G: int, b: int = 2, H: int = 8, P: int = 64, N: int = 64):
    """x, dt, A, B, C for a scan of T steps, leaves that take gradients; moderate decays."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, T, H, P, generator=g)
    dt = F.softplus(torch.randn(b, T, H, generator=g) - 2)  # [B, T, H]
    A = -torch.exp(torch.randn(H, generator=g))  # [H]
    B, C = torch.randn(2, b, T, G, N, generator=g)  # [B, T, G, N] each
    return [t.requires_grad_() for t in (x, dt, A, B, C)]


def scan_step(fn, inputs: list[torch.Tensor]) -> Callable[[], list[torch.Tensor]]:
    """One forward + backward of the scan fn; returns y, the final state and the grads."""
    def step() -> list[torch.Tensor]:
        y, state = fn(*inputs, chunk_size=64)
        return [y, state, *torch.autograd.grad(y.sum() + state.sum(), inputs)]

    return step


def bench_ssd(args: argparse.Namespace) -> Table:
    """The chunked SSD backend vs the paper's four-step listing, fwd+bwd in fp32 at T in
    {1024, 4096}, B=2, H=8, P=N=64, G in {1, 4}: the same inputs (B and C expanded to the H
    heads for the listing, outside the timing), outputs and gradients checked equal first.

    Each repeat times both paths back to back; min and median over --repeats after a
    warm-up. On a shared machine the figures are noisy: the min is the steadiest.
    """
    table = Table(title=f"SSD fwd+bwd, fp32, B=2 H=8 P=N=64 C=64, {torch.get_num_threads()} "
                        f"threads, {args.repeats} repeats")
    for column in ("T", "G", "four-step ms", "chunked ms", "four-step / chunked"):
        table.add_column(column, justify="right")
    table.caption = "each cell: min / median over the repeats"
    for T in (1024, 4096):
        for G in (1, 4):
            table.add_row(str(T), str(G), *ssd_row(T, G, args.repeats))
    return table


def ssd_row(T: int, G: int, repeats: int) -> tuple[str, str, str]:
    times = interleaved_seconds(ssd_steps(T, G), repeats)
    ref, fast = times["four-step"], times["chunked"]
    med = statistics.median
    return (f"{1e3 * min(ref):.0f} / {1e3 * med(ref):.0f}",
            f"{1e3 * min(fast):.0f} / {1e3 * med(fast):.0f}",
            f"{min(ref) / min(fast):.2f}x / {med(ref) / med(fast):.2f}x")


def ssd_steps(T: int, G: int) -> dict[str, Callable[[], list[torch.Tensor]]]:
    """fwd+bwd of the listing and of the chunked backend, checked to agree on outputs,
    final states and gradients (the listing's per-head dB, dC summed over each group)."""
    inputs = ssd_inputs(T, G)
    H = inputs[0].shape[2]
    per_head = [t.detach().clone().requires_grad_() for t in inputs[:3]]
    per_head += [expand_groups(t.detach(), H).requires_grad_() for t in inputs[3:]]
    steps = {"four-step": scan_step(four_step_ssd, per_head),
             "chunked": scan_step(chunked_ssd, inputs)}
    want, got = steps["four-step"](), steps["chunked"]()
    want[5:] = [g.unflatten(2, (G, H // G)).sum(3) for g in want[5:]]  # [B, T, G, N]
    for name, a, b in zip(("y", "state", "dx", "ddt", "dA", "dB", "dC"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=f"SSD {name} differs")
    return steps


def interleaved_seconds(steps: dict[str, Callable[[], object]], repeats: int):
    """name -> seconds of each repeat; every repeat runs all steps back to back, so that a
    load that comes and goes on a shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


BENCHMARKS = {"softmax": bench_softmax, "recurrent": bench_recurrent,
              "softmax_family": bench_softmax_family, "ssd": bench_ssd}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.zoo.bench_kernels",
                                     description=__doc__,
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
