"""Sparse attention (zoo/sparse.py): fp64 agreement, and fwd+bwd against softmax on SDPA.

    python -m benches.zoo.bench_sparse [--lengths 2048 8192] [--repeats 3] [--threads N]

1. fp64 agreement (B=2, T=100, d_model 32, 4 heads; the five presets' knobs scaled down):
   the largest absolute difference between the gathered path and the reference, between
   each and o_proj(M @ V) with M the block's mixing matrix (budgets/mixing/sparse.py), in
   the outputs and in the gradients of x and every weight (the indexer's through its loss),
   and between a prefill of 40 tokens followed by one-token steps and the parallel forward.
2. forward + backward of one block at each length (B=1, d_model 256, 4 heads, fp32): each
   preset on the gathered path against softmax attention on torch's SDPA (MHA, the same
   width), its selection's time alone (the indexer's scores and top-k, or the block means
   and their top-k) and its share of the block's time, and for the indexer its KL loss's
   (the forward and backward with the loss against without it). Times are the best of
   --repeats after a warm-up, in one process, so the ratios travel better than the times.
"""

from __future__ import annotations

import argparse
import math

import torch
from rich.console import Console
from rich.table import Table

import zoo
from zoo.ops.sparse.select import block_selection, slot_selection, token_selection

from .bench_delta import best_seconds, machine

SMALL = {  # the presets' knobs at T = 100
    "DSA-like": {"selection": "token", "top_k": 12, "n_kv_heads": 1},
    "NSA-like": {"selection": "block", "top_k": 3, "block_size": 8, "compress": "gated",
                 "rate": 4, "local_window": 16, "gate": "sigmoid", "n_kv_heads": 2},
    "MoBA-like": {"selection": "block", "top_k": 3, "block_size": 16, "n_kv_heads": None},
    "HCA-like": {"selection": "none", "compress": "gated", "rate": 8, "local_window": 8,
                 "gate": "sigmoid", "n_kv_heads": 1},
    "CSA-like": {"selection": "slots", "top_k": 4, "compress": "gated", "rate": 3,
                 "local_window": 8, "gate": "sigmoid", "n_kv_heads": 1},
}


def grads_of(block, x: torch.Tensor, y: torch.Tensor, aux: bool = True) -> list[torch.Tensor]:
    """Gradients of x and every weight (zeros where one has none) of y . cos, with the
    indexer's loss added where `aux`."""
    cot = torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)
    loss = (y * cot).sum() + (block.aux_loss if aux and block.aux_loss is not None else 0)
    inputs = [x, *block.parameters()]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]


def largest(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


def agreement() -> Table:
    table = Table(title="fp64 agreement, max |difference|, B=2 T=100 d_model 32, 4 heads")
    table.add_column("preset")
    for column in ("gath-ref o", "grads", "M@V-gath o", "grads", "M@V-ref o", "grads",
                   "decode-parallel"):
        table.add_column(column, justify="right")
    x0 = torch.randn(2, 100, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for name, knobs in SMALL.items():
        got = {}
        for backend in ("gathered", "reference"):
            torch.manual_seed(0)
            block = zoo.build("sparse", d_model=32, n_heads=4, chunk_size=32, backend=backend,
                              **knobs).double()
            x = x0.clone().requires_grad_()
            y = block(x)
            got[backend] = (y.detach(), grads_of(block, x, y),
                            grads_of(block, x, block(x), aux=False))
        x = x0.clone().requires_grad_()
        M = block._mixing_matrices(x)  # [B, H, T, T] in fp64, differentiable
        mv = block.o_proj((M @ block.value_heads(x)).transpose(1, 2).reshape(2, 100, -1))
        g_mv = grads_of(block, x, mv, aux=False)  # the selection is constant: no indexer
        with torch.no_grad():
            cache = block.init_cache(2, 100)
            steps = [block(x0[:, :40], cache)] + [block(x0[:, t:t + 1], cache)
                                                   for t in range(40, 100)]
        (yg, gg, mg), (yr, gr, mr) = got["gathered"], got["reference"]
        mv = mv.detach()
        table.add_row(name, f"{float((yg - yr).abs().max()):.1e}", f"{largest(gg, gr):.1e}",
                      f"{float((mv - yg).abs().max()):.1e}", f"{largest(g_mv, mg):.1e}",
                      f"{float((mv - yr).abs().max()):.1e}", f"{largest(g_mv, mr):.1e}",
                      f"{float((torch.cat(steps, 1) - yg).abs().max()):.1e}")
    table.caption = ("gath: the gathered path; ref: the reference (masks materialized); grads: "
                     "the largest over x and every weight (against M @ V without the indexer's "
                     "loss, which M does not hold); decode: a prefill of 40 tokens, then 60 "
                     "one-token steps, against the parallel forward")
    return table


def presets() -> dict[str, dict]:
    """The block's presets at d_model 256 and 4 heads (zoo/sparse.py's variants)."""
    return {label.split("(")[1].rstrip(")"): kwargs
            for label, kwargs in zoo.block_class("sparse").variants(256, 4)}


def fwd_bwd(block, x: torch.Tensor):
    def step() -> None:
        y = block(x)
        aux = getattr(block, "aux_loss", None)
        loss = y.square().mean() + (0 if aux is None else aux)
        torch.autograd.grad(loss, [x, *block.parameters()], allow_unused=True)
    return step


def selection_only(block, x: torch.Tensor):
    """The block's selection on x, as its forward makes it (no gradients)."""
    c = block.config

    def step() -> None:
        with torch.no_grad():
            q, k, _ = block.project(x)
            if c.selection == "token":
                token_selection(*block.indexer(x), c.top_k, 0, c.chunk_size)
            elif c.selection == "block":
                block_selection(q, k, c.top_k, c.block_size, 0, c.chunk_size)
            elif c.selection == "slots":  # the slots' pooling and their top-k
                slot_selection(q, block.slots(x, k, _, 0, None)[0], c.top_k, c.rate, 0)
    return step


def timings(T: int, repeats: int) -> Table:
    """One length's table (each printed as soon as it is measured)."""
    table = Table(title=f"fwd+bwd at T = {T}, B=1 d_model 256, 4 heads, fp32, "
                        f"{torch.get_num_threads()} threads")
    for column in ("T", "block", "knobs", "ms", "/ SDPA", "select ms", "share", "aux loss"):
        table.add_column(column, justify="left" if column in ("block", "knobs") else "right")
    x = torch.randn(1, T, 256, generator=torch.Generator().manual_seed(0)).requires_grad_()
    torch.manual_seed(0)
    sdpa = zoo.build("softmax", d_model=256, n_heads=4, backend="sdpa")
    base = best_seconds(fwd_bwd(sdpa, x), repeats)
    table.add_row(str(T), "softmax (MHA)", "sdpa", f"{1e3 * base:.0f}", "1.00", "", "", "")
    for name, kwargs in presets().items():
        torch.manual_seed(0)
        block = zoo.build("sparse", d_model=256, n_heads=4, **kwargs)
        total = best_seconds(fwd_bwd(block, x), repeats)
        chooses = block.config.selection != "none"  # HCA-like: every complete slot
        select = best_seconds(selection_only(block, x), repeats) if chooses else 0.0
        aux = ""
        if block.config.selection == "token":
            torch.manual_seed(0)
            plain = zoo.build("sparse", d_model=256, n_heads=4, indexer_loss_weight=0.0,
                              **kwargs)
            aux = f"{100 * (1 - best_seconds(fwd_bwd(plain, x), repeats) / total):.0f}%"
        table.add_row("", f"sparse ({name})", zoo.sparse.describe(block.config),
                      f"{1e3 * total:.0f}", f"{total / base:.2f}",
                      f"{1e3 * select:.0f}" if chooses else "-",
                      f"{100 * select / total:.0f}%" if chooses else "-", aux)
    table.caption = ("/ SDPA: the block's time over softmax's on SDPA at the same length; "
                     "select: the selection alone (no gradients; it has none), and its share "
                     "of the block's fwd+bwd; aux loss: the share of the indexer's KL loss "
                     "(fwd+bwd with it against without). T x T work: the indexer's scores "
                     f"(2 I d_I per key pair) and their top-k, over {math.ceil(T / 128)} "
                     "chunks of 128 queries")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's threads (default: torch's choice); 1 on busy cores, "
                             "where a team of threads waits at every barrier")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    console = Console(width=140)
    console.print(f"machine: {machine()}, torch {torch.__version__}")
    console.print(agreement())
    for T in args.lengths:
        console.print(timings(T, args.repeats))


if __name__ == "__main__":
    main()
