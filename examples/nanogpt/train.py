"""Train the nanoGPT-style model of model.py in a plain PyTorch loop with rankzoo's rank
monitor, on the text of configs/text.yaml (Python standard library sources through a
2048-token BPE trained offline), then print its rank-budget report.

    python -m examples.nanogpt.train --out runs/nanogpt          # ~300 steps
    rankzoo report runs/nanogpt                                  # the monitor's run
    rankzoo report --model examples.nanogpt.model:small --checkpoint runs/nanogpt/ckpt.pt \
        --text FILE --tokenizer runs/nanogpt/tokenizer.json      # the model itself

It writes the checkpoint (ckpt.pt) and the tokenizer its text was read through
(tokenizer.json) beside the monitor's files, so that the report reads any text as the
model read its own.

The loop is the user's; rankzoo adds two lines (the Monitor and `monitor.step`). At the
end it prints how much of the loop's time the monitor took.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from train.config import load_experiment
from train.data.text import TextSpec, text_splits, tokenizer_json
from train.monitor import Monitor

from .model import small

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "text.yaml"


def text_spec(seq_len: int) -> TextSpec:
    """text.yaml's corpus and tokenizer, in windows of seq_len tokens."""
    d = load_experiment(CONFIG).data
    return TextSpec(paths=d.paths, seq_len=seq_len, max_bytes=d.max_bytes,
                    val_fraction=d.val_fraction, tokenizer=d.tokenizer)


def data(train_size: int, seq_len: int):
    """((inputs, targets) [N, T] each) of the training and of the validation split of
    text.yaml's corpus."""
    return text_splits(text_spec(seq_len), train_size, 64, seed=0)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/nanogpt", help="the monitor's run directory")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=100, help="monitor every N steps")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = small()
    (x, y), (val, _) = data(args.steps * 8, model.config.block_size)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    monitor = Monitor(val[:4], args.out, every_n_steps=args.every, tensorboard=True,
                      max_steps=args.steps)
    began = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = slice((step - 1) * 8, step * 8)
        _, loss = model(x[rows], y[rows])  # [8, T] each
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        monitor.step(model, step)
        if step % args.every == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    monitor.finish(model, args.steps)
    total = time.perf_counter() - began
    torch.save({"model": model.state_dict()}, Path(args.out) / "ckpt.pt")
    shutil.copyfile(tokenizer_json(text_spec(model.config.block_size)),
                    Path(args.out) / "tokenizer.json")
    print(f"{args.steps} steps in {total:.1f} s; the monitor took {monitor.seconds:.1f} s "
          f"({100 * monitor.seconds / total:.1f}% of the loop)")
    print(f"next: rankzoo report {args.out}\n"
          f"      rankzoo report --model examples.nanogpt.model:small --checkpoint "
          f"{Path(args.out) / 'ckpt.pt'} --text FILE --tokenizer "
          f"{Path(args.out) / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
