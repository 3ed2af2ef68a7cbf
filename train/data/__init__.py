"""The data tasks, seeded: MQAR, a low-rank Markov language, and byte-level text.

Multi-query associative recall (MQAR), as in Zoology (Arora et al. 2023):

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

import glob
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from zoo.config import StrictConfig, is_instance, positive_int, positive_number, require

IGNORE = -100
BYTE_VOCAB = 256
STDLIB = "stdlib"  # data.paths entry: the Python standard library's own .py sources
VAL_SEED_OFFSET = 1_000_003  # the validation split's seed is the train seed plus this


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
        require(self.permute_seed is None or self.permute_seed >= 0,
                f"mqar.permute_seed must be a non-negative int or None, "
                f"got {self.permute_seed!r}")

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
    return make_loaders(spec, train_size, val_size, batch_size, seed)


def make_splits(spec, train_size: int, val_size: int,
                seed: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(tokens, labels) of the train and validation splits of any task's spec."""
    if isinstance(spec, MarkovSpec):
        return (make_markov(spec, train_size, seed),
                make_markov(spec, val_size, seed + VAL_SEED_OFFSET, transition_seed=seed))
    if isinstance(spec, TextSpec):
        return text_splits(spec, train_size, val_size, seed)
    return (make_mqar_mix(spec, spec.fit_kv_pairs, train_size, seed),
            make_mqar_val(spec, val_size, seed + VAL_SEED_OFFSET))


def make_loaders(spec, train_size: int, val_size: int, batch_size: int,
                 seed: int) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled by a seeded, resumable EpochBatches) and validation DataLoaders of
    any task."""
    train_split, val_split = make_splits(spec, train_size, val_size, seed)
    train, val = TensorDataset(*train_split), TensorDataset(*val_split)
    batches = EpochBatches(len(train), batch_size, seed, drop_last=len(train) >= batch_size)
    # the loader draws a seed for its workers from `generator` on every epoch; a generator
    # of its own keeps that draw off the global RNG (EpochBatches replays it for the order)
    train_loader = DataLoader(train, batch_sampler=batches, generator=torch.Generator())
    val_loader = DataLoader(val, batch_size=batch_size, shuffle=False)
    return train_loader, val_loader


class EpochBatches(Sampler[list[int]]):
    """The train split's batches, epoch after epoch, in exactly the order that
    DataLoader(shuffle=True, generator=Generator().manual_seed(seed)) gave under Lightning
    (so runs keep the order they had before resumes were exact), but starting from any
    step: a resumed run calls start_at(global_step) and continues mid-epoch with the batch
    the interrupted run would have drawn next. Under DDP each rank takes its share,
    perm[rank::world], of every epoch's permutation (Lightning's distributed sampler is
    turned off in train/harness/fit.py: it cannot start mid-epoch)."""

    def __init__(self, size: int, batch_size: int, seed: int, drop_last: bool = True):
        positive_int("EpochBatches", size=size, batch_size=batch_size)
        self.size, self.batch_size, self.seed, self.drop_last = size, batch_size, seed, drop_last
        self.step = 0  # the step the next epoch's iteration starts at
        self._stream: tuple[int, torch.Generator] | None = None  # (next epoch, its generator)

    def start_at(self, step: int) -> None:
        """Make the next iteration yield the batch of `step` (0-based, counted from the
        first batch of epoch 0) and the rest of its epoch."""
        require(step >= 0, f"EpochBatches.start_at: step must be >= 0, got {step}")
        self.step = step

    def __len__(self) -> int:  # batches per epoch on this rank
        share = self.size // world()[1]
        full, rest = divmod(share, self.batch_size)
        return max(1, full if self.drop_last else full + (rest > 0))

    def __iter__(self):
        n, b = len(self), self.batch_size
        epoch, offset = divmod(self.step, n)
        self.step = (epoch + 1) * n  # set before the first batch: nothing counts consumption
        order = self.epoch_order(epoch)
        for i in range(offset, n):
            yield order[i * b:(i + 1) * b]

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's share of epoch `epoch`'s permutation of the train split."""
        if self._stream is None or self._stream[0] != epoch:  # a jump: replay from the seed
            g = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch):
                self._draw_epoch(g)
            self._stream = (epoch, g)
        g = self._stream[1]
        perm = self._draw_epoch(g)
        self._stream = (epoch + 1, g)
        rank, size = world()
        return perm[rank::size][:self.size // size].tolist()

    def _draw_epoch(self, g: torch.Generator) -> torch.Tensor:
        # What DataLoader(shuffle=True, generator=g) drew from g per epoch as Lightning
        # iterated it: a base seed for its workers, then the permutation; and a second
        # permutation, never used, when a short last batch ran the sampler out (Lightning
        # stops at the epoch's length otherwise). Drawn alike, runs keep their old order.
        torch.empty((), dtype=torch.int64).random_(generator=g)
        perm = torch.randperm(self.size, generator=g)
        if not self.drop_last and (self.size // world()[1]) % self.batch_size:
            torch.randperm(self.size, generator=g)
        return perm


def world() -> tuple[int, int]:
    """(rank, world size) of the running distributed job; (0, 1) outside one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---------------------------------------------------------------- low-rank Markov language

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
    """pi [V] with pi P = pi, sum 1, of an irreducible row-stochastic P [V, V]: the solution
    of pi (I - P + 1 1^T) = 1^T (the all-ones term pins the sum; the matrix is invertible
    exactly when the chain is irreducible)."""
    P = P.to(torch.float64)
    V = P.shape[0]
    A = torch.eye(V, dtype=P.dtype) - P + 1.0  # [V, V]
    return torch.linalg.solve(A.T, torch.ones(V, dtype=P.dtype))  # [V]


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


# ---------------------------------------------------------------- byte-level text

@dataclass(frozen=True)
class TextSpec(StrictConfig):
    """Byte-level text read at run time from `paths`: files, directories (files matching
    `pattern`, recursively), globs, or "stdlib" (the standard library's .py sources).
    The first max_bytes bytes, in sorted path order, are read; the last `val_fraction` of
    them is the validation split."""

    owner: ClassVar[str] = "text"

    paths: tuple[str, ...] | list[str]
    seq_len: int
    max_bytes: int = 2_000_000
    val_fraction: float = 0.1
    pattern: str = "*"

    def validate(self) -> None:
        require(bool(self.paths) and all(isinstance(p, str) and p for p in self.paths),
                f"text paths must be a non-empty list of paths (or 'stdlib'), "
                f"got {list(self.paths)!r}")
        require(0 < self.val_fraction < 1,
                f"text val_fraction must be in (0, 1), got {self.val_fraction!r}")
        positive_int("text", max_bytes=self.max_bytes)

    def baseline(self, seed: int) -> dict:
        """None known: whether a text run learned is not judged."""
        return {"task": "text", "chance_accuracy": None, "entropy_floor": None,
                "unigram_loss": None}


def _expand(path: str, pattern: str) -> list[Path]:
    """The files one `paths` entry names; an entry naming nothing is an error."""
    if path == STDLIB:
        root, pattern = Path(sysconfig.get_paths()["stdlib"]), "*.py"
        found = sorted(p for p in root.rglob(pattern) if "site-packages" not in p.parts)
    elif glob.has_magic(path):
        found = sorted(Path(p) for p in glob.glob(path, recursive=True))
    elif Path(path).is_dir():
        found = sorted(Path(path).rglob(pattern))
    elif Path(path).exists():
        found = [Path(path)]
    else:
        raise FileNotFoundError(f"data.paths: {path!r} does not exist")
    files = [p for p in found if p.is_file()]
    if not files:
        raise ValueError(f"data.paths: {path!r} names no files"
                         + (f" matching {pattern!r}" if Path(path).is_dir() else ""))
    return files


def read_text_bytes(spec: TextSpec) -> bytes:
    """The corpus: files concatenated in order, capped at max_bytes."""
    chunks, total = [], 0
    for entry in spec.paths:
        for path in _expand(entry, spec.pattern):
            try:
                data = path.read_bytes()[:spec.max_bytes - total]
            except OSError as e:
                raise ValueError(f"data.paths: cannot read {str(path)!r} ({e.strerror})") from None
            chunks.append(data)
            total += len(data)
            if total >= spec.max_bytes:
                return b"".join(chunks)
    return b"".join(chunks)


def _windows(data: torch.Tensor, count: int, seq_len: int,
             g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random windows of seq_len + 1 bytes: (tokens, next-token labels)."""
    starts = torch.randint(len(data) - seq_len, (count,), generator=g)  # [N]
    seq = data[starts[:, None] + torch.arange(seq_len + 1)]  # [N, T + 1]
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def text_splits(spec: TextSpec, train_size: int, val_size: int, seed: int):
    """Train and validation windows from disjoint parts of the corpus, seeded."""
    raw = read_text_bytes(spec)
    if not raw:
        raise ValueError(f"data.paths {list(spec.paths)!r}: every file is empty")
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()  # [n_bytes]
    cut = int(len(data) * (1 - spec.val_fraction))
    train, val = data[:cut], data[cut:]
    if min(len(train), len(val)) <= spec.seq_len:
        raise ValueError(f"data.paths {list(spec.paths)!r}: {len(data):,} bytes is too little "
                         f"text for seq_len {spec.seq_len} with val_fraction "
                         f"{spec.val_fraction} (each split needs more than seq_len bytes)")
    return (_windows(train, train_size, spec.seq_len, torch.Generator().manual_seed(seed)),
            _windows(val, val_size, spec.seq_len,
                     torch.Generator().manual_seed(seed + VAL_SEED_OFFSET)))
