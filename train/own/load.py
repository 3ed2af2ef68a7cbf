"""Building a user's model from `pkg.module:factory`, its weights from a checkpoint, and its
rank-budget report on a text.

The factory is called without arguments and returns the nn.Module (a class works: its
constructor is the factory). Its module is found as `python -m` finds one: under the
current directory first, then on the installed path, so `examples.nanogpt.model:small`
works from the repository root with no PYTHONPATH. A checkpoint is a state dict saved by
torch.save, or a dict holding one under "model", "state_dict" or "model_state_dict"
(nanoGPT's ckpt.pt keeps it under "model"); the "_orig_mod." prefix torch.compile adds is
taken off. It is read with weights_only=True: nothing in it runs. The text becomes token
ids through a tokenizer (data.tokenizer's specs: tokenizer.json, a Hugging Face tokenizer
directory, bpe:N; encoded as data.tokenizer encodes a corpus), or as raw bytes modulo the
model's vocabulary (its output head's width), said so in a note.
Errors name the value (model=..., checkpoint=...); the CLI shows them as its flags.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path

import torch
from torch import nn

STATE_KEYS = ("model", "state_dict", "model_state_dict")
COMPILED = "_orig_mod."


def load_own_model(spec: str, checkpoint=None) -> nn.Module:
    """The model `spec` ("pkg.module:factory") builds, in eval mode, with the state dict
    of `checkpoint` loaded (strictly: a key missing or left over is an error)."""
    model = _factory(spec)()
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={spec}: the factory returned {type(model).__name__}, "
                         f"not a torch.nn.Module")
    if checkpoint is not None:
        state = _state_dict(Path(checkpoint))
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise ValueError(f"checkpoint={checkpoint}: does not fit model={spec}: "
                             f"{first}") from None
    return model.eval()


def _factory(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"model={spec}: expected pkg.module:factory")
    try:
        with current_directory_on_path():
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"model={spec}: cannot import {module_name} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"model={spec}: {module_name} has no callable {attr}")
    return factory


@contextlib.contextmanager
def current_directory_on_path():
    """The current directory first on sys.path for the duration, as `python -m` puts it
    there (the console script's sys.path[0] is its bin directory instead); sys.path as it
    was afterwards, so nothing else the process imports later changes."""
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.path[:] = saved


def _state_dict(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint={path}: file not found")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch's own errors all mean "not readable"
        raise ValueError(f"checkpoint={path}: not a torch.save file of tensors ({e})") \
            from None
    for key in STATE_KEYS:
        if isinstance(saved, dict) and isinstance(saved.get(key), dict):
            saved = saved[key]
            break
    if not isinstance(saved, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in saved.values()):
        raise ValueError(f"checkpoint={path}: holds no state dict (looked at the top and "
                         f"under {', '.join(STATE_KEYS)})")
    return {k.removeprefix(COMPILED): v for k, v in saved.items()}


def vocab_of(model: nn.Module) -> int:
    """The model's vocabulary: its output head's width."""
    from budgets.probe.blocks import output_head

    head = output_head(model)
    if head is None or not isinstance(getattr(head, "out_features", None), int):
        raise ValueError(f"{type(model).__name__}: no output head (a `head` or `lm_head` "
                         f"linear) gives its vocabulary size")
    return head.out_features


def own_tokens(data: bytes, tokenizer: str | None, vocab: int, where: str,
               notes: list[str]) -> torch.Tensor:
    """Token ids [N] of the text: through `tokenizer` (a data.tokenizer spec), else bytes
    modulo the vocabulary."""
    if tokenizer is None:
        notes.append(f"{where}: no --tokenizer given; using raw bytes modulo the vocab size "
                     f"({vocab}) as token ids")
        return torch.tensor(list(data), dtype=torch.long) % vocab  # [N]
    from ..data.tokenizer import encode_text, load_tokenizer

    text = data.decode("utf-8", errors="replace")
    tok = load_tokenizer(tokenizer, lambda: text)  # bpe:N trains on the text it encodes
    if tok.vocab_size > vocab:  # refused before any id is read: a model indexes V rows
        raise ValueError(f"tokenizer={tokenizer}: its {tok.vocab_size} tokens do not fit "
                         f"the model's vocab of {vocab} (its output head's width)")
    ids = encode_text(tok, text, where)  # data.tokenizer's path: pieces, a progress bar
    return torch.from_numpy(ids.astype("int64"))  # [N]


def report_own(spec: str, text, checkpoint=None, tokenizer: str | None = None,
               seq_len: int = 128, probe_size: int = 4, notes: list[str] | None = None,
               device: str = "cpu", **options) -> dict:
    """The rank-budget report of the model `spec` builds on the start of `text`
    (`options`: budgets.probe_torch_model's)."""
    from budgets.probe.own import report_of_model

    from ..data.tokenizer import bpe_size
    from ..hf import device_of, probe_batch, read_text, zoo_blocks

    notes = notes if notes is not None else []
    data = read_text(text)
    model = load_own_model(spec, checkpoint).to(device_of(device))
    ids = own_tokens(data, tokenizer, vocab_of(model), str(text), notes)
    if checkpoint is not None and tokenizer is not None and bpe_size(tokenizer) is not None:
        notes.append(f"{text}: --tokenizer {tokenizer} trains a BPE on this text, not the "
                     f"tokenizer {checkpoint} was trained with: name that one's "
                     f"tokenizer.json so the ids mean what they meant in training")
    batch = probe_batch(ids, seq_len, probe_size, str(text))  # [B, T]
    source = {"checkpoint": None if checkpoint is None else str(checkpoint),
              "text": str(text), "tokens": tokenizer or "bytes % vocab_size"}
    return report_of_model(model, batch.to(next(model.parameters()).device), name=spec,
                           source=source, zoo_blocks=zoo_blocks(), **options)
