import re

import pytest
import torch

from tests.train.conftest import tiny_experiment
from train.config import parse_experiment
from train.harness.module import LMModule, NonFiniteLoss

RAW = tiny_experiment(  # the sizes, train and monitor sections left at their defaults
    name="t", seed=1, data={"train_size": None, "val_size": None, "batch_size": None},
    model={"n_layers": 2}, block_defaults={"n_heads": 4},
    variants={"moe": {"block": "moe", "top_k": 2, "aux_loss_weight": 0.5}},
    train=None, monitor=None)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 32, (4, 16), generator=g)
    return tokens, tokens.roll(-1, dims=1)


def test_moe_balancing_loss_enters_the_training_loss_and_reaches_the_router():
    module = LMModule(parse_experiment(RAW).variant_config("moe"))
    module.log = lambda *args, **kwargs: None  # no Trainer attached
    module.optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.1)
    tokens, labels = batch()
    loss = module.training_step((tokens, labels), 0)
    main, _ = module._loss((tokens, labels))
    aux = module._aux_loss()
    assert aux is not None and aux.item() > 0
    torch.testing.assert_close(loss, main + aux)
    router = module.model.blocks[0].router.weight
    (grad,) = torch.autograd.grad(aux, router)
    assert grad.abs().sum() > 0


def test_blocks_without_aux_loss_leave_the_loss_alone():
    module = LMModule(parse_experiment(RAW).variant_config("mha"))
    module.log = lambda *args, **kwargs: None
    module.optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.1)
    tokens, labels = batch()
    assert module._aux_loss() is None
    torch.testing.assert_close(module.training_step((tokens, labels), 0),
                               module._loss((tokens, labels))[0])


def module_after_step(fill) -> LMModule:
    """An LMModule whose optimizer step (SGD at lr 0: the weights stay as `fill` left
    them) runs its weights check."""
    module = LMModule(parse_experiment(RAW).variant_config("mha"))
    with torch.no_grad():
        fill(module)
    module.optimizer_step(0, 0, torch.optim.SGD(module.parameters(), lr=0.0))
    return module


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_an_update_that_makes_a_weight_non_finite_stops_naming_it(bad):
    name = [n for n, _ in LMModule(parse_experiment(RAW).variant_config("mha"))
            .model.named_parameters()][3]

    def poison(module):
        dict(module.model.named_parameters())[name].view(-1)[5] = bad

    with pytest.raises(NonFiniteLoss, match=rf"made 1 weight tensors non-finite "
                                            rf"\({re.escape(name)}, \.\.\.\)"):
        module_after_step(poison)


def test_finite_weights_whose_sum_overflows_train_on():
    def huge(module):  # each weight finite, their sum beyond fp32's range
        module.model.head.weight.fill_(3e38)

    module = module_after_step(huge)
    assert torch.isinf(module.model.head.weight.sum()) and module.model.head.weight.isfinite().all()
