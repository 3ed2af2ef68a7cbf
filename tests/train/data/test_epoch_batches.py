"""EpochBatches: the train loader's order, resumable at any step.

It must give the batches in the order the loader had before (DataLoader(shuffle=True,
generator=seed), consumed as Lightning consumes it: len(loader) batches an epoch), so an
uninterrupted run keeps its figures; start from any step with the batch the interrupted
run would have drawn next; and leave the global RNG alone.
"""

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import train.data.loaders as data
from train.data import EpochBatches, MQARSpec, make_loaders

EPOCHS = 4


def old_order(size: int, batch_size: int, seed: int) -> list[list[int]]:
    """The batches of the loader runs had, epoch after epoch, as Lightning drew them."""
    loader = DataLoader(TensorDataset(torch.arange(size)), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(seed),
                        drop_last=size >= batch_size)
    return [b[0].tolist() for _ in range(EPOCHS) for b in itertools.islice(loader, len(loader))]


def new_loader(size: int, batch_size: int, seed: int) -> tuple[DataLoader, EpochBatches]:
    batches = EpochBatches(size, batch_size, seed, drop_last=size >= batch_size)
    return DataLoader(TensorDataset(torch.arange(size)), batch_sampler=batches,
                      generator=torch.Generator()), batches


def epoch(loader) -> list[list[int]]:
    return [b[0].tolist() for b in loader]


SIZES = [(80, 16), (83, 16), (10, 16), (64, 8)]  # whole batches, a short last one, one batch


@pytest.mark.parametrize("size, batch_size", SIZES)
def test_the_order_is_the_one_runs_had(size, batch_size):
    loader, _ = new_loader(size, batch_size, seed=7)
    assert [b for _ in range(EPOCHS) for b in epoch(loader)] == old_order(size, batch_size, 7)


@pytest.mark.parametrize("size, batch_size", SIZES)
def test_starting_at_any_step_continues_the_same_order(size, batch_size):
    order = old_order(size, batch_size, seed=3)
    loader, batches = new_loader(size, batch_size, seed=3)
    n = len(batches)
    for step in range((EPOCHS - 1) * n):
        batches.start_at(step)
        end = (step // n + 1) * n
        assert epoch(loader) == order[step:end], f"resumed at step {step}"
        assert epoch(loader) == order[end:end + n], f"the epoch after step {step}"


def test_ranks_share_each_epoch_without_overlap(monkeypatch):
    shares = []
    for rank in (0, 1):
        monkeypatch.setattr(data, "world", lambda rank=rank: (rank, 2))
        loader, batches = new_loader(40, 4, seed=0)
        assert len(batches) == 5  # 20 examples a rank
        shares.append([i for b in epoch(loader) for i in b])
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(40))


def test_the_train_loader_leaves_the_global_rng_alone():
    train, _ = make_loaders(MQARSpec(vocab_size=32, seq_len=16, num_kv_pairs=2), 64, 8, 8, 0)
    before = torch.get_rng_state()
    for _ in range(3):
        epoch_batches = list(train)
    assert len(epoch_batches) == 8
    assert torch.equal(torch.get_rng_state(), before)


def test_a_bad_start_is_named():
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        EpochBatches(8, 2, 0).start_at(-1)
