"""The one interface compress drives a model through, whichever kind it is.

    target = ZooTarget(model, keys)   # zoo_surgery.py: a DecoderLM of one block family
    target = HFTarget(model, keys)    # hf_surgery.py: a Hugging Face causal LM
    with target.projected(P, windows): target.evaluate(tokens, labels, batch_size)

Calibration, allocation, measuring, healing and saving ask a target, never which target it
is: what differs between a zoo model and a Hugging Face one, or between a KV cache and a
latent or a state, is answered here, by an attribute or a method of the target. Loading a
saved model builds no target (that would run a forward pass to find its layers), so what
loading needs is static: called on the class that `kind` names
(saved/load.py, at the package's top: train/commands/compress/).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from budgets.cache import Keys

from ..bases.lowrank import Slot
from .surgery import Surgery


@dataclass(frozen=True)
class PerSequence:
    """An evaluation's summed loss and labelled positions per sequence, in the order of
    the evaluation data (the same for every setting): Target.evaluate's "per_sequence"."""

    sums: list[float]
    positions: list[int]


@runtime_checkable
class Target(Protocol):
    """A model whose cache compress fits bases for, projects, evaluates, heals and saves."""

    kind: str  # "zoo" or "hf": the saved model's loader (Target.load_model and the rest)
    family: str  # the document's: "kv" for every KV cache, else the zoo block (mla, ssm)
    # the cache is keys and values per KV head: healed, read through windows (mixed),
    # served by the low-rank cache of codes, its keys chosen (--keys)
    caches_kv: bool
    model: nn.Module
    keys: Keys | str  # which keys get a basis ("auto" where there are none)
    rope: bool  # the keys are rotated by RoPE
    slots: Sequence[Slot]  # what is cached, per layer and kind
    window_layers: Sequence[int]  # the layers whose KV heads may be read through a window
    # a hybrid's other mixers, their state kept in full (hf_layers.py Kept: layer, kind,
    # elements per sequence); none in a model of one family
    kept: Sequence

    @property
    def one_scale(self) -> bool:
        """Whether the slots' weights share one scale (squared output error per token)."""
        ...

    @property
    def saveable(self) -> str | None:
        """Why the compression is not a change of weights (None: it is)."""
        ...

    def describe(self) -> str:
        """One line: the model, its layers and what each caches, the keys chosen."""
        ...

    def activations(self, tokens: torch.Tensor, weights: dict | None = None,
                    residual: dict | None = None) -> dict[tuple[int, str], torch.Tensor]:
        """Per slot what the cache holds for tokens [B, T], [B, G, T, K]; the slots'
        weights into `weights`, the residual stream's mean squared norm into `residual`."""
        ...

    def apply(self, surgery: Surgery, P: dict, windows: dict | None = None) -> None:
        """Every slot projected by its P [G, K, K] and the KV heads of `windows`
        ({(layer, g): (W, s)}) read through their window, through `surgery`."""
        ...

    def projected(self, P: dict, windows: dict | None = None):
        """A context: the model with apply(surgery, P, windows) in force, undone on exit."""
        ...

    def watched(self, record):
        """A context: a forward pass records its live cache activations (and window
        effects) into `record` (allocation/sensitivity.py)."""
        ...

    def query_heads(self, i: int) -> int:
        """H: the query heads of layer i (a KV head serves H / G of them)."""
        ...

    def loss_logits(self, tokens: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The logits [n, vocab] of the positions whose loss counts."""
        ...

    def evaluate(self, tokens: torch.Tensor, labels: torch.Tensor | None,
                 batch_size: int) -> dict:
        """Mean loss (and accuracy or perplexity), tokens, per-sequence sums."""
        ...

    def adapter_sites(self, P: dict) -> dict[nn.Module, list]:
        """{linear: [(row index, P)]}: the attention projections --heal adapts, each with
        the rows of the heads whose output the cache projects (heal.py Adapter)."""
        ...

    @staticmethod
    def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The logits [B, T, vocab] of a model of this kind, without a cache."""
        ...

    @staticmethod
    def load_model(path: Path) -> nn.Module:
        """The model a `--save` directory holds, in eval mode."""
        ...

    @staticmethod
    def unserved(info: dict) -> str | None:
        """Why the low-rank cache does not serve a saved model of this kind described by
        `info` (its compress.json); None: it does."""
        ...

    @staticmethod
    def lowrank_cache(model: nn.Module, codes: dict, dtype: torch.dtype, info: dict,
                      batch: int, max_len: int | None):
        """An empty low-rank cache of codes for `batch` sequences of a saved model."""
        ...

    @staticmethod
    def step(model: nn.Module, ids: torch.Tensor, cache) -> torch.Tensor:
        """Logits [B, n, vocab] of ids [B, n] continuing what `cache` holds (updated)."""
        ...
