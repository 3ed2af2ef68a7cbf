"""Fixtures of the compress tests that heal and save: a text and a tiny Llama trained on it,
and zoo variants of seeded weights written as a run leaves them.

The model learns in about two seconds on one CPU thread (64 steps on the word text below),
so compressing it hurts its loss, which healing can then be seen to win back.
"""

from __future__ import annotations

import pytest
import torch

from train.config import parse_experiment
from train.lm.decoder import build_model
from train.rundir.files import write_yaml

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "rank", "and", "budget", "met", "in",
         "zoo", "of", "heads", "keys", "values", "queries", "cache", "layer", "token", "mixing"]
VOCAB = 64  # the model reads bytes modulo its vocabulary: no tokenizer is saved


def word_text(seed: int, n: int = 700) -> str:
    picks = torch.randint(len(WORDS), (n,), generator=torch.Generator().manual_seed(seed))
    return " ".join(WORDS[i] for i in picks.tolist()) + "\n"


@pytest.fixture(scope="session")
def word_texts(tmp_path_factory):
    """(calibration text, evaluation text): two draws of the same word language."""
    root = tmp_path_factory.mktemp("texts")
    (root / "calib.txt").write_text(word_text(0))
    (root / "eval.txt").write_text(word_text(1))
    return root / "calib.txt", root / "eval.txt"


@pytest.fixture(scope="session")
def trained_llama(tmp_path_factory, word_texts):
    """A 2-layer Llama (hidden 32, 2 KV heads of 8, RoPE) trained on the calibration text,
    saved with save_pretrained."""
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config)
    data = torch.tensor(list(word_texts[0].read_bytes())) % VOCAB
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        starts = torch.randint(0, len(data) - 33, (8,), generator=g)
        x = torch.stack([data[s:s + 32] for s in starts.tolist()])  # [8, 32]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.eval().save_pretrained(path)
    return path


ZOO_RAW = {
    "name": "cc", "seed": 0,
    "data": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "train_size": 32,
             "val_size": 16, "batch_size": 8},
    "model": {"d_model": 16, "n_layers": 2},
    "block_defaults": {"n_heads": 2},
    "variants": {"mha": {"block": "softmax"},
                 "gqa-norope": {"block": "softmax", "n_heads": 4, "n_kv_heads": 2,
                                "rope": False},
                 "window": {"block": "sliding_window", "window": 4}},
    "train": {"max_steps": 6, "warmup_steps": 1},
}


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory):
    """runs/cc/<variant>/: config.yaml and checkpoints/last.ckpt of seeded weights."""
    exp = parse_experiment(ZOO_RAW)
    root = tmp_path_factory.mktemp("runs") / exp.name
    for i, name in enumerate(exp.variants):
        vdir = root / name
        (vdir / "checkpoints").mkdir(parents=True)
        config = exp.variant_config(name)
        torch.manual_seed(i)
        model = build_model(config)
        torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                    "global_step": 6}, vdir / "checkpoints" / "last.ckpt")
        write_yaml(vdir / "config.yaml", {**config, "params": model.param_count()})
    return root
