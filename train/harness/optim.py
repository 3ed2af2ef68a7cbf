"""Optimizers: AdamW (default), Muon on hidden weight matrices with AdamW on the rest, Lion;
and the learning-rate schedule every run steps them with (linear warmup, cosine decay).

Muon is train/harness/muon.py's (torch's, orthogonalizing in the device's fast dtype).

Muon plus AdamW is two optimizers. Lightning would need manual optimization for two
(`automatic_optimization = False`, our own backward, clipping and scheduler stepping);
instead `Combined` is one `torch.optim.Optimizer` that steps both, so automatic
optimization, gradient clipping, the LR scheduler (it sees every param group) and
checkpointing (its state dict holds both) keep working unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..lm.decoder import DecoderLM
from .muon import Muon, closure_loss


class Combined(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped together as one."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        super().__init__(params, {})
        # the same group dicts as the inner optimizers: a change of lr reaches them
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, state_dict["optimizers"], strict=True):
            optimizer.load_state_dict(state)
        # torch's load_state_dict gives each inner optimizer new group dicts: without
        # these again, the schedule would set the lr of groups no optimizer reads, and a
        # resumed run would train on at its checkpoint's lr
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]


def muon_params(model: DecoderLM) -> list[nn.Parameter]:
    """The hidden weight matrices: every nn.Linear weight inside the layers (blocks and
    MLPs). Chosen by module, not by ndim: the embedding and the LM head are 2-D too but
    are not hidden maps (Muon's authors leave them to AdamW), nor are 2-D parameters that
    are not a Linear's weight (per-head tables and the like)."""
    return [m.weight for layer in model.layers for m in layer.modules()
            if isinstance(m, nn.Linear) and m.weight.requires_grad]  # frozen (LoRA): none


def _adamw_groups(params: list[nn.Parameter], weight_decay: float) -> list[dict]:
    # decay matrices (projections, embedding), not norms' gains or biases
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _trainable_groups(model: DecoderLM, train: dict[str, Any]) -> list[dict]:
    return _adamw_groups([p for p in model.parameters() if p.requires_grad],
                         train["weight_decay"])


def _betas(train: dict[str, Any]) -> tuple[float, float]:
    return train["beta1"], train["beta2"]


def _adamw(model: DecoderLM, train: dict[str, Any], muon) -> torch.optim.Optimizer:
    return torch.optim.AdamW(_trainable_groups(model, train), lr=train["lr"],
                             betas=_betas(train))


def _lion(model: DecoderLM, train: dict[str, Any], muon) -> torch.optim.Optimizer:
    try:
        from lion_pytorch import Lion
    except ImportError:
        raise ValueError("train.optimizer 'lion' needs the package lion-pytorch: "
                         "pip install lion-pytorch") from None
    return Lion(_trainable_groups(model, train), lr=train["lr"], betas=_betas(train))


def _muon(model: DecoderLM, train: dict[str, Any], muon) -> torch.optim.Optimizer:
    """`muon` on the hidden matrices, AdamW on the rest; one lr serves both (Muon's
    match_rms_adamw scales its update to AdamW's RMS)."""
    lr, wd, betas = train["lr"], train["weight_decay"], _betas(train)
    hidden = muon_params(model)
    ids = {id(p) for p in hidden}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
    adamw = torch.optim.AdamW(_adamw_groups(rest, wd), lr=lr, betas=betas)
    if not hidden:  # every hidden matrix frozen (a LoRA fine-tune): AdamW on the rest
        return adamw
    return Combined([muon(hidden, lr=lr, weight_decay=wd, adjust_lr_fn="match_rms_adamw"),
                     adamw])


OPTIMIZERS = {"adamw": _adamw, "muon": _muon, "lion": _lion}  # train.optimizer -> builder


def build_optimizer(model: DecoderLM, train: dict[str, Any],
                    muon: type[torch.optim.Optimizer] = Muon) -> torch.optim.Optimizer:
    """The optimizer `train["optimizer"]` names, at lr `train["lr"]`; `muon` is the class
    Muon's share is built with (torch.optim.Muon's signature: ours by default, which
    orthogonalizes in the device's fast dtype; a benchmark passes torch's)."""
    name = train.get("optimizer", "adamw")
    if name not in OPTIMIZERS:
        raise ValueError(f"train.optimizer must be one of {', '.join(OPTIMIZERS)}; "
                         f"got {name!r}")
    return OPTIMIZERS[name](model, train, muon)


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup to 1 over `warmup` steps, cosine down to min_ratio."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_schedule(optimizer: torch.optim.Optimizer,
                   train: dict[str, Any]) -> torch.optim.lr_scheduler.LambdaLR:
    """The train section's schedule over `optimizer`, stepped once per optimizer step
    (here, not in train/harness/module.py, so that a plain loop builds it without Lightning)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, train["warmup_steps"], train["max_steps"],
                                              train["min_lr_ratio"]))
