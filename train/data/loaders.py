"""Any task's train and validation splits and their DataLoaders, with EpochBatches, the
train split's seeded order that a resumed run picks up at any step."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from zoo.config import positive_int, require

from .conventions import VAL_SEED_OFFSET
from .markov import MarkovSpec, make_markov
from .modadd import ModAddSpec, modadd_splits
from .mqar import MQARSpec, make_mqar_mix, make_mqar_val
from .text import TextSpec, text_splits
from .tokens import TokensSpec, tokens_splits


def mqar_loaders(spec: MQARSpec, train_size: int, val_size: int, batch_size: int,
                 seed: int) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled with a seeded generator) and validation DataLoaders."""
    return make_loaders(spec, train_size, val_size, batch_size, seed)


def _markov_splits(spec: MarkovSpec, train_size: int, val_size: int, seed: int):
    return (make_markov(spec, train_size, seed),
            make_markov(spec, val_size, seed + VAL_SEED_OFFSET, transition_seed=seed))


def _mqar_splits(spec: MQARSpec, train_size: int, val_size: int, seed: int):
    return (make_mqar_mix(spec, spec.fit_kv_pairs, train_size, seed),
            make_mqar_val(spec, val_size, seed + VAL_SEED_OFFSET))


# each task's spec -> its splits (spec, train_size, val_size, seed) -> (train, validation)
SPLITS = {MQARSpec: _mqar_splits, MarkovSpec: _markov_splits, TextSpec: text_splits,
          TokensSpec: tokens_splits, ModAddSpec: modadd_splits}


def make_splits(spec, train_size: int, val_size: int,
                seed: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(tokens, labels) of the train and validation splits of any task's spec."""
    return SPLITS[type(spec)](spec, train_size, val_size, seed)


def make_loaders(spec, train_size: int, val_size: int, batch_size: int,
                 seed: int, micro_batches: int = 1) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled by a seeded, resumable EpochBatches) and validation DataLoaders of
    any task. `batch_size` is the global batch, the sequences of one optimizer step on all
    processes together; `micro_batches` (train.accumulate_grad_batches) splits each
    process's share of it into that many forward/backward passes."""
    train_split, val_split = make_splits(spec, train_size, val_size, seed)
    train, val = TensorDataset(*train_split), TensorDataset(*val_split)
    batches = EpochBatches(len(train), batch_size, seed, drop_last=len(train) >= batch_size,
                           micro_batches=micro_batches)
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
    the interrupted run would have drawn next.

    `batch_size` is the global batch: optimizer step i trains on perm[i*B:(i+1)*B] however
    many processes share it. That batch is cut into world x micro_batches equal pieces in
    order; rank r takes pieces r*micro_batches ... (r+1)*micro_batches - 1, one per forward
    and backward (Lightning's accumulate_grad_batches steps the optimizer after the last).
    So 1 process, N under DDP or FSDP, and any accumulation see the same examples per step
    (Lightning's distributed sampler is turned off in train/harness/fit.py: it cannot start
    mid-epoch, and it would give every rank batches of its own)."""

    def __init__(self, size: int, batch_size: int, seed: int, drop_last: bool = True,
                 micro_batches: int = 1):
        positive_int("EpochBatches", size=size, batch_size=batch_size,
                     micro_batches=micro_batches)
        self.size, self.batch_size, self.seed, self.drop_last = size, batch_size, seed, drop_last
        self.micro_batches = micro_batches
        self.step = 0  # the optimizer step the next epoch's iteration starts at
        self._stream: tuple[int, torch.Generator] | None = None  # (next epoch, its generator)

    def start_at(self, step: int) -> None:
        """Make the next iteration yield the batch of optimizer step `step` (0-based,
        counted from the first batch of epoch 0) and the rest of its epoch."""
        require(step >= 0, f"EpochBatches.start_at: step must be >= 0, got {step}")
        self.step = step

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return max(1, full if self.drop_last else full + (rest > 0))

    def __len__(self) -> int:  # micro-batches per epoch on this rank
        return self.steps_per_epoch * self.micro_batches

    def __iter__(self):
        n, b = self.steps_per_epoch, self.batch_size
        epoch, offset = divmod(self.step, n)
        self.step = (epoch + 1) * n  # set before the first batch: nothing counts consumption
        order = self.epoch_order(epoch)
        for i in range(offset, n):
            yield from self.pieces(order[i * b:(i + 1) * b])

    def pieces(self, batch: list[int]) -> list[list[int]]:
        """This rank's micro-batches of one global batch, in order."""
        rank, size = world()
        parts = size * self.micro_batches
        if parts == 1:
            return [batch]
        check_divides(self.batch_size, size, self.micro_batches)
        if len(batch) < parts:  # a train split smaller than one batch (drop_last off)
            raise ValueError(f"data.train_size={self.size} holds fewer sequences than the "
                             f"{parts} pieces (processes x micro-batches) a step is cut into")
        cut = torch.tensor_split(torch.tensor(batch), parts)
        mine = cut[rank * self.micro_batches:(rank + 1) * self.micro_batches]
        return [piece.tolist() for piece in mine]

    def epoch_order(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s permutation of the train split (all ranks draw the same one)."""
        if self._stream is None or self._stream[0] != epoch:  # a jump: replay from the seed
            g = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch):
                self._draw_epoch(g)
            self._stream = (epoch, g)
        g = self._stream[1]
        perm = self._draw_epoch(g)
        self._stream = (epoch + 1, g)
        return perm.tolist()

    def _draw_epoch(self, g: torch.Generator) -> torch.Tensor:
        # What DataLoader(shuffle=True, generator=g) drew from g per epoch as Lightning
        # iterated it: a base seed for its workers, then the permutation; and a second
        # permutation, never used, when a short last batch ran the sampler out (Lightning
        # stops at the epoch's length otherwise). Drawn alike, runs keep their old order.
        torch.empty((), dtype=torch.int64).random_(generator=g)
        perm = torch.randperm(self.size, generator=g)
        if not self.drop_last and self.size % self.batch_size:
            torch.randperm(self.size, generator=g)
        return perm


def check_divides(batch_size: int, processes: int, micro_batches: int = 1) -> None:
    """data.batch_size, the global batch, must cut into equal pieces per process and
    micro-batch (unequal pieces would weigh their examples unequally in the mean)."""
    parts = processes * micro_batches
    if batch_size % parts:
        raise ValueError(
            f"data.batch_size={batch_size} (the global batch) does not divide among "
            f"{processes} process{'es' * (processes != 1)} x {micro_batches} micro-batch"
            f"{'es' * (micro_batches != 1)} (train.accumulate_grad_batches); use a multiple "
            f"of {parts}")


def world() -> tuple[int, int]:
    """(rank, world size) of the running distributed job; (0, 1) outside one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
