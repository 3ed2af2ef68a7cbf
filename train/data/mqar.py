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

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from zoo.config import StrictConfig, is_instance, positive_int, positive_number, require, seed_value

from .conventions import IGNORE, accuracy


@dataclass(frozen=True)
class MQARSpec(StrictConfig):
    """An MQAR task (the module docstring); types checked from the annotations."""

    owner: ClassVar[str] = "mqar"

    vocab_size: int
    seq_len: int
    num_kv_pairs: int
    power_a: float = 0.01
    random_non_queries: bool = True
    # numbers of key-value pairs mixed in the validation split (None: num_kv_pairs alone)
    val_kv_pairs: tuple[int, ...] | list[int] | None = None
    # relabel tokens 1..V-1 by a permutation drawn from this seed: the same task over a new
    # key/value vocabulary (a second task for fine-tuning); None: no relabelling
    permute_seed: int | None = None
    # numbers of key-value pairs mixed in the training split (None: num_kv_pairs alone).
    # Training on a mix is how recall is usually studied: one model, judged at each count
    train_kv_pairs: tuple[int, ...] | list[int] | None = None

    def validate(self) -> None:
        positive_int("mqar", vocab_size=self.vocab_size, seq_len=self.seq_len,
                     num_kv_pairs=self.num_kv_pairs)
        n, T, V = self.num_kv_pairs, self.seq_len, self.vocab_size
        require(4 * n <= T, f"mqar num_kv_pairs ({n}) too large for seq_len ({T}): the "
                            f"context and the queries need 4 * num_kv_pairs <= seq_len")
        n_keys, n_values = V // 2 - 1, V - V // 2
        require(n <= min(n_keys, n_values),
                f"mqar num_kv_pairs ({n}) too large for vocab_size ({V}): {n_keys} distinct "
                f"keys and {n_values} distinct values available")
        positive_number("mqar", power_a=self.power_a)
        for name in ("val_kv_pairs", "train_kv_pairs"):
            if getattr(self, name) is not None:
                self._check_kv_pairs(name)
        seed_value("mqar.permute_seed", self.permute_seed, optional=True)

    def _check_kv_pairs(self, name: str) -> None:
        pairs = list(getattr(self, name))
        require(bool(pairs) and all(is_instance(n, int) and n >= 1 for n in pairs),
                f"mqar {name} must be a non-empty list of positive ints, got {pairs!r}")
        require(len(set(pairs)) == len(pairs), f"mqar {name} has repeated values: {pairs}")
        for n in pairs:
            try:
                replace(self, num_kv_pairs=n, val_kv_pairs=None, train_kv_pairs=None)
            except ValueError as e:
                msg = str(e).replace(f"mqar num_kv_pairs ({n})", f"mqar {name} value {n}")
                raise ValueError(f"{msg} ({name} {pairs})") from None

    @property
    def eval_kv_pairs(self) -> tuple[int, ...]:
        """The numbers of key-value pairs in the validation split."""
        return tuple(self.val_kv_pairs) if self.val_kv_pairs is not None else (self.num_kv_pairs,)

    @property
    def fit_kv_pairs(self) -> tuple[int, ...]:
        """The numbers of key-value pairs in the training split."""
        return (tuple(self.train_kv_pairs) if self.train_kv_pairs is not None
                else (self.num_kv_pairs,))

    @property
    def chance_accuracy(self) -> float:
        """Accuracy of guessing a value uniformly among those in the vocabulary."""
        return 1.0 / (self.vocab_size - self.vocab_size // 2)

    @property
    def guess_plateau(self) -> float:
        """The validation accuracy of a model that has learned which tokens are values and
        copies one of the example's n values from its context, without binding it to its
        key: 1/n, well above chance_accuracy (1/num_values); MQAR training sits on this
        plateau before recall is learned. With val_kv_pairs, the mean over labelled
        positions (an n-pair example has n, the numbers come in equal shares): k / sum(n)."""
        pairs = self.eval_kv_pairs
        return len(pairs) / sum(pairs)

    def baseline(self, seed: int) -> dict:
        """What a model that learned nothing reaches (train/rundir/status.py judges against it)."""
        return {"task": "mqar", "chance_accuracy": self.guess_plateau,
                "entropy_floor": None, "unigram_loss": None}


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
    if spec.permute_seed is not None:
        tokens, labels = permute_tokens(tokens, labels, V, spec.permute_seed)
    return tokens, labels


def permute_tokens(tokens: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Relabel tokens and labels by a seeded permutation of 1..V-1 (0 and IGNORE kept)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.cat([torch.zeros(1, dtype=torch.long),
                      torch.randperm(vocab_size - 1, generator=g) + 1])  # [V]
    labelled = labels != IGNORE  # [N, T]
    return perm[tokens], torch.where(labelled, perm[labels.clamp(min=0)], labels)


def make_mqar_val(spec: MQARSpec, num_examples: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation split: make_mqar_mix over `spec.eval_kv_pairs`."""
    return make_mqar_mix(spec, spec.eval_kv_pairs, num_examples, seed)


def make_mqar_mix(spec: MQARSpec, pairs: tuple[int, ...], num_examples: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`num_examples` examples for each number of key-value pairs in `pairs`, split as
    evenly as possible and interleaved (example i has the (i mod k)-th number), so any
    prefix (the monitor's probe batch, a training batch) mixes them. An example with n
    pairs has exactly n labelled positions, which is how validation tells them apart.
    With pairs == (num_kv_pairs,) this is exactly make_mqar(spec, num_examples, seed)."""
    if pairs == (spec.num_kv_pairs,):
        return make_mqar(spec, num_examples, seed)
    k = len(pairs)
    if num_examples < k:
        raise ValueError(f"mqar split of {num_examples} examples must be >= the number of "
                         f"key-value pair counts mixed in it ({k}: {list(pairs)})")
    sizes = [num_examples // k + (i < num_examples % k) for i in range(k)]
    one = replace(spec, val_kv_pairs=None, train_kv_pairs=None)
    parts = [make_mqar(replace(one, num_kv_pairs=n), size, seed + i)
             for i, (n, size) in enumerate(zip(pairs, sizes, strict=True))]
    order = torch.cat([torch.arange(size) * k + i for i, size in enumerate(sizes)]).argsort()
    tokens = torch.cat([t for t, _ in parts])[order]  # [N, T]
    labels = torch.cat([y for _, y in parts])[order]  # [N, T]
    return tokens, labels


def accuracy_by_kv_pairs(logits: torch.Tensor, labels: torch.Tensor,
                         pairs: tuple[int, ...]) -> dict[int, tuple[torch.Tensor, int]]:
    """MQAR accuracy per number of key-value pairs: {n: (accuracy, labelled positions)}
    over the examples with n labelled positions (n pairs); numbers absent are left out."""
    per_example = (labels != IGNORE).sum(dim=1)  # [B]
    out = {}
    for n in pairs:
        rows = per_example == n  # [B]
        if rows.any():
            out[n] = accuracy(logits[rows], labels[rows])
    return out
