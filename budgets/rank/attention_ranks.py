"""The matrix-free ranks of a whole attention layer, its products shared (matfree.py).

    m = attention_metrics(mixing, eps=0.1, k_max=256, lengths=(T // 4, T // 2))
    m["mixing"], m["mixing_centered"], m["past_future"], m["lengths"][T // 2]   # [B, H]

Every quantity the probe reads from causal softmax mixing is a block of the one matrix P:
the past->future block P[T/2:, :T/2], and, since a causal row's normalizer sees no later
key, the past->future block of the prefix of length t is P[t/2:t, :t/2]. So each Krylov
step asks every open run for its block, and one pass over P's scores (a chunk of query rows
at a time, AttentionOperator.block_grams) serves them all, instead of one pass per block.
The whole matrix and its centered form share one run besides: with the mean row in the
start block their Krylov spaces coincide (krylov.Lanczos).
"""

from __future__ import annotations

from .matfree import (
    K_MAX,
    AttentionMixing,
    CenteredOperator,
    Operator,
    per_batch,
    single_op_grams,
    target_of,
)
from .metrics import check_eps
from .ritz_metrics import Target, measure


def centered_pair_metrics(op: Operator, eps: float = 0.1, k: int | None = None,
                          k_max: int = K_MAX) -> tuple[dict, dict]:
    """operator_metrics of op and of CenteredOperator(op), from one Krylov run: with the
    mean row in the start block, A^T A and A_c^T A_c = A^T A - m mu mu^T share their
    Krylov spaces, so every product serves both (krylov.Lanczos)."""
    check_eps(eps)
    targets = [target_of(op, op), target_of(CenteredOperator(op), op)]
    raw, centered = measure({0: targets}, single_op_grams(op), eps, k, k_max, op.device)[0]
    return per_batch(raw, op.batch), per_batch(centered, op.batch)



def attention_metrics(mixing: AttentionMixing, eps: float, k_max: int = K_MAX,
                      lengths: tuple[int, ...] = ()) -> dict:
    """operator_metrics [B, H] of the whole mixing matrix ("mixing"), its centered form
    ("mixing_centered"), its past->future block ("past_future") and the past->future
    blocks of its prefixes of `lengths` (by length), every product from shared passes over
    the whole matrix's scores (AttentionOperator.block_grams); the whole matrix and its
    centered form from one Krylov run."""
    check_eps(eps)
    T = mixing.seq_len
    corners = {t: ((t // 2, t), (0, t // 2)) for t in (T, *lengths) if 2 <= t <= T}
    full = mixing.full(blocks=tuple(corners.values()))  # their energies in its first pass
    groups = {"whole": [target_of(full, full), target_of(CenteredOperator(full), full)]}
    for t, block in corners.items():
        sums = full.block_sums(block)
        groups[t] = [target_of(mixing.operator(*block), full) if sums is None else
                     Target(sums.fro2, (t - t // 2, t // 2), top=sums.top())]
    blocks = {"whole": ((0, T), (0, T)), **corners}

    def grams(requests):
        return full.block_grams([(blocks[key], idx, X) for key, idx, X in requests])

    out = measure(groups, grams, eps, None, k_max, full.device)
    raw, centered = out.pop("whole")
    return {"mixing": per_batch(raw, full.batch),
            "mixing_centered": per_batch(centered, full.batch),
            "past_future": per_batch(out.pop(T)[0], full.batch),
            "lengths": {t: per_batch(m[0], full.batch) for t, m in out.items()}}


