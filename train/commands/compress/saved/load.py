"""A model `rankzoo compress --save` wrote, loaded to decode with the cache that holds its bytes.

    saved = load_compressed("small")            # the model, its codecs, its compress.json
    logits, cache = saved.decode(ids)           # ids [B, T]: a prefill, then a token a time
    held_bytes(cache) / (B * T)                 # == saved.bytes_per_token (the row's)
    ids = saved.generate(prompt, 64)            # greedy, through the low-rank cache
    check = measure_saved(saved, ids, reference_logits)   # bytes held vs counted, logits

A saved directory holds the model with W_K and W_V projected (a run's checkpoint laid out
like a variant's, or save_pretrained), bases.pt (per slot the decoders U_r and encoders
E_r of each head) and compress.json (the row saved: ranks, bytes_per_token at the cache
dtype, `length`). What differs between a zoo model and a Hugging Face one (how it loads,
its cache of codes, a decoding step) is asked of the target class its `kind` names
(train/commands/compress/target/protocol.py): train/commands/compress/target/cache.py's
LowRankKVCache per layer for a zoo model, train/commands/compress/target/hf_cache.py's
LowRankCache for a Hugging Face one, its codes at the cache dtype the row was counted at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..target.cache import held_bytes, layer_codes
from ..target.hf_surgery import HFTarget, cache_kwarg
from ..target.protocol import Target
from ..target.zoo_surgery import ZooTarget

SAVED_FILES = ("compress.json", "bases.pt")
# the cache dtypes codes are held at (compress.json's cache_dtype); 8-bit ones would need a
# quantizer beside the bases
CODE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Saved.kind -> the target class that loads and serves such a model (static members)
TARGET_TYPES = {t.kind: t for t in (ZooTarget, HFTarget)}


@dataclass
class Saved:
    """A compressed model as saved, with the codecs its cache encodes and rebuilds with."""

    model: nn.Module
    codes: dict  # per layer number, (keys' SlotCodes, values' SlotCodes)
    info: dict  # compress.json
    kind: str  # "hf" or "zoo"
    dtype: torch.dtype  # of the codes: the cache dtype the row counts bytes at

    @property
    def bytes_per_token(self) -> float:
        """The bytes per token of one sequence's cache that the saved row reports."""
        return float(self.info["row"]["bytes_per_token"])

    def new_cache(self, batch: int = 1, max_len: int | None = None):
        """An empty low-rank cache for `batch` sequences (zoo: of up to max_len tokens,
        preallocated; Hugging Face: grown as tokens come)."""
        return self.served_by.lowrank_cache(self.model, self.codes, self.dtype, self.info,
                                             batch, max_len)

    @property
    def served_by(self) -> type[Target]:
        """The target class of this kind of model (train/commands/compress/target/)."""
        return TARGET_TYPES[self.kind]

    @torch.no_grad()
    def step(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """Logits [B, n, vocab] of ids [B, n] continuing what `cache` holds (updated)."""
        ids = ids.to(next(self.model.parameters()).device)
        return self.served_by.step(self.model, ids, cache)

    @property
    def cache_kwarg(self) -> str:
        """The name a Hugging Face model's forward and generate take a cache by (`cache`
        since transformers 5, `past_key_values` before)."""
        return cache_kwarg(self.model)

    def decode(self, ids: torch.Tensor, prefill: int = 1):
        """(logits [B, T, vocab], the cache): ids [B, T] read through the low-rank cache,
        the first `prefill` tokens at once, then one token at a time."""
        if not 1 <= prefill <= ids.shape[1]:
            raise ValueError(f"prefill={prefill}: expected 1 <= prefill <= {ids.shape[1]}")
        cache = self.new_cache(ids.shape[0], ids.shape[1])
        out = [self.step(ids[:, :prefill], cache)]
        out += [self.step(ids[:, t:t + 1], cache) for t in range(prefill, ids.shape[1])]
        return torch.cat(out, dim=1).float(), cache

    def generate(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """prompt [B, P] followed by new_tokens greedy tokens, [B, P + new_tokens]."""
        cache = self.new_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
        ids, logits = prompt, self.step(prompt, cache)
        for _ in range(new_tokens):
            nxt = logits[:, -1:].argmax(-1).to(ids.device)  # [B, 1]
            ids = torch.cat([ids, nxt], dim=1)
            logits = self.step(nxt, cache)
        return ids


def load_compressed(path, device: str = "cpu") -> Saved:
    """The compressed model in `path` (a `rankzoo compress --save` directory) on `device`,
    with its codecs; a directory that is not one is a one-line error naming it."""
    path = Path(path)
    missing = [name for name in SAVED_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: no {' or '.join(missing)}: not a directory "
                                f"`rankzoo compress --save` wrote")
    return load_saved(path, json.loads((path / "compress.json").read_text()), device)


def load_saved(path: Path, info: dict, device: str = "cpu") -> Saved:
    """The model and bases.pt in `path`, described by `info` (compress.json's document)."""
    kind = "hf" if "hf" in info["source"] else "zoo"
    refused = TARGET_TYPES[kind].unserved(info)
    if refused is not None:
        raise ValueError(f"{path}: {refused}")
    if info["cache_dtype"] not in CODE_DTYPES:
        raise ValueError(f"{path}: cache_dtype {info['cache_dtype']}: the low-rank cache holds "
                         f"its codes at {', '.join(CODE_DTYPES)} (8-bit codes need a quantizer)")
    bases = torch.load(path / "bases.pt", weights_only=True)
    model = TARGET_TYPES[kind].load_model(path).to(device)
    saved = Saved(model, layer_codes(bases), info, kind, CODE_DTYPES[info["cache_dtype"]])
    saved.new_cache(1, 1)  # a model the cache does not serve is refused here, in one line
    return saved


def measure_saved(saved: Saved, ids: torch.Tensor,
                  reference: torch.Tensor | None = None, prefill: int = 1) -> dict:
    """Decode ids [B, T] through the low-rank cache: the bytes it holds against the row's
    bytes_per_token x B x T, and (reference: the logits [B, T, vocab] of the model the row
    measured) the largest logit difference."""
    logits, cache = saved.decode(ids, prefill)
    B, T = ids.shape
    held = held_bytes(cache)
    out = {"tokens": T, "batch": B, "cache_dtype": str(saved.dtype).removeprefix("torch."),
           "held_bytes": held, "reported_bytes": saved.bytes_per_token * B * T,
           "held_bytes_per_token": held / (B * T),
           "reported_bytes_per_token": saved.bytes_per_token}
    if reference is not None:
        reference = reference.float().to(logits.device)
        out["max_logit_error"] = float((logits - reference).abs().max())
        out["logit_scale"] = float(reference.abs().max())
        # what the rounding of the codes costs the sample's next-token loss, nats per token
        out["delta_loss"] = _next_token_loss(logits, ids) - _next_token_loss(reference, ids)
    return out


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean cross-entropy of logits [B, T, vocab] on the next tokens of ids [B, T]."""
    target = ids[:, 1:].to(logits.device)
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten()))
