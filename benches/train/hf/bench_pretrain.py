"""Pretrain a byte-level causal LM with the 135M Llama layout's attention geometry, offline,
so that `rankzoo compress --hf` and `rankzoo report --hf` can be measured on trained weights
when no pretrained model can be downloaded.

    python -m benches.train.hf.bench_pretrain OUT_DIR --text train.txt [--layers 8] [--minutes 30]
    python -m benches.train.hf.bench_pretrain OUT2 --text train.txt --start OUT_DIR   # train on

The layout is SmolLM-135M's per layer (hidden 576, 9 query heads over 3 KV heads of 64
channels, RoPE, SwiGLU 1536, RMSNorm, tied embeddings); only the depth (default 8 of 30) and
the vocabulary (raw bytes, 256) are smaller, so that it learns something in minutes on a CPU.
The model is saved with save_pretrained and no tokenizer: the probe then reads raw bytes, as
here. OUT_DIR must be new or empty; the loss is printed as it goes.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from train.hf.model_dir import import_transformers

LAYOUT = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
              num_key_value_heads=3, head_dim=64, vocab_size=256, rope_theta=10000.0,
              max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build(layers: int, seed: int, start: Path | None = None):
    """A new model of the layout, or (start) one saved by an earlier run, to train on."""
    transformers = import_transformers()
    torch.manual_seed(seed)
    if start is not None:
        return transformers.LlamaForCausalLM.from_pretrained(start)
    config = transformers.LlamaConfig(num_hidden_layers=layers, **LAYOUT)
    return transformers.LlamaForCausalLM(config)


def batches(data: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator):
    """Random windows of seq_len + 1 bytes: (inputs [B, T], targets [B, T]), forever."""
    if len(data) <= seq_len + 1:
        raise ValueError(f"--text: {len(data)} bytes, fewer than --seq-len {seq_len} + 2")
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        rows = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
        yield rows[:, :-1], rows[:, 1:]


def lr_at(step: int, steps: int, peak: float, warmup: int = 50) -> float:
    """Linear warmup, then cosine to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t))))


def train(model, data, args) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    stream, start = batches(data, args.seq_len, args.batch, gen), time.monotonic()
    model.train()
    for step in range(args.steps):
        x, y = next(stream)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        logits = model(input_ids=x).logits                                   # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        minutes = (time.monotonic() - start) / 60
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f} nats/byte  {minutes:.1f} min",
                  flush=True)
        if minutes > args.minutes:
            print(f"stopped at step {step}: --minutes {args.minutes:g} reached", flush=True)
            break
    model.eval()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--text", type=Path, required=True, help="training text, read as bytes")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=30.0, help="stop after this much time")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=Path, help="continue from a model this command saved")
    args = p.parse_args(argv)
    if args.out_dir.exists() and any(args.out_dir.iterdir()):
        raise SystemExit(f"out_dir={args.out_dir}: not empty; name a new or empty directory")
    data = torch.frombuffer(bytearray(args.text.read_bytes()), dtype=torch.uint8)
    model = build(args.layers, args.seed, args.start)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{len(data) / 1e6:.1f} MB of text", flush=True)
    train(model, data, args)
    model.save_pretrained(args.out_dir)
    print(f"saved to {args.out_dir}")


if __name__ == "__main__":
    main()
