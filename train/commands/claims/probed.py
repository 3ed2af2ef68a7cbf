"""A checkpoint's evidence: `rankzoo claims --hf MODEL --text FILE` probes it once at
eps = 0.01 (the claims' rank_0.01) through train/hf's probe_hf, the probe `rankzoo report
--hf` takes, and keeps one sequence's next-token logits for the softmax bound."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...hf.probe import load_for_probe, probe_batch, probe_hf, token_ids
from .evidence import Probed

EPS = 0.01  # the claims' rank_0.01
LOGITS_LEN = 64  # tokens of the sequence whose logits the softmax bound reads


def probe_checkpoint(model_dir: str, text: str, seq_len: int = 256, probe_size: int = 2,
                     notes: list[str] | None = None, progress: Callable | None = None,
                     device: str = "cpu") -> Probed:
    """The probe of the model saved in `model_dir` on `text`, and its logits [T, V]."""
    name, entry = probe_hf(model_dir, text, seq_len=seq_len, probe_size=probe_size, eps=EPS,
                           notes=notes, progress=progress, device=device)
    model, tokenizer, data = load_for_probe(model_dir, text, device=device)
    config = model.config
    ids = token_ids(data, tokenizer, int(config.vocab_size), str(text))
    batch = probe_batch(ids, min(LOGITS_LEN, seq_len), 1, str(text), None)
    with torch.no_grad():
        logits = model(input_ids=batch.to(next(model.parameters()).device)).logits[0]
    d_model = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0))
    n_heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or (d_model // n_heads if n_heads else 0))
    return Probed(name, entry["probe"], d_model, n_heads, head_dim,
                  logits.detach().double().cpu())
