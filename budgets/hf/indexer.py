"""DSA's lightning indexer watched as it selects (deepseek_v32, glm_moe_dsa): its scores, its
keys and its k, so that the capture reads the selection an attention call receives as
`indices` (budgets/capture/selection.py) together with the selector that made it.

    with indexers_watched(model) as latest:   # latest[0]: the last IndexerRun, or empty
        model(input_ids=ids)
    sel = selection_of(module, indices, mask, latest, names)

An indexer is a module whose class name ends in "Indexer" (DeepseekV32Indexer,
GlmMoeDsaIndexer). Inside, each one's forward runs under a torch function mode that keeps
the input and output of its top-k (the index scores [B, T, Tk], the keys it cannot see
at -inf or the dtype's min; the chosen positions [B, T, k]), and its cache (None in the
probe's forward) is wrapped in a recorder: the indexer passes it its keys [B, Tk, d_I]
(`update_indexer`) and gets back what the cache returns (the keys themselves without one),
the recorder keeping them. A layer that reuses an earlier layer's choice (glm_moe_dsa's
"shared" layers) receives that layer's indices: the last run whose choice they equal names
its indexer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..capture.selection import Selection

TOPK = (torch.topk, torch.Tensor.topk)


@dataclass
class IndexerRun:
    """One indexer forward, as watched."""

    module: nn.Module
    scores: torch.Tensor | None = None  # [B, T, Tk] what its top-k chose from
    chosen: torch.Tensor | None = None  # [B, T, k] what its top-k returned
    keys: torch.Tensor | None = None  # [B, Tk, d_I] its keys, as it caches them


class _KeyRecorder:
    """Stands in for the model's cache (None: no cache) in an indexer's forward: records
    the keys the cache gives back (all cached so far) or, without one, those it would
    cache, handed back unchanged; anything else is asked of the cache itself."""

    def __init__(self, run: IndexerRun, cache):
        self.run, self.cache = run, cache

    def update_indexer(self, keys: torch.Tensor, layer_idx: int) -> torch.Tensor:
        if self.cache is not None:
            keys = self.cache.update_indexer(keys, layer_idx)
        self.run.keys = keys.detach()  # [B, Tk, d_I]
        return keys

    def __getattr__(self, name: str):
        return getattr(self.cache, name)


class _TopkMode(TorchFunctionMode):
    def __init__(self, run: IndexerRun):
        super().__init__()
        self.run = run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in TOPK:
            self.run.scores, self.run.chosen = args[0].detach(), out.indices.detach()
        return out


def _watching(module: nn.Module, forward: Callable, latest: list[IndexerRun]) -> Callable:
    def watched(*args, **kwargs):
        run = IndexerRun(module)
        if "cache" in kwargs:
            kwargs["cache"] = _KeyRecorder(run, kwargs["cache"])
        with _TopkMode(run):
            out = forward(*args, **kwargs)
        latest[:] = [run]
        return out
    return watched


def is_indexer(module: nn.Module) -> bool:
    return type(module).__name__.endswith("Indexer")


@contextlib.contextmanager
def indexers_watched(model: nn.Module, latest: list | None = None):
    """Inside, every indexer of `model` is watched; yields `latest` (a new list if None),
    which holds the last run (empty before the first). The indexers' forwards are
    restored on the way out."""
    latest = [] if latest is None else latest
    saved = []
    for m in model.modules():
        if is_indexer(m):
            saved.append((m, vars(m).get("forward")))  # an instance's own forward, if any
            m.forward = _watching(m, m.forward, latest)
    try:
        yield latest
    finally:
        for m, own in saved:
            if own is None:
                del m.forward  # the class's forward again
            else:
                m.forward = own


def selection_of(module: nn.Module, indices: torch.Tensor, mask: torch.Tensor | None,
                 latest: list[IndexerRun], names: dict[nn.Module, str]) -> Selection:
    """The Selection an attention call of `module` received as `indices` [B, T, k], with
    the scores and keys of the indexer whose choice they are (the last run, when its
    top-k equals them; another layer's indexer: named in shared_from)."""
    indices = indices.detach()
    run = latest[0] if latest else None
    if run is not None and (run.chosen is None or not torch.equal(run.chosen.long(),
                                                                  indices.long())):
        run = None  # a choice the watched indexer did not make: read without its figures
    topk = getattr(run.module, "index_topk", None) if run is not None else None
    own = run is not None and any(m is run.module for m in module.modules())
    return Selection(indices, int(topk or indices.shape[-1]), dense_mask=mask,
                     scores=run.scores if run is not None else None,
                     keys=run.keys if run is not None else None,
                     shared_from=None if run is None or own else names.get(run.module),
                     index_heads=_int(run, "n_heads"),
                     index_dim=int(run.keys.shape[-1]) if run is not None and
                     run.keys is not None else _int(run, "head_dim"))


def _int(run: IndexerRun | None, attr: str) -> int:
    """The watched indexer's `attr` (n_heads, head_dim), 0 where unknown."""
    value = getattr(run.module, attr, None) if run is not None else None
    return value if isinstance(value, int) else 0
