"""Modular addition, the grokking task (Power et al. 2022): `a b =` -> (a + b) mod p.

Every one of the p^2 pairs is one example of three tokens, a, b and the `=` token (id p);
only the answer at `=` is scored. The pairs are shuffled once by the run's seed and cut
into a train split of `train_size` pairs and a validation split of the next `val_size`,
so the two never share a pair: validation accuracy is generalization to unseen sums, and
a model that memorizes its train pairs first and generalizes much later groks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from zoo.config import StrictConfig, positive_int, require

from .conventions import IGNORE

SEQ_LEN = 3  # a, b, =


@dataclass(frozen=True)
class ModAddSpec(StrictConfig):
    """(a + b) mod `modulus` over a vocabulary of the residues and `=`. The data's
    rank: the answer is a function of a + b alone, whose Fourier features a model is known
    to learn (Nanda et al. 2023); the task states no logit rank of its own."""

    owner: ClassVar[str] = "modadd"

    modulus: int
    vocab_size: int
    seq_len: int = SEQ_LEN

    def validate(self) -> None:
        positive_int("modadd", modulus=self.modulus, vocab_size=self.vocab_size)
        require(self.modulus >= 2, f"modadd modulus ({self.modulus}) must be >= 2")
        require(self.vocab_size >= self.modulus + 1,
                f"modadd vocab_size ({self.vocab_size}) must be >= modulus + 1 "
                f"({self.modulus + 1}): the residues and the `=` token")
        require(self.seq_len == SEQ_LEN,
                f"modadd seq_len must be {SEQ_LEN} (a, b, =), got {self.seq_len}")

    @property
    def pairs(self) -> int:
        return self.modulus ** 2

    def baseline(self, seed: int) -> dict:
        """A model that learned nothing guesses one residue in p."""
        return {"task": "modadd", "chance_accuracy": 1.0 / self.modulus,
                "entropy_floor": 0.0, "unigram_loss": None}


def modadd_examples(spec: ModAddSpec, order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N, 3], labels [N, 3]) of the pairs numbered `order` (pair i = (i // p, i % p));
    the label is the sum at the `=` position, IGNORE elsewhere."""
    p = spec.modulus
    a, b = order // p, order % p
    tokens = torch.stack([a, b, torch.full_like(a, p)], dim=1)  # [N, 3]
    labels = torch.full_like(tokens, IGNORE)
    labels[:, 2] = (a + b) % p
    return tokens, labels


def modadd_splits(spec: ModAddSpec, train_size: int, val_size: int, seed: int):
    """The train and validation splits: disjoint pairs, shuffled by `seed`."""
    require(train_size + val_size <= spec.pairs,
            f"modadd: train_size + val_size ({train_size} + {val_size}) must be <= "
            f"modulus^2 ({spec.pairs}), the number of distinct pairs")
    order = torch.randperm(spec.pairs, generator=torch.Generator().manual_seed(seed))
    return (modadd_examples(spec, order[:train_size]),
            modadd_examples(spec, order[train_size:train_size + val_size]))
