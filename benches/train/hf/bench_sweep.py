"""The sweep over every causal LM the installed transformers ships (tests/hf_sweep.py), as a
table: per model type its outcome (faithful, refused, skipped, broken), why, and seconds;
then the counts per outcome and the skips per reason.

    python -m benches.train.hf.bench_sweep              # every type, one row each
    python -m benches.train.hf.bench_sweep llama bert   # these types only

Tiny random models (hidden 64, 2 layers) are built offline from each type's config, probed
at 1 x 16 tokens in fp64 on one thread, as tests/budgets/hf/test_sweep.py does.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import torch

from tests.hf_sweep import B, T, causal_lm_types, sweep_one
from train.hf.model_dir import import_transformers


def reason(detail: str) -> str:
    """A skip's category: the part of its detail before the first colon."""
    return detail.split(":")[0].split(" (")[0]


def main() -> None:
    torch.set_num_threads(1)
    transformers = import_transformers()
    print(f"transformers {transformers.__version__}: report --hf at {B} x {T} tokens, fp64, "
          f"{torch.get_num_threads()} thread")
    print("| model type | outcome | seconds | detail |")
    print("|---|---|---|---|")
    start, rows = time.perf_counter(), []
    for model_type in sys.argv[1:] or causal_lm_types():
        row = sweep_one(model_type)
        rows.append(row)
        print(f"| {row.model_type} | {row.outcome} | {row.seconds:.2f} | "
              f"{row.detail.replace('|', '/')} |", flush=True)
    counts = Counter(r.outcome for r in rows)
    print(f"\n{len(rows)} types in {time.perf_counter() - start:.1f} s: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    skips = Counter(reason(r.detail) for r in rows if r.outcome == "skipped")
    for why, n in skips.most_common():
        print(f"  skipped, {why}: {n}")


if __name__ == "__main__":
    main()
