"""Multi-query associative recall (MQAR), as in Zoology (Arora et al. 2023), seeded.

A sequence of length T holds a context of `num_kv_pairs` key-value pairs
(k1 v1 k2 v2 ...), then a query region where each key re-appears once, at a gap drawn
from a power law (small gaps likelier). The model must predict, at the position of a
re-appearing key, the value it was paired with. Keys come from the lower half of the
vocabulary (token 0 excluded: it marks the filler), values from the upper half. As in
Zoology, the filler positions of the query region are replaced by random tokens.

Labels follow the next-token convention of the LM (the label at position t is the
target predicted from tokens[:t+1]): the value at each query key's position, -100
elsewhere. Accuracy is measured at those positions only.

Everything is drawn from one `torch.Generator` seeded by the caller, so the same seed
gives the same examples on every machine; the train and validation splits use different
seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

IGNORE = -100
VAL_SEED_OFFSET = 1_000_003  # the validation split's seed is the train seed plus this


@dataclass(frozen=True)
class MQARSpec:
    vocab_size: int
    seq_len: int
    num_kv_pairs: int
    power_a: float = 0.01
    random_non_queries: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "num_kv_pairs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"mqar {name} must be a positive int, got {value!r}")
        n, T, V = self.num_kv_pairs, self.seq_len, self.vocab_size
        if 4 * n > T:
            raise ValueError(f"mqar num_kv_pairs ({n}) too large for seq_len ({T}): the context "
                             f"and the queries need 4 * num_kv_pairs <= seq_len")
        n_keys, n_values = V // 2 - 1, V - V // 2
        if n > min(n_keys, n_values):
            raise ValueError(f"mqar num_kv_pairs ({n}) too large for vocab_size ({V}): "
                             f"{n_keys} distinct keys and {n_values} distinct values available")
        if not self.power_a > 0:
            raise ValueError(f"mqar power_a must be > 0, got {self.power_a!r}")

    @property
    def chance_accuracy(self) -> float:
        """Accuracy of guessing a value uniformly among those in the vocabulary."""
        return 1.0 / (self.vocab_size - self.vocab_size // 2)


def make_mqar(spec: MQARSpec, num_examples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (tokens [N, T], labels [N, T]) drawn deterministically from `seed`."""
    if not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"mqar num_examples must be a positive int, got {num_examples!r}")
    g = torch.Generator().manual_seed(seed)
    N, T, n, V = num_examples, spec.seq_len, spec.num_kv_pairs, spec.vocab_size
    half = V // 2
    context = 2 * n

    # distinct keys in [1, half), distinct values in [half, V), per example
    keys = torch.rand(N, half - 1, generator=g).argsort(dim=1)[:, :n] + 1  # [N, n]
    values = torch.rand(N, V - half, generator=g).argsort(dim=1)[:, :n] + half  # [N, n]
    kv = torch.stack([keys, values], dim=2).reshape(N, context)  # [N, 2n]: k1 v1 k2 v2 ...

    # each key re-appears once in the query region, at an even offset 2*gap, gap ~ power law
    space = (T - context) // 2
    p = spec.power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (spec.power_a - 1)
    gaps = torch.multinomial(p.expand(N, space), n, replacement=False, generator=g)  # [N, n]
    query_pos = context + 2 * gaps  # [N, n]

    tokens = torch.zeros(N, T, dtype=torch.long)  # [N, T]
    tokens[:, :context] = kv
    tokens.scatter_(1, query_pos, keys)
    labels = torch.full((N, T), IGNORE, dtype=torch.long)  # [N, T]
    labels.scatter_(1, query_pos, values)

    if spec.random_non_queries:
        noise = torch.randint(V, (N, T), generator=g)  # [N, T]
        filler = tokens == 0
        filler[:, :context] = False
        tokens = torch.where(filler, noise, tokens)
    return tokens, labels


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(fraction correct at labelled positions, number of labelled positions)."""
    mask = labels != IGNORE  # [B, T]
    count = int(mask.sum())
    if count == 0:
        return logits.new_zeros(()), 0
    correct = (logits.argmax(dim=-1) == labels) & mask  # [B, T]
    return correct.sum().float() / count, count


def mqar_loaders(spec: MQARSpec, train_size: int, val_size: int, batch_size: int,
                 seed: int) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled with a seeded generator) and validation DataLoaders."""
    train = TensorDataset(*make_mqar(spec, train_size, seed))
    val = TensorDataset(*make_mqar(spec, val_size, seed + VAL_SEED_OFFSET))
    order = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train, batch_size=batch_size, shuffle=True, generator=order,
                              drop_last=len(train) >= batch_size)
    val_loader = DataLoader(val, batch_size=batch_size, shuffle=False)
    return train_loader, val_loader
