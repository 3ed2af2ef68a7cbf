"""A low-rank Markov language, seeded: the next-token distribution has a known rank, and
the chain's entropy floor and unigram loss are what a run's losses are judged against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from zoo.config import StrictConfig, positive_int, positive_number, require


@dataclass(frozen=True)
class MarkovSpec(StrictConfig):
    """Tokens follow a Markov chain whose transition logits A B^T / temperature have rank
    `rank`: the best next-token predictor needs `rank` directions, the data's intrinsic
    rank. A and B are N(0, 1) [V, r] matrices scaled by 1/r^(1/4) each, so the logits have
    unit variance whatever r is."""

    owner: ClassVar[str] = "markov"

    vocab_size: int
    seq_len: int
    rank: int
    temperature: float = 1.0

    def validate(self) -> None:
        positive_int("markov", vocab_size=self.vocab_size, seq_len=self.seq_len, rank=self.rank)
        require(self.rank <= self.vocab_size,
                f"markov rank ({self.rank}) must be <= vocab_size ({self.vocab_size})")
        positive_number("markov", temperature=self.temperature)

    def baseline(self, seed: int) -> dict:
        """The entropy floor and unigram loss of the chain a run with this seed trains and
        validates on (make_splits draws both splits' chain from the run's seed). The
        sequences start from a uniform token, not from pi; a dense softmax chain forgets
        its start within a few tokens, so the stationary figures are the per-token ones."""
        floor, unigram = markov_baselines(markov_transitions(self, seed))
        return {"task": "markov", "chance_accuracy": None, "entropy_floor": floor,
                "unigram_loss": unigram}


def markov_transitions(spec: MarkovSpec, seed: int) -> torch.Tensor:
    """Row-stochastic [V, V] matrix: softmax of a rank-`rank` logit matrix."""
    g = torch.Generator().manual_seed(seed)
    scale = spec.rank ** -0.25
    a = torch.randn(spec.vocab_size, spec.rank, generator=g, dtype=torch.float64) * scale
    b = torch.randn(spec.vocab_size, spec.rank, generator=g, dtype=torch.float64) * scale
    return torch.softmax(a @ b.T / spec.temperature, dim=-1)  # [V, V]


def stationary_distribution(P: torch.Tensor) -> torch.Tensor:
    """pi [V] with pi P = pi, sum 1, of a row-stochastic P [V, V]. Irreducible: the
    solution of pi (I - P + 1 1^T) = 1^T (the all-ones term pins the sum; the matrix is
    invertible exactly when the chain is irreducible). At a low temperature the softmax
    underflows to exact zeros and the chain may split into classes: the solve then gives
    negative entries, and pi is instead the limit from the uniform start the sequences
    take (limiting_distribution)."""
    P = P.to(torch.float64)
    V = P.shape[0]
    A = torch.eye(V, dtype=P.dtype) - P + 1.0  # [V, V]
    try:
        pi = torch.linalg.solve(A.T, torch.ones(V, dtype=P.dtype))  # [V]
    except RuntimeError:  # singular: reducible
        pi = None
    if pi is None or not torch.isfinite(pi).all() or pi.min() < -1e-12:
        pi = limiting_distribution(P)
    pi = pi.clamp(min=0)  # rounding's -1e-17 would make the entropy NaN
    return pi / pi.sum()


def limiting_distribution(P: torch.Tensor, squarings: int = 64) -> torch.Tensor:
    """The distribution of the lazy chain (I + P) / 2 after 2^squarings steps from the
    uniform start [V]: the same stationary distributions as P, but aperiodic, so it
    converges, and for a chain with several closed classes it weighs each by the chance
    of falling into it."""
    V = P.shape[0]
    Q = (torch.eye(V, dtype=P.dtype) + P) / 2  # [V, V]
    for _ in range(squarings):
        Q = Q @ Q
        Q = Q / Q.sum(-1, keepdim=True)  # rows stay stochastic despite rounding
    return torch.full((V,), 1.0 / V, dtype=P.dtype) @ Q  # [V]


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dim (0 log 0 = 0)."""
    return -torch.xlogy(p, p).sum(-1)


def markov_baselines(P: torch.Tensor) -> tuple[float, float]:
    """(entropy floor, unigram loss) in nats of the stationary chain with transitions P:
    the floor H(X_t+1 | X_t) = sum_i pi_i H(P[i]) is the loss of the true next-token
    distribution, the best any model can do; the unigram loss H(pi) is the loss of a model
    that predicts the stationary token frequencies and ignores the context."""
    pi = stationary_distribution(P)  # [V]
    return float(pi @ entropy(P.to(torch.float64))), float(entropy(pi))


def make_markov(spec: MarkovSpec, num_examples: int, seed: int,
                transition_seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N, T], next-token labels [N, T]); the chain is drawn from
    `transition_seed` (default `seed`), so the validation split shares the train chain."""
    P = markov_transitions(spec, seed if transition_seed is None else transition_seed)
    g = torch.Generator().manual_seed(seed)
    seq = torch.empty(num_examples, spec.seq_len + 1, dtype=torch.long)  # [N, T + 1]
    seq[:, 0] = torch.randint(spec.vocab_size, (num_examples,), generator=g)
    for t in range(spec.seq_len):
        seq[:, t + 1] = torch.multinomial(P[seq[:, t]], 1, generator=g).squeeze(1)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
