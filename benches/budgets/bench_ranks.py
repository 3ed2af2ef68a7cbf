"""Benchmarks of rank measurement: figures as ratios measured in one run, printed.

    python -m benches.budgets.bench_ranks                 # every section below, in one run
    python -m benches.budgets.bench_ranks engine matfree  # some of them

  engine   the spectra engine (auto method) vs what every matrix took before it (one plain
           torch.linalg.svdvals call per batch, in the input's dtype), on one synthetic
           probe's matrices: speed ratio, largest figure difference
  matfree  matrix-free vs exact past->future ranks of one 8-head softmax layer at T = 2048
  scale    matrix-free past->future ranks at T = 8192 and 32768: time, peak memory (each
           length in a child process, so that its peak is its own)
  hf       the Hugging Face probe of a randomly initialized model of a 135M Llama layout
           (30 layers, 9 query heads, 3 KV heads, head dim 64, hidden 576) at 1 x 1024,
           engine vs plain SVD as above (needs transformers; skipped with a note without it)

On a shared machine a second heavy process halves every time; ratios within one run hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import subprocess
import sys
import time
from unittest import mock

import torch

from budgets.rank.matfree import AttentionMixing, operator_metrics
from budgets.rank.metrics import rank_metrics
from budgets.rank.spectra import METHODS, forced_method

SECTIONS = ("engine", "matfree", "scale", "hf")


def heads(T: int, H: int = 8, K: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [1, H, T, K] of varied heads: two sinks (every query matches token 0's key),
    two local (each key near its own query), four content heads."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, H, T, K, generator=g), torch.randn(1, H, T, K, generator=g)
    d = torch.randn(K, generator=g)
    d = d / d.norm()
    q[:, :2] += 4 * d
    k[:, :2, 0] = 10 * d
    k[:, 2:4] = q[:, 2:4] + 0.5 * torch.randn(1, 2, T, K, generator=g)
    return q, k


@contextlib.contextmanager
def plain_svd():
    """Every spectrum as before the engine: one torch.linalg.svdvals call per batch."""
    with forced_method("svd"), mock.patch.dict(METHODS, svd=torch.linalg.svdvals):
        yield


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def probe_matrices(seed: int = 0) -> list[tuple[torch.Tensor, bool]]:
    """What one probe of a 4-layer, 8-head, D = 512 model at 4 x 256 decomposes:
    attention (raw, centered, past->future), K/V caches, hidden states, weights."""
    g = torch.Generator().manual_seed(seed)
    T, D = 256, 512
    q, k = heads(T, seed=seed)
    P = torch.softmax((q @ k.mT * 0.125).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf), -1).expand(4, -1, -1, -1)
    out = []
    for _ in range(4):  # layers
        out += [(P, False), (P, True), (P[..., T // 2:, :T // 2], False)]
        out += [(torch.randn(4, T, 128, generator=g), False)] * 2  # K and V caches
        out += [(torch.randn(4, T, D, generator=g), True), (torch.randn(D, 128, generator=g),
                                                            False)]
    return out


def bench_engine() -> dict:
    mats = probe_matrices()
    figures = {}
    for method in ("svd", "auto"):
        with plain_svd() if method == "svd" else contextlib.nullcontext():
            figures[method], figures[f"{method}_s"] = timed(
                lambda: [rank_metrics(A, 0.1, center=c) for A, c in mats])
    diff_rank = max(float((a["rank_eps"] - b["rank_eps"]).abs().max())
                    for a, b in zip(figures["svd"], figures["auto"], strict=True))
    diff_erank = max(float(((a["erank"] - b["erank"]).abs() / a["erank"].clamp_min(1e-12)).max())
                     for a, b in zip(figures["svd"], figures["auto"], strict=True))
    return {"svd_s": figures["svd_s"], "engine_s": figures["auto_s"],
            "speedup": figures["svd_s"] / figures["auto_s"],
            "max_rank_eps_diff": diff_rank, "max_erank_rel_diff": diff_erank}


def bench_matfree(T: int = 2048) -> dict:
    q, k = heads(T)
    mixing = AttentionMixing(q, k, 0.125)
    free, t_free = timed(operator_metrics, mixing.past_future(), 0.1, k_max=512)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    P = torch.softmax((q @ k.mT * 0.125).masked_fill(mask, -math.inf), -1)
    exact, t_exact = timed(rank_metrics, P[..., T // 2:, :T // 2], 0.1)
    decided = ~free["rank_eps"].isnan()
    return {"T": T, "exact_s": t_exact, "matfree_s": t_free,
            "rank_eps_exact": exact["rank_eps"].flatten().tolist(),
            "rank_eps_matfree": [None if x != x else x
                                 for x in free["rank_eps"].flatten().tolist()],
            "max_rank_eps_diff": float((free["rank_eps"] - exact["rank_eps"])[decided].abs().max()),
            "max_stable_rank_rel_diff": float(((free["stable_rank"] - exact["stable_rank"]).abs()
                                               / exact["stable_rank"]).max())}


def scale_child(T: int) -> dict:
    q, k = heads(T)
    m, seconds = timed(operator_metrics, AttentionMixing(q, k, 0.125).past_future(), 0.1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    above = m["rank_eps_above"].flatten().tolist()
    ranks = [f"> {int(a)}" if a == a else int(r) for r, a in
             zip(m["rank_eps"].flatten().tolist(), above, strict=True)]
    return {"T": T, "seconds": seconds, "peak_mib": peak, "rank_eps": ranks}


def bench_scale(lengths=(8192, 32768)) -> list[dict]:
    rows = []
    for T in lengths:
        out = subprocess.run(
            [sys.executable, "-m", "benches.budgets.bench_ranks", "--child", str(T)],
            capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout))
    return rows


def bench_hf() -> dict:
    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers is not installed (pip install 'rankzoo[hf]')"}
    from budgets.hf.probe import probe_hf_model
    config = transformers.LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 1024), generator=torch.Generator().manual_seed(0))
    (new, _), t_new = timed(probe_hf_model, model, ids)
    with plain_svd():
        (old, _), t_old = timed(probe_hf_model, model, ids)
    same = all(a["quantities"][q]["rank_eps"] == b["quantities"][q]["rank_eps"]
               for a, b in zip(old["layers"], new["layers"], strict=True)
               for q in a["quantities"])
    return {"engine_s": t_new, "svd_s": t_old, "speedup": t_old / t_new,
            "rank_eps_identical": same}


RUNNERS = {"engine": bench_engine, "matfree": bench_matfree, "scale": bench_scale,
           "hf": bench_hf}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.budgets.bench_ranks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    if args.child:
        print(json.dumps(scale_child(args.child)))
        return 0
    for name in args.sections or SECTIONS:  # one JSON line per section, as it finishes
        print(json.dumps({name: RUNNERS[name]()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
