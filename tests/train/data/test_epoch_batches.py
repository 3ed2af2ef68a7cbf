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


def pieces_of(world: tuple[int, int], micro: int, monkeypatch, start: int = 0):
    """Each rank's micro-batches of one epoch of a 40-example split, global batch 8."""
    monkeypatch.setattr(data, "world", lambda: world)
    batches = EpochBatches(40, 8, seed=0, micro_batches=micro)
    batches.start_at(start)
    return list(batches), batches


@pytest.mark.parametrize("processes, micro", [(2, 1), (1, 2), (2, 2), (4, 2)])
def test_the_global_batch_is_shared_among_ranks_and_micro_batches(monkeypatch, processes,
                                                                  micro):
    whole, _ = pieces_of((0, 1), 1, monkeypatch)  # 1 process: 5 steps of 8
    shares = [pieces_of((r, processes), micro, monkeypatch)[0] for r in range(processes)]
    for share in shares:
        assert len(share) == 5 * micro and {len(p) for p in share} == {8 // (processes * micro)}
    for step, batch in enumerate(whole):  # every step, the same examples, none twice
        step_pieces = [p for share in shares for p in share[step * micro:(step + 1) * micro]]
        assert sorted(i for p in step_pieces for i in p) == sorted(batch)


def test_a_resume_under_accumulation_starts_at_the_optimizer_step(monkeypatch):
    full, _ = pieces_of((1, 2), 2, monkeypatch)
    resumed, batches = pieces_of((1, 2), 2, monkeypatch, start=3)
    assert resumed == full[3 * 2:] and len(batches) == 10


def test_a_global_batch_that_does_not_divide_is_refused(monkeypatch):
    monkeypatch.setattr(data, "world", lambda: (0, 3))
    with pytest.raises(ValueError, match=r"data.batch_size=8 \(the global batch\) does not "
                                         r"divide among 3 processes x 1 micro-batch"):
        list(EpochBatches(40, 8, seed=0))


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
